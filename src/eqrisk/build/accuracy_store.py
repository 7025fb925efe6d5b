"""The accuracy record's running state in a version (`model.accuracy_state`): one file per
time chunk, beside the risk model's state (`risk_run`), `risk/accuracy-<c>.npz` = the state
before chunk c's first session. A build links the files of the chunks it keeps and resumes from
the state at its first new chunk, so every build stores the record and a daily build adds its
sessions' outcomes only. The manifest's `risk_accuracy` is the record of the last state."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from eqrisk.model.accuracy_state import AccuracyState, accuracy_step, figures_of, new_state
from eqrisk.model.risk_model import RiskModel
from eqrisk.snapshot import chunks

ACCURACY_LAYOUT = "accuracy-1"  # the state's form; a version of another form is not resumed
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


def load_state(path: Path) -> AccuracyState:
    with np.load(path, allow_pickle=False) as z:
        return AccuracyState.from_arrays({k: z[k] for k in z.files})


def save_state(folder: Path, c: int, state: AccuracyState, previous: Path | None) -> None:
    """The state before chunk c, linked from `previous` when it holds the same bits."""
    parts = state.to_arrays()

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
) -> AccuracyState:
    """Add sessions [lo, hi) of the version's `fields` (`factors`: the ETF layer's returns of
    those sessions) to the state, `model` being their risk model."""
    returns = np.ascontiguousarray(fields["return"][:, lo:hi], dtype=np.float64)
    vol = np.asarray(fields["vol_23d"][:, max(lo - 1, 0) : hi - 1], dtype=np.float64) / DAILY
    if lo == 0:
        vol = np.hstack([np.full((vol.shape[0], 1), np.nan), vol])
    return accuracy_step(state, model, returns, np.ascontiguousarray(factors), vol)


def figures(state: AccuracyState) -> dict[str, Any]:
    """The record's figures and the sessions they cover (first evaluated .. last added)."""
    return {"first": state.first, "last": state.session - 1, "horizons": figures_of(state)}
