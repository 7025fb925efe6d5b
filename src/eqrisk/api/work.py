"""The work threads: where the heavier calls plan and render, off the event loop
(docs/decisions/request-path.md).

A `threaded` endpoint's plan and render, and every estimate, run in the app's work pool
(`EQRISK_WORK_THREADS` threads, bounded: further calls queue for a free thread), so the event
loop keeps answering `/api/health` and the cheap routes while they run. Each piece's CPU time
is measured in its thread (`time.thread_time`) and added up per request; a call whose plan and
render used more than `EQRISK_CPU_BUDGET_MS` is answered 503 SERVICE_UNAVAILABLE, and, not
being a 2xx, is not charged. The position and ticker caps of the routes keep every valid call
well under the budget (docs/BENCHMARKS.md): the budget is what stops the one that is not.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.requests import Request

from eqrisk.api.errors import ApiError

R = TypeVar("R")

POOL = "work_pool"
BUDGET = "cpu_budget_s"
_USED = "eqrisk.cpu_s"  # the request scope's running total of its work threads' CPU


def work_pool(threads: int, initializer: Callable[[], None] | None = None) -> ThreadPoolExecutor:
    """The app's work threads (`initializer`: the app lowers their CPU priority below the
    event loop's, as the render pool's)."""
    return ThreadPoolExecutor(threads, thread_name_prefix="work", initializer=initializer)


def cpu_used(request: Request) -> float:
    """CPU seconds this request's plan and render have used in the work threads so far."""
    return float(request.scope.get(_USED, 0.0))


async def offload(request: Request, fn: Callable[..., R], *args: Any) -> R:
    """`fn(*args)` in the app's work pool (inline where the app has none); its thread CPU
    time added to the request's, and a 503 when the total passes the budget."""
    state = request.app.state
    pool: ThreadPoolExecutor | None = getattr(state, POOL, None)
    context = contextvars.copy_context()

    def timed() -> tuple[R, float]:
        start = time.thread_time()
        out = context.run(fn, *args)
        return out, time.thread_time() - start

    if pool is None:
        out, used = timed()
    else:
        out, used = await asyncio.get_running_loop().run_in_executor(pool, timed)
    total = cpu_used(request) + used
    request.scope[_USED] = total
    budget: float | None = getattr(state, BUDGET, None)
    if budget is not None and total > budget:
        raise ApiError(
            "SERVICE_UNAVAILABLE",
            f"this call used {total * 1000:.0f} ms of CPU, over the {budget * 1000:.0f} ms a "
            "call may use (EQRISK_CPU_BUDGET_MS); it is not charged: ask for less (fewer "
            "positions or tickers, a shorter range)",
            cpu_ms=round(total * 1000, 1),
            budget_ms=round(budget * 1000, 1),
        )
    return out
