"""Issue 37, supervision: the Dask scheduler and worker run as deploy/systemd's units say
(their `ExecStart` lines, with this machine's paths and free ports), each under a supervisor
that restarts it whenever it ends (`Restart=always`, here a loop in the test: systemd does not
run on this machine). A build on the cluster; the worker down and the scheduler killed while a
build waits for a worker: that build ends with eqrisk's one line (exit 3, nothing of Dask's on
stderr, no staging folder left), as does a build that finds no scheduler; both back: the worker that ended
with the old scheduler was restarted, and the next `eqrisk build --dask` succeeds with no
manual step. Every port of the scheduler and the worker listens on the private address only.

The market is small (12 symbols x 374 sessions, windows of 60) so each build takes seconds.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from distributed import Client

from eqrisk.snapshot.build_times import build_mode, read_build_times
from helpers import REPO_ROOT, free_port, small_market_home

UNITS = REPO_ROOT / "deploy" / "systemd"
SYMBOLS = ["SPY", "XLK"] + [f"S{i:02d}" for i in range(10)]
PRIVATE = "127.0.0.1"  # the host's private address in the units


def exec_start(unit: str, env: dict[str, str], ports: dict[str, int]) -> list[str]:
    """The unit's ExecStart as argv: its `${VAR}`s from `env` (systemd's EnvironmentFile), the
    venv's programs for /opt/eqrisk/venv's, and the fixed ports swapped for free ones."""
    text = (UNITS / unit).read_text()
    line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    command = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], line.removeprefix("ExecStart="))
    command = command.replace("/opt/eqrisk/venv/bin/", str(Path(sys.executable).parent) + "/")
    for fixed, port in ports.items():
        command = command.replace(f":{fixed}", f":{port}").replace(f" {fixed}", f" {port}")
    return shlex.split(command)


class Supervised:
    """A process restarted whenever it ends, after `pause_s` (systemd's Restart=always and
    RestartSec), until `stop()`; `hold()` lets the next end stay ended until `release()`."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, pause_s: float = 0.5):
        self.argv, self.env, self.pause_s = argv, env, pause_s
        self.log = log.open("ab")
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._held = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self._stop.is_set():
                    return
                self.proc = subprocess.Popen(
                    self.argv, env=self.env, stdout=self.log, stderr=subprocess.STDOUT
                )
                self.starts += 1
            self.proc.wait()
            self._stop.wait(self.pause_s)
            while self._held.is_set() and not self._stop.is_set():
                self._stop.wait(0.05)

    def kill(self, *, hold: bool = False) -> None:
        """SIGKILL the running process (its children too), as an OOM kill or a crash would."""
        if hold:
            self._held.set()
        proc = self.proc
        assert proc is not None
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def release(self) -> None:
        self._held.clear()

    def listening(self) -> set[str]:
        """The addresses the process and its children listen on (TCP)."""
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        found = set()
        for proc in [root, *root.children(recursive=True)]:
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add(conn.laddr.ip)
        return found

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait(timeout=30)
        self._thread.join(timeout=30)
        self.log.close()


@pytest.fixture()
def builder(tmp_path: Path) -> Path:
    """The build host's home, with a small market ingested."""
    return small_market_home(tmp_path, seed=37)


def start_build(home: Path, address: str) -> subprocess.Popen[str]:
    """`eqrisk build --dask ADDRESS` on the build host's home (a full build: it runs on the
    cluster); Dask gives up reaching a scheduler after 2 s instead of 30."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EQRISK_")}
    args = ["build", "--json", "--full", "--dask", address, "--window", "60", "--min-obs", "30"]
    return subprocess.Popen(
        [sys.executable, "-m", "eqrisk.cli", *args],
        env={
            **clean,
            "EQRISK_HOME": str(home),
            "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def build(home: Path, address: str) -> subprocess.CompletedProcess[str]:
    proc = start_build(home, address)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def eqrisk_errors(stderr: str) -> list[str]:
    """The error lines of a build's stderr, which holds nothing else but its progress lines
    (`build: ...`): no traceback, no line of Dask's log."""
    lines = stderr.strip().splitlines()
    assert all(x.startswith(("build: ", "error: ")) for x in lines), stderr
    return [x for x in lines if x.startswith("error: ")]


def clients(client: Any) -> int:
    """The clients the scheduler knows."""
    return int(client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.clients)))


def test_workers_come_back_with_a_restarted_scheduler(builder: Path, tmp_path: Path) -> None:
    port = free_port()
    address = f"tcp://{PRIVATE}:{port}"
    env = {**os.environ, "EQRISK_PRIVATE_ADDRESS": PRIVATE, "EQRISK_DASK": address}
    ports = {"8786": port, "8787": free_port(), "8789": free_port()}
    scheduler = Supervised(
        exec_start("eqrisk-dask-scheduler.service", env, ports), env, tmp_path / "scheduler.log"
    )
    worker = Supervised(
        exec_start("eqrisk-dask-worker.service", env, ports), env, tmp_path / "worker.log"
    )
    try:
        first = build(builder, address)  # waits for the worker to register (at most 60 s)
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout)["build"]["reasons"] == ["--full"]
        assert scheduler.listening() == {PRIVATE} and worker.listening() == {PRIVATE}

        # The worker held down: a build connects and waits for one; the scheduler killed
        # meanwhile: the build ends with eqrisk's one line, nothing of Dask's, nothing left.
        store = builder / "snapshots"
        before = sorted(p.name for p in store.iterdir())
        worker.kill(hold=True)
        with Client(address, timeout=30) as watcher:
            alone = clients(watcher)
            waiting = start_build(builder, address)
            deadline = time.monotonic() + 120
            while clients(watcher) <= alone and waiting.poll() is None:
                assert time.monotonic() < deadline, "the build never reached the scheduler"
                time.sleep(0.05)
        scheduler.kill(hold=True)  # the build waits for a worker up to 60 s: it is waiting
        _, err = waiting.communicate(timeout=300)
        assert waiting.returncode == 3, err
        lines = eqrisk_errors(err)
        assert len(lines) == 1 and lines[0].startswith("error: the Dask cluster went away"), err
        assert sorted(p.name for p in store.iterdir()) == before  # no staging folder left

        # The scheduler kept down: a build finds no cluster, says so in one line.
        gone = build(builder, address)
        assert gone.returncode == 3, gone.stderr
        lines = eqrisk_errors(gone.stderr)
        assert len(lines) == 1, gone.stderr
        assert lines[0].startswith(f"error: no Dask scheduler at {address}")
        assert sorted(p.name for p in store.iterdir()) == before

        # The scheduler back (its supervisor restarts it): the worker, which ended with the old
        # scheduler, was restarted by its own and registers; the next build just works.
        scheduler.release()
        worker.release()
        again = build(builder, address)
        assert again.returncode == 0, again.stderr
        assert (
            json.loads(again.stdout)["model_version"] != json.loads(first.stdout)["model_version"]
        )
        assert scheduler.starts == 2 and worker.starts >= 2
        assert read_build_times(store)["dask"]["count"] == 2
    finally:
        worker.stop()
        scheduler.stop()


def test_the_build_counter_labels_in_process_updates_incremental() -> None:
    """With a Dask address set, an incremental build runs in process: its label is
    `incremental`; a full one with an address ran on the cluster (`dask`)."""
    incremental = {"build": {"mode": "incremental", "reasons": ["2 new sessions"]}}
    full = {"build": {"mode": "full", "reasons": ["--full"]}}
    assert build_mode(incremental, "tcp://scheduler:8786") == "incremental"
    assert build_mode(full, "tcp://scheduler:8786") == "dask"
    assert build_mode(full, "local") == "dask"
    assert build_mode(full, None) == "full" and build_mode(incremental, None) == "incremental"


def test_every_long_lived_process_is_restarted_and_dask_binds_the_private_address() -> None:
    import yaml

    services = yaml.safe_load((REPO_ROOT / "deploy" / "compose.yaml").read_text())["services"]
    assert set(services) == {"serve", "dask-scheduler", "dask-worker", "daily"}
    for name, service in services.items():
        assert service["restart"] == ("no" if name == "daily" else "always"), name
    for port in services["dask-scheduler"]["ports"]:  # published on the private address only
        assert port.startswith("${EQRISK_PRIVATE_ADDRESS"), port
    units = {p.name: p.read_text() for p in UNITS.glob("*.service")}
    assert set(units) == {
        "eqrisk-serve.service",
        "eqrisk-dask-scheduler.service",
        "eqrisk-dask-worker.service",
        "eqrisk-daily.service",
    }
    for name, text in units.items():
        long_lived = "Type=oneshot" not in text
        assert ("Restart=always" in text) == long_lived, name
    assert "Unit=" not in (UNITS / "eqrisk-daily.timer").read_text()  # its own name's service
    # Every Dask command of the docs and the units names the address it binds.
    docs = (REPO_ROOT / "docs" / "DEPLOYMENT.md").read_text()
    commands = [
        line for line in docs.splitlines() if line.startswith(("dask scheduler", "dask worker"))
    ]
    commands += [u.split("ExecStart=")[1] for n, u in units.items() if "dask" in n]
    assert len(commands) == 4
    for command in commands:
        assert "--host " in command and "--dashboard-address " in command, command
        assert "0.0.0.0" not in command, command
