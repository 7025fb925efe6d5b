"""Stripe, through its official SDK (`pip install 'eqrisk[payments]'`): the calls the
self-service routes make, and the check of its signed webhook events.

- A sign-up's card: a SetupIntent (`usage: off_session`) whose client secret the
  page confirms with Stripe.js; eqrisk never sees card numbers. The card counts as verified only
  when Stripe's signed `setup_intent.succeeded` arrives; its PaymentMethod's `card.fingerprint`
  is what "one starting credit per card" compares.
- A top-up: a PaymentIntent in USD for one of the operator's amounts, credited on the signed
  `payment_intent.succeeded`.
- Events: `Stripe-Signature` checked by `construct_event` (HMAC-SHA256 over "<t>." + raw body,
  timestamp within the tolerance); the SDK parses the body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

SIGNATURE_HEADER = "stripe-signature"
T = TypeVar("T")


class StripeMissing(RuntimeError):
    """Stripe is configured but its SDK is not installed."""


class ProviderError(RuntimeError):
    """Stripe did not answer, or refused a call eqrisk made (message safe to return)."""


class EventRejected(ValueError):
    """A webhook call that is not a genuine, fresh Stripe event (message safe to return)."""


@dataclass(frozen=True)
class Intent:
    id: str
    client_secret: str


class StripeGateway:
    """One Stripe account: its secret key, its webhook secret, and optionally another API
    address (a local stand-in in tests)."""

    def __init__(
        self,
        secret_key: str,
        webhook_secret: str,
        *,
        api_base: str | None = None,
        tolerance_s: int = 300,
    ) -> None:
        try:
            import stripe
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise StripeMissing("Stripe is configured: pip install 'eqrisk[payments]'") from exc
        self._stripe = stripe
        options: dict[str, Any] = {"max_network_retries": 2}
        if api_base:
            options["base_addresses"] = {"api": api_base.rstrip("/")}
        self.client = stripe.StripeClient(secret_key, **options)
        self.webhook_secret = webhook_secret
        self.tolerance_s = tolerance_s

    def _call(self, work: Callable[[], T]) -> T:
        try:
            return work()
        except self._stripe.StripeError as exc:
            raise ProviderError(
                f"Stripe did not accept the call: {exc.user_message or exc}"
            ) from exc

    def setup_card(self, account_id: str) -> Intent:
        """A SetupIntent for the sign-up's card, tagged with the account."""
        return self._call(lambda: self._setup_card(account_id))

    def _setup_card(self, account_id: str) -> Intent:
        intent = self.client.v1.setup_intents.create(
            params={
                "usage": "off_session",
                "metadata": {"account_id": account_id},
            }
        )
        return Intent(intent.id, str(intent.client_secret))

    def payment(self, account_id: str, amount_cents: int) -> Intent:
        """A PaymentIntent for a top-up of `amount_cents` US cents."""
        return self._call(lambda: self._payment(account_id, amount_cents))

    def _payment(self, account_id: str, amount_cents: int) -> Intent:
        intent = self.client.v1.payment_intents.create(
            params={
                "amount": amount_cents,
                "currency": "usd",
                "metadata": {"account_id": account_id, "purpose": "eqrisk top-up"},
            }
        )
        return Intent(intent.id, str(intent.client_secret))

    def fingerprint(self, payment_method: str) -> str:
        """The card's fingerprint (the same card gives the same one on every account)."""
        method = self._call(
            lambda: self.client.v1.payment_methods.retrieve(payment_method).to_dict()
        )
        card = method.get("card")
        value = card.get("fingerprint") if card else None
        if not value:
            raise EventRejected(f"payment method {payment_method} has no card fingerprint")
        return str(value)

    def event(self, body: bytes, header: str | None) -> dict[str, Any]:
        """The event of a webhook call, as a plain dict, if its signature is Stripe's and
        fresh; else EventRejected (a forged, altered or stale call)."""
        if not header:
            raise EventRejected("missing Stripe-Signature header")
        try:
            event = self.client.construct_event(
                body, header, self.webhook_secret, tolerance=self.tolerance_s
            )
        except self._stripe.SignatureVerificationError as exc:
            raise EventRejected(f"signature refused: {exc.user_message or exc}") from None
        except ValueError as exc:
            raise EventRejected(f"body is not a Stripe event ({exc})") from None
        result: dict[str, Any] = event.to_dict()
        return result
