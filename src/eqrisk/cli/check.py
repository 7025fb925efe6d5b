"""`eqrisk config --check`: every backend the settings name, tried for real, one line each.

The accounts database (PostgreSQL when EQRISK_DATABASE_URL is set, else the SQLite file under
the home), Redis (when set), the snapshot store (readable, its current version opens) and a
Dask scheduler (when EQRISK_DASK is an address). Every wait is bounded by the settings'
timeouts. Nothing is written: no schema is created, no file made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from eqrisk.settings import Settings

DASK_TIMEOUT_S = 5


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


def check_database(settings: Settings) -> str:
    from sqlalchemy import create_engine, inspect, text
    from sqlalchemy.engine import make_url

    if settings.database_url is None:
        path = settings.home_dir / "accounts.db"
        if not path.exists():
            return f"SQLite {path}: not created yet (the first command that needs it makes it)"
        engine = create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
        where = f"SQLite {path}"
    else:
        url = make_url(settings.database_url.get_secret_value())
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        connect_args: dict[str, object] = {"connect_timeout": settings.database_connect_timeout_s}
        if settings.database_pooler == "pgbouncer":  # no startup options, nothing prepared
            connect_args["prepare_threshold"] = None
        else:
            ms = round(settings.database_timeout_s * 1000)
            connect_args["options"] = f"-c statement_timeout={ms}"
        engine = create_engine(url, connect_args=connect_args)
        kind = "PgBouncer" if settings.database_pooler == "pgbouncer" else "PostgreSQL"
        where = f"{kind} {url.render_as_string(hide_password=True)}"
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            tables = set(inspect(conn).get_table_names())
    except Exception as exc:
        raise RuntimeError(f"{where}: {_first_line(exc)}") from None
    finally:
        engine.dispose()
    schema = "accounts schema present" if "accounts" in tables else "no schema yet (made on use)"
    return f"{where}: connected, {schema}"


def check_redis(settings: Settings) -> str:
    import redis

    assert settings.redis_url is not None
    url = settings.redis_url.get_secret_value()
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=settings.redis_connect_timeout_s,
        socket_timeout=settings.redis_timeout_s,
    )
    shown = redis.connection.ConnectionPool.from_url(url).connection_kwargs
    where = f"Redis {shown.get('host', shown.get('path', '?'))}:{shown.get('port', '')}"
    try:
        client.ping()
        version = client.info("server").get("redis_version", "?")
    except redis.RedisError as exc:
        raise RuntimeError(f"{where}: {_first_line(exc)}") from None
    finally:
        client.close()
    return f"{where}: PING answered (server {version})"


def check_store(settings: Settings) -> str:
    from eqrisk.snapshot.versions import VERSION_RE, SnapshotStore

    root = settings.snapshots_dir
    if not root.is_dir():
        raise RuntimeError(
            f"{root} is not a readable folder: run `eqrisk build`, or fix "
            "EQRISK_SNAPSHOTS / EQRISK_HOME"
        )
    snap = SnapshotStore(settings.home_dir, root=root).current()
    kept = sum(1 for p in root.iterdir() if p.is_dir() and VERSION_RE.match(p.name))
    return (
        f"{root}: current version {snap.version} opens (data as of "
        f"{snap.index.data_as_of_text}); {kept} versions kept"
    )


def check_dask(settings: Settings) -> str:
    assert settings.dask is not None
    if settings.dask == "local":
        return "local: each build starts its own LocalCluster (nothing to reach)"
    from distributed import Client

    address = settings.dask if "://" in settings.dask else f"tcp://{settings.dask}"
    try:
        # distributed leaves Client unannotated (as in eqrisk.build.distributed).
        with Client(address, timeout=DASK_TIMEOUT_S) as client:  # type: ignore[no-untyped-call]
            workers = client.scheduler_info(n_workers=-1)["workers"]
    except Exception as exc:
        raise RuntimeError(f"scheduler {address}: {_first_line(exc)}") from None
    if not workers:
        raise RuntimeError(f"scheduler {address}: answers but has no workers")
    threads = sum(int(w.get("nthreads", 0)) for w in workers.values())
    return f"scheduler {address}: {len(workers)} workers, {threads} threads"


def run_checks(settings: Settings) -> list[Check]:
    """Each configured backend's check, in order; a failure is recorded, not raised."""
    checks: list[tuple[str, Callable[[Settings], str]]] = [("database", check_database)]
    if settings.redis_url is not None:
        checks.append(("redis", check_redis))
    checks.append(("snapshots", check_store))
    if settings.dask is not None:
        checks.append(("dask", check_dask))
    found = []
    for name, fn in checks:
        try:
            found.append(Check(name, True, fn(settings)))
        except Exception as exc:
            found.append(Check(name, False, _first_line(exc)))
    return found
