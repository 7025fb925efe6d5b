"""The risk model in a snapshot: per session the factor covariance F (K x K, the ETF / group
factors), per stock and session the specific variance D and the predicted total, factor and
specific volatility (daily), written by every build and read by the routes.

Layout, under `<version>/risk/`, per time chunk c of the version's chunk grid (sessions
[c L, (c + 1) L)):

- `cov-<c>.npy` (sessions, K, K): F of each session of the chunk;
- `<field>-<c>.npy` (n, sessions) for each of `RISK_FIELDS`;
- `state-<c>.npz`: the model's resumable state before the chunk's first session (c >= 1);
- `fidx.npy` (n, 3): each row's market, sector and subsector factor (-1 = none);
- `accuracy-<c>.npz`: the accuracy record's running state before chunk c (`accuracy_store`).

The manifest's `risk` block names the factors (keys and levels), the settings and the files.
The build runs the model chunk by chunk, each run resumed from the state the previous one
left (`risk_model(..., state=)`, bit for bit one run over every session), so an incremental
build links the chunks before its first new one and resumes from the stored state there: its
values are a full build's, bit for bit. No look-ahead: F and D of session t use data up to t-1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from eqrisk.model.covariance import CovarianceState
from eqrisk.model.plan_slices import PlanOutline
from eqrisk.model.regime import RegimeParams, RegimeState
from eqrisk.model.risk_model import (
    LEVEL_NAMES,
    STYLE_LEVEL,
    RiskModel,
    RiskModelDay,
    RiskParams,
    RiskState,
    factor_levels,
    hedge_exposures,
    risk_model,
)
from eqrisk.model.run import LEVEL_HR, ModelPlan, ModelResult
from eqrisk.model.specific import SpecificState
from eqrisk.model.styles import StyleParams
from eqrisk.snapshot import chunks
from eqrisk.snapshot.accuracy_store import (
    ACCURACY_LAYOUT,
    accuracy_rel,
    chunk_step,
    load_state,
    save_state,
    start_state,
)
from eqrisk.snapshot.accuracy_store import figures as accuracy_figures
from eqrisk.snapshot.risk_layer import (
    NEXT_FIELDS,
    is_next,
    layer_block,
    layer_prefixes,
    next_day_parts,
    read_next,
    read_style,
    save_layer,
    stocks_of,
    style_inputs_of,
)

RISK_DIR = "risk"
RISK_LAYOUT = "risk-3"  # risk-3: both layers (style block shrunk by its signal share), the regime state, the next session
# Stored per stock and session: array name -> file prefix.
RISK_FIELDS: dict[str, str] = {
    "risk_total_vol": "total",
    "risk_factor_vol": "factor",
    "risk_specific_vol": "specific",
    "risk_specific_var": "d",
}
HEDGE_FIELDS = tuple(dict.fromkeys(name for lev in (1, 2, 3) for name in LEVEL_HR[lev]))
SERVED = RiskParams(styles=StyleParams.calibrated(), regime=RegimeParams.calibrated())
"""The served model: both layers and the regime adjustment (docs/decisions/risk-forecast.md)."""


@dataclass(frozen=True)
class RiskInputs:
    """What the risk model needs beyond the model's arrays: the published factor rows."""

    factors: np.ndarray  # (K, T - first) factor returns of sessions first .. T-1
    keys: list[str]
    fidx: np.ndarray  # (n, 3)
    params: RiskParams
    first: int = 0  # the session of the factors' first column (a tail plan's base)

    @classmethod
    def of(
        cls, plan: ModelPlan | PlanOutline, params: RiskParams | None = None, first: int = 0
    ) -> RiskInputs:
        layout = plan.layout
        return cls(layout.factors, list(layout.keys), layout.fidx, params or SERVED, first)

    def history(self) -> int:
        """Sessions before a chunk's first one that its run reads (the descriptors' windows
        with the second layer; the hedge of the session before without)."""
        styles = self.params.styles
        return 1 if styles is None else styles.history()


def state_to_npz(path: Path, state: RiskState) -> None:
    parts = _state_parts(state)
    with path.open("wb") as fh:
        np.savez(fh, **parts)  # type: ignore[arg-type]


def _state_parts(state: RiskState) -> dict[str, np.ndarray]:
    parts = {f"cov_{k}": v for k, v in state.covariance.to_arrays().items()}
    parts.update({f"spec_{k}": v for k, v in state.specific.to_arrays().items()})
    if state.regime is not None:
        parts.update({f"reg_{k}": v for k, v in state.regime.to_arrays().items()})
    return parts


def _same_state(parts: Mapping[str, np.ndarray]) -> Callable[[Path], bool]:
    def same(old: Path) -> bool:
        try:
            with np.load(old) as z:
                return set(z.files) == set(parts) and all(
                    chunks.same_bits(np.asarray(z[k]), np.asarray(v)) for k, v in parts.items()
                )
        except (ValueError, OSError):
            return False

    return same


def _save(folder: Path, rel: Path, values: np.ndarray, previous: Path | None) -> None:
    """Write `values` as `folder/rel`, or link the previous version's file when it holds the
    same bits (a rebuild's recomputed tail chunk shares its files like the arrays' do)."""
    values = np.ascontiguousarray(values)
    chunks.share_or_write(
        folder, rel, previous, chunks.chunk_equals(values), lambda target: np.save(target, values)
    )


def _save_state(folder: Path, rel: Path, state: RiskState, previous: Path | None) -> None:
    parts = _state_parts(state)
    chunks.share_or_write(
        folder, rel, previous, _same_state(parts), lambda target: state_to_npz(target, state)
    )


def state_from_npz(path: Path) -> RiskState:
    with np.load(path) as z:
        cov = {k[4:]: z[k] for k in z.files if k.startswith("cov_")}
        spec = {k[5:]: z[k] for k in z.files if k.startswith("spec_")}
        reg = {k[4:]: z[k] for k in z.files if k.startswith("reg_")}
    return RiskState(
        CovarianceState.from_arrays(cov),
        SpecificState.from_arrays(spec),
        RegimeState.from_arrays(reg) if reg else None,
    )


def _rel(name: str, c: int, ext: str = "npy") -> Path:
    return Path(RISK_DIR) / f"{name}-{c:05d}.{ext}"


def _columns(arr: Any, lo: int, hi: int) -> np.ndarray:
    """Sessions [lo, hi) of every row of a field, as float64."""
    return np.ascontiguousarray(arr[:, lo:hi], dtype=np.float64)


def _reusable(previous: Mapping[str, Any] | None, inputs: RiskInputs, reuse: int) -> int:
    """How many leading chunks of the previous version's risk files this build may link: the
    same layout, factors and settings (`_identity`), and at least `reuse` chunks."""
    if not previous or reuse <= 0:
        return 0
    old = previous.get("risk")
    if not isinstance(old, dict):
        return 0
    same = all(old.get(k) == v for k, v in _identity(inputs).items())
    return reuse if same and int(old.get("chunks", 0)) >= reuse else 0


def _identity(inputs: RiskInputs) -> dict[str, Any]:
    """What a version's risk files depend on besides the arrays (the manifest's `risk`)."""
    params = inputs.params
    styles = [] if params.styles is None else params.styles.factor_names
    return {
        "layout": RISK_LAYOUT,
        "accuracy": ACCURACY_LAYOUT,
        "keys": [*inputs.keys, *styles],
        "params": {**params.describe(), "level": params.level},
    }


def risk_resumes(previous: Mapping[str, Any], inputs: RiskInputs, reuse: int) -> bool:
    """Whether `write_risk` resumes the previous version's risk model at chunk `reuse` (an
    incremental build's first chunk) rather than rerunning it from the first session: the
    same settings, and the factors read from far enough back for the chunk's run."""
    lo = reuse * chunks.CHUNK_SESSIONS
    enough = max(lo - inputs.history(), 0) >= inputs.first
    # (a data set without caps has no second layer: `_served`, decided on the arrays later)
    bare = replace(inputs, params=replace(inputs.params, styles=None))
    same = reuse in (_reusable(previous, inputs, reuse), _reusable(previous, bare, reuse))
    return enough and same and reuse > 0


def _served(inputs: RiskInputs, fields: Mapping[str, Any]) -> RiskInputs:
    """The inputs as this data set can serve them: a data set without market caps has no
    second layer (its manifest says `styles: null`)."""
    if inputs.params.styles is None:
        return inputs
    cap = fields.get("market_cap")
    if cap is not None:
        values = np.asarray(cap, dtype=np.float64)
        if bool((np.isfinite(values) & (values > 0)).any()):
            return inputs
    return replace(inputs, params=replace(inputs.params, styles=None))


def _run(
    fields: Mapping[str, Any],
    inputs: RiskInputs,
    symbols: np.ndarray,
    stocks: np.ndarray,
    first: int,
    hi: int,
    state: RiskState | None,
    pad: int = 0,
) -> RiskModel:
    """The model over sessions [first, hi) (+ `pad` sessions of no data: the next session's
    forecast), resumed from `state` (the whole calendar's sessions)."""

    def cols(name: str) -> np.ndarray:
        out = _columns(fields[name], first, hi)
        return np.hstack([out, np.full((len(out), pad), np.nan)]) if pad else out

    factors = np.asarray(inputs.factors, dtype=np.float64)[
        :, first - inputs.first : hi - inputs.first
    ]
    if pad:
        factors = np.hstack([factors, np.full((len(factors), pad), np.nan)])
    params = inputs.params
    style = None
    if params.styles is not None:
        names = ("market_cap", "volume", "close_raw")
        style = style_inputs_of({k: cols(k) for k in names if k in fields}, stocks)
    return risk_model(
        cols("return"),
        factors,
        inputs.fidx,
        inputs.keys,
        symbols,
        {name: cols(name) for name in HEDGE_FIELDS},
        params,
        state=None if state is None else state.moved(-first),
        style_inputs=style,
    )


def write_risk(
    folder: Path,
    result: ModelResult,
    fields: Mapping[str, Any],
    inputs: RiskInputs,
    grid: chunks.ChunkGrid,
    *,
    previous: Path | None = None,
    previous_manifest: Mapping[str, Any] | None = None,
    reuse: int = 0,
    sessions: np.ndarray | None = None,
) -> dict[str, Any]:
    """Compute and write the risk model of every session and of the next one; return the
    manifest's `risk` block. With `reuse` = c0 (an incremental build whose inputs before chunk
    c0 are proved unchanged) the files of chunks < c0 are linked from `previous` and the run
    resumes at chunk c0. `fields`: the version's arrays as written (a Dask build's live in the
    version folder by now, no longer where `result`'s were opened); `sessions`: the calendar
    (the next session's date)."""
    inputs = _served(inputs, fields)
    params = inputs.params
    identity = _identity(inputs)
    symbols = np.asarray(result.symbols)
    k_etf = len(inputs.keys)
    block: dict[str, Any] = {
        "layout": identity["layout"],
        "accuracy": identity["accuracy"],
        "keys": identity["keys"],
        "levels": [
            LEVEL_NAMES[lv - 1] if lv > 0 else None
            for lv in factor_levels(inputs.fidx, k_etf).tolist()
        ]
        + ["style"] * (len(identity["keys"]) - k_etf),
        "params": identity["params"],
        "fields": list(RISK_FIELDS),
        "chunks": grid.chunks,
        **layer_block(params, k_etf),
    }
    c0 = _reusable(previous_manifest, inputs, reuse) if previous is not None else 0
    (folder / RISK_DIR).mkdir(parents=True, exist_ok=True)
    _save(folder, Path(RISK_DIR) / "fidx.npy", np.asarray(inputs.fidx, dtype=np.int64), previous)
    stocks = stocks_of(folder, grid.n, inputs.fidx, inputs.keys)
    state: RiskState | None = None
    history = inputs.history()
    layer = layer_prefixes(params)
    if c0 > 0:
        assert previous is not None
        for c in range(c0):
            for prefix in ("cov", *RISK_FIELDS.values(), *layer):
                chunks.link_unread(folder, _rel(prefix, c), previous)
            if c >= 1:
                chunks.link_unread(folder, _rel("state", c, "npz"), previous)
                chunks.link_unread(folder, accuracy_rel(c), previous)
        chunks.link_unread(folder, _rel("state", c0, "npz"), previous)
        chunks.link_unread(folder, accuracy_rel(c0), previous)
        state = state_from_npz(folder / _rel("state", c0, "npz"))
        tracked = load_state(folder / accuracy_rel(c0))
    else:
        tracked = start_state(inputs.fidx, stocks, inputs.keys)
    if max(grid.cols(c0)[0] - history, 0) < inputs.first:
        raise ValueError(f"the factors begin at session {inputs.first}, after chunk {c0}'s run")
    for c in range(c0, grid.chunks):
        lo, hi = grid.cols(c)
        # The run of chunk c reads sessions lo - history .. hi - 1 only (the hedge of the
        # session before; with the second layer, the descriptors' windows): the model runs on
        # those columns, its state moved to their origin and back, so memory holds a chunk
        # and its history of the fields, never the (n x T) history.
        first = max(lo - history, 0)
        model = _run(fields, inputs, symbols, stocks, first, hi, state)
        _save(folder, _rel("cov", c), model.factor_cov.cov, previous)
        predicted = dict(model.predicted)
        predicted["risk_specific_var"] = model.specific.var
        for name, prefix in RISK_FIELDS.items():
            _save(folder, _rel(prefix, c), predicted[name], previous)
        for prefix, values in save_layer(model).items():
            _save(folder, _rel(prefix, c), values, previous)
        state = model.state.moved(first)
        etf = np.asarray(inputs.factors[:, lo - inputs.first : hi - inputs.first], np.float64)
        tracked = chunk_step(tracked, model, fields, etf, lo, hi)
        save_state(folder, c + 1, tracked, previous)
        chunks.close_files(fields)
        # The state after the chunk (the next chunk's start; after the last one, where the
        # next build's first new chunk starts when this version ends on a chunk boundary).
        _save_state(folder, _rel("state", c + 1, "npz"), state, previous)
    if grid.t > 0 and state is not None:
        # The forecast for the session after the last close (F, D, exposures of t = T).
        first = max(grid.t - history, 0)
        ahead = _run(fields, inputs, symbols, stocks, first, grid.t, state, pad=1)
        for prefix, values in next_day_parts(ahead, grid.t - first).items():
            _save(folder, Path(RISK_DIR) / f"{prefix}.npy", values, previous)
        chunks.close_files(fields)
        block["next"] = _next_date(sessions)
    block["linked_chunks"] = c0
    block["accuracy_record"] = accuracy_figures(tracked)  # tables: the `risk_accuracy`
    return block


def _next_date(sessions: np.ndarray | None) -> str | None:
    """The exchange session after the last one (its forecast is the `next` one)."""
    if sessions is None or not len(sessions):
        return None
    import pandas as pd

    from eqrisk.data.calendar import sessions_between

    last = pd.Timestamp(np.datetime64(sessions[-1], "D"))
    ahead = sessions_between(last + pd.Timedelta(days=1), last + pd.Timedelta(days=14))
    return str(ahead[0].date()) if len(ahead) else str((last + pd.offsets.BDay(1)).date())


class RiskArray:
    """An (n x T) stored risk field, sliced like the snapshot's arrays (`[row, lo:hi]`,
    `[rows, t]`) over its memory-mapped chunk files."""

    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, folder: Path, prefix: str, grid: chunks.ChunkGrid) -> None:
        self.folder, self.prefix, self.grid = folder, prefix, grid
        self.shape = (grid.n, grid.t)
        self._maps: dict[int, np.ndarray] = {}

    def chunk(self, c: int) -> np.ndarray:
        if c not in self._maps:
            self._maps[c] = np.load(self.folder / _rel(self.prefix, c), mmap_mode="r")
        return self._maps[c]

    def __getitem__(self, key: Any) -> Any:
        rows, cols = key
        size = self.grid.chunk
        if isinstance(cols, (int, np.integer)):
            t = int(cols) % self.shape[1]
            return self.chunk(t // size)[rows, t % size]
        if not isinstance(cols, slice):  # session indexes: gathered chunk by chunk
            idx = np.asarray(cols, dtype=np.int64) % self.shape[1]
            parts = [
                np.asarray(self.chunk(int(c))[rows, idx[idx // size == c] - c * size])
                for c in np.unique(idx // size).tolist()
            ]
            if not parts:
                return np.asarray(self.chunk(0)[rows, 0:0])
            # The parts hold the indexes chunk by chunk, each chunk's in the order asked.
            back = np.argsort(np.argsort(idx // size, kind="stable"), kind="stable")
            return np.concatenate(parts, axis=-1)[..., back]
        lo, hi, step = cols.indices(self.shape[1])
        if step != 1:
            raise IndexError("a risk array takes unit-step slices")
        parts = [
            self.chunk(c)[rows, max(lo, c * size) - c * size : min(hi, (c + 1) * size) - c * size]
            for c in range(lo // size, -(-hi // size))
        ]
        if not parts:
            probe = self.chunk(0)[rows, 0:0]
            return np.asarray(probe)
        return np.concatenate(parts, axis=-1)

    def __len__(self) -> int:
        return int(self.shape[0])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.asarray(self[:, 0 : self.shape[1]], dtype=np.float64)
        return whole if dtype is None else whole.astype(dtype)


def risk_grid(manifest: Mapping[str, Any]) -> chunks.ChunkGrid | None:
    if "risk" not in manifest or "arrays" not in manifest:
        return None
    return chunks.ChunkGrid.of(manifest["arrays"]["grid"])


class MissingArray:
    """A risk field of a version written before the risk model was stored: all NaN, so that
    the routes answer null columns until the next build."""

    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, shape: tuple[int, int]) -> None:
        self.shape = shape

    def __getitem__(self, key: Any) -> Any:
        probe = np.broadcast_to(np.float64(np.nan), self.shape)[key]
        return np.full(np.shape(probe), np.nan) if np.ndim(probe) else np.float64(np.nan)

    def __len__(self) -> int:
        return int(self.shape[0])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.full(self.shape, np.nan, dtype=dtype or np.float64)


def open_risk_arrays(
    folder: Path, manifest: Mapping[str, Any]
) -> dict[str, RiskArray | MissingArray]:
    """The stored risk fields of a version (all-NaN ones for a version written before them)."""
    grid = risk_grid(manifest)
    if grid is None:
        if "arrays" not in manifest:
            return {}
        old = chunks.ChunkGrid.of(manifest["arrays"]["grid"])
        return {name: MissingArray((old.n, old.t)) for name in RISK_FIELDS}
    return {name: RiskArray(folder, prefix, grid) for name, prefix in RISK_FIELDS.items()}


@dataclass(frozen=True)
class FactorCovarianceDay:
    """F of one session: the factors' keys and levels and the K x K matrix (NaN rows and
    columns for a factor with too few returns yet)."""

    session: int
    keys: list[str]
    levels: list[str | None]
    cov: np.ndarray


def factor_covariance_of(folder: Path, manifest: Mapping[str, Any], t: int) -> FactorCovarianceDay:
    grid = risk_grid(manifest)
    if grid is None:
        raise KeyError("this version holds no risk model")
    if is_next(manifest, t):
        cov = read_next(folder, "next-cov")
    else:
        c, k = divmod(t, grid.chunk)
        cov = np.array(np.load(folder / _rel("cov", c), mmap_mode="r")[k])
    block = manifest["risk"]
    return FactorCovarianceDay(t, list(block["keys"]), list(block["levels"]), cov)


@dataclass(frozen=True)
class RiskRows:
    """What every session's risk model of a version shares, read once per version: the
    symbols of the rows, each row's factor slots (`fidx.npy`), the factor a row is itself
    (its own ETF's key, -1 = none) and each factor's level."""

    symbols: np.ndarray  # (n,) object
    fidx: np.ndarray  # (n, 3)
    own: np.ndarray  # (n,)
    factor_level: np.ndarray  # (K,)

    @cached_property
    def row_of(self) -> dict[str, int]:
        return {str(s): i for i, s in enumerate(self.symbols.tolist())}

    @classmethod
    def read(cls, folder: Path, manifest: Mapping[str, Any]) -> RiskRows:
        grid = risk_grid(manifest)
        if grid is None:
            raise KeyError("this version holds no risk model")
        keys = list(manifest["risk"]["keys"])
        k_etf = n_etf(manifest)
        fidx = np.load(folder / RISK_DIR / "fidx.npy")
        symbols = np.asarray(_symbol_names(folder, grid.n), dtype=object)
        where = {k: i for i, k in enumerate(keys[:k_etf])}
        own = np.array([where.get(s, -1) for s in symbols.tolist()], dtype=np.int64)
        level = np.concatenate(
            [factor_levels(fidx, k_etf), np.full(len(keys) - k_etf, STYLE_LEVEL)]
        )
        return cls(symbols, fidx, own, level)


def n_etf(manifest: Mapping[str, Any]) -> int:
    """The first layer's factors: the first rows of F (all of them without a second layer)."""
    block = manifest["risk"]
    styles = block.get("styles")
    return int(styles["first"]) if styles else len(block["keys"])


def model_day(
    folder: Path,
    manifest: Mapping[str, Any],
    arrays: Mapping[str, Any],
    t: int,
    *,
    level: int | None = None,
    rows: RiskRows | None = None,
) -> RiskModelDay:
    """The risk model of session t as a portfolio's risk needs it: F and D as stored, the
    exposures rebuilt from the hedge ratios published on t-1 exactly as the build did
    (`hedge_exposures`; those of `level` where given, the model's otherwise). `arrays`: the
    version's fields (`Snapshot.array`); `rows`: the version's `RiskRows` where already read."""
    f = factor_covariance_of(folder, manifest, t)
    block = manifest["risk"]
    rows = rows or RiskRows.read(folder, manifest)
    n = len(rows.symbols)
    lo = max(t - 1, 0)
    ahead = is_next(manifest, t)
    hedge = {
        name: np.asarray(arrays[name][:, lo : t + (0 if ahead else 1)], dtype=np.float64)
        for name in HEDGE_FIELDS
    }
    if t == 0:  # no previous session: nothing published
        hedge = {name: np.column_stack([np.full(n, np.nan), v]) for name, v in hedge.items()}
    if ahead:  # the session after the last close: its hedge is the last one published
        hedge = {name: np.column_stack([v, np.full(n, np.nan)]) for name, v in hedge.items()}
    exp = hedge_exposures(
        hedge, rows.fidx, rows.own, level or int(block["params"]["level"]), start=1
    )
    lev = exp.level[:, 0]
    index = np.where(lev[:, None] > np.arange(3)[None, :], exp.index, -1)
    d = predicted_of(folder, manifest, arrays, t)["risk_specific_var"]
    return RiskModelDay(
        session=t,
        symbols=rows.symbols,
        factor_keys=f.keys,
        factor_level=rows.factor_level,
        cov=f.cov,
        index=index,
        values=np.where(index >= 0, exp.values[:, :, 0].T, 0.0),
        level=lev,
        specific_var=d,
        style=read_style(folder, manifest, t),
    )


def predicted_of(
    folder: Path, manifest: Mapping[str, Any], arrays: Mapping[str, Any], t: int
) -> dict[str, np.ndarray]:
    """The stored per-stock fields of session t (`RISK_FIELDS`; `arrays`: the version's, or
    those of them asked), the next session's included."""
    if is_next(manifest, t):
        values = read_next(folder, "next-fields")
        every = {name: np.ascontiguousarray(values[:, j]) for j, name in enumerate(NEXT_FIELDS)}
        return {name: every[name] for name in arrays if name in every}
    return {
        name: np.asarray(arrays[name][:, t], dtype=np.float64)
        for name in arrays
        if name in RISK_FIELDS
    }


def _symbol_names(folder: Path, n: int) -> list[str]:
    import pyarrow.parquet as pq

    frame = pq.read_table(folder / "symbols.parquet", columns=["ticker", "row"]).to_pandas()
    names = [""] * n
    for ticker, row in zip(frame["ticker"], frame["row"], strict=True):
        names[int(row)] = str(ticker)
    return names
