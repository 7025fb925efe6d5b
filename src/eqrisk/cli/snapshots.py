"""`eqrisk snapshots`: list the kept versions, use one, pin or unpin one; `eqrisk export`:
a version's long table as the spec's Parquet dataset, its factor frames as Parquet files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from eqrisk.cli.app import (
    EXIT_FAILURE,
    EXIT_USAGE,
    SUMMARY_KEYS,
    JsonOpt,
    app,
    fail,
    get_settings,
)
from eqrisk.cli.output import print_json, result, result_table, show

if TYPE_CHECKING:
    from eqrisk.snapshot.bucket import Bucket
    from eqrisk.snapshot.store import VersionStore


def _store() -> VersionStore:
    """The configured snapshot store, the one object every command here works on."""
    from eqrisk.snapshot.store import VersionStore

    return VersionStore.from_settings(get_settings())


def configured_bucket() -> Bucket:
    """The bucket the settings name; bad usage (exit 2) when none is set."""
    from eqrisk.snapshot.bucket import Bucket

    bucket = Bucket.from_settings(get_settings())
    if bucket is None:
        raise fail(
            "no bucket configured: set EQRISK_SNAPSHOT_BUCKET (s3://bucket/prefix) and, for a "
            "server that is not AWS, EQRISK_SNAPSHOT_BUCKET_ENDPOINT",
            EXIT_USAGE,
        )
    return bucket


snapshots_app = typer.Typer(help="Snapshot versions: list (alone), use one, pin or unpin one.")
app.add_typer(snapshots_app, name="snapshots")


@snapshots_app.callback(invoke_without_command=True)
def snapshots(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the snapshot versions (the current one and the pinned ones marked)."""
    if ctx.invoked_subcommand is not None:
        return
    from eqrisk.snapshot.version import SnapshotError

    store = _store()
    current, pinned = store.current(), set(store.pinned())
    rows = []
    for version in store.versions():
        try:
            manifest = store.open(version).manifest
            row: dict[str, Any] = {k: manifest[k] for k in SUMMARY_KEYS}
            row["problem"] = None
        except SnapshotError as exc:
            row = {k: None for k in SUMMARY_KEYS} | {"model_version": version}
            row["problem"] = str(exc)
        rows.append({**row, "current": version == current, "pinned": version in pinned})
    if as_json:
        print_json({"current": current, "pinned": sorted(pinned), "versions": rows})
        return
    if not rows:
        result("no snapshots yet: run `eqrisk build` or `eqrisk demo`")
        return

    def method(row: dict[str, Any]) -> str:
        m = row["method"]
        if not m:
            return f"damaged: {row['problem']}"
        return f"{m['weighting']} w={m['window']} min={m['min_obs']}"

    result_table(
        ("version", "current", "pinned", "data as of", "source", "symbols", "sessions", "method"),
        (
            (
                row["model_version"],
                "*" if row["current"] else "",
                "pinned" if row["pinned"] else "",
                row["data_as_of"] or "",
                row["data_source"] or "",
                row["universe_size"] or "",
                row["sessions"] or "",
                method(row),
            )
            for row in rows
        ),
    )


def _versioned(fn: Callable[[], str]) -> str:
    """Run a version command; a name that names no kept version is bad usage (exit 2)."""
    from eqrisk.snapshot.versions import UnknownVersion

    try:
        return fn()
    except UnknownVersion as exc:
        raise fail(str(exc), EXIT_USAGE) from None


VersionArg = Annotated[str, typer.Argument(help="A kept version: its full name or vN.")]


@snapshots_app.command("use")
def snapshots_use(version: VersionArg, as_json: JsonOpt = False) -> None:
    """Make a kept version current. Atomically: running servers switch without a restart."""
    store = _store()
    before = store.current()
    chosen = _versioned(lambda: store.use(version))
    show(
        {"current": chosen, "previous": before},
        as_json,
        f"current snapshot: {chosen} (was {before})",
    )


@snapshots_app.command("pin")
def snapshots_pin(version: VersionArg, as_json: JsonOpt = False) -> None:
    """Pin a kept version: pruning after a build never removes it."""
    store = _store()
    chosen = _versioned(lambda: store.set_pinned(version, True))
    show({"pinned": store.pinned()}, as_json, f"pinned {chosen}")


@snapshots_app.command("unpin")
def snapshots_unpin(version: VersionArg, as_json: JsonOpt = False) -> None:
    """Unpin a version: pruning may remove it again. It goes once it is older than the newest
    versions a build keeps."""
    store = _store()
    chosen = _versioned(lambda: store.set_pinned(version, False))
    show({"pinned": store.pinned()}, as_json, f"unpinned {chosen}")


@snapshots_app.command("verify")
def snapshots_verify(
    bucket: Annotated[
        bool,
        typer.Option(
            "--bucket", help="Check the versions the bucket publishes (EQRISK_SNAPSHOT_BUCKET)."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check every kept version's files against their checksums. The checksums are those
    recorded in each manifest when the version was written; a damaged file is named with
    every version that shares it, and the exit status is 1 when one is found. With --bucket,
    every chunk the bucket's versions name is read and hashed."""
    report = configured_bucket().verify() if bucket else _store().verify()
    if as_json:
        print_json(report.describe())
    else:
        for damage in report.damaged:
            result(f"damaged: {damage.line()}")
        if report.unrecorded:
            result(f"no checksums recorded (written before them): {', '.join(report.unrecorded)}")
        state = "all intact" if report.ok else f"{len(report.damaged)} damaged"
        result(
            f"{len(report.versions)} versions, {report.files} files "
            f"({report.bytes / 1e6:.1f} MB) checked: {state}"
        )
    if not report.ok:
        raise typer.Exit(EXIT_FAILURE)


export_app = typer.Typer(help="Write a version's tables as files for other tools.")
app.add_typer(export_app, name="export")

OutOpt = Annotated[
    Path, typer.Option("--out", help="Folder to write the Parquet dataset into (created).")
]
VersionOpt = Annotated[
    str | None, typer.Option("--version", help="A kept version (default: the current one).")
]


def _export_source(version: str | None) -> tuple[str, Any]:
    """The version an export reads (default: the current one) and its opened snapshot."""
    from eqrisk.snapshot.version import SnapshotError

    store = _store()
    name = _versioned(lambda: store.resolve(version)) if version else store.current()
    if name is None:
        raise SnapshotError(f"no snapshot built under {store.root}: run `eqrisk build`")
    return name, store.open(name)


def _show_export(what: str, name: str, out_dir: Path, files: list[Path], as_json: bool) -> None:
    size = sum(f.stat().st_size for f in files)
    show(
        {"version": name, "out": str(out_dir), "files": [f.name for f in files], "bytes": size},
        as_json,
        f"{what} of {name}: {len(files)} files ({size / 1e6:.1f} MB) in {out_dir}",
    )


@export_app.command("security-history")
def export_security_history(
    out_dir: OutOpt, version: VersionOpt = None, as_json: JsonOpt = False
) -> None:
    """The long table security_history as Parquet. A dataset of daily-<chunk>.parquet and
    monthly-<year>.parquet files: a version keeps its daily rows in the arrays only."""
    name, snap = _export_source(version)
    files = snap.export_security_history(out_dir)
    _show_export("security_history", name, out_dir, files, as_json)


@export_app.command("factors")
def export_factors(out_dir: OutOpt, version: VersionOpt = None, as_json: JsonOpt = False) -> None:
    """Factor returns and loadings as Parquet. The whole universe's factor returns
    (factor_returns.parquet: date x factor) and factor loadings (factor_loadings.parquet: (date, ticker) x factor), the frames pyfolio,
    empyrical and skfolio take; the same values as /facts and /betas."""
    from eqrisk.snapshot.factor_frames import export_factors as write_factors

    name, snap = _export_source(version)
    _show_export("factors", name, out_dir, write_factors(snap, out_dir), as_json)
