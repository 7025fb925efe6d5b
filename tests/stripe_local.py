"""Stripe in the tests: localstripe (PyPI), a local server speaking Stripe's API and signing its
webhooks, started on a free port (tests/stripe_stand_in.py), and what the tests do on Stripe's
side with the official SDK (a card, a payment)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from helpers import free_port

SECRET_KEY = "sk_test_eqrisk"
PUBLISHABLE_KEY = "pk_test_eqrisk"
WEBHOOK_SECRET = "whsec_eqrisk_tests"


def wait_for(
    check: Callable[[], Any], timeout: float = 30.0, message: Callable[[], str] = str
) -> Any:
    """`check()`'s first truthy value, polled until `timeout` (then the test fails)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"no answer from {check} within {timeout}s\n{message()}")


def stripe_env(stripe_base: str) -> dict[str, str]:
    return {
        "EQRISK_STRIPE_SECRET_KEY": SECRET_KEY,
        "EQRISK_STRIPE_PUBLISHABLE_KEY": PUBLISHABLE_KEY,
        "EQRISK_STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "EQRISK_STRIPE_API_BASE": stripe_base,
        "EQRISK_STRIPE_JS_URL": f"{stripe_base}/js.stripe.com/v3/",
    }


def stripe_settings(stripe_base: str) -> dict[str, Any]:
    return {k.removeprefix("EQRISK_").lower(): v for k, v in stripe_env(stripe_base).items()}


def card(sdk: Any, number: str = "4242424242424242") -> str:
    method = sdk.v1.payment_methods.create(
        params={
            "type": "card",
            "card": {"number": number, "exp_month": 12, "exp_year": 2031, "cvc": "123"},
        }
    )
    return str(method.id)


def pay(sdk: Any, intent: str) -> None:
    """Pay a PaymentIntent with a card on Stripe's side (localstripe takes the card by an
    update, then a confirmation without one)."""
    sdk.v1.payment_intents.update(intent, params={"payment_method": card(sdk)})
    sdk.v1.payment_intents.confirm(intent)


@contextmanager
def local_stripe() -> Iterator[str]:
    """localstripe on a free port (its base URL), stopped on exit."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("stripe_stand_in.py")), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, "localstripe exited"
        try:
            return httpx.get(f"{base}/js.stripe.com/v3/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)
