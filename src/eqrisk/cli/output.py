"""Where the command line writes. Every command follows one rule, kept here:

- **stdout: results**, what a script reads: a summary line, a table, a key, `--json`'s one
  JSON document (`result`, `result_table`, `print_mapping`, `print_json`, `show`).
- **stderr: everything else**: progress (`stages`, a spinner at a terminal), notes for people
  (`note`), one-line errors (`say_error`), a server's banner and access log.

Nothing written is ever cut or wrapped where a script or a log reads it: a line is one line
whatever its length (`soft_wrap`), and away from a terminal (a pipe, a file, CI) a table is as
wide as its widest cell. At a terminal a table that does not fit folds its cells onto more lines
(every character stays) instead of ending them with an ellipsis.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # rich's console and tables load on first use: `eqrisk --help` needs neither
    from rich.console import Console

# The width of a console that is not a terminal: wide enough that rich never cuts a cell.
UNBOUNDED = 1_000_000
# Away from a terminal, a stage that counts (blocks, chunks) is reported this often at most.
PROGRESS_EVERY = 10.0


def _console(stderr: bool) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else UNBOUNDED
    return Console(stderr=stderr, width=width, soft_wrap=True, highlight=False)


def escape(text: str) -> str:
    """`text` shown as written, never read as rich markup (rich.markup's escape)."""
    from rich.markup import escape as escape_markup

    return escape_markup(text)


class _FirstUse:
    """A console made when a command first writes with it."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            self._console = _console(self._stderr)
        return getattr(self._console, name)


out = cast("Console", _FirstUse(stderr=False))  # results
err = cast("Console", _FirstUse(stderr=True))  # progress, notes, errors


def result(line: str) -> None:
    """One result line on stdout (rich markup allowed: escape the values you put in it)."""
    out.print(line)


def note(line: str) -> None:
    """One line for people on stderr (what happened, what to do next): never a result."""
    err.print(line)


def print_json(doc: Any) -> None:
    """`--json`: one JSON document on stdout."""
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def show(doc: Any, as_json: bool, line: str) -> None:
    """A command's result: the JSON document with `--json`, else its line for people."""
    if as_json:
        print_json(doc)
    else:
        result(line)


def result_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None
) -> None:
    """Rows as a table on stdout; a cell is never cut (see the module docstring)."""
    from rich.table import Table

    table = Table(*headers, title=title)
    for column in table.columns:
        column.overflow = "fold"
    for row in rows:
        table.add_row(*(escape(str(cell)) for cell in row))
    out.print(table)


def print_mapping(doc: dict[str, Any], as_json: bool, heading: str) -> None:
    """A flat mapping as one JSON document, or as a two-column table for people."""
    if as_json:
        print_json(doc)
    else:
        result_table((heading, "value"), doc.items())


def say_error(message: str) -> None:
    """One line on stderr, never wrapped (scripts and logs read it whole)."""
    err.print(f"[bold red]error:[/] {escape(message)}")


@contextmanager
def stages(title: str) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr showing the current stage and the elapsed time; away from a
    terminal (a log, a container, a pipe), where a spinner shows nothing, one line per stage."""
    start = time.perf_counter()
    if not err.is_terminal:
        last_stage, last_at = "", 0.0

        def line(message: str) -> None:
            # A counter ("block 3/40") is the same stage: a line when it starts, then one
            # every PROGRESS_EVERY seconds at most, so a log is never flooded.
            nonlocal last_stage, last_at
            stage, now = re.sub(r"\d+", "#", message), time.perf_counter()
            if stage == last_stage and now - last_at < PROGRESS_EVERY:
                return
            last_stage, last_at = stage, now
            err.print(f"{title}: {escape(message)} ({now - start:.1f}s)")

        yield line
        err.print(f"done {title} in {time.perf_counter() - start:.1f}s")
        return
    with err.status(title) as status:

        def say(message: str) -> None:
            status.update(f"{title}: {message} [dim]({time.perf_counter() - start:.1f}s)[/]")

        yield say
    err.print(f"[green]done[/] {title} in {time.perf_counter() - start:.1f}s")
