"""Card verification through a payment-provider interface.

The default provider is the operator (`eqrisk accounts verify ACCOUNT`). A real provider confirms
through the signed webhook `POST /api/webhooks/payment`: the body is JSON
`{"event_id", "type": "card.verified", "account_id", "reference"}` and the header
`X-Eqrisk-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + raw body)>`.
A signature that does not match, a timestamp outside the tolerance, or an event id seen before
is refused and grants nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from eqrisk.accounts.book import Accounts

SIGNATURE_HEADER = "x-eqrisk-signature"
DEFAULT_TOLERANCE_S = 300
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


class PaymentProvider(Protocol):
    """Something that can tell eqrisk an account's card is verified."""

    name: str

    def confirm_card(self, account_id: str, reference: str | None = None) -> bool: ...


@dataclass
class OperatorProvider:
    """The operator confirms a card by hand (after checking it out of band)."""

    accounts: Accounts
    name: str = "operator"

    def confirm_card(self, account_id: str, reference: str | None = None) -> bool:
        return self.accounts.verify_card(account_id, provider=self.name, reference=reference)


class WebhookError(ValueError):
    """Why a webhook call was refused (the message is safe to return to the caller)."""


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The signature header value a provider sends for `body` at `timestamp`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(
    secret: str,
    header: str | None,
    body: bytes,
    *,
    now: float | None = None,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
    decode: Callable[[bytes], Any] = json.loads,
) -> dict[str, Any]:
    """Check the signature and timestamp of a webhook call; return the event, the body as
    `decode` reads it (the HTTP route passes its one body parser; a ValueError from it is
    a refusal). A header of any other shape, whatever its bytes, is refused (WebhookError)."""
    if not header:
        raise WebhookError(f"missing {SIGNATURE_HEADER} header")
    fields = dict(part.strip().split("=", 1) for part in header.split(",") if "=" in part)
    stamp, given = fields.get("t", ""), fields.get("v1", "")
    if not _TIMESTAMP.fullmatch(stamp) or not _HEX_SHA256.fullmatch(given):
        raise WebhookError("signature header must be 't=<unix seconds>,v1=<64 hex digits>'")
    timestamp = int(stamp)
    expected = sign(secret, body, timestamp).split("v1=", 1)[1]
    if not hmac.compare_digest(given.lower().encode("ascii"), expected.encode("ascii")):
        raise WebhookError("signature does not match the body")
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance_s:
        raise WebhookError(f"timestamp is more than {tolerance_s}s away from the server's clock")
    try:
        event = decode(body)
    except ValueError as exc:
        raise WebhookError(f"body is not JSON ({exc})") from exc
    if not isinstance(event, dict) or not all(
        isinstance(event.get(k), str) and event.get(k) for k in ("event_id", "type", "account_id")
    ):
        raise WebhookError("event needs string fields event_id, type and account_id")
    if event["type"] != "card.verified":
        raise WebhookError(f"unsupported event type {event['type']!r}; accepted: card.verified")
    return event
