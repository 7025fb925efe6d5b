"""Charge transactions answered with an error while their outcome was unknown, kept until the
database says what became of them (docs/decisions/outages.md).

When a COMMIT gets no answer and the database cannot be asked either (a partition), the charge
writer answers the group's requests 503 at once, and records the transaction here before it
does: in memory, and as one small file under `<home>/charges-in-doubt/` so that a process that
dies meanwhile leaves the work to the next charge writer that starts (any worker; taking
charges back twice changes nothing, `accounts/pg.py`). Once the database answers, each recorded
transaction that did commit has its charges taken back, and its record is dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("eqrisk.accounts")

JOURNAL_DIR = "charges-in-doubt"


@dataclass(frozen=True)
class Doubt:
    """A charge transaction (`xid`, of server process `pid`) whose requests were answered with
    an error although it may have committed."""

    xid: str
    pid: int | None
    request_ids: tuple[str, ...] = ()


class InDoubt:
    """The recorded `Doubt`s of this process (and those left by others in `journal`)."""

    def __init__(self, journal: Path | None = None) -> None:
        self.journal = journal
        self._items: dict[str, Doubt] = {}

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[Doubt]:
        return list(self._items.values())

    def add(self, doubt: Doubt) -> None:
        """Record `doubt` in memory and on disk, synced (the error answers go out after this).
        A journal that cannot be written (a full disk) leaves the record in memory only: it is
        still settled while this process lives."""
        self._items[doubt.xid] = doubt
        if self.journal is None:
            return
        text = json.dumps(
            {"xid": doubt.xid, "pid": doubt.pid, "request_ids": list(doubt.request_ids)}
        )
        try:
            self.journal.mkdir(parents=True, exist_ok=True)
            with open(self.journal / f"{doubt.xid}.json", "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
        except OSError as exc:
            logger.warning("charges in doubt of transaction %s not journaled: %s", doubt.xid, exc)

    def adopt(self) -> int:
        """Take on the records other processes left in the journal; how many were new."""
        if self.journal is None or not self.journal.is_dir():
            return 0
        found = 0
        for path in sorted(self.journal.glob("*.json")):
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                doubt = Doubt(str(doc["xid"]), doc.get("pid"), tuple(doc.get("request_ids", ())))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written, or already settled by another process
            if doubt.xid not in self._items:
                self._items[doubt.xid] = doubt
                found += 1
        return found

    def drop(self, doubt: Doubt) -> None:
        """`doubt` is settled: forget it (here and on disk)."""
        self._items.pop(doubt.xid, None)
        if self.journal is not None:
            with contextlib.suppress(FileNotFoundError):
                (self.journal / f"{doubt.xid}.json").unlink()
