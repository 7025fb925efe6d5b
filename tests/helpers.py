"""What several test modules share: the one problem+json assertion, a real `eqrisk serve` in a
child process, free ports, funded accounts with keys, and a small market to build. Imported as
`helpers` (tests/ is on sys.path: the root conftest lives there); fixtures stay in the conftest
files."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.api.app import create_app
from eqrisk.data.calendar import sessions_between
from eqrisk.data.ingest import ingest
from eqrisk.settings import Settings

TEST_KEY = "test-key-1-not-secret"
WEBHOOK_SECRET = "whsec-test-secret"
REDIS_URL = "redis://127.0.0.1:6379/0"
REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"  # the real data sets, beside the checkout
PROBLEM_TYPE = "application/problem+json"
PROBLEM_KEYS = {"type", "title", "status", "detail", "error", "request_id"}


# ------------------------------------------------------------------------------ errors


def assert_problem(resp: Any, status: int, code: str) -> dict[str, Any]:
    """`resp` is the one error shape: problem+json with this status and machine code, a
    sentence for the caller, an error type URN and the request id of its response header."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM_TYPE
    body: dict[str, Any] = resp.json()
    assert set(body) >= PROBLEM_KEYS
    assert body["status"] == status and body["error"] == code
    assert body["detail"]
    assert body["type"].startswith("urn:eqrisk:error:")
    assert body["request_id"] == resp.headers["x-request-id"]
    return body


# ------------------------------------------------------------------------------ values


def shared_file(name: str) -> Path:
    """A file of the real data sets; the test skips where this clone has none (the answer keys
    in tests/resources keep the model's equality tests running there)."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"real data file {path} is not available")
    return path


def gics_master(gics: pd.DataFrame) -> pd.DataFrame:
    """The real `gics_constituents.csv` rows as master rows of stocks."""
    return pd.DataFrame(
        {
            "symbol": gics["Symbol"],
            "name": gics["Security"],
            "asset_type": "stock",
            "gics_sector": gics["GICS Sector"],
            "gics_sub_industry": gics["GICS Sub-Industry"],
        }
    )


def nan_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Exact equality where NaN equals NaN."""
    return bool(np.array_equal(a, b, equal_nan=True))


# A small market of 12 symbols x 374 sessions (two ETFs and ten stocks) whose builds take
# seconds: the fleet's and the supervised cluster's tests build it as an operator would.
SMALL_MARKET = ["SPY", "XLK"] + [f"S{i:02d}" for i in range(10)]


def small_market_home(folder: Path, seed: int) -> Path:
    """`folder/builder`, a home with the small market ingested (random-walk closes from
    `seed`); its price and master files are written beside it."""
    sessions = sessions_between(pd.Timestamp("2023-01-03"), pd.Timestamp("2024-06-28"))
    steps = np.random.default_rng(seed).normal(0.0, 0.01, (len(sessions), len(SMALL_MARKET)))
    close = pd.DataFrame(
        100 * np.exp(np.cumsum(steps, axis=0)), index=sessions, columns=SMALL_MARKET
    )
    close.index.name = "date"
    close.to_csv(folder / "wide.csv")
    master = pd.DataFrame({"symbol": SMALL_MARKET[2:], "asset_type": "stock"})
    master["gics_sector"] = "Information Technology"
    master["gics_sub_industry"] = "Application Software"
    master.to_csv(folder / "master.csv", index=False)
    home = folder / "builder"
    assert ingest([folder / "wide.csv"], folder / "master.csv", home=home).ok
    return home


# ------------------------------------------------------------------------------ accounts


def register_key(home: Path, key: str = TEST_KEY, *, rate_limit: str = "1000000/minute") -> str:
    """A verified, well-funded account in `home`'s accounts database, with `key` imported as
    its key; returns the account id. Tests call the real gate with it."""
    accounts = Accounts(make_engine(home))
    account_id = accounts.create_account("tests")["account_id"]
    accounts.verify_card(account_id, provider="tests")
    accounts.credit(account_id, 10**12, "test credit")
    accounts.create_key(account_id, key=key, rate_limit=rate_limit)
    return account_id


def new_key(
    accounts: Accounts, *, verified: bool = True, rate_limit: str = "1000/minute"
) -> tuple[str, str]:
    """A new account (with the starting credit only) and a key generated for it."""
    account_id = accounts.create_account("someone")["account_id"]
    if verified:
        accounts.verify_card(account_id, provider="operator")
    key = accounts.create_key(account_id, rate_limit=rate_limit)["key"]
    return account_id, key


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def client_for(home: Path, **settings: Any) -> TestClient:
    """The real app in process over `home`, with settings overridden by keyword."""
    return TestClient(create_app(Settings(home=home, _env_file=None, **settings)))


# A stage line a command writes on stderr away from a terminal (`cli.output.stages`):
# "build: reading ingested data (0.4s)". What a failure prints is the rest.
PROGRESS_LINE = re.compile(r"^(?!error:)[^:\n]+: .* \(\d+\.\ds\)$")


def without_progress(stderr: str) -> str:
    """A command's stderr without its stage lines (what is left: errors, notes)."""
    return "\n".join(line for line in stderr.splitlines() if not PROGRESS_LINE.match(line))


# ------------------------------------------------------------------------------ the CLI


def eqrisk_cli(
    home: Path,
    *args: str,
    inherit: bool = False,
    timeout: float = 300,
    cwd: Path | None = None,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """`eqrisk ARGS` in a child process on `home`, its output captured as text. The child has
    none of this process's EQRISK_ variables unless `inherit`; `env`: more variables."""
    base = {k: v for k, v in os.environ.items() if inherit or not k.startswith("EQRISK_")}
    return subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", *args],
        env={**base, "EQRISK_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


# ------------------------------------------------------------------------------ real servers


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def uvicorn_in_thread(config: Any) -> Iterator[Any]:
    """A real uvicorn (`uvicorn.Config`) serving in this process on a thread, from when it has
    started until it is stopped at the block's end."""
    import uvicorn

    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.02)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def children_of(pid: int) -> list[int]:
    """Live child processes of `pid` (from /proc/<pid>/task/*/children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return sorted(set(found))


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def is_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as dead)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"


def raw_request(base: str, data: bytes) -> bytes:
    """Bytes sent on a fresh socket to `base`, and all the server wrote back until it closed."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        # The server may answer and close before it has read everything.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


class Server:
    """`eqrisk serve` in a child process, stopped on exit. Its stderr goes to an unnamed file
    (`log()`): a pipe nobody reads would block a chatty server once it fills."""

    def __init__(
        self,
        home: Path,
        *,
        workers: int = 1,
        args: tuple[str, ...] = (),
        nofile: int | None = None,
        **env: str,
    ) -> None:
        """`nofile`: the server's file limit (soft and hard), as a host with a low one has."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in __exit__
        command = ["serve", "--port", str(self.port), "--workers", str(workers), *args]

        def limit_files() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eqrisk.cli", *command],
            env={**os.environ, "EQRISK_HOME": str(home), **env},
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            preexec_fn=limit_files if nofile is not None else None,
        )

    def log(self) -> str:
        """What the server wrote on stderr so far (pread: the server shares the file offset)."""
        fd = self._log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def log_with(self, *needles: str, timeout: float = 10.0) -> str:
        """The log once it holds every needle (or after `timeout`): a request's access-log line
        is written as the request ends, which can be after its client has the answer."""
        deadline = time.monotonic() + timeout
        log = self.log()
        while not all(n in log for n in needles) and time.monotonic() < deadline:
            time.sleep(0.02)
            log = self.log()
        return log

    def workers(self) -> list[int]:
        """Process ids of the live uvicorn workers (spawned children of the serve process;
        multiprocessing's resource tracker is not one)."""
        return [
            pid
            for pid in children_of(self.proc.pid)
            if "spawn_main" in cmdline(pid) and is_alive(pid)
        ]

    def kill_worker(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log()
                self._log.close()
                raise AssertionError(f"eqrisk serve exited:\n{log}")
            try:
                if httpx.get(f"{self.base}/api/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        log = self.log()
        self.__exit__()  # a `with` whose __enter__ raises never calls __exit__: stop it here
        raise AssertionError(f"eqrisk serve did not start:\n{log}")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self._log.close()


def export_factors(
    home: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`eqrisk export factors --out OUT` on `home`, in process (the settings read afresh before
    and after): the factor returns and factor loadings it wrote."""
    from typer.testing import CliRunner

    from eqrisk.cli import app
    from eqrisk.settings import get_settings

    monkeypatch.setenv("EQRISK_HOME", str(home))
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["export", "factors", "--out", str(out), "--json"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    return (
        pd.read_parquet(out / "factor_returns.parquet"),
        pd.read_parquet(out / "factor_loadings.parquet"),
    )


def tree_hash(home: Path) -> dict[str, str]:
    """Every file of an eqrisk home but its report folders (a refused command writes its
    report), by path, with the hash of its bytes: equal before and after a refused command."""
    import hashlib

    return {
        str(p.relative_to(home)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(home.rglob("*"))
        if p.is_file() and p.relative_to(home).parts[0] != "reports"
    }
