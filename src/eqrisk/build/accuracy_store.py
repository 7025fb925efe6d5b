"""The accuracy record's running state in a version (`model.accuracy_state`): one file per
time chunk, beside the risk model's state (`risk_run`), `risk/accuracy-<c>.npz` = the state
before chunk c's first session. A build links the files of the chunks it keeps and resumes from
the state at its first new chunk, so every build stores the record and a daily build adds its
sessions' outcomes only. The manifest's `risk_accuracy` is the record of the last state.
Each file also holds the previous model's resumable state at the same session (`prev_*`: the
ETF layer alone, `accuracy_state.previous_params`), which the record measures beside the
served model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from eqrisk.model.accuracy_state import AccuracyState, accuracy_step, figures_of, new_state
from eqrisk.model.risk_model import RiskModel
from eqrisk.snapshot import chunks

ACCURACY_LAYOUT = "accuracy-2"  # the state's form; a version of another form is not resumed
# accuracy-2: the previous model measured beside the served one, its state in the same file
DAILY = np.sqrt(252.0)  # vol_23d is annualised


def accuracy_rel(c: int) -> Path:
    return Path("risk") / f"accuracy-{c:05d}.npz"


def start_state(fidx: np.ndarray, stocks: np.ndarray | None, keys: list[str]) -> AccuracyState:
    """The state before the first session: the stocks with a sector, their sectors."""
    sectors = np.asarray(fidx[:, 1], dtype=np.int64)
    if stocks is None:  # no master at hand: every row with a sector that is not a factor
        stocks = np.ones(len(sectors), dtype=bool)
    is_stock = np.asarray(stocks, dtype=bool) & (sectors >= 0)
    return new_state(is_stock, np.where(is_stock, sectors, -1), len(keys))


PREVIOUS = "prev_"  # the previous model's state arrays in the file


def load_state(path: Path) -> tuple[AccuracyState, dict[str, np.ndarray]]:
    """The record's state and the previous model's state arrays (without their prefix; empty
    before the first session)."""
    with np.load(path, allow_pickle=False) as z:
        own = {k: z[k] for k in z.files if not k.startswith(PREVIOUS)}
        model = {k[len(PREVIOUS) :]: z[k] for k in z.files if k.startswith(PREVIOUS)}
    return AccuracyState.from_arrays(own), model


def save_state(
    folder: Path,
    c: int,
    state: AccuracyState,
    previous: Path | None,
    model_state: Mapping[str, np.ndarray] | None = None,
) -> None:
    """The state before chunk c and the previous model's state arrays there, linked from
    `previous` when they hold the same bits."""
    parts = state.to_arrays()
    parts.update({f"{PREVIOUS}{k}": v for k, v in (model_state or {}).items()})

    def same(old: Path) -> bool:
        try:
            with np.load(old, allow_pickle=False) as z:
                return set(z.files) == set(parts) and all(
                    chunks.same_bits(np.asarray(z[k]), np.asarray(v)) for k, v in parts.items()
                )
        except (ValueError, OSError):
            return False

    def write(target: Path) -> None:
        with target.open("wb") as fh:
            np.savez(fh, **parts)  # type: ignore[arg-type]

    chunks.share_or_write(folder, accuracy_rel(c), previous, same, write)


def step_inputs(
    fields: Mapping[str, Any],
    lo: int,
    hi: int,
    *,
    read: Callable[[str, int, int], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """What `chunk_step` reads of the version for sessions [lo, hi), as arrays of its own (no
    view of a mapped chunk file, which the build closes after each chunk): the returns (from
    `read(name, lo, hi)`, the columns already read) and each stock's daily 23-session
    volatility of the session before."""
    returns = read("return", lo, hi)
    vol = np.array(fields["vol_23d"][:, max(lo - 1, 0) : hi - 1], dtype=np.float64) / DAILY
    if lo == 0:
        vol = np.hstack([np.full((vol.shape[0], 1), np.nan), vol])
    return returns, vol


def chunk_step(
    state: AccuracyState,
    model: RiskModel,
    inputs: tuple[np.ndarray, np.ndarray],
    factors: np.ndarray,
    previous: RiskModel | None = None,
) -> AccuracyState:
    """Add the sessions of `inputs` (`step_inputs`) to the state, `model` being their risk
    model, `factors` the ETF layer's returns of those sessions and `previous` the previous
    model's."""
    returns, vol = inputs
    return accuracy_step(state, model, returns, np.ascontiguousarray(factors), vol, previous)


class RecordThread:
    """The record's steps (`chunk_step`, then `save_state`) on a thread of their own, in chunk
    order, while the build runs the next chunk's model: a step needs the served and previous
    models of its chunk and the state the step before left, nothing the next chunk's run
    makes, so the two overlap (the record's kernels release the GIL). At most one step waits
    behind the running one: memory holds the models of two chunks beyond the build's own.
    A step's error is raised by the next `add` or by `finish`; the steps queued after it do
    not run (they would start from the state before the failed one)."""

    def __init__(self, folder: Path, state: AccuracyState, previous: Path | None) -> None:
        self.folder, self.state, self.previous = folder, state, previous
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="eqrisk-accuracy")
        self._queued: list[Future[None]] = []
        self._failed = False

    def add(
        self,
        c: int,
        model: RiskModel,
        inputs: tuple[np.ndarray, np.ndarray],
        factors: np.ndarray,
        previous_model: RiskModel,
        model_state: Mapping[str, np.ndarray],
    ) -> None:
        """Queue chunk c's step; the state after it is saved as the state before chunk c + 1.
        Both models' forecasts are made here, on the build's thread: their kernels run in
        parallel, and only the build's thread launches parallel kernels (numba's workqueue
        layer aborts on launches from two threads at once)."""
        _ = (model.predicted, previous_model.predicted)
        while len(self._queued) > 1:
            self._queued.pop(0).result()

        def step() -> None:
            if self._failed:
                return
            try:
                self.state = chunk_step(self.state, model, inputs, factors, previous_model)
                save_state(self.folder, c + 1, self.state, self.previous, model_state)
            except BaseException:
                self._failed = True
                raise

        self._queued.append(self._pool.submit(step))

    def finish(self) -> AccuracyState:
        """The state after every step queued (each step's error raised here)."""
        while self._queued:
            self._queued.pop(0).result()
        return self.state

    def __enter__(self) -> RecordThread:
        return self

    def __exit__(self, *exc: object) -> None:
        for queued in self._queued:  # the build failed: the steps not begun are dropped
            queued.cancel()
        self._pool.shutdown(wait=True)


def figures(state: AccuracyState) -> dict[str, Any]:
    """The record's figures and the sessions they cover (first evaluated .. last added)."""
    return {"first": state.first, "last": state.session - 1, "horizons": figures_of(state)}
