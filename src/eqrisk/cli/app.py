"""The `eqrisk` command. Results a script would read go to stdout (`--json`: one JSON document);
progress and logs go to stderr (the rule and its helpers: eqrisk.cli.output). Exit codes:
0 success, 1 failure (including a refusal to lose data), 2 bad usage, 3 the environment is not
usable (home, disk, port, database, Redis, snapshot); the last three print one line that names
the cause and the fix.

This module holds the app, the operator-error mapping and the helpers every command group uses;
the command groups register themselves on `app` from their own modules."""

from __future__ import annotations

import atexit
import errno
import gc
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer._click.utils import make_default_short_help
from typer.core import TyperArgument, TyperGroup, TyperOption
from typer.exceptions import TyperException

# Where commands write (results on stdout, the rest on stderr): eqrisk.cli.output. The names
# are also importable from here, where the command modules have always found them.
from eqrisk.cli.output import err as err
from eqrisk.cli.output import out as out
from eqrisk.cli.output import print_json as print_json
from eqrisk.cli.output import print_mapping as print_mapping
from eqrisk.cli.output import result as result
from eqrisk.cli.output import say_error as say_error
from eqrisk.cli.output import show as show
from eqrisk.cli.output import stages as stages

if TYPE_CHECKING:  # the settings (pydantic-settings) load on first use: `--help` needs none
    from eqrisk.settings import Settings

EXIT_FAILURE, EXIT_USAGE, EXIT_ENVIRONMENT = 1, 2, 3


def get_settings() -> Settings:
    """The process's settings (`eqrisk.settings.get_settings`), imported when a command first
    asks: `eqrisk --help` and every command's help start without loading them."""
    from eqrisk import settings

    return settings.get_settings()


def reload_settings() -> Settings:
    """The settings read again from the environment (after a command has set a variable its
    worker processes read)."""
    from eqrisk import settings

    settings.get_settings.cache_clear()
    return settings.get_settings()


_FREEZE_AT_EXIT: list[bool] = []  # one atexit step per process, however many commands ran


def skip_final_collections() -> None:
    """A batch command's process (ingest, build, update) ends when the command does, and the
    interpreter's final garbage collections would walk every object its imports and its model
    left (numba's, pandas', pyarrow's: ~180k) only for the OS to take the pages back whole: the
    daily job spent 0.36-0.43 s exiting, 0.06 s with `gc.freeze` run at exit (1,000 x 2,000,
    2 cores). Atexit steps registered earlier (logging's flush) still run after it; objects left
    in reference cycles are not finalized (Python promises no finalizer at exit: the command has
    closed its files and published its version by then). Registered once per process (tests run
    many commands in one)."""
    if not _FREEZE_AT_EXIT:
        _FREEZE_AT_EXIT.append(True)
        atexit.register(gc.freeze)


@contextmanager
def heavy_imports() -> Iterator[None]:
    """The garbage collector paused while a batch command imports its libraries (pandas,
    pyarrow, numba), and what they made frozen after (`gc.freeze`). Imports make long-lived
    objects (modules, functions, classes: ~180k) and next to no garbage, but each object made
    counts towards the next collection, and the full ones walk every object so far: the daily
    job collected for 0.17-0.37 s, nearly all of it inside imports (at pandas' 28 ms, at numba's
    75 ms, 119 ms at numba's first kernel call, which walked what the imports had left); 0.06 s
    with this. Frozen objects are never collected (the process keeps them to its end anyway);
    what the command makes after is collected as before. Nested uses leave the collector off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


@contextmanager
def without_huge_pages() -> Iterator[None]:
    """numpy's advice to the kernel to back its large arrays with 2 MB pages (madvise
    MADV_HUGEPAGE, numpy's default on Linux) off while the daily job runs. Where transparent
    huge pages are `madvise` with `defrag` `madvise` (Debian's defaults), a page fault in such
    an array compacts memory on the spot to find a free 2 MB page, and the daily job's page
    cache (the versions it reads) leaves little of it free: 1.3-1.7 s of its 4.7-5.1 s were
    the kernel's, and without the advice the job took 0.38 s less (median of 10 runs in turn,
    5,000 x 7,560, docs/BENCHMARKS.md). The advice is numpy's process-wide switch; it is put
    back after."""
    from numpy._core import multiarray

    switch = getattr(multiarray, "_set_madvise_hugepage", None)
    if switch is None:  # a numpy without the switch gives no advice to take back
        yield
        return
    before = switch(False)
    try:
        yield
    finally:
        switch(before)


class EnvironmentProblem(Exception):
    """Something around eqrisk is not usable (exit 3); the message names the cause and the fix."""


def _database_name(settings: Settings) -> str:
    """Where the accounts database is, password hidden (for messages)."""
    if settings.database_url is None:
        return f"SQLite {settings.home_dir / 'accounts.db'}"
    from sqlalchemy.engine import make_url

    try:
        return make_url(settings.database_url.get_secret_value()).render_as_string(True)
    except Exception:
        return "EQRISK_DATABASE_URL"


def _first_line(exc: BaseException | None) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_CANNOT_WRITE = {errno.EROFS, errno.EACCES, errno.EPERM}
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def os_problem(exc: OSError, home: Path) -> str:
    where = exc.filename or home
    fix = f"or point EQRISK_HOME (now {home}) at another directory"
    # numpy reports a short write as a bare OSError ("N requested and M written"), no errno:
    # the device filled up (by the time we look, the failed build's files are gone again).
    short_write = exc.errno is None and _SHORT_WRITE.search(str(exc)) is not None
    if exc.errno in _NO_SPACE or short_write:
        why = exc.strerror or "No space left on device"
        return f"no space left writing {where} ({why}): free space on that disk {fix}"
    if exc.errno == errno.EROFS:
        return f"cannot write {where}: the file system is read-only; remount it writable {fix}"
    if exc.errno in _CANNOT_WRITE:
        return f"cannot write {where}: permission denied; fix its permissions {fix}"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST) and not home.is_dir():
        return f"EQRISK_HOME {home} is not a directory: point EQRISK_HOME at a directory"
    return f"{exc.strerror or _first_line(exc)}: {where}"


def _is_snapshot_error(exc: BaseException) -> bool:
    """Whether `exc` is a SnapshotError, without loading the snapshot modules where none was
    loaded (so none was raised): a command's `--help` ends in an exception too, and its help
    must not import the model's kernels."""
    if "eqrisk.snapshot.version" not in sys.modules:  # where SnapshotError is defined
        return False
    from eqrisk.snapshot.versions import SnapshotError

    return isinstance(exc, SnapshotError)


def _operator_error(exc: BaseException) -> tuple[str, int] | None:
    """One line and an exit code for a failure the operator can fix, else None (a bug: the
    traceback is kept). The single place where environment failures become messages."""
    from eqrisk.settings import SettingsError

    if isinstance(exc, SettingsError):
        return f"invalid setting: {exc}", EXIT_ENVIRONMENT
    settings = get_settings()
    if isinstance(exc, EnvironmentProblem) or _is_snapshot_error(exc):
        return str(exc), EXIT_ENVIRONMENT
    if isinstance(exc, OSError):
        return os_problem(exc, settings.home_dir), EXIT_ENVIRONMENT
    if "sqlalchemy" in sys.modules:
        from sqlalchemy.exc import DBAPIError

        if isinstance(exc, DBAPIError):
            return (
                f"the accounts database ({_database_name(settings)}) is not usable: "
                f"{_first_line(exc.orig)}; start it, or fix EQRISK_DATABASE_URL or EQRISK_HOME",
                EXIT_ENVIRONMENT,
            )
    if "redis" in sys.modules:
        from redis.exceptions import ConnectionError as RedisConnectionError

        if isinstance(exc, RedisConnectionError):
            return (
                f"Redis is not reachable ({_first_line(exc)}): start it, or fix or unset "
                "EQRISK_REDIS_URL",
                EXIT_ENVIRONMENT,
            )
    return None


class _NamedArgument(TyperArgument):
    """An argument whose help shows its name alone (`PRICES`), not `PRICES <list[Path]>`."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def _name_values(command: Any) -> None:
    """Give every option that takes a value a metavar that says what it is (`--since SINCE`,
    `--out PATH`) where none was given, and every argument its name alone: typer would show
    the Python type (`<str>`, `<list[Path]>`). Choices keep their list of values."""
    for param in command.params:
        described = getattr(param, "type_descriptor", None)
        if described is None or described.is_choice:
            continue
        if isinstance(param, TyperArgument):
            param.__class__ = _NamedArgument
        elif isinstance(param, TyperOption) and not param.is_flag and param.metavar is None:
            param.metavar = "PATH" if described.is_path else (param.name or "value").upper()
    for sub in getattr(command, "commands", {}).values():
        _name_values(sub)


# Every command of `eqrisk --help`, in its order: the modules of eqrisk.cli that register it
# (imported when the command is first asked for) and its one-line help (what `eqrisk --help`
# lists without importing them; tests/cli/test_cli_imports.py holds it to the commands' own).
COMMANDS: dict[str, tuple[tuple[str, ...], str]] = {
    "config": ((), "Print the effective settings (secrets masked)."),
    "ingest": (("data",), "Validate and ingest daily prices and a security master."),
    "build": (("data",), "Build a snapshot from the ingested data; make it current."),
    "update": (("data",), "The daily job: merge new price files, then build."),
    "mcp": (("mcp",), "Serve the MCP tools over stdio for a local assistant."),
    "serve": (("serve",), "Serve Service A and/or Service B over the current snapshot."),
    "demo": (("demo",), "Build the demo market in its own home, then serve it."),
    "fetch": (("feeds",), "Fetch new sessions from a price provider."),
    "evaluate": (("evaluate",), "Out-of-sample accuracy of the risk forecast and the hedges."),
    "model-quality": (("evaluate",), "Print the current snapshot's accuracy table."),
    "pictures": (("pictures",), "Make the README's screenshots of the page."),
    "snapshots": (
        ("snapshots", "bucket"),
        "Snapshot versions: list (alone), use one, pin or unpin one.",
    ),
    "export": (("snapshots",), "Write a version's tables as files for other tools."),
    "accounts": (
        ("accounts", "ledger"),
        "Accounts: create, verify a card, credit, suspend, list.",
    ),
    "keys": (("accounts",), "API keys: create (shown once), list, revoke."),
    "bench": (("bench",), "Benchmarks, each beside the alternative, in one run."),
}
# The key of `ctx.meta` that says the command line only asks for a command's help.
HELP_ONLY = "eqrisk.help_only"


def _register(name: str) -> Any:
    """The click command `name` of `app`, its modules imported (they register it on `app`)."""
    from typer.main import get_command_from_info, get_command_name, get_group_from_info

    for module in COMMANDS[name][0]:
        # The import statement's path (importlib.import_module's is not seen by -X importtime)
        __import__(f"eqrisk.cli.{module}")
    for info in app.registered_commands:
        if (info.name or get_command_name(getattr(info.callback, "__name__", ""))) == name:
            return get_command_from_info(
                info, pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=None
            )
    (group,) = (info for info in app.registered_groups if info.name == name)
    return get_group_from_info(
        group,
        pretty_exceptions_short=app.pretty_exceptions_short,
        suggest_commands=True,
        rich_markup_mode=None,
    )


class OperatorErrors(TyperGroup):
    """Runs every command; a failure the operator can fix ends in one line and a documented
    exit code instead of a traceback. Every command's values are named in its help
    (`_name_values`). A command's modules are imported when it is first asked for
    (`COMMANDS`): `eqrisk --help` imports none, `eqrisk update` only eqrisk.cli.data."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _name_values(self)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            command = _register(cmd_name)
            _name_values(command)
            self.commands[cmd_name] = command
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in COMMANDS:  # a typo: suggest among every command
            for name in COMMANDS:
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The commands' one-line help from `COMMANDS`, none of their modules imported."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, make_default_short_help(short, limit)) for name, (_, short) in COMMANDS.items()
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def get_help_option(self, ctx: Any) -> Any:
        # typer passes a flag's value through pydantic unless it is a bool: the default of
        # None (no --help for eqrisk itself) would import pydantic before a command's help.
        option = super().get_help_option(ctx)
        if option is not None and option.default is None:
            option.default = False
        return option

    # Typer always passes its own Context (a subclass of the one TyperGroup.invoke declares).
    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        words = ctx.args[: ctx.args.index("--")] if "--" in ctx.args else ctx.args
        ctx.meta[HELP_ONLY] = not set(words).isdisjoint(ctx.help_option_names)
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException):  # help, usage, a command's own exit
            raise
        except Exception as exc:
            found = _operator_error(exc)
            if found is None:
                raise
            message, code = found
            say_error(message)
            raise typer.Exit(code) from None


app = typer.Typer(
    cls=OperatorErrors,
    help="eqrisk: equity-risk data services computed from daily prices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


# Commands that work on an existing home: a missing one is a typo or a lost mount, never a
# new home to create (only `ingest` and `demo` create one). `mcp` is a client of a server (its
# URL), so it reads no home.
NEEDS_HOME = frozenset(
    {"build", "update", "serve", "snapshots", "export", "evaluate", "fetch", "model-quality"}
)


@app.callback()
def _every_command(ctx: typer.Context) -> None:
    if ctx.meta.get(HELP_ONLY):  # a command's help reads no settings and needs no home
        return
    # A home that is a file fails every state-reading command in its own way; say it once.
    home = get_settings().home_dir
    if ctx.invoked_subcommand not in ("config", "bench") and home.exists() and not home.is_dir():
        raise EnvironmentProblem(
            f"EQRISK_HOME {home} is not a directory: point EQRISK_HOME at a directory"
        )
    if ctx.invoked_subcommand in NEEDS_HOME and not home.exists():
        raise EnvironmentProblem(
            f"EQRISK_HOME {home} does not exist: point EQRISK_HOME at your home, or create one "
            "with `eqrisk ingest` (or `eqrisk demo`)"
        )


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def effective_settings(**overrides: Any) -> Settings:
    base = get_settings()
    clean = {k: v for k, v in overrides.items() if v is not None}
    return base.model_copy(update=clean) if clean else base


def fail(message: str, code: int = EXIT_FAILURE) -> typer.Exit:
    say_error(message)
    return typer.Exit(code)


SUMMARY_KEYS = (
    "model_version",
    "data_as_of",
    "data_source",
    "universe_size",
    "sessions",
    "method",
)


def summary_line(s: dict[str, Any]) -> str:
    return (
        f"snapshot [bold]{s['model_version']}[/]: {s['universe_size']} symbols x "
        f"{s['sessions']} sessions, data as of {s['data_as_of']}, source {s['data_source']}"
    )


@app.command()
def config(
    as_json: JsonOpt = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Try the database, Redis, the snapshot store and the Dask scheduler: one "
            "line each, exit 3 when one fails.",
        ),
    ] = False,
) -> None:
    """Print the effective settings (secrets masked). With --check, test the connections."""
    if not check:
        print_mapping(get_settings().masked(), as_json, "setting")
        return
    from dataclasses import asdict

    from eqrisk.cli.check import run_checks

    checks = run_checks(get_settings())
    if as_json:
        print_json([asdict(c) for c in checks])
    else:
        for c in checks:
            out.print(f"{'ok  ' if c.ok else 'FAIL'} {c.name:<9} {c.detail}", markup=False)
    failed = [c.name for c in checks if not c.ok]
    if failed:
        raise fail(f"{len(failed)} of {len(checks)} checks failed: {', '.join(failed)}", 3)
