"""The byte loops of the answer writers (`writers`), compiled by numba.

The kernels only move bytes that orjson already formatted, and all of them run without the GIL
(`nogil`): a worker thread that lays out an 8 MB answer leaves the event loop free to answer
other requests meanwhile. Cached on disk, so a worker compiles them once.

Cells are short (a float is at most 24 bytes), so they are moved eight bytes at a time with
unaligned 64-bit loads and stores: a word may run past the end of a cell, which the next cell
overwrites, so every source and the output carry `SLACK` spare bytes at their end.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir  # type: ignore[import-untyped]
from numba import njit, types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

QUOTE, BACKSLASH, COMMA, NEWLINE = 34, 92, 44, 10
OPENERS = (91, 123)  # [ {
CLOSERS = (93, 125)  # ] }
SLACK = 8  # spare bytes after a source or the output: a word copy may pass a cell's end
SCAN, BOUNDS = 0, 1  # how a column's cells are found (`lay_out_rows`)

_ONES = np.uint64(0x0101010101010101)
_HIGHS = np.uint64(0x8080808080808080)
_COMMAS = np.uint64(0x2C2C2C2C2C2C2C2C)


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
def load_word(typingctx, arr, pos):
    """The 8 bytes arr[pos:pos + 8] as one little-endian uint64 (an unaligned load)."""
    sig = types.uint64(arr, types.intp)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        a, p = args
        array = context.make_array(signature.args[0])(context, builder, a)
        ptr = builder.bitcast(builder.gep(array.data, [p]), ir.IntType(64).as_pointer())
        return builder.load(ptr, align=1)

    return sig, codegen


@intrinsic
def store_word(typingctx, arr, pos, word):
    """arr[pos:pos + 8] = the 8 bytes of `word` (an unaligned store)."""
    sig = types.void(arr, types.intp, types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        a, p, w = args
        array = context.make_array(signature.args[0])(context, builder, a)
        ptr = builder.bitcast(builder.gep(array.data, [p]), ir.IntType(64).as_pointer())
        builder.store(w, ptr, align=1)
        return context.get_dummy_value()

    return sig, codegen


@njit(nogil=True, cache=True, inline="always")
def _copy(out, pos, src, start, n):
    """out[pos:pos + n] = src[start:start + n], a word at a time (up to 7 bytes more are
    written past the end, and read past the source's: both have `SLACK`)."""
    k = 0
    while k < n:
        store_word(out, pos + k, load_word(src, start + k))
        k += 8


@njit(nogil=True, cache=True, inline="always")
def _copy_to_comma(out, pos, src, start):
    """Copies src[start:] up to (not including) the next comma into out[pos:]; returns the
    length copied. The lowest byte of the word's zero-byte mask is the first comma."""
    n = 0
    while True:
        word: np.uint64 = load_word(src, start + n)
        store_word(out, pos + n, word)
        x = word ^ _COMMAS
        mask = (x - _ONES) & ~x & _HIGHS
        if mask != 0:
            return n + (np.int64(trailing_zeros(mask)) >> 3)
        n += 8


@njit(nogil=True, cache=True, inline="always")
def _write_null(out, pos, value):
    """The CSV cell of a number orjson wrote as `null`, at out[pos:]; returns its length:
    empty for NaN, `inf` / `-inf` for an infinity, as pyarrow wrote them."""
    if value == np.inf:
        out[pos], out[pos + 1], out[pos + 2] = 105, 110, 102  # inf
        return 3
    if value == -np.inf:
        out[pos], out[pos + 1], out[pos + 2], out[pos + 3] = 45, 105, 110, 102  # -inf
        return 4
    return 0


@njit(nogil=True, cache=True)
def lay_out_rows(
    src,
    nrows,
    kinds,
    cursors,
    slots,
    starts,
    ends,
    inf_slots,
    values,
    lit,
    lit_bounds,
    csv,
    out,
    pos,
):
    """`nrows` rows of cells into `out` from `pos` on; returns the position after the last byte.

    Per row r, for column c: literal c, then the cell. A `SCAN` column's cells follow each
    other in `src` from `cursors[c]` on, each ended by a comma (orjson's array text of a numeric
    column, its closing bracket made a comma); a `BOUNDS` column's cell r is
    src[starts[slots[c], r]:ends[slots[c], r]]. Literal ncols ends each row, literal ncols + 1
    separates rows (literal k is lit[lit_bounds[k]:lit_bounds[k + 1]]).

    `csv`: scanned numbers are made CSV cells; values[inf_slots[c], r] tells infinity from NaN
    in a column that holds an infinity (inf_slots[c] < 0: none does)."""
    ncols = len(kinds)
    cur = cursors.copy()
    for r in range(nrows):
        if r > 0:
            n = lit_bounds[ncols + 2] - lit_bounds[ncols + 1]
            _copy(out, pos, lit, lit_bounds[ncols + 1], n)
            pos += n
        for c in range(ncols):
            n = lit_bounds[c + 1] - lit_bounds[c]
            _copy(out, pos, lit, lit_bounds[c], n)
            pos += n
            if kinds[c] == BOUNDS:
                s = starts[slots[c], r]
                n = ends[slots[c], r] - s
                _copy(out, pos, src, s, n)
            else:
                start = cur[c]
                n = _copy_to_comma(out, pos, src, start)
                cur[c] = start + n + 1
                if csv:  # as pyarrow wrote numbers: null (NaN, infinity) and 37.0 -> 37
                    if n == 4 and out[pos] == 110:
                        n = _write_null(
                            out, pos, values[inf_slots[c], r] if inf_slots[c] >= 0 else 0.0
                        )
                    elif n >= 3 and out[pos + n - 2] == 46 and out[pos + n - 1] == 48:
                        n -= 2
            pos += n
        n = lit_bounds[ncols + 1] - lit_bounds[ncols]
        _copy(out, pos, lit, lit_bounds[ncols], n)
        pos += n
    return pos


@njit(nogil=True, cache=True)
def lay_out_records(src, starts, ends, lit, lit_bounds, out, pos):
    """A JSON array of records into `out` from `pos` on; returns the position after it.

    Record r is, for each column c, literal c (`{"name":` or `,"name":`, lit[lit_bounds[c]:
    lit_bounds[c + 1]]) and the cell src[starts[c, r]:ends[c, r]], then `}`; records are
    separated by commas. `src`, `lit` and `out` carry `SLACK` spare bytes (word copies)."""
    ncols, nrows = starts.shape
    out[pos] = OPENERS[0]
    pos += 1
    for r in range(nrows):
        if r > 0:
            out[pos] = COMMA
            pos += 1
        for c in range(ncols):
            n = lit_bounds[c + 1] - lit_bounds[c]
            _copy(out, pos, lit, lit_bounds[c], n)
            pos += n
            s = starts[c, r]
            n = ends[c, r] - s
            _copy(out, pos, src, s, n)
            pos += n
        out[pos] = CLOSERS[1]
        pos += 1
    out[pos] = CLOSERS[0]
    return pos + 1
