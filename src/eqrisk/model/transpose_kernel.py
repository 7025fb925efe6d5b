"""The session-major copy of a block of style arrays (`style_regression._session_major`) as a
numba kernel: (S, n, T) -> (T, n, S), the sessions taken SPAN at a time.

numpy's copy of the moved axes walks the output in order and reads the input one element per
row of S x n, a cache line for each value; here each of the S x n rows gives SPAN sessions
(one or two cache lines) at once, written to SPAN session planes of the output. A copy: the
values are the input's, bit for bit.
"""

from __future__ import annotations

import numba

SPAN = 16  # sessions copied per read of a row


@numba.njit(cache=True, nogil=True)
def session_major_kernel(a, out):
    """out[t, i, s] = a[s, i, t] for a (S, n, T) and out (T, n, S), both C-ordered."""
    n_s, n, n_t = a.shape
    for t0 in range(0, n_t, SPAN):
        t1 = min(t0 + SPAN, n_t)
        for i in range(n):
            for s in range(n_s):
                row = a[s, i]
                for t in range(t0, t1):
                    out[t, i, s] = row[t]
