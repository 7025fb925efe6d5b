"""The compiled loops of the accuracy measure (`accuracy.portfolio_outcomes`, the running record
`accuracy_state`): per session and portfolio, the weights of the members with a forecast and a
return, the portfolio's factor exposures, its predicted variance, realised return and baseline.
A portfolio holds a few dozen stocks, so the loops visit its members only (a dense weights x
exposures product per session would touch every stock of every portfolio).

The sessions go in blocks of BLOCK: a member's figures of a block lie together in the callers'
(n x S) arrays, so a member adds them to its portfolio's sums for every session of the block in
one sweep, over each run of sessions through which the portfolio's members stay the same (a
member with no return on a session cuts the run); its first-layer exposures slot by slot (the
three of its level, whatever the number of factors). The quadratic forms then run over all
portfolios at once, a pair of factors for every portfolio in one sweep, zero where the
portfolio lacks one of them. None of it changes an addition's order: a slot above the member's
level adds an exact zero, and every output is the bits of a plain loop per session and
portfolio over its members, then over the pairs of factors it has in order (tests/model:
`outcome_reference`, the loops as first written)."""

from __future__ import annotations

import numpy as np
from numba import njit

A = np.ndarray
BLOCK = 32  # sessions a member's figures are added for in one sweep


@njit(cache=True, nogil=True)
def gross(members, weights, avail, p):  # fmt: skip
    """Portfolio p's long and short gross weight (both >= 0) over its members available in
    `avail` (n,): the sums its long weights are scaled by to 1 and its short ones to -1."""
    pos = 0.0
    neg = 0.0
    for a in range(members.shape[1]):
        i = members[p, a]
        if i < 0:
            break
        if avail[i]:
            w = weights[p, a]
            if w > 0:
                pos += w
            else:
                neg -= w
    return pos, neg


def twins(members: A, weights: A) -> A:
    """(P,) for each portfolio the first one before it with the same members and weights (the
    hedged books are the long-only ones again), -1 where none."""
    first: dict[bytes, int] = {}
    out = np.full(len(members), -1, dtype=np.int64)
    for p in range(len(members)):
        key = members[p].tobytes() + weights[p].tobytes()
        out[p] = first.setdefault(key, p)
        if out[p] == p:
            out[p] = -1
    return out


def _c(a: A, dtype: type = np.float64) -> A:
    return np.ascontiguousarray(a, dtype=dtype)


def portfolio_days(
    members: A, weights: A, hedged: A, avail: A, index: A, level: A, values: A, cov: A, spec: A,
    r_sum: A, f_sum: A, base: A, fbase: A, style: A, out_real: A, out_model: A, out_base: A,
    prev: tuple[A, A, A] | None = None, twin: A | None = None,
) -> None:  # fmt: skip
    """Sessions are the columns of `avail` (n x S), `level` (n x S), `values` (3 x n x S),
    `spec`, `r_sum`, `base` (n x S), `f_sum`, `fbase` (K x S) and `cov` (S x K x K); the
    members of portfolio p are members[p, :] (-1 = padding) with weights[p, :]. Long weights of
    the members present are scaled to sum to 1, short ones to -1. Outputs (P x S) are written
    where the portfolio has a member; the horizon's scaling is the caller's. `style` (S' x n x
    S): exposures to the second-layer factors, the last S' of the K (never hedged: a hedged
    portfolio sells its exposure to the first K - S' only, and keeps the second layer's risk).
    `prev`: (cov (S x K' x K'), spec (n x S), out (P x S)) a second model on the same
    exposures' first K' = K - S' factors (the previous model: the ETF layer alone), whose
    predicted volatility goes to out, as this call without `style` on its cov and spec would
    write it. `twin`: `twins(members, weights)`, computed when not given."""
    n, s_count = avail.shape
    k = cov.shape[1]
    p_cov, p_spec, p_out = (
        prev
        if prev is not None
        else (np.zeros((s_count, 0, 0)), np.zeros((n, s_count)), np.zeros((len(members), 0)))
    )
    if prev is not None and p_cov.shape[1] != k - style.shape[0]:
        raise ValueError("the second model's factors are not the first layer's")
    cols = np.stack([_c(r_sum), np.where(np.isfinite(base), base, 0.0), _c(spec), _c(p_spec)])
    # The quadratic forms run over the plain portfolios, then the hedged ones (fewer factors).
    order = np.concatenate([np.flatnonzero(~hedged), np.flatnonzero(hedged)])
    _portfolio_days(members, weights, hedged, twins(members, weights) if twin is None else twin,
                    order, _c(avail.T, np.bool_), _c(index, np.int64), _c(level, np.int64),
                    _c(values), _c(style), cols, _c(cov), _c(p_cov), _c(f_sum), _c(fbase),
                    out_real, out_model, out_base, p_out)  # fmt: skip


@njit(cache=True, nogil=True)
def _block(t0, avail, index, level, values, style, cols, buf, flag):  # fmt: skip
    """Every stock's figures of sessions t0 .. t0 + B - 1 laid out together (a member's then
    lie in one stretch of memory, which the loops read in order): buf[i, :, ts] its first-layer
    exposures slot by slot (0 in a slot above its level), its second-layer ones (`style`), then
    cols[:, i]; flag[i, :, ts] 1 for a slot of its level, a nonzero second-layer exposure."""
    n_style = style.shape[0]
    n_l = min(BLOCK, avail.shape[0] - t0)
    for i in range(buf.shape[0]):
        for j in range(3):
            if index[i, j] < 0:
                continue
            for ts in range(n_l):
                on = j < level[i, t0 + ts]
                buf[i, j, ts] = values[j, i, t0 + ts] if on else 0.0
                flag[i, j, ts] = on
        for s in range(n_style):
            for ts in range(n_l):
                e = style[s, i, t0 + ts]
                buf[i, 3 + s, ts] = e
                flag[i, 3 + s, ts] = e != 0.0
        for c in range(cols.shape[0]):
            for ts in range(n_l):
                buf[i, 3 + n_style + c, ts] = cols[c, i, t0 + ts]


@njit(cache=True, nogil=True)
def _book(members, weights, av, p, pos, neg, l0, l1, index, buf, flag, acc, acc_c, got):  # fmt: skip
    """Portfolio p's members' figures (`_block`) of local sessions l0 .. l1 - 1 added up with
    their weights (normalised on `av`'s members) into row p of: acc (K + 1 x B: the
    exposures, slot by slot then the second layer's, and the return, w x), acc_c (C - 1 x B:
    the baseline |w| x, the specific variances w^2 x) and got (K x B: the factors they have)."""
    k = got.shape[1]
    n_style = flag.shape[1] - 3
    n_etf = k - n_style
    r = 3 + n_style  # the return's row in buf
    # Unsigned indices: numba then checks no index for a negative one (which would keep the
    # loops scalar), and a sweep runs over 4 sessions at a time.
    u0, u1 = np.uint64(l0), np.uint64(l1)
    for f in range(k + 1):
        for u in range(u0, u1):
            acc[p, f, u] = 0.0
    for c in range(acc_c.shape[1]):
        for u in range(u0, u1):
            acc_c[p, c, u] = 0.0
    for f in range(k):
        for u in range(u0, u1):
            got[p, f, u] = 0
    for a in range(members.shape[1]):
        i = members[p, a]
        if i < 0:
            break
        if not av[i]:
            continue
        w = weights[p, a]
        w = w / pos if w > 0 else w / neg
        for j in range(3):
            f = index[i, j]
            if f < 0 or f >= n_etf:
                continue
            for u in range(u0, u1):
                acc[p, f, u] += w * buf[i, j, u]
                got[p, f, u] |= flag[i, j, u]
        for s in range(n_style):
            for u in range(u0, u1):
                acc[p, n_etf + s, u] += w * buf[i, 3 + s, u]
                got[p, n_etf + s, u] |= flag[i, 3 + s, u]
        for u in range(u0, u1):
            acc[p, k, u] += w * buf[i, r, u]
        ww = w * w
        for c in range(acc_c.shape[1]):
            m = abs(w) if c == 0 else ww
            for u in range(u0, u1):
                acc_c[p, c, u] += m * buf[i, r + 1 + c, u]


@njit(cache=True, nogil=True)
def _books(members, weights, twin, avail, t0, index, buf, flag, acc, acc_c, got, held):  # fmt: skip
    """Every portfolio's sums (`_book`) on sessions t0 .. t0 + B - 1, one sweep over each run
    of sessions through which its members' availability holds; held[p, ts]: whether it has a
    member on the session. A twin's are its first's."""
    n_l = min(BLOCK, avail.shape[0] - t0)
    one = np.uint64(1)
    change = np.zeros(avail.shape[1], dtype=np.uint64)  # bit ts: not as on the session before
    for ts in range(1, n_l):
        for i in range(avail.shape[1]):
            if avail[t0 + ts, i] != avail[t0 + ts - 1, i]:
                change[i] |= one << np.uint64(ts)
    for p in range(members.shape[0]):
        q = twin[p]
        if q >= 0:
            acc[p] = acc[q]
            acc_c[p] = acc_c[q]
            got[p] = got[q]
            held[p] = held[q]
            continue
        cuts = np.uint64(0)
        for a in range(members.shape[1]):
            i = members[p, a]
            if i < 0:
                break
            cuts |= change[i]
        l0 = 0
        while l0 < n_l:
            l1 = l0 + 1
            while l1 < n_l and not (cuts >> np.uint64(l1)) & one:
                l1 += 1
            av = avail[t0 + l0]
            pos, neg = gross(members, weights, av, p)
            for ts in range(l0, l1):
                held[p, ts] = pos != 0.0 or neg != 0.0
            if pos != 0.0 or neg != 0.0:
                _book(members, weights, av, p, pos, neg, l0, l1, index, buf, flag, acc, acc_c,
                      got)  # fmt: skip
            l0 = l1


@njit(cache=True, nogil=True)
def _quadratic(cov, x, q, f0, j0, j1, out):  # fmt: skip
    """out[j] = sum over pairs (f, g) of the factors from f0 on that column j has (q[:, j]),
    f first, of x[f, j] cov[f, g] x[g, j], for the columns j0 .. j1 - 1: every portfolio's
    quadratic form in its own order of terms (a pair it lacks adds an exact 0)."""
    k = cov.shape[0]
    u0, u1 = np.uint64(j0), np.uint64(j1)  # unsigned, as in `_book`
    for j in range(u0, u1):
        out[j] = 0.0
    for f in range(f0, k):
        for g in range(f0, k):
            c = cov[f, g]
            for j in range(u0, u1):
                term = x[f, j] * c * x[g, j]
                out[j] += term if q[f, j] & q[g, j] else 0.0


@njit(cache=True, nogil=True)
def _portfolio_days(
    members, weights, hedged, twin, order, avail, index, level, values, style, cols, cov, p_cov,
    f_sum, fbase, out_real, out_model, out_base, p_out,
):  # fmt: skip
    """`portfolio_days` on avail (S x n) and cols (4 x n x S: return, baseline, specific
    variances); twin[p] = q < p holding the same positions (-1: none), whose sums p reuses;
    order: the portfolios, the plain ones first."""
    n_p = members.shape[0]
    n = avail.shape[1]
    k = cov.shape[1]
    n_etf = k - style.shape[0]
    k_prev = p_cov.shape[1]
    n_plain = 0
    for p in range(n_p):
        n_plain += not hedged[p]
    buf = np.zeros((n, 3 + style.shape[0] + cols.shape[0], BLOCK))
    flag = np.zeros((n, 3 + style.shape[0], BLOCK), dtype=np.uint8)
    acc = np.zeros((n_p, k + 1, BLOCK))
    acc_c = np.zeros((n_p, 3, BLOCK))
    got = np.zeros((n_p, k, BLOCK), dtype=np.uint8)
    held = np.zeros((n_p, BLOCK), dtype=np.bool_)
    # A block's exposures by session, a portfolio a column (in `order`), and the factors of its
    # quadratic form (of the previous model's too: the first K' of them, none for a hedged one)
    xb = np.zeros((BLOCK, k, n_p))
    qb = np.zeros((BLOCK, k, n_p), dtype=np.uint8)
    var = np.zeros(n_p)
    p_var = np.zeros(n_p)
    for t0 in range(0, avail.shape[0], BLOCK):
        n_l = min(BLOCK, avail.shape[0] - t0)
        _block(t0, avail, index, level, values, style, cols, buf, flag)
        _books(members, weights, twin, avail, t0, index, buf, flag, acc, acc_c, got, held)
        for j in range(n_p):  # a hedged portfolio's risk: the second layer's factors only
            p = order[j]
            for f in range(k):
                counts = f >= n_etf or not hedged[p]
                for ts in range(n_l):
                    xb[ts, f, j] = acc[p, f, ts]
                    qb[ts, f, j] = held[p, ts] and got[p, f, ts] != 0 and counts
        for ts in range(n_l):
            t = t0 + ts
            x, q = xb[ts], qb[ts]
            _quadratic(cov[t], x, q, 0, 0, n_plain, var)
            _quadratic(cov[t], x, q, n_etf, n_plain, n_p, var)
            if k_prev > 0:
                _quadratic(p_cov[t], x, q, 0, 0, n_plain, p_var)
            for j in range(n_p):
                p = order[j]
                if not held[p, ts]:
                    continue
                real, base_vol = acc[p, k, ts], acc_c[p, 0, ts]
                if hedged[p]:
                    for f in range(n_etf):  # sells its first-layer exposure, in factor order
                        if got[p, f, ts]:
                            real -= x[f, j] * f_sum[f, t]
                            if np.isfinite(fbase[f, t]):
                                base_vol += abs(x[f, j]) * fbase[f, t]
                out_real[p, t] = real
                out_model[p, t] = np.sqrt(acc_c[p, 1, ts] + var[j])
                out_base[p, t] = base_vol
                if k_prev > 0:
                    p_out[p, t] = np.sqrt(acc_c[p, 2, ts] + (0.0 if hedged[p] else p_var[j]))


def held_returns(
    members: A, weights: A, hedged: A, avail: A, index: A, level: A, values: A, r_sum: A,
    f_sum: A, out: A, twin: A | None = None,
) -> None:  # fmt: skip
    """The realised return of each portfolio held from each of S sessions over a horizon: the
    positions of that session (`portfolio_days`' weights: members in `avail` (n x S), long
    weights scaled to 1, short to -1, a hedged one selling its ETF exposure; `index` (n x 3),
    `level` (n x S), `values` (3 x n x S)) times the horizon's summed returns `r_sum` (n x S)
    and `f_sum` (K x S). out (P x S) is written where the portfolio has a member."""
    n, s_count = avail.shape
    _held_returns(members, weights, hedged, twins(members, weights) if twin is None else twin,
                  _c(avail.T, np.bool_), _c(index, np.int64), _c(level, np.int64), _c(values),
                  np.zeros((0, n, s_count)), _c(r_sum)[None], _c(f_sum), out)  # fmt: skip


@njit(cache=True, nogil=True)
def _held_returns(members, weights, hedged, twin, avail, index, level, values, style, cols,
                  f_sum, out):  # fmt: skip
    """`held_returns` on avail (S x n) and cols (1 x n x S, the summed returns)."""
    n_p = members.shape[0]
    n = avail.shape[1]
    k = f_sum.shape[0]
    buf = np.zeros((n, 3 + style.shape[0] + cols.shape[0], BLOCK))
    flag = np.zeros((n, 3 + style.shape[0], BLOCK), dtype=np.uint8)
    acc = np.zeros((n_p, k + 1, BLOCK))
    acc_c = np.zeros((n_p, 0, BLOCK))
    got = np.zeros((n_p, k, BLOCK), dtype=np.uint8)
    held = np.zeros((n_p, BLOCK), dtype=np.bool_)
    for t0 in range(0, avail.shape[0], BLOCK):
        _block(t0, avail, index, level, values, style, cols, buf, flag)
        _books(members, weights, twin, avail, t0, index, buf, flag, acc, acc_c, got, held)
        for t in range(t0, min(t0 + BLOCK, avail.shape[0])):
            ts = t - t0
            for p in range(n_p):
                if not held[p, ts]:
                    continue
                real = acc[p, k, ts]
                if hedged[p]:
                    for f in range(k):
                        real -= acc[p, f, ts] * f_sum[f, t]
                out[p, t] = real


@njit(cache=True, nogil=True)
def accumulate(z, count, s1, s2, s4, ring):  # fmt: skip
    """Add the rows of z (S x R, a session a row) to the running sums one session after the
    other: per column with a finite z, count + 1, z, z^2 and z^4 to count, s1, s2, s4, and the
    first three to ring (3 x R, the current block's). A z that is not finite adds exact zeros
    instead (a sum that starts at +0 keeps its bits: no branch, the loops run in SIMD lanes)."""
    r_count = z.shape[1]
    n_count, n_s1, n_s2 = ring[0], ring[1], ring[2]
    for c in range(z.shape[0]):
        row = z[c]
        for r in range(r_count):
            ok = np.isfinite(row[r])
            v = row[r] if ok else 0.0
            one = 1.0 if ok else 0.0
            q = v * v
            count[r] += one
            s1[r] += v
            s2[r] += q
            s4[r] += q * q
            n_count[r] += one
            n_s1[r] += v
            n_s2[r] += q


@njit(cache=True, nogil=True)
def window_done(blocks, order, family, min_obs, mad_sum, mad_count, worst):  # fmt: skip
    """A 12-month window complete: per row b of the window (the std, ddof 1, from the sums of
    the ring's blocks (B x 3 x R) added in `order`; NaN below `min_obs` outcomes), |b - 1|
    added to mad_sum and 1 to mad_count where b is finite; per family f (family[r], -1 =
    none) the median of its finite b into worst[f] where higher (or worst[f] NaN). As numpy
    computes them: `accuracy_state._std`, `np.median`."""
    r_count = blocks.shape[2]
    c = np.zeros(r_count)
    s1 = np.zeros(r_count)
    s2 = np.zeros(r_count)
    for a in order:  # block after block, each row's sums in the blocks' order
        b_count, b_s1, b_s2 = blocks[a, 0], blocks[a, 1], blocks[a, 2]
        for r in range(r_count):
            c[r] += b_count[r]
            s1[r] += b_s1[r]
            s2[r] += b_s2[r]
    b = np.full(r_count, np.nan)
    for r in range(r_count):
        if c[r] >= max(min_obs, 2):
            var = (s2[r] - s1[r] * s1[r] / c[r]) / (c[r] - 1.0)
            b[r] = np.sqrt(var if var >= 0.0 or var != var else 0.0)  # np.maximum(var, 0)
        if np.isfinite(b[r]):
            mad_sum[r] += abs(b[r] - 1.0)
            mad_count[r] += 1.0
    for f in range(worst.shape[0]):
        vals = np.sort(b[(family == f) & np.isfinite(b)])
        m = len(vals)
        if m == 0:
            continue
        med = vals[m // 2] if m % 2 else (vals[m // 2 - 1] + vals[m // 2]) / 2.0
        if not med <= worst[f]:  # NaN (none yet) or higher
            worst[f] = med
