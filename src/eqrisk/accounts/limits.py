"""Per-key rate limits with the `limits` library (moving window): in process memory for a single
server process, in Redis when `EQRISK_REDIS_URL` is set so that every worker and host shares
one count per key."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache

from limits import RateLimitItem, parse, storage, strategies


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    reset_time: float  # unix time when the window frees a request

    def headers(self) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(math.ceil(self.reset_time)),
        }

    @property
    def retry_after(self) -> int:
        return max(1, math.ceil(self.reset_time - time.time()))


@lru_cache(maxsize=64)
def _item(spec: str) -> RateLimitItem:
    return parse(spec)


class RateLimiter:
    def __init__(self, redis_url: str | None = None) -> None:
        backend = storage.storage_from_string(redis_url) if redis_url else storage.MemoryStorage()
        self.blocking = redis_url is not None  # a network round trip per hit
        self._limiter = strategies.MovingWindowRateLimiter(backend)

    def hit(self, key_id: str, spec: str) -> Decision:
        """Count one request of `key_id` against `spec` (e.g. "5/minute") unless it is over."""
        item = _item(spec)
        allowed = self._limiter.hit(item, "eqrisk", key_id)
        stats = self._limiter.get_window_stats(item, "eqrisk", key_id)
        return Decision(
            allowed=allowed,
            limit=item.amount,
            remaining=max(0, stats.remaining),
            reset_time=stats.reset_time,
        )
