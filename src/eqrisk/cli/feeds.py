"""`eqrisk fetch`: new sessions from a price provider, written in the ingest layout (and the
fetch half of `eqrisk update --from`). Results on stdout, progress on stderr."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from eqrisk.cli.app import (
    EXIT_ENVIRONMENT,
    JsonOpt,
    app,
    err,
    fail,
    get_settings,
    show,
    stages,
)

if TYPE_CHECKING:
    from eqrisk.settings import Settings

ProviderOpt = Annotated[
    str, typer.Option("--provider", help="The price provider: yahoo (keyless) or tiingo (key).")
]
SinceOpt = Annotated[
    str | None,
    typer.Option(
        help="First session to fetch, YYYY-MM-DD (default: the day after the ingested data "
        "set's last session)."
    ),
]
UntilOpt = Annotated[
    str | None, typer.Option(help="Last session to fetch, YYYY-MM-DD (default: today).")
]
SymbolsOpt = Annotated[
    str | None,
    typer.Option(help="Comma-separated tickers (default: every symbol of the ingested set)."),
]


def _day(name: str, value: str) -> date:
    try:
        return date.fromisoformat(value.strip())
    except ValueError:
        raise fail(f"--{name} {value!r} is not a date: give YYYY-MM-DD", 2) from None


def fetch_file(
    settings: Settings,
    provider_name: str,
    since: str | None,
    until: str | None,
    symbols: str | None,
    out: Path | None,
) -> tuple[Path | None, dict[str, Any]]:
    """Fetch and write the new sessions; returns the file (None when there was nothing new)
    and a summary (rows, symbols, sessions, unknown symbols, rate-limit waits)."""
    from eqrisk.data.providers import Access, ProviderError, provider
    from eqrisk.data.providers.feed import (
        fetch,
        last_stored_session,
        stored_anchors,
        write_feed,
    )

    home = settings.home_dir
    try:
        feed = provider(provider_name)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    start, end = _span(since, until, last_stored_session(home))
    anchors = stored_anchors(home, start)
    tickers = (
        [t.strip().upper() for t in symbols.split(",") if t.strip()] if symbols else sorted(anchors)
    )
    if not tickers:
        raise fail("no symbols to fetch: give --symbols, or ingest a data set first", 2)
    key = settings.tiingo_api_key.get_secret_value() if settings.tiingo_api_key else None
    access = Access(
        settings.provider_urls.get(feed.name, feed.url),
        key if feed.key_setting else None,
        timeout=settings.feed_timeout_s,
        max_bytes=settings.feed_max_bytes,
    )
    try:
        with stages(f"fetch from {feed.name}") as say:
            fetched = fetch(
                feed, access, tickers, start, end, anchors, progress=say,
                fetch_timeout=settings.feed_fetch_timeout_s, max_price=settings.max_price,
            )  # fmt: skip
    except ProviderError as exc:
        raise fail(str(exc), EXIT_ENVIRONMENT) from None
    frame = fetched.frame
    if fetched.unknown:
        _say_unknown(sorted(fetched.unknown), feed.name)
    summary: dict[str, Any] = {
        "provider": feed.name,
        "since": start.isoformat(),
        "until": end.isoformat(),
        "rows": len(frame),
        "symbols": int(frame["symbol"].nunique()) if len(frame) else 0,
        "sessions": int(frame["date"].nunique()) if len(frame) else 0,
        "unknown": sorted(fetched.unknown),
        "rate_limit_waits": fetched.waits,
        "file": None,
    }
    if frame.empty:
        return None, summary
    target = out or home / "feeds" / f"{feed.name}-{start}-{end}.csv"
    write_feed(frame, target, home)
    summary["file"] = str(target)
    return target, summary


def _span(since: str | None, until: str | None, last: date | None) -> tuple[date, date]:
    """The sessions to fetch: --since (default: the day after the stored data set's last) to
    --until (default: today)."""
    if since is None and last is None:
        raise fail("no ingested data set to continue: give --since YYYY-MM-DD", 2)
    start = _day("since", since) if since else (last or date.today()) + timedelta(days=1)
    end = _day("until", until) if until else date.today()
    if end < start:
        raise fail(f"--until {end} is before --since {start}", 2)
    return start, end


def _say_unknown(names: list[str], feed: str) -> None:
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    err.print(
        f"skipped {len(names)} symbols {feed} does not know: {shown}", soft_wrap=True, markup=False
    )


@app.command()
def fetch(
    provider: ProviderOpt,
    since: SinceOpt = None,
    until: UntilOpt = None,
    symbols: SymbolsOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="CSV to write (default: EQRISK_HOME/feeds/<provider>-<since>-<until>.csv)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fetch new sessions from a price provider. It writes a price file in the ingest layout: raw
    close, adjusted close (continuing the ingested closes), open/high/low, volume, split and
    dividend factors. Symbols the provider does not know are skipped and listed. Merge it with
    `eqrisk update FILE` (or fetch and merge in one step: `eqrisk update --from PROVIDER`)."""
    path, summary = fetch_file(get_settings(), provider, since, until, symbols, out)
    line = (
        f"{summary['rows']} rows ({summary['symbols']} symbols x {summary['sessions']} sessions) "
        f"from {summary['provider']} in {path}"
        if path
        else f"nothing new from {summary['provider']} from {summary['since']} to {summary['until']}"
    )
    show(summary, as_json, line)
