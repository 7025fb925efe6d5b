"""The copy loops of an assembled row (`chunks.ChunkStore.full_row`), compiled by numba.

A ticker's full history is one row of every field over all sessions, assembled from the row's
pieces in each time chunk: its runs in the chunk's group file (one contiguous piece a chunk),
NaN where a field has no run, the fields stored on their own in a narrow dtype, then the derived
fields computed from the assembled ones. The whole row is one call without the GIL.

Per chunk, the row's piece of the group file is first copied into a small scratch (`stage`,
in the CPU's cache), then each field's part is copied from there into its row of `out`.
Copying straight from the file into `out` interleaves loads that come from memory with 1 KB
stores into every field's row, and ran twice as slow (measured, docs/decisions/snapshots.md,
"Reading a row"): the stores wait on the loads and the loads stop running ahead.

Loops copy element by element over slices indexed from 0: numba compiles them to vector moves
(a slice assignment, or an index it cannot prove non-negative, measured 2-3x slower).

The chunk files are passed as addresses of their memory maps (`address`), which the caller
keeps open: a typed list of arrays would cost every process about a second of compiling
numba's list code on its first read, and this kernel is cached on disk like the others.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir  # type: ignore[import-untyped]
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.numpy_support import carray

# Derivation codes of the kernel's table (chunks.DERIVATIONS's operations; "same" is an alias
# of its source's row, never computed).
MINUS, ONE_MINUS, ONE_MINUS_KNOWN = 1, 2, 3
U8, U16, F32 = 0, 1, 2  # the dtype of a field's own chunk (`own` table)
OWN_DTYPES = {np.dtype(np.uint8): U8, np.dtype(np.uint16): U16, np.dtype(np.float32): F32}
OWN_AHEAD = 4  # chunks: how early an own chunk's piece of the row is asked for
UNSET, MISSING = -2, -1  # a field's run in a chunk: none to place (own field), NaN


def address(arr: np.ndarray) -> int:
    """Where a C-contiguous array's data starts (0 for an empty one): the kernel reads it
    there, so the caller must keep `arr` alive while the kernel may run."""
    if not arr.flags.c_contiguous:
        raise ValueError("the row kernel reads C-contiguous chunks only")
    return int(arr.ctypes.data) if arr.size else 0


def _pointer_intrinsic(item: types.Type) -> Any:
    @intrinsic
    def at(typingctx: Any, where: Any) -> Any:
        sig = types.CPointer(item)(types.intp)  # type: ignore[no-untyped-call]

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return sig, codegen

    return at


_f64_at = _pointer_intrinsic(types.float64)
_u8_at = _pointer_intrinsic(types.uint8)
_u16_at = _pointer_intrinsic(types.uint16)
_f32_at = _pointer_intrinsic(types.float32)


@intrinsic
def _prefetch(typingctx: Any, where: Any) -> Any:
    """Ask the CPU to start loading the cache line at address `where`."""
    sig = types.void(types.intp)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ptr = builder.inttoptr(args[0], ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module, fnty, "llvm.prefetch.p0"
        )
        # a read, kept in every cache level, of data
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


_ITEM_BYTES = np.array([1, 2, 4], dtype=np.int64)  # by own kind: U8, U16, F32


@njit(nogil=True, cache=True)
def assemble(
    out: np.ndarray,
    local: int,
    stage: np.ndarray,
    slots: np.ndarray,
    bounds: np.ndarray,
    groups: np.ndarray,
    first: np.ndarray,
    pattern: np.ndarray,
    copy_at: np.ndarray,
    copies: np.ndarray,
    own: np.ndarray,
    own_at: np.ndarray,
    derived: np.ndarray,
) -> None:
    """Write row `local` of a symbol block into `out` (fields x T).

    - stage (fields x L) float64 and slots (fields,) int64: scratch, one per thread (the
      caller's).
    - bounds (chunks + 1,): session boundaries of the chunks.
    - groups (chunks x 2): chunk c's group file, (runs x width) float64 at address
      groups[c, 0] with groups[c, 1] runs (0: none); first[c, local] the row's first run in
      it, pattern[c, local] its pattern.
    - copies[copy_at[c, p] : copy_at[c, p + 1]]: (lo, hi, off): rows [lo, hi) of `out` from
      the row's runs off, off + 1, ... (off < 0: NaN) for pattern p of chunk c.
    - own: (c, position, kind, address), by chunk (chunk c's: own[own_at[c] : own_at[c + 1]]):
      row `position` over chunk c from the (rows x width) chunk of dtype `kind` at `address`.
    - derived: (code, position, a, b, c), sources as rows of `out` (-1: absent, NaN).
    """
    nan = np.nan
    chunks = bounds.shape[0] - 1
    # The own-chunk pieces are small, each in its own file: their loads are asked for
    # OWN_AHEAD chunks early so that their memory latencies pass during the copies between.
    for c in range(min(OWN_AHEAD, chunks)):
        _prefetch_own(own, own_at[c], own_at[c + 1], local, bounds[c + 1] - bounds[c])
    for c in range(chunks):
        c0 = bounds[c]
        width = bounds[c + 1] - c0
        ahead = c + OWN_AHEAD
        if ahead < chunks:
            _prefetch_own(own, own_at[ahead], own_at[ahead + 1], local, width)
        p = pattern[c, local]
        # Where each field's run is among the row's runs in this chunk (MISSING: NaN).
        slots[:] = UNSET
        runs = 0
        for k in range(copy_at[c, p], copy_at[c, p + 1]):
            lo, hi, off = copies[k, 0], copies[k, 1], copies[k, 2]
            for i in range(lo, hi):
                if off < 0:
                    slots[i] = MISSING
                else:
                    slots[i] = off + i - lo
                    runs = max(runs, off + i - lo + 1)
        # 1. the row's runs in this chunk, one contiguous piece of the file, into `stage`.
        if runs:
            data = carray(_f64_at(groups[c, 0]), (groups[c, 1], width))
            piece = data[first[c, local] : first[c, local] + runs].ravel()
            if width == stage.shape[1]:
                staged = stage[:runs].ravel()
                for s in range(piece.shape[0]):
                    staged[s] = piece[s]
            else:  # the last chunk, shorter than L
                for r in range(runs):
                    into = stage[r]
                    for s in range(width):
                        into[s] = piece[r * width + s]
        # 2. each field's piece of its row, from the stage (in cache now) or NaN.
        for i in range(slots.shape[0]):
            j = slots[i]
            if j == UNSET:
                continue
            row = out[i]
            dst = row[c0 : c0 + width]
            if j == MISSING:
                for s in range(width):
                    dst[s] = nan
            else:
                got = stage[j]
                for s in range(width):
                    dst[s] = got[s]
        # 3. the fields stored on their own in a narrow dtype, this chunk (asked for earlier).
        for k in range(own_at[c], own_at[c + 1]):
            i, kind, base = own[k, 1], own[k, 2], own[k, 3]
            row = out[i]
            dst = row[c0 : c0 + width]
            where = base + local * width * _ITEM_BYTES[kind]
            if kind == U8:
                src8 = carray(_u8_at(where), width)
                for s in range(width):
                    dst[s] = src8[s]
            elif kind == U16:
                src16 = carray(_u16_at(where), width)
                for s in range(width):
                    dst[s] = src16[s]
            else:
                src32 = carray(_f32_at(where), width)
                for s in range(width):
                    dst[s] = src32[s]
    # 4. the derived fields, from the assembled rows.
    for k in range(derived.shape[0]):
        _derive(out, derived[k, 0], derived[k, 1], derived[k, 2], derived[k, 3], derived[k, 4])


@njit(nogil=True, cache=True, inline="always")
def _prefetch_own(own: np.ndarray, k0: int, k1: int, local: int, width: int) -> None:
    for k in range(k0, k1):
        size = width * _ITEM_BYTES[own[k, 2]]
        where = own[k, 3] + local * size
        for line in range(0, size, 64):
            _prefetch(where + line)  # type: ignore[call-arg]  # numba supplies the context


@njit(nogil=True, cache=True)
def _derive(out: np.ndarray, code: int, i: int, a: int, b: int, c: int) -> None:
    """Row i of `out` from rows a, b, c (-1: absent, NaN): chunks.derive's arithmetic, the same
    IEEE operations in the same order, so the same bits."""
    row = out[i]
    t = row.shape[0]
    if a < 0 or (code == MINUS and b < 0):
        for s in range(t):
            row[s] = np.nan
        return
    x = out[a]
    if code == MINUS:
        y = out[b]
        for s in range(t):
            row[s] = x[s] - y[s]
        return
    for s in range(t):
        row[s] = 1.0 - x[s]
    if code != ONE_MINUS_KNOWN:
        return
    for more in (b, c):
        if more >= 0:
            y = out[more]
            for s in range(t):
                # A NaN term is a level the row lacks: nothing subtracted.
                row[s] = row[s] - y[s] if y[s] == y[s] else row[s]


def warm_up() -> None:
    """Load the kernel (compiled, or from numba's cache on disk) now: a server calls this at
    startup so that its first ticker read does not wait for it."""
    group = np.arange(4.0).reshape(1, 4)
    out = np.empty((1, 4))
    i64 = np.int64
    assemble(
        out,
        0,
        np.empty((1, 4)),
        np.empty(1, dtype=i64),
        np.array([0, 4], dtype=i64),
        np.array([[address(group), 1]], dtype=i64),
        np.zeros((1, 1), dtype=i64),
        np.zeros((1, 1), dtype=i64),
        np.array([[0, 1]], dtype=i64),
        np.array([[0, 1, 0]], dtype=i64),
        np.zeros((0, 4), dtype=i64),
        np.zeros(2, dtype=i64),
        np.zeros((0, 5), dtype=i64),
    )
    if out.tobytes() != group.tobytes():
        raise RuntimeError("the row kernel does not copy what it is given")
