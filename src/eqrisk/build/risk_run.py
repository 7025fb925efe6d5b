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
from pathlib import Path
from typing import Any

import numpy as np

from eqrisk.build.accuracy_store import (
    ACCURACY_LAYOUT,
    RecordThread,
    accuracy_rel,
    load_state,
    start_state,
    step_inputs,
)
from eqrisk.build.accuracy_store import figures as accuracy_figures
from eqrisk.build.risk_evaluation import stored_record
from eqrisk.model.accuracy_state import previous_params
from eqrisk.model.covariance import CovarianceState
from eqrisk.model.plan_slices import PlanOutline
from eqrisk.model.regime import RegimeState
from eqrisk.model.risk_model import (
    LEVEL_NAMES,
    RiskModel,
    RiskParams,
    RiskState,
    factor_levels,
    risk_model,
)
from eqrisk.model.run import ModelPlan, ModelResult
from eqrisk.model.specific import SpecificState
from eqrisk.snapshot import chunks
from eqrisk.snapshot.integrity import save_array
from eqrisk.snapshot.risk_arrays import HEDGE_FIELDS, RISK_DIR, RISK_FIELDS
from eqrisk.snapshot.risk_arrays import risk_rel as _rel
from eqrisk.snapshot.risk_layer import (
    layer_block,
    layer_prefixes,
    next_day_parts,
    save_layer,
    stocks_of,
    style_inputs_of,
)
from eqrisk.snapshot.tables import MoreFiles, Reuse

RISK_LAYOUT = "risk-3"  # risk-3: both layers (style block shrunk by its signal share), the regime state, the next session
# (the settings, correlations of standardised returns among them, are part of the identity too)
SERVED = RiskParams.served()
"""The served model: both layers, the regime adjustment, correlations of standardised returns
(docs/decisions/risk-forecast.md)."""


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
        folder,
        rel,
        previous,
        chunks.chunk_equals(values),
        lambda target: save_array(target, values),
    )


def _save_state(folder: Path, rel: Path, state: RiskState, previous: Path | None) -> None:
    parts = _state_parts(state)
    chunks.share_or_write(
        folder, rel, previous, _same_state(parts), lambda target: state_to_npz(target, state)
    )


def state_from_npz(path: Path) -> RiskState:
    with np.load(path) as z:
        return _state_of({k: z[k] for k in z.files})


def _state_of(parts: Mapping[str, np.ndarray]) -> RiskState:
    cov = {k[4:]: v for k, v in parts.items() if k.startswith("cov_")}
    spec = {k[5:]: v for k, v in parts.items() if k.startswith("spec_")}
    reg = {k[4:]: v for k, v in parts.items() if k.startswith("reg_")}
    return RiskState(
        CovarianceState.from_arrays(cov),
        SpecificState.from_arrays(spec),
        RegimeState.from_arrays(reg) if reg else None,
    )


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
    if cap is not None and _any_cap(cap):
        return inputs
    return replace(inputs, params=replace(inputs.params, styles=None))


def _any_cap(cap: Any) -> bool:
    """Whether some session of some row has a positive market cap: one time chunk at a time
    from the last (where a data set with caps has them), never the whole (n x T) field (an
    update's is the previous version's history, read chunk by chunk)."""
    n_t = int(cap.shape[1])
    step = chunks.CHUNK_SESSIONS
    for hi in range(n_t, 0, -step):
        values = np.asarray(cap[:, max(hi - step, 0) : hi], dtype=np.float64)
        if bool((np.isfinite(values) & (values > 0)).any()):
            return True
    return False


class _Columns:
    """The fields' sessions [lo, hi) as float64, each read once and shared by the runs of a
    time chunk (the served model's, the previous model's, the accuracy record's): the runs
    read the same columns, or the last ones of them."""

    def __init__(self, fields: Mapping[str, Any], lo: int, hi: int) -> None:
        self.fields, self.lo, self.hi = fields, lo, hi
        self._read: dict[str, np.ndarray] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.fields

    def __call__(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Sessions [lo, hi) of the field `name` (a copy unless they are all that was read)."""
        return np.ascontiguousarray(self.view(name, lo, hi))

    def view(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Sessions [lo, hi) of the field `name`, a slice of the columns held (no copy) where
        they are inside them."""
        if lo < self.lo or hi > self.hi:
            return _columns(self.fields[name], lo, hi)
        read = self._read.get(name)
        if read is None:
            read = self._read[name] = _columns(self.fields[name], self.lo, self.hi)
        return read[:, lo - self.lo : hi - self.lo]

    def advance(self, lo: int, hi: int) -> None:
        """Move on to sessions [lo, hi) (the next time chunk's runs, lo >= self.lo): the
        columns held already are kept, only the new ones read (every field once in a build,
        none of its chunk files left mapped for the next chunk's runs)."""
        if not self.lo <= lo <= self.hi <= hi:
            self._read = {}
        for name, held in self._read.items():  # one field at a time: one extra copy at most
            new = _columns(self.fields[name], self.hi, hi)
            self._read[name] = np.concatenate([held[:, lo - self.lo :], new], axis=1)
        self.lo, self.hi = lo, hi


def _run(
    read: _Columns,
    inputs: RiskInputs,
    symbols: np.ndarray,
    stocks: np.ndarray,
    first: int,
    hi: int,
    state: RiskState | None,
    pad: int = 0,
    hedge: _Columns | None = None,
) -> RiskModel:
    """The model over sessions [first, hi) (+ `pad` sessions of no data: the next session's
    forecast), resumed from `state` (the whole calendar's sessions). `read`: the fields'
    columns, shared with the chunk's other runs; `hedge`: the hedge ratios' (which the model
    reads from the session before its first forecast one only)."""
    ratios = hedge if hedge is not None else read
    start = 0 if state is None else state.session - first
    h_first = first + max(start, 1) - 1  # `hedge_exposures` reads from start - 1 on

    def cols(name: str, lo: int = first) -> np.ndarray:
        source = ratios if name in HEDGE_FIELDS else read
        if not pad:
            return source(name, lo, hi)
        held = source.view(name, lo, hi)  # copied once, beside the padding
        out = np.empty((len(held), held.shape[1] + pad))
        out[:, : held.shape[1]] = held
        out[:, held.shape[1] :] = np.nan
        return out

    factors = np.asarray(inputs.factors, dtype=np.float64)[
        :, first - inputs.first : hi - inputs.first
    ]
    if pad:
        factors = np.hstack([factors, np.full((len(factors), pad), np.nan)])
    params = inputs.params
    style = None
    if params.styles is not None:
        names = ("market_cap", "volume", "close_raw")
        style = style_inputs_of({k: cols(k) for k in names if k in read}, stocks)
    return risk_model(
        cols("return"),
        factors,
        inputs.fidx,
        inputs.keys,
        symbols,
        {name: cols(name, h_first) for name in HEDGE_FIELDS},
        params,
        state=None if state is None else state.moved(-first),
        style_inputs=style,
    )


def _chunk(
    c: int,
    grid: chunks.ChunkGrid,
    folder: Path,
    previous: Path | None,
    fields: Mapping[str, Any],
    columns: tuple[_Columns, _Columns],
    inputs: RiskInputs,
    prev_inputs: RiskInputs,
    symbols: np.ndarray,
    stocks: np.ndarray,
    state: RiskState | None,
    prev_state: RiskState | None,
    record: RecordThread,
) -> tuple[RiskState, RiskState]:
    """Time chunk c of `write_risk`: the served model's run and files, the previous model's
    run, the accuracy record's step queued on its thread; the two models' states after it."""
    read, hedge = columns
    lo, hi = grid.cols(c)
    # The run of chunk c reads sessions lo - history .. hi - 1 only (the hedge of the session
    # before; with the second layer, the descriptors' windows): the model runs on those
    # columns, its state moved to their origin and back, so memory holds a chunk and its
    # history of the fields, never the (n x T) history.
    first = max(lo - inputs.history(), 0)
    p_first = max(lo - prev_inputs.history(), 0)  # the previous model's run
    read.advance(min(first, p_first), hi)
    hedge.advance(max(lo - 1, 0), hi)
    model = _run(read, inputs, symbols, stocks, first, hi, state, hedge=hedge)
    _save(folder, _rel("cov", c), model.factor_cov.cov, previous)
    predicted = dict(model.predicted)
    predicted["risk_specific_var"] = model.specific.var
    for name, prefix in RISK_FIELDS.items():
        _save(folder, _rel(prefix, c), predicted[name], previous)
    for prefix, values in save_layer(model).items():
        _save(folder, _rel(prefix, c), values, previous)
    prev = _run(read, prev_inputs, symbols, stocks, p_first, hi, prev_state, hedge=hedge)
    prev_after = prev.state.moved(p_first)
    etf = np.asarray(inputs.factors[:, lo - inputs.first : hi - inputs.first], np.float64)
    step = step_inputs(fields, lo, hi, read=read)
    record.add(c, model, step, etf, prev, _state_parts(prev_after))
    # Unmapped: every chunk file read (the next chunk's runs read their new sessions only, the
    # others are held in `read`): mapped pages of the grouped files would hold every field of
    # the sessions read, not the few the model reads.
    chunks.close_files(fields)
    # The state after the chunk (the next chunk's start; after the last one, where the next
    # build's first new chunk starts when this version ends on a chunk boundary).
    after = model.state.moved(first)
    _save_state(folder, _rel("state", c + 1, "npz"), after, previous)
    return after, prev_after


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
    # The previous model (the ETF layer alone, no regime adjustment), run beside the served one
    # for the accuracy record only; its state travels in the record's files.
    prev_inputs = replace(inputs, params=previous_params(params))
    prev_state: RiskState | None = None
    history = inputs.history()
    layer = layer_prefixes(params)
    read = _Columns(fields, 0, 0)  # the fields' columns the runs of a chunk read
    hedge = _Columns(fields, 0, 0)  # the hedge ratios' (from the session before the chunk's)
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
        tracked, parts = load_state(folder / accuracy_rel(c0))
        prev_state = _state_of(parts)
    else:
        tracked = start_state(inputs.fidx, stocks, inputs.keys)
    if max(grid.cols(c0)[0] - history, 0) < inputs.first:
        raise ValueError(f"the factors begin at session {inputs.first}, after chunk {c0}'s run")
    with RecordThread(folder, tracked, previous) as record:
        for c in range(c0, grid.chunks):
            state, prev_state = _chunk(
                c, grid, folder, previous, fields, (read, hedge), inputs, prev_inputs,
                symbols, stocks, state, prev_state, record,
            )  # fmt: skip
        tracked = record.finish()
    if grid.t > 0 and state is not None:
        # The forecast for the session after the last close (F, D, exposures of t = T).
        first = max(grid.t - history, 0)
        ahead = _run(read, inputs, symbols, stocks, first, grid.t, state, pad=1, hedge=hedge)
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


def risk_files(
    result: ModelResult, inputs: RiskInputs, reuse: Reuse | None, sessions: np.ndarray
) -> MoreFiles:
    """The risk model's writer a version takes (`tables.SnapshotContent.more`): `write_risk`
    on the arrays as written (resumed at `reuse.chunks` from the previous version), and the
    accuracy record of its running state; the manifest's `risk` and `risk_accuracy`."""

    def write(folder: Path, fields: Mapping[str, Any], grid: chunks.ChunkGrid) -> dict[str, Any]:
        risk = write_risk(
            folder,
            result,
            fields,
            inputs,
            grid,
            previous=reuse.previous if reuse is not None else None,
            previous_manifest=reuse.manifest if reuse is not None else None,
            reuse=reuse.chunks if reuse is not None else 0,
            sessions=sessions,
        )
        running = risk.pop("accuracy_record", None)
        more: dict[str, Any] = {"risk": risk}
        if running is not None:
            more["risk_accuracy"] = stored_record(running, sessions, inputs.params)
        return more

    return write
