"""Typed exceptions built from the services' problem+json answers.

The machine code (`error`) decides the class, the HTTP status is the fallback: callers catch
`InsufficientBalance` or `RateLimited` instead of parsing bodies, and every exception keeps the
parsed body and the request id so support can find the call in the server's log.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import httpx


class EqriskError(Exception):
    """Any error answer of either service (status >= 400)."""

    def __init__(self, status: int, code: str, detail: str, body: Any, request_id: str | None):
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body
        self.request_id = request_id
        super().__init__(
            f"{status} {code}: {detail}" + (f" (request {request_id})" if request_id else "")
        )

    def _field(self, name: str) -> Any:
        return self.body.get(name) if isinstance(self.body, dict) else None


class AuthenticationError(EqriskError):
    """401: no key, or an unknown or revoked key."""


class InsufficientBalance(EqriskError):
    """402: the balance does not cover the call (`balance_usd`, `required_usd`)."""

    @property
    def balance_usd(self) -> float | None:
        value = self._field("balance_usd")
        return None if value is None else float(value)

    @property
    def required_usd(self) -> float | None:
        value = self._field("required_usd")
        return None if value is None else float(value)


class PermissionDenied(EqriskError):
    """403 of any kind (the base of the two below)."""


class DemoRestricted(PermissionDenied):
    """403 DEMO_RESTRICTED: the demo key covers seven tickers and small calls only."""

    @property
    def allowed_tickers(self) -> list[str]:
        return list(self._field("allowed_tickers") or [])


class AccountInactive(PermissionDenied):
    """403 ACCOUNT_INACTIVE: the account is suspended or not verified for metered calls."""


class NotFound(EqriskError):
    """404: unknown ticker (`suggestions`), no data for the request (NO_DATA), unknown route."""

    @property
    def suggestions(self) -> list[str]:
        return list(self._field("suggestions") or [])


class InvalidParameter(EqriskError):
    """400: a missing, unknown or invalid parameter (`parameters`, `accepted`)."""

    @property
    def accepted(self) -> Any:
        return self._field("accepted")

    @property
    def parameters(self) -> Any:
        return self._field("parameters") or self._field("parameter")


class PayloadTooLarge(EqriskError):
    """413/414/431: the request body, URI or headers are over the server's limits."""


class RateLimited(EqriskError):
    """429: over the key's rate limit; `retry_after` seconds from the Retry-After header."""

    def __init__(self, *args: Any, retry_after: float | None = None) -> None:
        super().__init__(*args)
        self.retry_after = retry_after


class ServiceUnavailable(EqriskError):
    """503: the server has no model snapshot to serve (yet)."""


_BY_CODE: dict[str, type[EqriskError]] = {
    "DEMO_RESTRICTED": DemoRestricted,
    "ACCOUNT_INACTIVE": AccountInactive,
    "TICKER_NOT_FOUND": NotFound,
    "NO_DATA": NotFound,
    "NOT_FOUND": NotFound,
    "INVALID_PARAMETER": InvalidParameter,
    "MISSING_PARAMETER": InvalidParameter,
}
_BY_STATUS: dict[int, type[EqriskError]] = {
    400: InvalidParameter,
    401: AuthenticationError,
    402: InsufficientBalance,
    403: PermissionDenied,
    404: NotFound,
    413: PayloadTooLarge,
    414: PayloadTooLarge,
    431: PayloadTooLarge,
    429: RateLimited,
    503: ServiceUnavailable,
}


class WithHeaders(Protocol):
    """An answer with headers (an httpx.Response, a price provider's checked answer)."""

    @property
    def headers(self) -> httpx.Headers: ...


def retry_after_of(response: WithHeaders) -> float | None:
    """Seconds from a Retry-After header given in seconds (the services never send a date)."""
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def error_from(response: httpx.Response) -> EqriskError:
    """The typed exception for an error answer; a non-JSON body keeps its text as the detail."""
    try:
        body: Any = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = response.text
    if isinstance(body, dict):
        code = str(body.get("error") or f"HTTP_{response.status_code}")
        detail = str(body.get("message") or body.get("detail") or code)
    else:
        code = f"HTTP_{response.status_code}"
        detail = str(body)[:2000] or f"HTTP {response.status_code} (empty error body)"
    request_id = response.headers.get("x-request-id")
    if request_id is None and isinstance(body, dict):
        request_id = body.get("request_id")
    args = (response.status_code, code, detail, body, request_id)
    if response.status_code == 429:
        return RateLimited(*args, retry_after=retry_after_of(response))
    cls = _BY_CODE.get(code) or _BY_STATUS.get(response.status_code, EqriskError)
    if code in ("AUTHENTICATION_REQUIRED", "INVALID_API_KEY"):
        cls = AuthenticationError
    return cls(*args)
