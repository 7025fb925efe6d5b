"""Service A's per-stock half (`flat_betas`: betas and residuals) and the sector factor a member
of a sector group portfolio was estimated on (`own_sector_factors`).

A stock in a sector without an ETF is regressed on its group without itself (leave-one-out,
docs/decisions/model.md), so its b_sec is a coefficient on that series, not on the published
(whole-group) one. Its residual must subtract the same series, cleaned of the market the way
the published sector factor is: f_-i,t = s_-i,t - g_-i,t-1 m_t, with g_-i the rolling link
beta of s_-i on the market (the window, sample rule and weights of every other beta).
Subtracting the whole group instead, which holds the stock itself, shrank the residuals of
small groups (variance 0.70 of the leave-one-out residual's in a three-member group).
"""

from __future__ import annotations

import numpy as np

from eqrisk.model.cascade import CASCADE_FIELDS, rolling_cascade


def own_sector_factors(
    n_published: int,
    model_fidx: np.ndarray,
    exposure: np.ndarray,
    model_factors: np.ndarray,
    market: np.ndarray,
    params: tuple[int, int, float | None],
    start: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a block whose flat-model sector factor is their own leave-one-out series
    (exposed to a sector whose factor row in `model_factors`, the published rows then the
    leave-one-out rows, is a leave-one-out row: index >= `n_published`),
    and those series (rows x T; NaN before `start` + 1). `start` is a re-anchoring point of
    the calendar (a multiple of the window, 0 included): the series from it on equal a run
    from column 0, bit for bit. `params`: window, min_obs, halflife."""
    sector = model_fidx[:, 1]
    rows = np.flatnonzero((exposure >= 0) & (sector >= n_published))
    out = np.full((len(rows), market.shape[0]), np.nan)
    if not len(rows):
        return rows, out
    series = model_factors[sector[rows]]
    link_idx = np.full((len(rows), 3), -1, dtype=np.int64)
    link_idx[:, 0] = 0
    window, min_obs, halflife = params
    # From a re-anchoring point (an incremental run) the kernel writes in place, from `start` on.
    shape = series.shape
    into = {name: np.full(shape, np.nan) for name in CASCADE_FIELDS} if start else None
    link = rolling_cascade(
        series,
        market[None, :],
        link_idx,
        window=window,
        min_obs=min_obs,
        halflife=halflife,
        out=into,
        start=start,
    )["l1_mkt_hr"]
    first = start + 1  # the link of the session before is needed
    out[:, first:] = series[:, first:] - link[:, first - 1 : -1] * market[None, first:]
    return rows, out


def flat_betas(
    r: np.ndarray,
    l1_mkt_hr: np.ndarray,
    l2_sec_hr: np.ndarray,
    exposure: np.ndarray,
    market: np.ndarray,
    flat_returns: np.ndarray,
    own: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-stock half: betas and residuals (b_Mkt, b_sec, e), row by row.

    A stock's betas are its cascade coefficients (b_Mkt = b_m of its L1 sample, b_sec = b_s
    of its L2 sample: on the stock's joint days with the market, and with the sector too); its
    residual uses the previous session's betas: e_t = r_t - b_Mkt,t-1 f_Mkt,t - b_sec,t-1
    f_sec,t, with no sector term on a day whose b_sec is not published (before the sector
    ETF's sample reaches min_obs) while b_Mkt is. `own` (rows, series): the sector factor of
    rows estimated on a group without themselves (`own_sector_factors`), so e matches the betas.
    """
    n, n_t = r.shape
    exposed = exposure >= 0
    beta_mkt = l1_mkt_hr.copy()
    beta_sec = np.full((n, n_t), np.nan)
    beta_sec[exposed] = l2_sec_hr[exposed]
    systematic = beta_mkt[:, :-1] * market[None, 1:]
    sector_f = flat_returns[exposure[exposed], 1:]
    if own is not None and len(own[0]):  # place among the exposed rows <- own series
        sector_f[(np.cumsum(exposed) - 1)[own[0]]] = own[1][:, 1:]
    sector = beta_sec[exposed, :-1] * sector_f
    sector[np.isnan(beta_sec[exposed, :-1])] = 0.0
    systematic[exposed] += sector
    resid = np.full((n, n_t), np.nan)
    resid[:, 1:] = r[:, 1:] - systematic
    return beta_mkt, beta_sec, resid
