"""The one settings object of eqrisk: environment variables `EQRISK_*` and an optional `eqrisk.toml`.

Everything the CLI and the servers write lives under `home`; nothing else on disk is touched
but the NYSE sessions list the data commands keep in `calendar_cache` (a cache: one small file
a day, rebuilt from exchange_calendars when missing).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

# The default rate of unknown or revoked keys per client address (a `limits` spec).
INVALID_KEY_LIMIT = "20/minute"


class SettingsError(ValueError):
    """A setting's value is not usable: one line naming each bad setting, its variable and why
    (the CLI prints it and exits 3)."""


def _url_problem(value: str, schemes: tuple[str, ...], example: str) -> str | None:
    """Why `value` is not a URL of one of `schemes` (`postgresql+psycopg` counts as
    `postgresql`) with a host or a path, else None."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        return f"not a URL ({exc}); expected one like {example}"
    if parts.scheme.split("+")[0] not in schemes:
        return f"not a {' or '.join(schemes)} URL; expected one like {example}"
    if not (parts.netloc or parts.path.strip("/") or parts.query):
        return f"names no host or database; expected one like {example}"
    return None


def metrics_address(value: str, host: str) -> tuple[str, int] | None:
    """(host, port) of a `metrics` setting "[HOST:]PORT" (`host` when it names none), else
    None."""
    name, _, port = value.rpartition(":")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    return (name.strip("[]") or host, int(port))


class Settings(BaseSettings):
    """Effective configuration; precedence: init args > environment > eqrisk.toml > defaults."""

    model_config = SettingsConfigDict(
        env_prefix="EQRISK_", toml_file="eqrisk.toml", extra="ignore", frozen=True
    )

    home: Path = Field(default=Path("~/.eqrisk"), description="State directory.")
    database_url: SecretStr | None = Field(default=None, description="PostgreSQL URL (at scale).")
    redis_url: SecretStr | None = Field(default=None, description="Redis URL for shared limits.")
    snapshots: Path | None = Field(
        default=None,
        description="Snapshot store (a path every server host mounts); None = <home>/snapshots.",
    )
    calendar_cache: Path | None = Field(
        default=None,
        description="Where the data commands keep the NYSE sessions list between processes (one "
        "small file a day, instead of building the calendar in each); None = eqrisk under "
        "$XDG_CACHE_HOME (~/.cache).",
    )
    snapshot_check_ms: int = Field(
        default=0,
        ge=0,
        le=60_000,
        description="Servers look at the CURRENT pointer at most this often (0 = every request).",
    )
    snapshot_bucket: str | None = Field(
        default=None,
        description="An S3-compatible bucket the versions are published to (s3://bucket/prefix): "
        "`eqrisk build` pushes each new version there and `eqrisk serve` keeps the host's "
        "`snapshots` folder (its local cache) on the bucket's CURRENT. Credentials and region: "
        "the usual AWS_* variables.",
    )
    snapshot_bucket_endpoint: str | None = Field(
        default=None,
        description="The bucket's server when it is not AWS (MinIO, Ceph: http://host:9000).",
    )
    snapshot_bucket_poll_s: float = Field(
        default=10.0,
        ge=0.05,
        le=3600,
        description="`eqrisk serve` looks at the bucket's CURRENT this often (seconds).",
    )
    snapshot_cache_keep: int = Field(
        default=2,
        ge=1,
        description="Versions a server host keeps in its local cache (the served one always).",
    )
    dask: str | None = Field(
        default=None,
        description="Where `eqrisk build` runs the model: None = in process, 'local' = a Dask "
        "LocalCluster, or a scheduler address (tcp://host:8786).",
    )
    block_rows: int = Field(
        default=1024,
        ge=1,
        description="Symbols per task of a Dask build (its memory bound), rounded up to whole "
        "blocks of the snapshot's chunk grid (`block_symbols`).",
    )
    block_symbols: int | None = Field(
        default=None,
        ge=16,
        le=65536,
        description="Symbols per block of a new version's chunk grid: the rows a Dask task "
        "computes and writes as a unit (at least one block a task); smaller blocks let more "
        "workers share a small universe and bound a build's memory. Unset: the current "
        "version's block (512 for a first build). A change makes the next build a full one.",
    )
    dask_min_cells: int = Field(
        default=20_000_000,
        ge=0,
        description="With `dask` set, an incremental build that computes at most this many "
        "cells (symbols x sessions) runs in process; a larger one is a full Dask build.",
    )

    # Model defaults (DESIGN section 2); every value is reported in `_metadata.method`.
    window: int = Field(default=252, ge=20, le=5000, description="Rolling window in sessions.")
    min_obs: int = Field(default=126, ge=10, description="Joint observations before publishing.")
    halflife: float | None = Field(
        default=None, gt=0, description="EWMA half-life in sessions; None = equal weights."
    )
    market_etf: str = Field(default="SPY", description="The market benchmark ETF.")
    max_move: float = Field(
        default=0.5, gt=0, description="Ingest flags one-day |simple return| above this."
    )
    min_coverage: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="A merge whose new session prices fewer than this share of the symbols "
        "of the session before it is refused unless `--partial`.",
    )
    share_classes: Path | None = Field(
        default=None,
        description="CSV (company,symbol) of share classes that share one company market cap; "
        "default: the project's data/reference/share_classes.csv.",
    )
    min_price: float = Field(
        default=1e-4, gt=0, description="Ingest rejects a price below this (no price can be)."
    )
    max_price: float = Field(
        default=1e7, gt=0, description="Ingest rejects a price above this (no price can be)."
    )
    max_line_bytes: int = Field(
        default=2**20,
        ge=2**16,
        description="Longest line of an input CSV: a longer one ends the read at once (a file "
        "without newlines is never read whole).",
    )
    max_cell_bytes: int = Field(
        default=2**16,
        ge=256,
        description="Longest cell of an input file: a longer one is an error.",
    )
    subsector_map: Path | None = Field(
        default=None, description="CSV (gics_sub_industry,etf) overriding the default mapping."
    )
    sector_map: Path | None = Field(
        default=None, description="CSV (gics_sector,etf) overriding the SPDR sector mapping."
    )

    demo_key: SecretStr = Field(
        default=SecretStr("eqrisk-demo"),
        description="The shared, documented demo key (rotate it by setting another value).",
    )
    evaluation_key: SecretStr | None = Field(
        default=None,
        description="A key the dashboard offers every visitor as the local evaluation key: "
        "`eqrisk demo` sets it for its own server, on a loopback address only (never set it "
        "on a server other people reach).",
    )
    webhook_secret: SecretStr | None = Field(
        default=None, description="Shared secret of the payment-provider webhook (off if unset)."
    )
    webhook_tolerance_s: int = Field(default=300, ge=1, description="Webhook timestamp tolerance.")

    # Self-service accounts through Stripe (off, the operator creates accounts, until the
    # secret key, publishable key and webhook secret are all set): docs/DEPLOYMENT.md.
    stripe_secret_key: SecretStr | None = Field(
        default=None, description="Stripe secret key (sk_test_... first, then sk_live_...)."
    )
    stripe_publishable_key: str | None = Field(
        default=None, description="Stripe publishable key (pk_...), given to the pages."
    )
    stripe_webhook_secret: SecretStr | None = Field(
        default=None, description="Signing secret (whsec_...) of the Stripe webhook endpoint."
    )
    stripe_api_base: str | None = Field(
        default=None, description="Another Stripe API address (a local stand-in; unset: Stripe)."
    )
    stripe_js_url: str = Field(
        default="https://js.stripe.com/v3/", description="Where the pages load Stripe.js from."
    )
    starting_credit_usd: int = Field(
        default=20, ge=0, le=1000, description="Credit granted once per verified card (USD)."
    )
    topup_amounts_usd: tuple[int, ...] = Field(
        default=(10, 25, 100), description="Top-up amounts offered (whole USD, JSON list)."
    )
    signups_per_hour: int = Field(
        default=5, ge=1, description="Sign-ups allowed per client address and hour."
    )
    signup_expiry_s: int = Field(
        default=86400, ge=60, description="An unverified sign-up is deleted after this long."
    )
    pricing_file: Path | None = Field(default=None, description="JSON price overrides.")

    # Price feeds (`eqrisk fetch`, `eqrisk update --from`): keys and the providers' addresses.
    tiingo_api_key: SecretStr | None = Field(
        default=None, description="Tiingo API token (`eqrisk fetch --provider tiingo`)."
    )
    provider_urls: dict[str, str] = Field(
        default_factory=dict,
        description='Base URL per price provider, e.g. {"yahoo": "http://proxy:8080"} (a JSON '
        "object); unset providers use their public address.",
    )
    feed_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="Seconds one request to a price provider may take, all of it (connect, "
        "head and body); then the fetch ends (exit 3).",
    )
    feed_fetch_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="Seconds a whole fetch (every symbol) may take; then it ends, writing "
        "nothing (exit 3).",
    )
    feed_max_bytes: int = Field(
        default=20_000_000,
        ge=1024,
        description="The largest answer read from a price provider (bytes); a larger one is "
        "refused (exit 3), never read whole.",
    )

    services: list[str] = Field(
        default_factory=lambda: ["daily", "risk"], description="Services the app serves."
    )
    render_cache_mb: int = Field(
        default=256, ge=0, description="Per-process cache of rendered answers (0 = off)."
    )
    render_threads: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Threads per process that render large answers, at a CPU priority 10 "
        "below the event loop's (more compete with the event loop for the GIL).",
    )
    work_threads: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Threads per process that plan and render the heavier calls (portfolio "
        "risk, estimates, threaded routes) off the event loop, at a CPU priority 10 below the "
        "event loop's; more calls wait for one.",
    )
    cpu_budget_ms: int = Field(
        default=5000,
        ge=10,
        description="CPU a call's plan and render may use in the work threads; a call over it "
        "is answered 503 and not charged.",
    )
    max_body_bytes: int = Field(
        default=2**20, ge=1024, description="Largest request body accepted (413 beyond)."
    )
    max_header_bytes: int = Field(
        default=16 * 2**10, ge=1024, description="Largest request header block (431 beyond)."
    )
    max_query_bytes: int = Field(
        default=8 * 2**10, ge=256, description="Longest query string (414 beyond)."
    )
    rate_limit_storage: Literal["auto", "memory", "sqlite"] = Field(
        default="auto",
        description="Rate-limit counts without Redis: memory (one process) or a SQLite file "
        "under home shared by the processes of this machine; auto = memory, or sqlite when "
        "`serve --workers` > 1. EQRISK_REDIS_URL wins over both.",
    )
    # Backends (docs/decisions/outages.md): every wait on the database or Redis is bounded, and a
    # backend that failed is not waited for again until `backend_retry_s` has passed.
    database_connect_timeout_s: int = Field(
        default=3,
        ge=2,
        le=60,
        description="Seconds to open a PostgreSQL connection (whole seconds, at least 2: libpq's "
        "own rule for connect_timeout).",
    )
    database_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="Seconds one PostgreSQL round trip (a statement, a commit) may take; also "
        "the server's statement, lock and idle-in-transaction timeouts.",
    )
    database_pool_size: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="PostgreSQL connections each process (each `serve` worker) keeps open.",
    )
    database_max_overflow: int = Field(
        default=10,
        ge=0,
        le=1000,
        description="Connections a process may open beyond `database_pool_size` under load "
        "(closed when returned): a host holds at most workers x (pool size + overflow).",
    )
    database_pooler: Literal["none", "pgbouncer"] = Field(
        default="none",
        description="What `database_url` points at: PostgreSQL itself (none), or PgBouncer in "
        "transaction mode (pgbouncer: no prepared statements, no session options; the server "
        "timeouts are then PgBouncer's `connect_query`).",
    )
    redis_connect_timeout_s: float = Field(
        default=2.0, gt=0, le=60, description="Seconds to open a Redis connection."
    )
    redis_timeout_s: float = Field(
        default=2.0, gt=0, le=60, description="Seconds one Redis command may take."
    )
    backend_retry_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="After a backend failed, requests are answered without trying it (503 for "
        "the database, per-process limits for Redis) until this many seconds have passed; then "
        "one request tries it again.",
    )
    # Connections (api/connections.py): what one client connection may hold of a worker.
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="Seconds from a connection's start (or a keep-alive request's first byte) "
        "to the end of its request head; then 408 and closed.",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds from the end of a request head to the end of its body; then closed.",
    )
    idle_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="Seconds a keep-alive connection may wait for its next request.",
    )
    max_connections: int = Field(
        default=1000,
        ge=16,
        le=1_000_000,
        description="Open client connections per worker (also kept below the process's file "
        "limit); past it the longest-waiting idle or unfinished request is closed.",
    )
    invalid_key_limit: str = Field(
        default=INVALID_KEY_LIMIT,
        description="Unknown or revoked keys one client address may present (a `limits` spec "
        "such as 20/minute); past it, 429 without looking the key up.",
    )
    access_log: bool = Field(default=True, description="One stderr line per request (serve).")
    metrics: str = Field(
        default="off",
        description="Prometheus metrics of `serve`: off, public (GET /metrics on the API's "
        "port, open to anyone who reaches it) or [HOST:]PORT (a port of their own, on the "
        "serve host unless HOST is given: keep it off the public network).",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)

    @field_validator("topup_amounts_usd")
    @classmethod
    def _topup_amounts(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(a < 1 or a > 10000 for a in value):
            raise ValueError("top-up amounts are whole USD from 1 to 10000, at least one")
        return tuple(sorted(set(value)))

    @property
    def stripe_enabled(self) -> bool:
        """Self-service sign-up and top-ups through Stripe: all three of its settings set."""
        return bool(
            self.stripe_secret_key and self.stripe_publishable_key and self.stripe_webhook_secret
        )

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            why = _url_problem(
                value.get_secret_value(), ("postgresql",), "postgresql://user:pw@host:5432/db"
            )
            if why:
                raise ValueError(why)  # the value is a secret: never in the message
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            why = _url_problem(
                value.get_secret_value(), ("redis", "rediss", "unix"), "redis://host:6379/0"
            )
            if why:
                raise ValueError(why)
        return value

    @field_validator("snapshot_bucket")
    @classmethod
    def _snapshot_bucket(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme != "s3" or not parts.netloc:
                raise ValueError(f"{value!r} is not a bucket URL like s3://bucket/prefix")
        return value

    @field_validator("snapshot_bucket_endpoint")
    @classmethod
    def _bucket_endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            why = _url_problem(value, ("http", "https"), "http://host:9000")
            if why:
                raise ValueError(why)
        return value

    @field_validator("dask")
    @classmethod
    def _dask_address(cls, value: str | None) -> str | None:
        """None, "local", or a scheduler address (tcp://host:8786, or host:8786)."""
        if value is None or value == "local":
            return value
        address = value if "://" in value else f"tcp://{value}"
        try:
            parts = urlsplit(address)
            port = parts.port
        except ValueError:
            port = None
            parts = urlsplit("")
        if not parts.hostname or port is None:
            raise ValueError(
                f"{value!r} is neither 'local' nor a scheduler address such as tcp://host:8786"
            )
        return value

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, value: str) -> str:
        if value in ("off", "public") or metrics_address(value, "") is not None:
            return value
        raise ValueError(f"{value!r} is not off, public or [HOST:]PORT (a port from 1 to 65535)")

    @field_validator("provider_urls")
    @classmethod
    def _provider_urls(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            why = _url_problem(url, ("http", "https"), "http://proxy:8080")
            if why:
                raise ValueError(f"{name}: {url!r} is {why}")
        return value

    @field_validator("invalid_key_limit")
    @classmethod
    def _rate_spec(cls, value: str) -> str:
        """A rate the `limits` library reads ("20/minute", "100 per hour"). The default is
        one: the library (and asyncio under it) loads only to read another, so that a
        command that serves nothing starts without it."""
        if value == INVALID_KEY_LIMIT:
            return value
        from limits import parse

        try:
            parse(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a rate such as '20/minute' or '100 per hour'"
            ) from None
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    @property
    def home_dir(self) -> Path:
        """`home` with `~` expanded (created on first use by the writers, not here)."""
        return self.home.expanduser()

    @property
    def snapshots_dir(self) -> Path:
        """Where the versions live: `snapshots` (shared by several servers), else under home."""
        return (self.snapshots or self.home / "snapshots").expanduser()

    @property
    def calendar_cache_dir(self) -> Path:
        """Where the NYSE sessions list is kept: `calendar_cache`, else the user's cache folder
        (`$XDG_CACHE_HOME/eqrisk`, `~/.cache/eqrisk`): never in the home, which only the
        commands' own writes change."""
        if self.calendar_cache is not None:
            return self.calendar_cache.expanduser()
        return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "eqrisk"

    def masked(self) -> dict[str, Any]:
        """Settings as a JSON-ready dict, secrets masked (for `eqrisk config`)."""
        out = self.model_dump(mode="json")
        for key in (
            "database_url",
            "redis_url",
            "webhook_secret",
            "stripe_secret_key",
            "stripe_webhook_secret",
            "demo_key",
            "evaluation_key",
            "tiingo_api_key",
        ):
            if out.get(key):
                out[key] = "**********"
        out["home"] = str(self.home_dir)
        out["snapshots"] = str(self.snapshots_dir)
        return out


def describe(error: ValidationError) -> str:
    """Every problem of `error` on one line: the setting, its environment variable, the value
    (never a secret's) and why."""
    problems = []
    for item in error.errors():
        field = str(item["loc"][0]) if item["loc"] else ""
        info = Settings.model_fields.get(field)
        secret = info is not None and "SecretStr" in str(info.annotation)
        shown = "" if secret or "input" not in item else f"={item['input']!r}"
        why = str(item["msg"]).removeprefix("Value error, ")
        problems.append(f"EQRISK_{field.upper()}{shown} (setting {field}): {why}")
    return "; ".join(problems) + " (fix it in the environment or eqrisk.toml, or unset it)"


def load_settings() -> Settings:
    """The settings of the environment and eqrisk.toml, or `SettingsError` with one line."""
    try:
        return Settings()
    except ValidationError as exc:
        raise SettingsError(describe(exc)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (tests build their own `Settings(...)` instead); raises
    `SettingsError` (one line) when a value is not valid."""
    return load_settings()
