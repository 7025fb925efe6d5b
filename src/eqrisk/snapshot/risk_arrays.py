"""The risk model's stored arrays of a version, read: F per session, each stock's D and
predicted volatilities (`RiskArray`, sliced like the snapshot's arrays), the rows every
session shares (`RiskRows`) and one session's model as a portfolio's risk needs it
(`model_day`). The build writes them (`eqrisk.build.risk_run`); the layout:

under `<version>/risk/`, per time chunk c of the version's chunk grid, `cov-<c>.npy`
(sessions, K, K), `<field>-<c>.npy` (n, sessions) for each of `RISK_FIELDS`, `fidx.npy`
(n, 3); the second layer's files and the next session's (`risk_layer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from eqrisk.model.risk_model import STYLE_LEVEL, RiskModelDay, factor_levels, hedge_exposures
from eqrisk.model.run import LEVEL_HR
from eqrisk.snapshot import chunks
from eqrisk.snapshot.risk_layer import NEXT_FIELDS, is_next, read_next, read_style

RISK_DIR = "risk"
# Stored per stock and session: array name -> file prefix.
RISK_FIELDS: dict[str, str] = {
    "risk_total_vol": "total",
    "risk_factor_vol": "factor",
    "risk_specific_vol": "specific",
    "risk_specific_var": "d",
}
HEDGE_FIELDS = tuple(dict.fromkeys(name for lev in (1, 2, 3) for name in LEVEL_HR[lev]))


def risk_rel(name: str, c: int, ext: str = "npy") -> Path:
    """The file of chunk c of a risk array (`name` its prefix), relative to the version."""
    return Path(RISK_DIR) / f"{name}-{c:05d}.{ext}"


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
            self._maps[c] = np.load(self.folder / risk_rel(self.prefix, c), mmap_mode="r")
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
        cov = np.array(np.load(folder / risk_rel("cov", c), mmap_mode="r")[k])
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
