"""The chunk grid of a version (blocks of S symbols x chunks of L sessions), the codes a
manifest gives each chunk, and what the writer reads from and readers get (the protocols)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

LAYOUT = "chunks-2"  # group files hold only the runs with a number (`runs_path`)
DENSE_GROUPS = "chunks-1"  # the layout before: group files (rows x fields x L), every run
CHUNK_SESSIONS = 128  # L: a one-session update rewrites at most L/T of a version
BLOCK_SYMBOLS = 512  # S: the rows one worker writes as a unit (a first build's)
EMPTY = "."  # manifest code of a chunk that is not stored (all NaN)
GROUPED = "d"  # float64 chunks: stored together, a row's fields contiguous (`group_path`)
GROUP_DIR = "_rows"

CODES: dict[str, np.dtype[Any]] = {
    "B": np.dtype(np.uint8),
    "H": np.dtype(np.uint16),
    "f": np.dtype(np.float32),
    "d": np.dtype(np.float64),
}
CODE_OF = {dtype: code for code, dtype in CODES.items()}
RUNS = "i"  # the dtype code of a group's runs index (`runs_path`)
FILE_DTYPES: dict[str, np.dtype[Any]] = {**CODES, RUNS: np.dtype(np.int32)}


class Sliceable(Protocol):
    """What the writer reads a field from: a dense array, a memory map or a lazy generator."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, key: Any, /) -> Any: ...


class FieldArray(Protocol):
    """What `Snapshot.array` returns: an (n x T) float64 array for indexing and `np.asarray`."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, key: Any, /) -> Any: ...

    def __array__(self, dtype: Any = None, /, *, copy: Any = None) -> np.ndarray: ...


@dataclass(frozen=True)
class ChunkGrid:
    """The fixed grid of one version: n symbols x t sessions in blocks of S and chunks of L."""

    n: int
    t: int
    block: int = BLOCK_SYMBOLS
    chunk: int = CHUNK_SESSIONS

    @property
    def blocks(self) -> int:
        return -(-self.n // self.block)

    @property
    def chunks(self) -> int:
        return -(-self.t // self.chunk)

    def rows(self, b: int) -> tuple[int, int]:
        return b * self.block, min(self.n, (b + 1) * self.block)

    def cols(self, c: int) -> tuple[int, int]:
        return c * self.chunk, min(self.t, (c + 1) * self.chunk)

    def cells(self) -> Iterator[tuple[int, int]]:
        for b in range(self.blocks):
            for c in range(self.chunks):
                yield b, c

    def describe(self) -> dict[str, int]:
        return {"symbols": self.n, "sessions": self.t, "block": self.block, "chunk": self.chunk}

    @classmethod
    def of(cls, grid: Mapping[str, Any]) -> ChunkGrid:
        return cls(
            int(grid["symbols"]), int(grid["sessions"]), int(grid["block"]), int(grid["chunk"])
        )


# Fields a row often lacks (a level the symbol does not have: an ETF's sector, most stocks'
# subsector), last in a group file and in an assembled row, the deepest last: a row without
# them is then one contiguous piece and one NaN fill per chunk.
