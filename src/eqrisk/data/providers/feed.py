"""`eqrisk fetch`: new sessions from a provider, in the ingest layout, continuing the stored
history.

The file written is a LONG price file (`FEED_COLUMNS`): the raw `close`, `open`/`high`/`low`,
`volume`, the `split_coefficient` and `dividend_amount` on their ex-dates, and an
`adjusted_close` that CONTINUES the ingested data set's closes: for a symbol the data set has,
the fetch starts at its last stored session t0 before `since`, and each new session's adjusted
close is the previous one times the total return (P_t + D_t) k_t / P_{t-1} (the convention of
`corporate_actions`), from the stored close of t0. So a split or a dividend inside the fetched
days never makes a false return where the new rows meet the stored ones (a provider's own
adjusted closes are adjusted as of today, the stored ones as of their own day). A symbol the
data set does not have keeps the provider's adjusted close.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import httpx
import numpy as np
import pandas as pd

from eqrisk.data.calendar import sessions_between
from eqrisk.data.daily import stored_basis
from eqrisk.data.dates import format_pattern
from eqrisk.data.ingested import last_closes, stored
from eqrisk.data.providers import (
    BAR_COLUMNS,
    Access,
    Provider,
    ProviderError,
    RateLimited,
    UnknownSymbol,
)
from eqrisk.data.providers.checks import checked_bars

# The file: the bars with the symbol after the date (a LONG price file of the ingest).
FEED_COLUMNS = ("date", "symbol", *BAR_COLUMNS[1:])
RETRIES = 4  # rate-limited answers retried per symbol, each after the provider's wait
MAX_WAIT = 60.0  # seconds; a longer Retry-After ends the fetch (say so, try later)


@dataclass(frozen=True)
class Anchor:
    """The stored history's last session before the fetch, and its (adjusted) close."""

    day: pd.Timestamp
    close: float


@dataclass
class Fetched:
    """The new sessions, and what was skipped: symbols the provider does not know."""

    frame: pd.DataFrame
    unknown: dict[str, str] = field(default_factory=dict)
    waits: int = 0


def stored_anchors(home: Path, before: date) -> dict[str, Anchor]:
    """Per symbol of the ingested data set, its last session before `before` and its close."""
    found = stored(home)
    if found is None:
        return {}
    last = last_closes(found, pd.Timestamp(before))
    return {
        str(s): Anchor(pd.Timestamp(d), float(c))
        for s, d, c in zip(last["symbol"], last["date"], last["close"], strict=True)
    }


def last_stored_session(home: Path) -> date | None:
    """The ingested data set's last session (None without one)."""
    found = stored(home)
    if found is None:
        return None
    sessions = found.stats.sessions()
    return None if sessions.empty else pd.Timestamp(sessions.index.max()).date()


def continued(bars: pd.DataFrame, anchor: Anchor | None, since: pd.Timestamp) -> pd.DataFrame:
    """The bars from `since` on, with `adjusted_close` chained from the anchor (when the bars
    hold its day) by the total return of each session."""
    bars = bars.loc[bars["close"].notna() & (bars["close"] > 0)].reset_index(drop=True)
    new = bars.loc[bars["date"] >= since].copy()
    if anchor is None or new.empty:
        return new
    at = bars.index[bars["date"] == anchor.day]
    if len(at) == 0:
        return new  # the provider lacks the anchor's day: its own adjusted closes
    span = bars.loc[at[0] :]
    raw = span["close"].to_numpy()
    growth = (
        (raw[1:] + span["dividend_amount"].to_numpy()[1:])
        * span["split_coefficient"].to_numpy()[1:]
        / raw[:-1]
    )
    # Session by session, as a reader would: A_t = A_{t-1} * growth_t from the stored close.
    chained = np.cumprod(np.concatenate([[anchor.close], growth]))[1:]
    new["adjusted_close"] = chained[-len(new) :]
    return new


def fetch(
    provider: Provider,
    access: Access,
    tickers: Sequence[str],
    since: date,
    until: date,
    anchors: dict[str, Anchor],
    *,
    progress: Callable[[str], None] = lambda _: None,
    sleep: Callable[[float], None] = time.sleep,
    fetch_timeout: float | None = None,
    max_price: float = 1e7,
) -> Fetched:
    """Every ticker's NYSE sessions from `since` to `until`, in `FEED_COLUMNS`. The whole fetch
    ends within `fetch_timeout` seconds (ProviderError past it), each request within
    `access.timeout`; every answer is checked (`checks.checked_bars`, prices up to
    `max_price`) before any of it is kept."""
    sessions = sessions_between(since, until)
    result = Fetched(pd.DataFrame(columns=list(FEED_COLUMNS)))
    if len(sessions) == 0:
        return result
    if fetch_timeout is not None:
        access = dataclasses.replace(access, deadline=time.monotonic() + fetch_timeout)
    parts = []
    with httpx.Client(timeout=access.timeout, follow_redirects=False) as http:
        for n, ticker in enumerate(tickers, 1):
            if access.deadline is not None and time.monotonic() >= access.deadline:
                raise ProviderError(
                    f"{provider.name}: the fetch passed its {fetch_timeout:g} s "
                    f"(EQRISK_FEED_FETCH_TIMEOUT_S) at {ticker} ({n}/{len(tickers)}): nothing "
                    "written; raise it, fetch fewer --symbols, or try again later"
                )
            progress(f"{provider.name} {ticker} ({n}/{len(tickers)})")
            anchor = anchors.get(ticker)
            start = min(anchor.day.date(), since) if anchor is not None else since

            def call(ticker: str = ticker, start: date = start) -> pd.DataFrame:
                bars = provider.history(http, access, ticker, start, until)
                return checked_bars(bars, provider.name, ticker, (start, until), max_price)

            try:
                bars = _with_retries(call, sleep, result)
            except UnknownSymbol as exc:
                result.unknown[ticker] = str(exc)
                continue
            new = continued(bars, anchor, pd.Timestamp(since))
            new = new.loc[new["date"].isin(sessions)]
            if len(new):
                parts.append(new.assign(symbol=ticker))
    if parts:
        frame = pd.concat(parts, ignore_index=True).loc[:, list(FEED_COLUMNS)]
        result.frame = frame.sort_values(["date", "symbol"]).reset_index(drop=True)
    return result


def _with_retries(
    call: Callable[[], pd.DataFrame], sleep: Callable[[float], None], result: Fetched
) -> pd.DataFrame:
    """The call, retried after a rate limit's wait (its Retry-After, else 1, 2, 4 s)."""
    for attempt in range(RETRIES + 1):
        try:
            return call()
        except RateLimited as exc:
            wait = exc.retry_after if exc.retry_after is not None else float(2**attempt)
            if attempt == RETRIES or wait > MAX_WAIT:
                raise RateLimited(
                    f"{exc}; still rate limited after {attempt + 1} tries: try again later",
                    exc.retry_after,
                ) from None
            result.waits += 1
            sleep(wait)
    raise AssertionError("unreachable")


def write_feed(frame: pd.DataFrame, path: Path, home: Path | None = None) -> Path:
    """The fetched sessions as a LONG CSV that `eqrisk ingest --merge` / `update` read: dates
    in the date format the data set under `home` was ingested with (a merge reads every file
    with it), else ISO."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = frame.copy()
    found = stored(home) if home is not None else None
    recorded = stored_basis(found.meta)["date_format"] if found is not None else None
    pattern = format_pattern(str(recorded)) if recorded else "%Y-%m-%d"
    out["date"] = pd.to_datetime(out["date"]).dt.strftime(pattern)
    out.to_csv(path, index=False)  # floats as their shortest exact text
    return path
