"""The sign-up and account pages in real headless Chromium (Debian's, as the dashboard's tests)
against `eqrisk serve` connected to localstripe, whose stand-in Stripe.js draws the card fields:
the sign-up page walked to a working key, the account page to a credited top-up, with no error
in the browser's log. Writes the pages' screenshots into the test's temporary folder (or
EQRISK_SCREENSHOTS), never into the clone's docs/screenshots."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eqrisk.accounts.book import STARTING_CREDIT_TOKENS
from helpers import Server, bearer
from stripe_local import SECRET_KEY, WEBHOOK_SECRET, pay, stripe_env

stripe = pytest.importorskip("stripe")

CHROMIUM = Path(os.environ.get("EQRISK_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("EQRISK_CHROMEDRIVER", "/usr/bin/chromedriver"))
WAIT_S = 60


@pytest.fixture()
def browser() -> Iterator[Any]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        why = f"{', '.join(missing)} not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("EQRISK_SKIP_BROWSER") == "1":
            pytest.skip(f"EQRISK_SKIP_BROWSER=1 and {why}")
        pytest.fail(f"the page tests need Debian's Chromium: {why}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        f"--user-data-dir={tempfile.mkdtemp(prefix='eqrisk-chromium-')}",
        "--window-size=1100,900",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_script_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait_js(driver: Any, script: str, timeout: float = WAIT_S) -> Any:
    """Poll `script` (a JS function body) until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            logs = [e["message"] for e in driver.get_log("browser")]
            raise AssertionError(f"timed out waiting for: {script}\nbrowser log: {logs}")
        time.sleep(0.1)


def fill(driver: Any, css: str, text: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, css).send_keys(text)


def click(driver: Any, css: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, css).click()


def errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_the_pages_walk_a_sign_up_to_a_key_and_the_account_to_a_top_up(
    home: Path, stripe_base: str, browser: Any, tmp_path: Path
) -> None:
    shots = Path(os.environ.get("EQRISK_SCREENSHOTS") or tmp_path)
    sdk = stripe.StripeClient(SECRET_KEY, base_addresses={"api": stripe_base})
    with Server(home, **stripe_env(stripe_base)) as server:
        httpx.post(
            f"{stripe_base}/_config/webhooks/pages",
            json={"url": f"{server.base}/api/webhooks/stripe", "secret": WEBHOOK_SECRET},
        ).raise_for_status()
        browser.get(f"{server.base}/signup")
        wait_js(browser, "return !document.getElementById('signup-form').hidden")
        fill(browser, "#signup-name", "Grace Hopper")
        fill(browser, "#signup-email", "grace@example.com")
        click(browser, "#signup-submit")
        # The stand-in Stripe.js draws plain inputs named by placeholder in the card's box.
        wait_js(browser, "return document.querySelector('#card-element input')")
        for field, value in (
            ("number", "4242424242424242"),
            ("exp_month", "12"),
            ("exp_year", "31"),
            ("cvc", "123"),
            ("postal_code", "10001"),
        ):
            fill(browser, f"#card-element input[placeholder='{field}']", value)
        click(browser, "#card-submit")
        key = wait_js(
            browser, "const k = document.getElementById('new-key'); return k && k.textContent"
        )
        assert key.startswith("eqk_")
        assert "20.00 USD" in browser.find_element("id", "result").text
        shots.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(shots / "signup-desktop.png"))
        api = httpx.Client(base_url=server.base, headers=bearer(key), timeout=30)
        paid = api.get("/api/metrics/NVDA")
        assert paid.status_code == 200
        cost = int(paid.headers["X-Tokens-Consumed"])

        browser.get(f"{server.base}/account")
        wait_js(browser, "return document.getElementById('key-input')")
        fill(browser, "#key-input", key)
        click(browser, "#key-form button")
        wait_js(browser, "return document.getElementById('balance').textContent")
        # The chart shows the paid call: one bar, the metrics route, its price in USD.
        bars = wait_js(
            browser,
            "const c = document.getElementById('usage-chart');"
            "return c.data && c.data.length && c.data.map(t => [t.name, t.y]);",
        )
        assert bars == [["metrics", [cost * 0.00002]]]
        keys = wait_js(browser, "return document.querySelectorAll('#keys tbody tr').length")
        assert keys == 1
        click(browser, "#topup button[data-amount='10']")
        intent = wait_js(
            browser,
            "const b = document.getElementById('topup-pay'); return b.dataset.paymentIntent",
        )
        # localstripe's stand-in Stripe.js cannot pay a PaymentIntent with card fields: the
        # card pays on Stripe's side, and the page waits for the credit its event brings.
        pay(sdk, intent)
        wait_js(
            browser,
            "return document.getElementById('topup-status').textContent.includes('Credited')",
        )
        balance = api.get("/api/balance").json()["balance_tokens"]
        assert balance == STARTING_CREDIT_TOKENS - cost + 10 * 100 * 500
        assert f"{balance * 0.00002:.5f}" in browser.find_element("id", "balance").text
        browser.save_screenshot(str(shots / "account-desktop.png"))
        assert errors(browser) == []
        api.close()
