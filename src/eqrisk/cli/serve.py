"""`eqrisk serve`: preflight checks (home, port, database, snapshot), then uvicorn."""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from eqrisk.cli.app import (
    EnvironmentProblem,
    app,
    fail,
    os_problem,
    reload_settings,
)
from eqrisk.cli.mcp import mcp_line
from eqrisk.cli.output import escape, note

if TYPE_CHECKING:
    from eqrisk.settings import Settings


def _log_config(access_log: bool) -> dict[str, Any]:
    """Uvicorn's logging setup in every worker process: its own loggers as usual (its access
    log off), and ours: `eqrisk.access` lines, as they are, on stderr."""
    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = json.loads(json.dumps(LOGGING_CONFIG))
    config["formatters"]["eqrisk_access"] = {"format": "%(message)s pid=%(process)d"}
    config["handlers"]["eqrisk_access"] = {
        "formatter": "eqrisk_access",
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
    }
    config["loggers"]["eqrisk.access"] = {
        "handlers": ["eqrisk_access"],
        "level": "INFO" if access_log else "WARNING",
        "propagate": False,
    }
    return config


def _check_home(home: Path) -> None:
    """The home exists, is a directory and takes a new file (a real write: `os.access` says
    yes to root on a read-only mount)."""
    if not home.exists():
        raise EnvironmentProblem(
            f"EQRISK_HOME {home} does not exist: build a snapshot there first (`eqrisk ingest` "
            "and `eqrisk build`, or `eqrisk demo`), or point EQRISK_HOME at your eqrisk home"
        )
    if not home.is_dir():
        raise EnvironmentProblem(
            f"EQRISK_HOME {home} is not a directory: point EQRISK_HOME at a directory"
        )
    try:
        with tempfile.TemporaryFile(dir=home, prefix=".probe-"):
            pass
    except OSError as exc:
        raise EnvironmentProblem(os_problem(OSError(exc.errno, exc.strerror, home), home)) from None


def _check_port(host: str, port: int) -> None:
    """The port can be bound (with the options uvicorn binds it with)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot listen on {host}:{port} ({exc.strerror}): stop what uses it or choose "
                "another port with --port or EQRISK_PORT"
            ) from None


def preflight(
    settings: Settings, host: str, port: int | None, *, snapshot: bool = True
) -> str | None:
    """What serving needs, checked before `serve` says it is serving (and before `demo` builds
    anything): the home, the current snapshot (unless `snapshot` is False: the demo builds it),
    the accounts database, Redis, the port (unless None). Returns the current version (None:
    not checked)."""
    from eqrisk.accounts.backends import BackendUnavailable
    from eqrisk.accounts.db import Pool, Timeouts, make_engine
    from eqrisk.accounts.limits import RateLimiter
    from eqrisk.snapshot.served import ServedSnapshot
    from eqrisk.snapshot.store import VersionStore

    home = settings.home_dir
    _check_home(home)
    store = VersionStore.from_settings(settings)
    version = ServedSnapshot(home, store=store).current().version if snapshot else None
    url = settings.database_url.get_secret_value() if settings.database_url else None
    timeouts = Timeouts(settings.database_connect_timeout_s, settings.database_timeout_s)
    make_engine(home, url, timeouts=timeouts, pool=Pool.of(settings)).dispose()
    if settings.redis_url is not None:
        limiter = RateLimiter(
            settings.redis_url.get_secret_value(),
            connect_timeout_s=settings.redis_connect_timeout_s,
            timeout_s=settings.redis_timeout_s,
        )
        # The preflight says it in its own one line: not the backend's "down" warning too.
        import logging

        backends_log = logging.getLogger("eqrisk.backends")
        level = backends_log.level
        backends_log.setLevel(logging.ERROR)
        try:
            limiter.ping()
            reachable = True
        except BackendUnavailable:
            reachable = False
        finally:
            backends_log.setLevel(level)
        if not reachable:
            raise EnvironmentProblem(
                "Redis at EQRISK_REDIS_URL is not reachable: start it, or fix or unset "
                "EQRISK_REDIS_URL (limits are then counted per process)"
            )
    if port is not None:
        _check_port(host, port)
    return version


def follow_bucket(settings: Settings) -> None:
    """With a bucket (`snapshot_bucket`): fill this host's store, its local cache, with the
    bucket's CURRENT before the preflight, then follow it from a thread of this process (the
    workers read the local files; docs/decisions/snapshot-store.md)."""
    from eqrisk.snapshot.bucket import Bucket
    from eqrisk.snapshot.cache import Follower
    from eqrisk.snapshot.store import VersionStore
    from eqrisk.snapshot.version import SnapshotError

    bucket = Bucket.from_settings(settings)
    if bucket is None:
        return
    store = VersionStore.from_settings(settings)
    follower = Follower(
        bucket,
        store,
        every_s=settings.snapshot_bucket_poll_s,
        keep=settings.snapshot_cache_keep,
        say=lambda line: note(escape(line)),  # stderr, whatever logging the app set up
    )
    try:
        pulled = follower.sync()
    except SnapshotError as exc:
        raise EnvironmentProblem(f"{exc} (filling {store.root} from the bucket)") from None
    if pulled is not None:
        note(
            f"filled {store.root} from {bucket.url}: {pulled.version}, {pulled.downloaded} "
            f"files downloaded ({pulled.downloaded_bytes / 1e6:.1f} MB), {pulled.linked} linked"
        )
    follower.start()


def metrics_folder() -> Path:
    """prometheus_client's multiprocess folder for this server, set in the environment before
    anything imports prometheus_client (its value class is chosen at import) and before the
    workers start (they inherit it): the operator's PROMETHEUS_MULTIPROC_DIR, emptied of a
    previous run's files, or a new temporary folder (removed when serve ends)."""
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.db"):
            old.unlink(missing_ok=True)
        return folder
    folder = Path(tempfile.mkdtemp(prefix="eqrisk-metrics-"))
    atexit.register(shutil.rmtree, folder, True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    return folder


def start_metrics_port(settings: Settings, host: str) -> str:
    """With `metrics` = [HOST:]PORT, serve /metrics there from this process (a thread),
    adding up every worker's counts; returns the banner's words."""
    from eqrisk.settings import metrics_address

    address = metrics_address(settings.metrics, host)
    if address is None:
        return {"off": "off", "public": "public, at /metrics"}.get(settings.metrics, "off")
    from prometheus_client import start_http_server

    from eqrisk.api.telemetry import metrics_registry

    try:
        start_http_server(address[1], address[0], registry=metrics_registry(settings.snapshots_dir))
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot serve metrics on {address[0]}:{address[1]} ({exc.strerror}): stop what "
            "uses it or choose another EQRISK_METRICS port"
        ) from None
    return f"http://{_url_host(address[0])}:{address[1]}/metrics"


def run_server(
    settings: Settings, host: str, port: int, workers: int, *, offered: str = ""
) -> None:
    """Check what serving needs, say where it serves (stderr), then run uvicorn until stopped.
    `offered`: a line on the keys the page offers besides the demo key (the demo's)."""
    if settings.metrics != "off":
        metrics_folder()  # first: before anything imports prometheus_client
    import uvicorn

    from eqrisk.api.bounds import head_limit
    from eqrisk.api.connections import connection_cap, raise_file_limit

    limits = "redis" if settings.redis_url else "memory"
    if workers > 1 and not settings.redis_url:
        if settings.rate_limit_storage == "memory":
            raise fail(
                f"--workers {workers} with EQRISK_RATE_LIMIT_STORAGE=memory would give every "
                "worker its own rate-limit count; use sqlite (or auto) or set EQRISK_REDIS_URL",
                2,
            )
        limits = "sqlite"
    elif not settings.redis_url and settings.rate_limit_storage == "sqlite":
        limits = "sqlite"
    # Worker processes build the app from the settings, so the choices travel in the environment.
    os.environ["EQRISK_RATE_LIMIT_STORAGE"] = "sqlite" if limits == "sqlite" else "memory"
    os.environ["EQRISK_ACCESS_LOG"] = json.dumps(settings.access_log)
    follow_bucket(settings)
    version = preflight(settings, host, port)
    raise_file_limit()  # the workers inherit it: it bounds their open connections
    metrics = start_metrics_port(settings, host)
    base = f"http://{_url_host(host)}:{port}"
    note(
        f"serving snapshot {version} (of {settings.snapshots_dir}) at [bold]{base}[/]\n"
        f"  Service A: {base}/daily ... (header apikey)\n"
        f"  Service B: {base}/api/... (Authorization: Bearer <key>)\n"
        f"  dashboard: {base}/\n"
        f"  docs:      {base}/docs\n"
        f"  MCP:       {escape(mcp_line(base, settings.services))}\n"
        f"  demo key:  {settings.demo_key.get_secret_value()} (5 requests a minute, the seven "
        "demo tickers)\n"
        f"{offered}"
        f"  workers:   {workers}, rate limits in {limits}, "
        f"access log {'on' if settings.access_log else 'off'}, "
        f"up to {connection_cap(settings.max_connections)} connections each\n"
        f"  metrics:   {metrics}"
    )
    # The head of a request (request line and headers) is bounded before the app sees it;
    # the app answers what fits with 414 / 431 / 413 problem+json (eqrisk.api.bounds). Each
    # connection's time and number are bounded too (eqrisk.api.connections).
    uvicorn.run(
        "eqrisk.cli.mcp:serving_app",  # the API, with /mcp mounted when mcp is installed
        factory=True,
        host=host,
        port=port,
        workers=workers,
        http="eqrisk.api.connections:GuardedHttpToolsProtocol",
        timeout_keep_alive=math.ceil(settings.idle_timeout_s),  # ours is the exact one
        h11_max_incomplete_event_size=head_limit(
            settings.max_header_bytes, settings.max_query_bytes
        ),
        log_level="warning",
        access_log=False,
        log_config=_log_config(settings.access_log),
    )


def _url_host(host: str) -> str:
    """The host as written in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


HostOpt = Annotated[
    str | None, typer.Option(help="Interface to bind (default EQRISK_HOST, 127.0.0.1).")
]
PortOpt = Annotated[
    int | None,
    typer.Option(min=1, max=65535, help="Port to listen on (default EQRISK_PORT, 8000)."),
]


@app.command()
def serve(
    host: HostOpt = None,
    port: PortOpt = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 1,
    service: Annotated[
        str, typer.Option(help="Which services: all, daily (Service A) or risk (Service B).")
    ] = "all",
    access_log: Annotated[
        bool | None,
        typer.Option(
            "--access-log/--no-access-log", help="One stderr line per request (default: on)."
        ),
    ] = None,
) -> None:
    """Serve Service A and/or Service B over the current snapshot. New snapshots are picked up
    without a restart. The home, the snapshot, the accounts database, Redis and the port are
    checked first (exit 3 with the cause and the fix)."""
    choices = {"all": ["daily", "risk"], "daily": ["daily"], "risk": ["risk"]}
    if service not in choices:
        raise fail(f"--service must be one of {', '.join(choices)}; got {service!r}", 2)
    # Worker processes build the app from the settings, so the choice travels in the environment.
    os.environ["EQRISK_SERVICES"] = json.dumps(choices[service])
    if access_log is not None:
        os.environ["EQRISK_ACCESS_LOG"] = json.dumps(access_log)
    settings = reload_settings()
    run_server(settings, host or settings.host, port or settings.port, workers)
