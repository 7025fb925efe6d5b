"""Daily returns from a price panel: no forward fill, no gap spanning."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

# Member returns of a group portfolio are held within this many robust daily vols of the
# member (1.4826 x the median |return| of its previous MEMBER_VOL_WINDOW returns, at least
# MEMBER_VOL_MIN of them) around the group's median return that day: one member's bad day
# (a spin-off booked as a loss, a print, a missing split) then moves its group by at most its
# weight x WINSOR_SIGMAS vols, not by its weight x 57%.
WINSOR_SIGMAS = 4.0
MEMBER_VOL_WINDOW = 63
MEMBER_VOL_MIN = 20


def simple_returns(close: np.ndarray) -> np.ndarray:
    """r_t = P_t / P_{t-1} - 1 where both sessions have a price, else NaN.

    A missing price is missing: the return into it and out of it are both NaN, so a multi-day
    move is never booked as one day's return (and never as zero).
    """
    close = np.asarray(close, dtype=np.float64)
    out = np.full(close.shape, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        out[..., 1:] = close[..., 1:] / close[..., :-1] - 1.0
    return out


def log_returns(simple: np.ndarray) -> np.ndarray:
    """ln(1 + r): the `return` metric of the spec's security_history."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out: np.ndarray = np.log1p(simple)
    return out


def winsorised_members(returns: np.ndarray) -> np.ndarray:
    """(members x T) member returns, each held within WINSOR_SIGMAS of its own robust daily vol
    (from its previous returns only, so nothing looks ahead) around the members' median return
    of the day; a member without MEMBER_VOL_MIN previous returns is held within the median of
    the others' vols that day. NaN stays NaN."""
    r = np.asarray(returns, dtype=np.float64)
    if r.size == 0:
        return r.copy()
    past = pd.DataFrame(np.abs(r).T).shift(1)
    vol = 1.4826 * past.rolling(MEMBER_VOL_WINDOW, min_periods=MEMBER_VOL_MIN).median()
    vol_arr = vol.to_numpy().T
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN days: nothing to hold
        centre = np.nanmedian(r, axis=0)
        typical = np.nanmedian(vol_arr, axis=0)
    vol_arr = np.where(np.isfinite(vol_arr), vol_arr, typical[None, :])
    band = WINSOR_SIGMAS * vol_arr
    held = np.clip(r, centre[None, :] - band, centre[None, :] + band)
    # Where no vol is known at all (the group's first sessions), the return stays as it is.
    out: np.ndarray = np.where(np.isfinite(band), held, r)
    return out


@dataclass(frozen=True)
class GroupPortfolio:
    """A group of rows and each member's weight per session (previous session's cap).

    `returns` are the members' returns as the portfolio holds them (`winsorised_members`);
    `weights` (members x T) is zero where a member has no return; `imputed` marks the members
    that were given a cap by the missing-cap rule on at least one session.
    """

    members: np.ndarray
    returns: np.ndarray  # (members x T), NaN where no return
    weights: np.ndarray  # (members x T)
    imputed: np.ndarray  # (members,) bool

    def full(self) -> np.ndarray:
        """The group's return: sum of w r over sum of w; NaN on a day with no member return."""
        num, total = self._sums()
        with np.errstate(invalid="ignore", divide="ignore"):
            out: np.ndarray = num / total
        out[total <= 0] = np.nan
        return out

    def leave_one_out(self) -> np.ndarray:
        """(members x T): row j is the group's return with member j's weight removed and the
        others renormalised, NaN where no other member has a return that day."""
        num, total = self._sums()
        r0 = np.where(self.weights > 0, self.returns, 0.0)
        rest = total[None, :] - self.weights
        with np.errstate(invalid="ignore", divide="ignore"):
            out: np.ndarray = (num[None, :] - self.weights * r0) / rest
        # A relative tolerance: the rest's weight is a difference of two sums.
        out[~(rest > 1e-12 * np.maximum(total[None, :], 1e-300))] = np.nan
        return out

    def _sums(self) -> tuple[np.ndarray, np.ndarray]:
        r0 = np.where(self.weights > 0, self.returns, 0.0)
        return (r0 * self.weights).sum(axis=0), self.weights.sum(axis=0)


def group_portfolio(
    returns: np.ndarray, members: np.ndarray, market_cap: np.ndarray | None
) -> GroupPortfolio:
    """Weights of a group portfolio, weighted by the previous session's market cap, over the
    members' winsorised returns (`winsorised_members`).

    Missing-cap rule: on a session where some members with a return have a cap and others do
    not, each member without one is weighted by the median of the known caps that day (never by
    zero, which would drop it silently). A session where no member has a cap is equal-weighted.
    """
    r = winsorised_members(returns[members])
    has_r = np.isfinite(r)
    eq = np.where(has_r, 1.0, 0.0)
    imputed = np.zeros(len(members), dtype=bool)
    if market_cap is None:
        return GroupPortfolio(members, r, eq, imputed)
    caps = np.full(r.shape, np.nan)
    caps[:, 1:] = market_cap[members][:, :-1]
    known = has_r & np.isfinite(caps) & (caps > 0)
    use_caps = known.any(axis=0)
    missing = has_r & ~known & use_caps[None, :]
    cap_w = np.where(known, caps, 0.0)
    if missing.any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: not used
            median = np.nanmedian(np.where(known, caps, np.nan), axis=0)
        cap_w = np.where(missing, median[None, :], cap_w)
        imputed = missing.any(axis=1)
    weights = np.where(use_caps[None, :], cap_w, eq)
    return GroupPortfolio(members, r, weights, imputed)


def group_returns(
    returns: np.ndarray, members: np.ndarray, market_cap: np.ndarray | None
) -> np.ndarray:
    """Cap-weighted (by the previous session's market cap) return of a group of rows, over
    their winsorised returns (`winsorised_members`).

    Falls back to equal weights for the days where no member has a market cap; members without
    a cap on a capped day follow the missing-cap rule of `group_portfolio`. A day with no member
    return is NaN. This is the published factor of a level that has no ETF in the data.
    """
    return group_portfolio(returns, members, market_cap).full()
