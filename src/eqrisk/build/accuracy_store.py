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


def chunk_step(
    state: AccuracyState,
    model: RiskModel,
    fields: Mapping[str, Any],
    factors: np.ndarray,
    lo: int,
    hi: int,
    previous: RiskModel | None = None,
    *,
    read: Callable[[str, int, int], np.ndarray],
) -> AccuracyState:
    """Add sessions [lo, hi) of the version's `fields` (`factors`: the ETF layer's returns of
    those sessions) to the state, `model` being their risk model and `previous` the previous
    model's. `read(name, lo, hi)`: the returns of sessions [lo, hi) already read (float64)."""
    returns = read("return", lo, hi)
    vol = np.asarray(fields["vol_23d"][:, max(lo - 1, 0) : hi - 1], dtype=np.float64) / DAILY
    if lo == 0:
        vol = np.hstack([np.full((vol.shape[0], 1), np.nan), vol])
    return accuracy_step(state, model, returns, np.ascontiguousarray(factors), vol, previous)


def figures(state: AccuracyState) -> dict[str, Any]:
    """The record's figures and the sessions they cover (first evaluated .. last added)."""
    return {"first": state.first, "last": state.session - 1, "horizons": figures_of(state)}
