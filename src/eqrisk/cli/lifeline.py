"""Worker processes of `eqrisk serve --workers N` end when the serving process dies.

uvicorn's supervisor (the `eqrisk serve` process) spawns the workers, and they share its
listening socket. Killed with SIGKILL, the supervisor cannot stop them: they kept serving,
holding the port, and the next `eqrisk serve` failed with "Address already in use". Two
guards, both installed in each worker as it builds its app:

- Linux's `prctl(PR_SET_PDEATHSIG, SIGTERM)`: the kernel sends SIGTERM when the parent dies
  (uvicorn's own handler then shuts the worker down: requests in progress finish);
- a watchdog thread that polls the parent's pid every `POLL_S` (any system; and on Linux the
  case where the parent died before the prctl call): SIGTERM to itself, and `os._exit` after
  `GRACE_S` if the graceful shutdown has not ended the process by then.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_S = 0.5
GRACE_S = 10.0


def _death_signal(sig: int) -> bool:
    """Ask the kernel for `sig` when the parent dies (Linux); False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _stop(grace_s: float) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os._exit(1)  # the graceful shutdown did not finish: the parent is gone, so are we


def _watch(parent_pid: int, poll_s: float, grace_s: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    _stop(grace_s)


def follow_parent(*, poll_s: float = POLL_S, grace_s: float = GRACE_S) -> bool:
    """In a process spawned by multiprocessing (a uvicorn worker): end it when its parent
    dies. Returns False in a process that has no such parent (`serve` with one worker runs
    the app in the serving process itself), True once the guards are installed."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None:
        return False
    _death_signal(signal.SIGTERM)
    # The parent may have died before the prctl call (then the kernel sends nothing): the
    # watchdog's first look sees another parent pid and stops the worker.
    threading.Thread(
        target=_watch, args=(parent.pid, poll_s, grace_s), name="lifeline", daemon=True
    ).start()
    return True
