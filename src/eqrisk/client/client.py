"""`Client`: one method per route of both eqrisk services, over httpx.

Service B (risk metrics) lives under `/api` with the key as `Authorization: Bearer`; Service A
(daily data) at the root with the key in the `apikey` header. The client sends each the header
it reads. Time series come back as pandas DataFrames (Parquet on the wire where the route has it:
typed columns and no JSON parsing); errors raise the typed exceptions of `errors.py`. The
methods are defined once for both clients, in the mixins (`service_methods.py`,
`dropin_methods.py`, `account_methods.py`, `risk.py`, bound by `bind.method`): a client only
sends (`_run`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import httpx

from eqrisk.client import calls
from eqrisk.client.account_methods import AccountMethods
from eqrisk.client.bind import Runs
from eqrisk.client.calls import Call
from eqrisk.client.dropin_methods import DropinMethods
from eqrisk.client.frames import LastCall
from eqrisk.client.risk import RiskMethods
from eqrisk.client.service_methods import ServiceAMethods, ServiceBMethods

DEFAULT_URL = "http://127.0.0.1:8000"
DEMO_KEY = "eqrisk-demo"
T = TypeVar("T")


class _Config:
    """Where and how to call: `url` and `api_key` default to `EQRISK_URL` / `EQRISK_API_KEY`,
    then to the local server and the demo key (a trailing `/api` is dropped: both services hang
    off the root). `retry_rate_limited` > 0 waits out a 429 (its Retry-After) and retries that
    many times, but never waits more than `max_wait` seconds at once."""

    def __init__(
        self, url: str | None, api_key: str | None, retry_rate_limited: int, max_wait: float
    ) -> None:
        base = (url or os.environ.get("EQRISK_URL") or DEFAULT_URL).rstrip("/")
        self.url = base.removesuffix("/api")
        self.api_key = api_key or os.environ.get("EQRISK_API_KEY") or DEMO_KEY
        self.retry_rate_limited = retry_rate_limited
        self.max_wait = max_wait
        self.last_call: LastCall | None = None


class _AsyncBridge(httpx.BaseTransport):
    """Runs an async transport (an `httpx.ASGITransport` over the app) under the sync client,
    so the same `Client` works in process: each request in its own short event loop."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def run() -> httpx.Response:
            response = await self.inner.handle_async_request(request)
            # The body as sent (a compressed answer stays compressed): the client decodes it.
            content = b"".join([part async for part in response.aiter_raw()])
            await response.aclose()
            return httpx.Response(response.status_code, headers=response.headers, content=content)

        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: the usual case
            return asyncio.run(run())
        # Called from async code (a notebook's loop): a loop of its own in a worker thread.
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, run()).result()


class Client(
    _Config, Runs, ServiceBMethods, ServiceAMethods, DropinMethods, AccountMethods, RiskMethods
):
    """A client of both services (see `_Config` for the configuration).

    `transport` is any httpx transport, sync or async (an `httpx.ASGITransport(app)` runs the
    app in process). `last_call` holds the price, balance and model version the server sent
    with the last answer, error or not.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 120.0,
        retry_rate_limited: int = 0,
        max_wait: float = 60.0,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(url, api_key, retry_rate_limited, max_wait)
        self._sleep = sleep
        if isinstance(transport, httpx.AsyncBaseTransport):
            transport = _AsyncBridge(transport)
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout, transport=transport, follow_redirects=True
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, call: Call[T]) -> T:
        """One call, retried on 429 as configured; an error answer raises its typed exception."""
        attempts = 0
        while True:
            response = self._http.request(
                call.method,
                call.path,
                params=call.query(),
                json=call.body,
                headers=call.headers(self.api_key),
            )
            self.last_call = LastCall.of(response)
            if response.status_code < 400:
                return call.read(response)
            wait = calls.retry_wait(response, attempts, self.retry_rate_limited, self.max_wait)
            attempts += 1
            self._sleep(wait)
