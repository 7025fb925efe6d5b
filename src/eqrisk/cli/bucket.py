"""`eqrisk snapshots push` and `pull`: versions on an S3-compatible bucket (the
`snapshot_bucket` setting, docs/decisions/snapshot-store.md), for a fleet without a shared
mount: the build host pushes, each server host pulls (or `eqrisk serve` follows the bucket)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from eqrisk.cli.app import EXIT_USAGE, JsonOpt, fail, get_settings
from eqrisk.cli.output import note, show
from eqrisk.cli.snapshots import _store, _versioned, configured_bucket, snapshots_app

if TYPE_CHECKING:
    from eqrisk.snapshot.bucket import Bucket, Pushed
    from eqrisk.snapshot.store import VersionStore


def push_version(
    bucket: Bucket, store: VersionStore, version: str, *, current: bool, keep: int | None
) -> Pushed:
    """Publish a local version, move the bucket's CURRENT to it (with `current`), prune the
    bucket to `keep` versions (None: no pruning); the store's build lock is held throughout,
    so a build on this host waits (one publisher per bucket)."""
    with store.lock():
        pushed = bucket.push(store, version)
        if current:
            bucket.set_current(version)
            pushed.current = version
        if keep is not None:
            bucket.set_pinned(store.pinned())
            pushed.pruned, pushed.chunks_removed = bucket.prune(keep)
    return pushed


def pushed_line(pushed: Pushed, url: str) -> str:
    line = (
        f"pushed {pushed.version} to {url}: {pushed.uploaded} files uploaded "
        f"({pushed.uploaded_bytes / 1e6:.1f} MB), {pushed.shared} already there"
    )
    if pushed.current:
        line += f"; the bucket's CURRENT is {pushed.current}"
    if pushed.pruned:
        line += f"; pruned {', '.join(pushed.pruned)} ({pushed.chunks_removed} chunks removed)"
    return line


@snapshots_app.command("push")
def snapshots_push(
    version: Annotated[
        str | None, typer.Argument(help="A kept local version (default: the current one).")
    ] = None,
    no_current: Annotated[
        bool, typer.Option("--no-current", help="Publish without moving the bucket's CURRENT.")
    ] = False,
    keep: Annotated[
        int, typer.Option(min=1, help="Newest versions the bucket keeps (pinned ones besides).")
    ] = 3,
    as_json: JsonOpt = False,
) -> None:
    """Publish a local version to the bucket. The chunk files the bucket lacks, then the
    manifest (a push killed half way publishes nothing); then the bucket's CURRENT moves to it
    (servers following the bucket switch) and the bucket is pruned. Pushing a version the
    bucket has moves CURRENT back to it (a rollback)."""
    bucket = configured_bucket()
    store = _store()
    name = _versioned(lambda: store.resolve(version)) if version else store.current()
    if name is None:
        raise fail(f"no snapshot built under {store.root}: run `eqrisk build`", EXIT_USAGE)
    pushed = push_version(bucket, store, name, current=not no_current, keep=keep)
    show(pushed.describe(), as_json, pushed_line(pushed, bucket.url))


@snapshots_app.command("pull")
def snapshots_pull(
    version: Annotated[
        str | None,
        typer.Argument(help="A version the bucket publishes (default: the bucket's CURRENT)."),
    ] = None,
    no_current: Annotated[
        bool, typer.Option("--no-current", help="Copy it without making it current here.")
    ] = False,
    keep: Annotated[
        int | None,
        typer.Option(min=1, help="Newest local versions to keep (default: no pruning)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Copy a version from the bucket into this host's store. It is made current; files a
    local version already has are hard-linked, the others downloaded and checked against
    their checksums; running servers switch without a restart."""
    from eqrisk.snapshot.cache import pull

    bucket = configured_bucket()
    pulled = pull(bucket, _store(), version, make_current=not no_current, keep=keep)
    if pulled.already:
        line = f"{pulled.version} was here already"
    else:
        line = (
            f"pulled {pulled.version}: {pulled.downloaded} files downloaded "
            f"({pulled.downloaded_bytes / 1e6:.1f} MB), {pulled.linked} linked from local versions"
        )
    if pulled.current:
        line += "; it is current here"
    if pulled.pruned:
        line += f"; pruned {', '.join(pulled.pruned)}"
    show(pulled.describe(), as_json, line)


def push_after_build(version: str, keep: int) -> None:
    """`eqrisk build` with a bucket configured: the new version is pushed and made the
    bucket's CURRENT (one line on stderr)."""
    from eqrisk.snapshot.bucket import Bucket

    bucket = Bucket.from_settings(get_settings())
    if bucket is None:
        return
    pushed = push_version(bucket, _store(), version, current=True, keep=keep)
    note(pushed_line(pushed, bucket.url))
