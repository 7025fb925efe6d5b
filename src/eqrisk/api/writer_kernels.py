"""The byte loops of the answer writers (`writers`), compiled by numba.

Both kernels only move bytes that orjson already formatted, and both run without the GIL
(`nogil`): a worker thread that assembles an 8 MB answer leaves the event loop free to answer
other requests meanwhile. Cached on disk, so a worker compiles them once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

QUOTE, BACKSLASH, COMMA, NEWLINE = 34, 92, 44, 10
OPENERS = (91, 123)  # [ {
CLOSERS = (93, 125)  # ] }


@njit(nogil=True, cache=True)
def split_elements(text, lo, hi, sep, json, starts, ends):
    """Bounds of the top-level elements of text[lo:hi] separated by byte `sep`, written to
    `starts`/`ends`; returns how many. `json`: strings escape with a backslash and brackets
    nest (a JSON array's body); else CSV: a quote doubles inside quotes, nothing nests."""
    k = 0
    if hi <= lo:
        return k
    depth = 0
    in_str = False
    escaped = False
    start = lo
    for i in range(lo, hi):
        c = text[i]
        if in_str:
            if escaped:
                escaped = False
            elif json and c == BACKSLASH:
                escaped = True
            elif c == QUOTE:
                in_str = False
        elif c == QUOTE:
            in_str = True
        elif json and (c == OPENERS[0] or c == OPENERS[1]):
            depth += 1
        elif json and (c == CLOSERS[0] or c == CLOSERS[1]):
            depth -= 1
        elif c == sep and depth == 0:
            if k < len(starts):
                starts[k] = start
                ends[k] = i
            k += 1
            start = i + 1
    if json or start < hi:  # a JSON body always ends with an element; a CSV text with a newline
        if k < len(starts):
            starts[k] = start
            ends[k] = hi
        k += 1
    return k


@intrinsic
def copy_bytes(typingctx, dst, dst_pos, src, src_pos, count):
    """dst[dst_pos:dst_pos + count] = src[src_pos:src_pos + count] as one memcpy: a cell is a
    few bytes, and a byte loop or a slice assignment per cell costs 5x more."""
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        d, d_pos, s, s_pos, n = args
        d_array = context.make_array(signature.args[0])(context, builder, d)
        s_array = context.make_array(signature.args[2])(context, builder, s)
        target = builder.gep(d_array.data, [d_pos])
        origin = builder.gep(s_array.data, [s_pos])
        cgutils.raw_memcpy(builder, target, origin, n, 1)
        return context.get_dummy_value()

    return sig, codegen


@njit(nogil=True, cache=True)
def assemble_rows(src, starts, ends, lit, lit_starts, lit_ends, out, pos):
    """Rows of cells into `out` from `pos` on: per row r, for column c the literal c then the
    cell src[starts[r, c]:ends[r, c]]; literal ncols (row end) after each row, literal
    ncols + 1 (row separator) between rows. Returns the position after the last byte."""
    nrows, ncols = starts.shape
    for r in range(nrows):
        if r > 0:
            n = lit_ends[ncols + 1] - lit_starts[ncols + 1]
            copy_bytes(out, pos, lit, lit_starts[ncols + 1], n)
            pos += n
        for c in range(ncols):
            n = lit_ends[c] - lit_starts[c]
            copy_bytes(out, pos, lit, lit_starts[c], n)
            pos += n
            n = ends[r, c] - starts[r, c]
            copy_bytes(out, pos, src, starts[r, c], n)
            pos += n
        n = lit_ends[ncols] - lit_starts[ncols]
        copy_bytes(out, pos, lit, lit_starts[ncols], n)
        pos += n
    return pos


def empty_bounds(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two int64 arrays of n element bounds, to be filled by `split_elements`."""
    return np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
