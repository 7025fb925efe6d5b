"""A Python client of both eqrisk services (`Client`, `AsyncClient`), its typed errors and the portfolio hedge.

A leaf package: it imports httpx, pandas and pyarrow, never the server's modules, so it can be
used where the server's dependencies are not installed.
"""

from eqrisk.client.aio import AsyncClient
from eqrisk.client.client import DEFAULT_URL, DEMO_KEY, Client
from eqrisk.client.errors import (
    AccountInactive,
    AuthenticationError,
    DemoRestricted,
    EqriskError,
    InsufficientBalance,
    InvalidParameter,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    ServiceUnavailable,
)
from eqrisk.client.frames import LastCall, Portfolio
from eqrisk.client.risk import PortfolioRisk

__all__ = [
    "DEFAULT_URL",
    "DEMO_KEY",
    "AccountInactive",
    "AsyncClient",
    "AuthenticationError",
    "Client",
    "DemoRestricted",
    "EqriskError",
    "InsufficientBalance",
    "InvalidParameter",
    "LastCall",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "Portfolio",
    "PortfolioRisk",
    "RateLimited",
    "ServiceUnavailable",
]
