"""`eqrisk serve --workers 2`: kill -9 of the serving process takes its workers with it, and
the port can be bound again (a restart no longer fails with "Address already in use")."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from helpers import Server, is_alive


def test_workers_exit_when_the_serving_process_is_killed(demo_home: Path) -> None:
    server = Server(demo_home, workers=2)
    with server:
        deadline = time.monotonic() + 30
        while len(server.workers()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = server.workers()
        assert len(workers) == 2, server.log()
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while any(is_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(is_alive(pid) for pid in workers), server.log()
        # Nothing listens on the port any more: it binds (as uvicorn binds it) and refuses
        # connections.
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", server.port))
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", server.port)) != 0
