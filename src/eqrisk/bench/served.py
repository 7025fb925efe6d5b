"""`eqrisk serve` in a child process, for the benches and the screenshots: started on a free
port of 127.0.0.1 with the environment given, waited for until `/api/health` answers 200, and
stopped (terminated, killed after a minute) when the block ends."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

import httpx


def free_port() -> int:
    """A port of 127.0.0.1 nobody listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Served:
    base: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen[bytes]


@contextmanager
def eqrisk_serve(
    env: Mapping[str, str],
    *args: str,
    wait_s: float = 120.0,
    stderr: IO[bytes] | None = None,
    log: Callable[[], str] | None = None,
    error: Callable[[str], Exception] = RuntimeError,
) -> Iterator[Served]:
    """`eqrisk serve --host 127.0.0.1 --port PORT *args` with `env` as its whole environment,
    once it answers. `stderr`: a file for its log (else discarded), whose end `log` reads into
    the error when it stops before answering; `error` makes what is raised then, or after
    `wait_s` seconds without an answer."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = ["serve", "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "eqrisk.cli", *command],
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if stderr is None else stderr,
    )
    try:
        deadline = time.monotonic() + wait_s
        while not _answers(base):
            if proc.poll() is not None:
                tail = f":\n{log()[-3000:]}" if log is not None else ""
                raise error(f"the server on {base} stopped (exit {proc.returncode}){tail}")
            if time.monotonic() > deadline:
                raise error(f"the server on {base} did not answer in {wait_s:.0f} s")
            time.sleep(0.2)
        yield Served(base, proc)
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes], wait_s: float = 60.0) -> None:
    """Terminate `proc`, and kill it if it has not ended after `wait_s` seconds."""
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/api/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
