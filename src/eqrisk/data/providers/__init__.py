"""Price feeds for the daily job: a small interface, one module per provider.

A provider answers one question: a symbol's daily bars from `start` to `end` (`history`), as a
frame of `BAR_COLUMNS` with the RAW close, the split ratio and the cash dividend on their
ex-dates (and its own adjusted close). `feed.fetch` turns those into the ingest layout.
Each provider module imports only what it needs (httpx, a dependency of eqrisk already, for
the two here); a provider whose official client library is a package of its own names it as
its optional extra and imports it inside the module.

Errors a provider raises: `UnknownSymbol` (the provider does not have it: skipped and
reported), `RateLimited` (retried after its wait), `ProviderError` (anything else: one line
that says what to fix; never the key).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any, ClassVar, Protocol

import httpx
import pandas as pd

# What `history` returns: the raw close, the provider's adjusted close, the split ratio (new
# shares per old, 1 = none) and cash dividend (per share, 0 = none) on their ex-dates.
BAR_COLUMNS = (
    "date",
    "open",
    "high",
    "low",
    "close",
    "adjusted_close",
    "volume",
    "split_coefficient",
    "dividend_amount",
)
# The modules, by provider name (imported on first use).
PROVIDERS = {
    "yahoo": "eqrisk.data.providers.yahoo",
    "tiingo": "eqrisk.data.providers.tiingo",
}


class ProviderError(Exception):
    """A provider's answer that ends the fetch: the message says what to fix."""


class UnknownSymbol(ProviderError):
    """The provider has no such symbol (or no data for it): skipped, and reported."""


class RateLimited(ProviderError):
    """Over the provider's rate limit; `retry_after` seconds when it said."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Access:
    """Where and how to reach a provider: its base URL and key (None for keyless ones)."""

    base_url: str
    api_key: str | None = None
    timeout: float = 30.0  # seconds a request may take, all of it (EQRISK_FEED_TIMEOUT_S)
    max_bytes: int = 20_000_000  # the largest answer read (EQRISK_FEED_MAX_BYTES)
    deadline: float | None = None  # the fetch's end, a time.monotonic() instant

    def __repr__(self) -> str:  # never print the key
        return f"Access(base_url={self.base_url!r}, api_key={'***' if self.api_key else None})"


class Provider(Protocol):
    """One price provider (a module-level object `PROVIDER` in its module)."""

    name: ClassVar[str]
    url: ClassVar[str]  # its public base URL
    key_setting: ClassVar[str | None]  # the setting holding its key, None when keyless

    def symbol(self, ticker: str) -> str:
        """The provider's spelling of one of our tickers (BRK.B -> BRK-B)."""
        ...

    def history(
        self, http: httpx.Client, access: Access, ticker: str, start: date, end: date
    ) -> pd.DataFrame:
        """Daily bars of `ticker` from `start` to `end` (inclusive), `BAR_COLUMNS`."""
        ...


def names() -> list[str]:
    return sorted(PROVIDERS)


def provider(name: str) -> Provider:
    """The provider called `name` (a ValueError that lists the known ones otherwise)."""
    module = PROVIDERS.get(name.strip().lower())
    if module is None:
        raise ValueError(f"unknown provider {name!r}; known providers: {', '.join(names())}")
    found: Provider = importlib.import_module(module).PROVIDER
    return found


def bars(rows: Mapping[str, Any]) -> pd.DataFrame:
    """A `history` frame from columns (missing ones: no value; factors: none)."""
    frame = pd.DataFrame(rows)
    for column in BAR_COLUMNS:
        if column not in frame:
            frame[column] = (
                1.0
                if column == "split_coefficient"
                else (0.0 if column == "dividend_amount" else float("nan"))
            )
    frame["date"] = pd.to_datetime(frame["date"]).dt.normalize()
    numeric = [c for c in BAR_COLUMNS if c != "date"]
    frame[numeric] = frame[numeric].apply(pd.to_numeric, errors="coerce").astype(float)
    frame["split_coefficient"] = frame["split_coefficient"].fillna(1.0)
    frame["dividend_amount"] = frame["dividend_amount"].fillna(0.0)
    return frame.loc[:, list(BAR_COLUMNS)].sort_values("date").reset_index(drop=True)
