"""The accuracy record kept as a running state: every build adds the outcomes of its new
sessions to the sums the previous build left, so the record never recomputes the history.
Pure: arrays in, arrays out (the build stores the state, `build.risk_run`).

The measure is `accuracy`'s (bias statistic b = std(R_t / s_t), the same families of
portfolios, the weighted-volatility baseline), arranged so that it can run forward:

- whole period: per row the count, sum and sum of squares of z = R / s (b from them, ddof 1);
- 12-month windows: the outcomes from the first evaluated session on in blocks of 21 (one a
  month); a window is 12 consecutive blocks, complete when its last block is, so a window
  never changes once counted (`accuracy.rolling_bias` places them back from the last session
  instead, which moves them every day). Per row the sum of |b_w - 1| over complete windows
  gives the MAD; per family the highest median b of a window is its worst 12 months;
- 21-day outcomes: the forecast of session s is known at s, its outcome at s + 20. The state
  keeps the last `TAIL` sessions' positions (members available, exposures), returns and
  forecasts, so that a step finishes the outcomes its sessions complete;
- the random books' memberships are drawn once (`make_portfolios`, seed 0) and kept;
- beside the served model and the baseline, the previous model (`previous_params`: the ETF
  layer alone, F and D of the ETF factors' residuals, no regime adjustment) is measured on the
  same rows, sessions and members, so the record carries it side by side.

Every sum is added session by session in time order, so a run split anywhere (one chunk of
sessions per step, or a daily build resuming yesterday's state) gives the same bits as one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from eqrisk.model.accuracy import (
    FAMILIES,
    HEDGED_SIZES,
    MONTH,
    YEAR,
    Portfolios,
    make_portfolios,
)
from eqrisk.model.outcome_kernel import accumulate, held_returns, portfolio_days, window_done
from eqrisk.model.risk_model import RiskModel, RiskParams

HORIZONS = (1, 21)
KINDS = ("model", "baseline", "previous")
"""The forecasts measured: the served model, the weighted-volatility baseline and the previous
model (`previous_params`: the ETF layer alone, without the regime adjustment), NaN where the
caller has none."""
TAIL = 23  # sessions kept: the 21-day horizon's 20 and the baseline's 23-session volatility
FACTOR_VOL_MIN_OBS = 16  # as the stocks' vol_23d (`run.VOL_SHORT_MIN_OBS`)
BLOCKS = YEAR // MONTH  # 12 blocks of 21 outcomes make a window
ROW_FAMILIES = ("single_stocks", *FAMILIES)


@dataclass
class Running:
    """The sums of one horizon and one forecast (model or baseline) over R rows."""

    count: np.ndarray  # (R,)
    s1: np.ndarray  # (R,) sum of z
    s2: np.ndarray  # (R,) sum of z^2
    s4: np.ndarray  # (R,) sum of z^4 (the tails, for the floor)
    blocks: np.ndarray  # (BLOCKS, 3, R): count, s1, s2 of the last 12 blocks (ring)
    mad_sum: np.ndarray  # (R,) sum over complete windows of |b_w - 1|
    mad_count: np.ndarray  # (R,)
    worst: np.ndarray  # (len(ROW_FAMILIES),) highest median b of a window, NaN = none yet
    outcomes: int = 0  # outcomes added (sessions from the first evaluated one)

    @classmethod
    def empty(cls, rows: int) -> Running:
        z = np.zeros(rows)
        return cls(z.copy(), z.copy(), z.copy(), z.copy(), np.zeros((BLOCKS, 3, rows)),
                   z.copy(), z.copy(), np.full(len(ROW_FAMILIES), np.nan))  # fmt: skip

    def add(self, z: np.ndarray, family: np.ndarray) -> None:
        """Add the outcomes of consecutive sessions (R x S, NaN = none for that row), one
        session after the other."""
        # `accumulate` reads a session's rows together
        self.add_sessions(np.ascontiguousarray(z.T), family)

    def add_sessions(self, by_session: np.ndarray, family: np.ndarray) -> None:
        """`add` of the outcomes a session a row (S x R, C-ordered; a value not finite = none
        for that row)."""
        c, n_s = 0, by_session.shape[0]
        while c < n_s:
            j, pos = divmod(self.outcomes, MONTH)
            ring = self.blocks[j % BLOCKS]
            if pos == 0:
                ring[:] = 0.0
            take = min(MONTH - pos, n_s - c)  # up to the end of the block
            accumulate(by_session[c : c + take], self.count, self.s1, self.s2, self.s4, ring)
            self.outcomes += take
            c += take
            if pos + take == MONTH and j >= BLOCKS - 1:
                self._window_done(j, family)

    def _window_done(self, j: int, family: np.ndarray) -> None:
        order = np.array([(j - BLOCKS + 1 + a) % BLOCKS for a in range(BLOCKS)])
        window_done(self.blocks, order, family, YEAR // 2, self.mad_sum, self.mad_count,
                    self.worst)  # fmt: skip

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "count": self.count, "s1": self.s1, "s2": self.s2, "s4": self.s4,
            "blocks": self.blocks, "mad_sum": self.mad_sum, "mad_count": self.mad_count,
            "worst": self.worst, "outcomes": np.array(self.outcomes, dtype=np.int64),
        }  # fmt: skip

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> Running:
        def f(k: str) -> np.ndarray:
            return np.array(a[k], dtype=np.float64)

        return cls(f("count"), f("s1"), f("s2"), f("s4"), f("blocks"), f("mad_sum"),
                   f("mad_count"), f("worst"), outcomes=int(a["outcomes"]))  # fmt: skip


def _std(count: np.ndarray, s1: np.ndarray, s2: np.ndarray, min_obs: int) -> np.ndarray:
    """Standard deviation (ddof 1) from the sums, NaN below `min_obs` observations."""
    out = np.full(count.shape, np.nan)
    ok = count >= max(min_obs, 2)
    c = count[ok]
    var = (s2[ok] - s1[ok] * s1[ok] / c) / (c - 1.0)
    out[ok] = np.sqrt(np.maximum(var, 0.0))
    return out


@dataclass
class AccuracyState:
    """Where the accuracy record stopped: resume `accuracy_step` with it at `session`."""

    session: int  # the next session to add (every forecast of a session before it is in)
    first: int  # the first evaluated forecast session (the model's first + one year)
    n: int  # stock rows; rows n .. n + P - 1 are the portfolios
    portfolios: Portfolios
    family: np.ndarray  # (n + P,) index into ROW_FAMILIES, -1 = not counted
    tail: dict[str, np.ndarray]  # the last TAIL sessions' inputs (`_TAIL_FIELDS`)
    sums: dict[str, Running] = field(default_factory=dict)  # "<h>d/<kind>"

    def to_arrays(self) -> dict[str, np.ndarray]:
        out = {
            "session": np.array(self.session, dtype=np.int64),
            "first": np.array(self.first, dtype=np.int64),
            "n": np.array(self.n, dtype=np.int64),
            **_book_members(self.portfolios),
            "p_hedged": self.portfolios.hedged,
            "p_family": np.array(self.portfolios.family, dtype=str),
            "family": self.family,
        }
        out.update({f"tail_{k}": v for k, v in self.tail.items()})
        for key, run in self.sums.items():
            out.update({f"sum_{key}_{k}": v for k, v in run.to_arrays().items()})
        return out

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> AccuracyState:
        ports = Portfolios(
            [str(f) for f in a["p_family"].tolist()],
            _book_weights(a),
            np.array(a["p_hedged"], dtype=bool),
        )
        sums = {}
        for key in _keys():
            prefix = f"sum_{key}_"
            sums[key] = Running.from_arrays({k[len(prefix):]: v for k, v in a.items()
                                             if k.startswith(prefix)})  # fmt: skip
        tail = {k[5:]: np.array(v) for k, v in a.items() if k.startswith("tail_")}
        return cls(int(a["session"]), int(a["first"]), int(a["n"]), ports,
                   np.array(a["family"], dtype=np.int64), tail, sums)  # fmt: skip


def _book_members(ports: Portfolios) -> dict[str, np.ndarray]:
    """The books' weights as stored: each book's number of members (`p_count`, P), then
    their rows and weights, book after book (`p_rows`, `p_members`), not the (P x n) matrix."""
    rows, weights = ports.members()
    held = rows >= 0
    return {"p_count": held.sum(axis=1).astype(np.int64), "p_rows": rows[held],
            "p_members": weights[held]}  # fmt: skip


def _book_weights(a: dict[str, np.ndarray]) -> np.ndarray:
    """The books' (P x n) weights of a stored state (`_book_members`), or as a state written
    before 2026-11-28 holds them (`p_weights`)."""
    if "p_weights" in a:
        return np.array(a["p_weights"], dtype=np.float64)
    count = np.asarray(a["p_count"], dtype=np.int64)
    weights = np.zeros((len(count), int(a["n"])))
    book = np.repeat(np.arange(len(count)), count)
    weights[book, np.asarray(a["p_rows"], dtype=np.int64)] = np.asarray(a["p_members"])
    return weights


def _keys() -> list[str]:
    return [f"{h}d/{kind}" for h in HORIZONS for kind in KINDS]


def new_state(stocks: np.ndarray, sectors: np.ndarray, n_factors: int, *, first: int = YEAR,
              seed: int = 0) -> AccuracyState:  # fmt: skip
    """The state before session 0: the portfolios drawn (`make_portfolios` with the hedged
    books of HEDGED_SIZES), nothing added. `stocks` (n,) bool, `sectors` (n,) int (-1 = none),
    `n_factors`: the ETF-layer factors (the hedge's legs)."""
    ports = make_portfolios(stocks, sectors, hedged_sizes=HEDGED_SIZES, seed=seed)
    n, p = len(stocks), len(ports.family)
    family = np.full(n + p, -1, dtype=np.int64)
    family[:n][stocks] = 0
    family[n:] = [ROW_FAMILIES.index(f) for f in ports.family]
    tail = {
        "avail": np.zeros((n, TAIL), dtype=bool),
        "level": np.zeros((n, TAIL), dtype=np.int64),
        "values": np.zeros((3, n, TAIL)),
        "r": np.full((n, TAIL), np.nan),
        "f": np.full((n_factors, TAIL), np.nan),
        **{kind: np.full((n + p, TAIL), np.nan) for kind in KINDS},
    }
    sums = {key: Running.empty(n + p) for key in _keys()}
    return AccuracyState(0, first, n, ports, family, tail, sums)


def _available(model: RiskModel, returns: np.ndarray) -> np.ndarray:
    """(n, S) a member counts on session t with a forecast and a return on t (as
    `accuracy.portfolio_outcomes`)."""
    level = model.exposures.level
    avail: np.ndarray = (level > 0) & np.isfinite(model.specific.var) & np.isfinite(returns)
    index = model.exposures.index
    diag_ok = np.isfinite(np.diagonal(model.factor_cov.cov, axis1=1, axis2=2)).T
    for j in range(3):
        idx = index[:, j]
        has = idx >= 0
        avail[has] &= ~(level[has] > j) | diag_ok[idx[has]]
    return avail


def _factor_vol(f: np.ndarray) -> np.ndarray:
    """(K, S) the 23-session volatility of each factor up to the session before each column
    of f[:, TAIL:] (ddof 1, at least FACTOR_VOL_MIN_OBS returns). Each window is summed in
    session order, so a column's value does not depend on the others."""
    k, total = f.shape
    width = total - TAIL
    ok = np.isfinite(f)
    v = np.where(ok, f, 0.0)
    cnt = np.zeros((k, width))
    s1 = np.zeros((k, width))
    for a in range(TAIL):
        cnt += ok[:, a : a + width]
        s1 += v[:, a : a + width]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s1 / cnt
        ss = np.zeros((k, width))
        for a in range(TAIL):
            d = np.where(ok[:, a : a + width], v[:, a : a + width] - mean, 0.0)
            ss += d * d
        out = np.sqrt(ss / (cnt - 1.0))
    return np.where(cnt >= FACTOR_VOL_MIN_OBS, out, np.nan)


def accuracy_step(
    state: AccuracyState,
    model: RiskModel,
    returns: np.ndarray,
    factor_returns: np.ndarray,
    vol_before: np.ndarray,
    previous: RiskModel | None = None,
) -> AccuracyState:
    """The state after the sessions of `model` (its forecast sessions, which must start at
    `state.session`): `returns` (n x S) and `factor_returns` (K_etf x S) of those sessions,
    `vol_before` (n x S) each stock's daily 23-session volatility of the session before;
    `previous`: the previous model over the same sessions (`previous_params`; None: its
    forecasts are missing and its figures null)."""
    s_count = returns.shape[1]
    n, ports = state.n, state.portfolios
    members, weights = ports.members()
    avail = _available(model, returns)
    level = model.exposures.level.astype(np.int64)
    values = np.ascontiguousarray(model.exposures.values, dtype=np.float64)
    index = model.exposures.index.astype(np.int64)
    f_ext = np.concatenate([state.tail["f"], factor_returns], axis=1)
    fbase = _factor_vol(f_ext)
    cov = model.factor_cov.cov
    style = model.exposures.style
    if style is None:
        style = np.zeros((0, n, s_count))
    p = len(ports.family)
    real1, model1, base1 = (np.full((p, s_count), np.nan) for _ in range(3))
    # The previous model is measured on the same positions: on the served model's first-layer
    # exposures when they are its own (the same hedges: one pass over the members for both).
    prev1 = np.full((p, s_count), np.nan)
    shared = previous is not None and _same_exposures(previous, model)
    portfolio_days(members, weights, ports.hedged, avail, index, level, values, cov,
                   model.specific.var, np.nan_to_num(returns), np.nan_to_num(factor_returns),
                   vol_before, fbase, style, real1, model1, base1,
                   (previous.factor_cov.cov, previous.specific.var, prev1)
                   if shared and previous is not None else None, ports.twins())  # fmt: skip
    if previous is None:
        before = np.full((n + p, s_count), np.nan)
    elif shared:
        before = np.vstack([previous.predicted["risk_total_vol"], prev1])
    else:
        before = _previous_forecast(previous, ports, avail, returns, factor_returns,
                                    vol_before, fbase)  # fmt: skip
    forecast = {
        "model": np.vstack([model.predicted["risk_total_vol"], model1]),
        "baseline": np.vstack([vol_before, base1]),
        "previous": before,
    }
    realised = np.vstack([np.where(np.isfinite(returns), returns, np.nan), real1])
    t0 = state.session
    skip = min(max(state.first - t0, 0), s_count)  # sessions before the first evaluated one
    for kind in KINDS:
        _add(state, 1, kind, realised[:, skip:], forecast[kind][:, skip:])
    ext = {
        "avail": np.concatenate([state.tail["avail"], avail], axis=1),
        "level": np.concatenate([state.tail["level"], level], axis=1),
        "values": np.concatenate([state.tail["values"], values], axis=2),
        "r": np.concatenate([state.tail["r"], returns], axis=1),
        "f": f_ext,
        **{k: np.concatenate([state.tail[k], forecast[k]], axis=1) for k in KINDS},
    }
    h = HORIZONS[-1]
    # Starts s whose horizon ends in these sessions: s + h - 1 in [t0, t0 + S), those before
    # the first evaluated session left out; e: their columns in `ext`.
    lo = max(t0 - h + 1, state.first, 0)
    hi = t0 + s_count - h + 1
    if hi > lo:
        e0, width = lo - (t0 - TAIL), hi - lo
        r_sum = np.zeros((n, width))
        f_sum = np.zeros((f_ext.shape[0], width))
        r_ext, f_ext0 = np.nan_to_num(ext["r"]), np.nan_to_num(ext["f"])
        for a in range(h):  # each start's sum in the order of its sessions
            r_sum += r_ext[:, e0 + a : e0 + a + width]
            f_sum += f_ext0[:, e0 + a : e0 + a + width]
        held = np.full((p, width), np.nan)
        cols = slice(e0, e0 + width)
        held_returns(members, weights, ports.hedged, ext["avail"][:, cols], index,
                     ext["level"][:, cols], ext["values"][:, :, cols], r_sum, f_sum, held,
                     ports.twins())  # fmt: skip
        stock = np.where(np.isfinite(ext["r"][:, cols]), r_sum, np.nan)
        real = np.vstack([stock, held])
        scale = np.sqrt(h)
        for kind in KINDS:
            _add(state, h, kind, real, ext[kind][:, cols] * scale)
    state.tail = {k: np.ascontiguousarray(v[..., -TAIL:]) for k, v in ext.items()}
    state.session = t0 + s_count
    return state


def previous_params(params: RiskParams) -> RiskParams:
    """The previous model of a served one: the same exposures (the ETF layer's hedge ratios at
    its level) and the same estimators of F and D (half-lives, prior, floor, Newey-West), on
    the ETF factors only (no second layer: D from the residuals after the ETF hedge), with
    correlations of the raw returns and no volatility regime adjustment: the model served
    before issue 34."""
    covariance = replace(params.covariance, corr_standardised=False)
    return RiskParams(level=params.level, covariance=covariance, specific=params.specific)


def _same_exposures(a: RiskModel, b: RiskModel) -> bool:
    """Whether the two models hold the same first-layer exposures, bit for bit."""
    x, y = a.exposures, b.exposures
    return bool(
        np.array_equal(x.index, y.index)
        and np.array_equal(x.level, y.level)
        and x.values.shape == y.values.shape
        and np.array_equal(x.values.view(np.uint64), y.values.view(np.uint64))
    )


def _previous_forecast(
    previous: RiskModel,
    ports: Portfolios,
    avail: np.ndarray,
    returns: np.ndarray,
    factor_returns: np.ndarray,
    vol_before: np.ndarray,
    fbase: np.ndarray,
) -> np.ndarray:
    """(n + P, S) the previous model's forecasts of the stocks and of the books, the books'
    members those the served model counts (`avail`: the same outcomes), on its own exposures."""
    n, s_count = returns.shape
    p = len(ports.family)
    members, weights = ports.members()
    ex = previous.exposures
    real, fc, base = (np.full((p, s_count), np.nan) for _ in range(3))
    portfolio_days(members, weights, ports.hedged, avail, ex.index.astype(np.int64),
                   ex.level.astype(np.int64),
                   np.ascontiguousarray(ex.values, dtype=np.float64), previous.factor_cov.cov,
                   previous.specific.var, np.nan_to_num(returns), np.nan_to_num(factor_returns),
                   vol_before, fbase, np.zeros((0, n, s_count)), real, fc, base)  # fmt: skip
    out: np.ndarray = np.vstack([previous.predicted["risk_total_vol"], fc])
    return out


def record_of(
    model: RiskModel,
    returns: np.ndarray,
    factor_returns: np.ndarray,
    vol_before: np.ndarray,
    stocks: np.ndarray,
    sectors: np.ndarray,
    *,
    burn_in: int = YEAR,
    previous: RiskModel | None = None,
) -> AccuracyState:
    """The record of every forecast of `model` after its first `burn_in` sessions, in one
    step (a build's chunked steps give the same bits): `returns` (n x T), `factor_returns`
    (K_etf x T) and `vol_before` (n x T, each stock's daily 23-session volatility of the
    session before) of the sessions of the data, the model's forecasts from `model.start`;
    `stocks`, `sectors` as `new_state`; `previous`: the previous model over the same sessions
    (`previous_params`), measured beside it. What the build stores, `eqrisk evaluate` reports
    and `bench.accuracy` measures: one measure."""
    s = model.start
    state = new_state(stocks, sectors, factor_returns.shape[0], first=burn_in)
    return accuracy_step(state, model, np.ascontiguousarray(returns[:, s:]),
                         np.ascontiguousarray(factor_returns[:, s:]), vol_before[:, s:],
                         previous)  # fmt: skip


def _add(state: AccuracyState, h: int, kind: str, real: np.ndarray, fc: np.ndarray) -> None:
    # real / fc, each quotient written a session a row (what `accumulate` reads), no transposed
    # copy; `accumulate` skips a quotient that is not finite (the record's "none").
    z = np.empty((real.shape[1], real.shape[0]))
    with np.errstate(invalid="ignore", divide="ignore"):
        np.divide(real.T, fc.T, out=z)
    state.sums[f"{h}d/{kind}"].add_sessions(z, state.family)


def _median(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return round(float(np.median(x)), 4) if len(x) else None


def _round(x: float) -> float | None:
    return round(float(x), 4) if np.isfinite(x) else None


def figures_of(state: AccuracyState) -> dict[str, dict[str, Any]]:
    """Per horizon and family the record's figures (`accuracy._figures`' keys): members
    and observations (rows with a whole-period b, at least a year of outcomes), the band,
    model and baseline b, MAD 12m and worst 12m, `previous_model` (the same three of the
    previous model, `previous_params`, on the same rows; null where it was not measured beside
    it) and the MAD floor a right
    forecast would show with these tails (from each row's daily kurtosis, below)."""
    out: dict[str, dict[str, Any]] = {}
    daily = state.sums[f"{HORIZONS[0]}d/model"]
    for h in HORIZONS:
        figures: dict[str, Any] = {}
        for f, name in enumerate(ROW_FAMILIES):
            rows = np.flatnonzero(state.family == f)
            if not len(rows):
                continue
            entry: dict[str, Any] = {}
            kept = np.ones(len(rows), dtype=bool)
            for kind in KINDS:
                run = state.sums[f"{h}d/{kind}"]
                if kind == "previous" and not (run.count[rows] > 0).any():
                    entry["previous_model"] = None  # not measured beside it
                    continue
                whole = _std(run.count[rows], run.s1[rows], run.s2[rows], YEAR)
                if kind == "model":
                    kept = np.isfinite(whole)
                    entry["members"] = int(kept.sum())
                    obs = run.count[rows[kept]]
                    entry["observations"] = int(np.median(obs)) if len(obs) else 0
                with np.errstate(invalid="ignore", divide="ignore"):
                    mad = run.mad_sum[rows[kept]] / run.mad_count[rows[kept]]
                entry["previous_model" if kind == "previous" else kind] = {
                    "bias": _median(whole[kept]),
                    "mad_12m": _median(mad),
                    "worst_12m": _round(run.worst[f]),
                }
            half = float(np.sqrt(2.0 / max(entry["observations"] / h, 1.0)))
            entry["band"] = [round(1.0 - half, 4), round(1.0 + half, 4)]
            entry["mad_12m_floor"] = _median(_floor(daily, rows[kept], h))
            figures[name] = entry
        out[f"{h}d"] = figures
    return out


def _floor(daily: Running, rows: np.ndarray, h: int) -> np.ndarray:
    """The MAD from 1 of b over 12-month windows that a forecast right on every session would
    still show: b of T = 252 / h independent outcomes has a standard deviation of about
    sqrt((kappa - 1) / (4 T)), kappa the outcomes' kurtosis (that of an h-day sum of daily z of
    kurtosis k1: 3 + (k1 - 3) / h), and a normal deviation's mean absolute value is
    sqrt(2 / pi) of its standard deviation."""
    c = daily.count[rows]
    with np.errstate(invalid="ignore", divide="ignore"):
        m2 = daily.s2[rows] / c
        k1 = (daily.s4[rows] / c) / (m2 * m2)
    kappa = 3.0 + (k1 - 3.0) / h
    floor: np.ndarray = np.sqrt(2.0 / np.pi) * np.sqrt(
        np.maximum(kappa - 1.0, 0.0) / (4.0 * YEAR / h)
    )
    return floor
