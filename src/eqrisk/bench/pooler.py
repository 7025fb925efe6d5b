"""A real PgBouncer (Debian's `pgbouncer` package) in transaction pool mode on a free port, in
front of the machine's PostgreSQL; started by `eqrisk bench pgbouncer` and the tests, stopped
on exit.

PgBouncer refuses to run as root: under root it is started with `-u nobody` (it reads its
configuration before it drops to that user). Its log goes to an unnamed file (`log()`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from eqrisk.bench.served import free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    return Path(PGBOUNCER).is_file()


class PgBouncer:
    """PgBouncer at `url_for(database_url)`: a pool of `pool_size` server connections per
    database, any number of clients (up to `max_clients`). `timeout_ms` is the server's
    statement and idle-in-transaction timeouts, set on each server connection
    (`connect_query`), as docs/decisions/connections.md tells operators to."""

    def __init__(
        self,
        folder: Path,
        *,
        pool_size: int = 20,
        max_clients: int = 2000,
        timeout_ms: int = 5000,
    ) -> None:
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        users = folder / "users.txt"
        users.write_text('"postgres" ""\n')
        config = folder / "pgbouncer.ini"
        server_setup = (
            f"SET statement_timeout = {timeout_ms}; "
            f"SET idle_in_transaction_session_timeout = {timeout_ms}"
        )
        config.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port=5432 connect_query='{server_setup}'\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "reserve_pool_size = 0\n"
            f"max_client_conn = {max_clients}\n"
            "server_reset_query =\n"
        )
        user = ["-u", "nobody"] if os.geteuid() == 0 else []
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen(
            [PGBOUNCER, *user, str(config)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def url_for(self, database_url: str) -> str:
        """`database_url` (the real server's) pointed at this PgBouncer instead."""
        url = make_url(database_url).set(host="127.0.0.1", port=self.port)
        return url.render_as_string(hide_password=False)

    def log(self) -> str:
        fd = self._log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def __enter__(self) -> PgBouncer:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}):\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not start:\n{self.log()}")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self._log.close()
