"""Authenticated keys remembered for at most a second, so that a busy key costs no database read.

What a key record says (its account, state, limit, the balance when it was read) may be up to
`ttl_s` old: a revoked key, a suspended account, is refused by every request that starts more
than `ttl_s` after the change made by another process (the CLI, another worker), and at once
after a change made through this process's `Accounts` (`book.access_generation`). A charge
never relies on it: the charge's transaction refuses a revoked key or an inactive account. The balance is only a first check: the charge decides on the
account's row in its own transaction, and a request the remembered balance would refuse is
looked up again before it is (a credit is never missed). Unknown keys are not remembered (a key
created a moment ago works at once). Entries are stored under the key's SHA-256, never the key.

While the database is unavailable (docs/decisions/outages.md) a key this process remembers,
however old its entry, is still let in: free calls go on answering for known keys, and a priced
call is refused by its charge (503) whatever the entry says. An unknown key is a 503 then.
"""

from __future__ import annotations

import time
from dataclasses import replace

from eqrisk.accounts.backends import BackendUnavailable
from eqrisk.accounts.book import Accounts, KeyRecord, access_generation, hash_key

KEY_TTL_S = 1.0
MAX_KEYS = 10_000


class KeyCache:
    def __init__(self, accounts: Accounts, *, ttl_s: float = KEY_TTL_S) -> None:
        self.accounts = accounts
        self.ttl_s = ttl_s
        # digest -> (read at, access generation before the read, record)
        self._records: dict[str, tuple[float, int, KeyRecord]] = {}
        self.outage_hits = 0  # keys let in from memory while the database was unavailable

    def cached(self, key: str) -> KeyRecord | None:
        """The remembered record of `key` while it is fresh, else None (no I/O)."""
        hit = self._records.get(hash_key(key))
        if hit is None or time.monotonic() - hit[0] >= self.ttl_s or hit[1] != access_generation():
            return None
        return hit[2]

    def load(self, key: str) -> KeyRecord | None:
        """Read the key from the database and remember it (blocking: call it off the loop).
        The entry's age counts from before the read, so nothing older than the read's start
        is served for longer than `ttl_s`."""
        started = time.monotonic()
        generation = access_generation()
        digest = hash_key(key)
        try:
            with self.accounts.backend.guard():
                record = self.accounts.authenticate(key)
        except BackendUnavailable:
            hit = self._records.get(digest)
            if hit is None or hit[1] != generation:
                raise
            self.outage_hits += 1
            return hit[2]
        if record is None:
            self._records.pop(digest, None)
            return None
        if len(self._records) >= MAX_KEYS:
            self._evict(started)
        self._records[digest] = (started, generation, record)
        return record

    def note_balance(self, key: str, balance_tokens: int) -> None:
        """A charge of this key just left the account at `balance_tokens`: remember that
        (the entry keeps its age: this is not a fresh read of the state)."""
        digest = hash_key(key)
        hit = self._records.get(digest)
        if hit is not None:
            self._records[digest] = (hit[0], hit[1], replace(hit[2], balance_tokens=balance_tokens))

    def _evict(self, now: float) -> None:
        stale = [d for d, (at, _, _) in list(self._records.items()) if now - at >= self.ttl_s]
        for digest in stale:
            self._records.pop(digest, None)
        if len(self._records) >= MAX_KEYS:
            self._records.clear()
