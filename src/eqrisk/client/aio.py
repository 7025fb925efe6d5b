"""`AsyncClient`: the same methods as `Client`, awaited, over httpx.AsyncClient.

The methods are `Client`'s mixins, each bound as a coroutine method (`bind.method`); only the
sending (and the wait before a retried 429, `asyncio.sleep`) differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx

from eqrisk.client import calls
from eqrisk.client.account_methods import AccountMethods
from eqrisk.client.bind import AsyncRuns
from eqrisk.client.calls import Call
from eqrisk.client.client import _Config
from eqrisk.client.dropin_methods import DropinMethods
from eqrisk.client.frames import LastCall
from eqrisk.client.risk import RiskMethods
from eqrisk.client.service_methods import ServiceAMethods, ServiceBMethods

T = TypeVar("T")


class AsyncClient(
    _Config, AsyncRuns, ServiceBMethods, ServiceAMethods, DropinMethods, AccountMethods, RiskMethods
):
    """A client of both services for asyncio code; configured as `Client` (`transport`: an
    async httpx transport, for example `httpx.ASGITransport(app)` in process)."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 120.0,
        retry_rate_limited: int = 0,
        max_wait: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(url, api_key, retry_rate_limited, max_wait)
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=self.url, timeout=timeout, transport=transport, follow_redirects=True
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _run(self, call: Call[T]) -> T:
        """One call, retried on 429 as configured; an error answer raises its typed exception."""
        attempts = 0
        while True:
            response = await self._http.request(
                call.method,
                call.path,
                params=call.query(),
                json=call.body,
                headers=call.headers(self.api_key),
            )
            await response.aread()
            self.last_call = LastCall.of(response)
            if response.status_code < 400:
                return call.read(response)
            wait = calls.retry_wait(response, attempts, self.retry_rate_limited, self.max_wait)
            attempts += 1
            await self._sleep(wait)
