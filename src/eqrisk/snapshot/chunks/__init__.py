"""Chunked arrays of a snapshot version: immutable files that consecutive versions share.

Each (n x T) metric is cut along a grid of symbol blocks x time chunks, rows [b*S, (b+1)*S) x
sessions [c*L, (c+1)*L), into files:

    arrays/_rows/<b>.<c>.npy       (runs x L) float64: the chunk of every float64 field, one
                                   run of L sessions per (row, field) that holds a number, a
                                   row's runs side by side (a ticker's history: one piece a chunk)
    arrays/_rows/<b>.<c>.runs.npy  (rows x fields) int32: where each (row, field) run is in the
                                   group file, -1 where it is all NaN (not stored)
    arrays/<field>/<b>.<c>.npy     (rows x L): the chunk of a field stored in a narrower dtype

with fixed boundaries at multiples of S and L, so that a new session changes only the last
time chunk of each block (the last chunk holds only the sessions that exist: it grows), and a
worker that computed one symbol block writes that block's files alone. Why these choices, and
the measurements behind them, are in docs/decisions/snapshots.md.

- A chunk whose values are all NaN is not stored (the manifest says so; it reads back as NaN),
  nor is the run of a row that is all NaN within a group file (its runs index says -1).
- A chunk is stored in the narrowest of uint8, uint16, float32 and float64 that gives back the
  same float64 bits, so counts (n_obs) take a byte and floats stay exact.
- A field that is an exact function of stored ones (an alias, `a - b`, `1 - a`, `1 - a - b`
  skipping NaN terms: IEEE operations that give the same bits on every machine) is not stored when the writer has checked, on the
  whole array, that the function gives its very bits back.
- A chunk equal, byte for byte, to the same chunk of the previous version is a hard link to that
  file, never written again: versions are whole folders that share inodes, so removing one (`rm
  -r`, pruning) frees only what no other version links.

Readers get a `ChunkedArray`, sliced like the dense array it replaces (`a[row, lo:hi]`,
`a[:, -1]`, `a[rows, cols]`), over memory-mapped chunks opened on first use.

The package's modules, along its seams: `grid` (the grid, codes, protocols), `layout` (paths,
group order, dtypes, the files a manifest implies), `derivations`, `writer`, `reader` (the
opened chunks and assembled rows) and `indexing` (how a field is sliced). This module names
them all, as the one module did before.
"""

from eqrisk.snapshot.chunks.derivations import (
    DERIVATIONS,
    derivable,
    derivable_from,
    derive,
)
from eqrisk.snapshot.chunks.grid import (
    BLOCK_SYMBOLS,
    CHUNK_SESSIONS,
    CODE_OF,
    CODES,
    DENSE_GROUPS,
    EMPTY,
    FILE_DTYPES,
    GROUP_DIR,
    GROUPED,
    LAYOUT,
    RUNS,
    ChunkGrid,
    FieldArray,
    Sliceable,
)
from eqrisk.snapshot.chunks.indexing import ChunkedArray, DerivedArray, FieldIndexing, field_span
from eqrisk.snapshot.chunks.layout import (
    SPARSE_LAST,
    chunk_path,
    expected_chunks,
    group_order,
    group_path,
    group_runs,
    narrowest,
    runs_path,
    same_bits,
    shape_fits,
)
from eqrisk.snapshot.chunks.reader import ROW_CACHE_BYTES, ChunkStore, close_files, open_arrays
from eqrisk.snapshot.chunks.writer import (
    WriteStats,
    chunk_equals,
    link_unread,
    share_or_write,
    write_arrays,
    write_block,
)

__all__ = [
    "BLOCK_SYMBOLS",
    "CHUNK_SESSIONS",
    "CODES",
    "CODE_OF",
    "DENSE_GROUPS",
    "DERIVATIONS",
    "EMPTY",
    "FILE_DTYPES",
    "GROUPED",
    "GROUP_DIR",
    "LAYOUT",
    "ROW_CACHE_BYTES",
    "RUNS",
    "SPARSE_LAST",
    "ChunkGrid",
    "ChunkStore",
    "ChunkedArray",
    "DerivedArray",
    "FieldArray",
    "FieldIndexing",
    "Sliceable",
    "WriteStats",
    "chunk_equals",
    "chunk_path",
    "close_files",
    "derivable",
    "derivable_from",
    "derive",
    "expected_chunks",
    "field_span",
    "group_order",
    "group_path",
    "group_runs",
    "link_unread",
    "narrowest",
    "open_arrays",
    "runs_path",
    "same_bits",
    "shape_fits",
    "share_or_write",
    "write_arrays",
    "write_block",
]
