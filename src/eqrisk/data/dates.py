"""The one date parser of the input files: one format per file, found from the whole column.

A day-first file (`02/01/2019`, `13/01/2019`) parsed row by row reads `13/01` day-first and
`02/01` as 1 February: rows land on wrong dates without an error. So a column's format is chosen
once, from all of its distinct values: the format that reads every value that any known format
reads. A column that two formats read differently (every day <= 12: `01/02/2019` only) is
ambiguous, and one whose values need two formats is mixed; both are refused with the formats
seen and the option that states the format (`--date-format`). Values no format reads stay bad
cells (the row is rejected as BAD_DATE). A time or zone suffix (`2019-01-02 16:00:00-05:00`) is
dropped: the date is the local date written.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from eqrisk.data.ingest_report import IngestError

# Name -> strptime pattern, in the order they are tried (and named in messages).
DATE_FORMATS: dict[str, str] = {
    "YYYY-MM-DD": "%Y-%m-%d",
    "YYYY/MM/DD": "%Y/%m/%d",
    "YYYYMMDD": "%Y%m%d",
    "MM/DD/YYYY": "%m/%d/%Y",
    "DD/MM/YYYY": "%d/%m/%Y",
    "DD.MM.YYYY": "%d.%m.%Y",
    "MM-DD-YYYY": "%m-%d-%Y",
    "DD-MM-YYYY": "%d-%m-%Y",
    "DD-Mon-YYYY": "%d-%b-%Y",
    "DD Mon YYYY": "%d %b %Y",
    "Mon DD YYYY": "%b %d %Y",
    "Mon DD, YYYY": "%b %d, %Y",
    "DD Month YYYY": "%d %B %Y",
    "Month DD, YYYY": "%B %d, %Y",
    "MM/DD/YY": "%m/%d/%y",
    "DD/MM/YY": "%d/%m/%y",
}
DATE_OPTION = "--date-format"
_TIME_SUFFIX = re.compile(
    r"[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d*)?)?\s*(?:Z|UTC|[+-]\d{2}:?\d{2})?$", re.IGNORECASE
)
_NA = {"", "na", "n/a", "nan", "null", "none", "#n/a", "nat"}
_MIN_YEAR, _MAX_YEAR = 1900, 2200


class DateFormatError(IngestError):
    """A date column whose format cannot be told from its values (ambiguous or mixed)."""


def format_pattern(date_format: str) -> str:
    """A format given by the user: a name of DATE_FORMATS (any case) or a strptime pattern."""
    if "%" in date_format:
        return date_format
    by_name = {name.lower(): pattern for name, pattern in DATE_FORMATS.items()}
    pattern = by_name.get(date_format.strip().lower())
    if pattern is None:
        raise IngestError(
            f"{DATE_OPTION} {date_format!r}: give one of {', '.join(DATE_FORMATS)} or a strptime "
            "pattern such as %d/%m/%Y"
        )
    return pattern


def _strip_time(text: str) -> str:
    text = text.strip()
    stripped = _TIME_SUFFIX.sub("", text, count=1)
    return stripped or text


def _parse(values: Sequence[str], pattern: str) -> np.ndarray:
    """datetime64[ns] of each value read with one pattern (NaT where it does not fit)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = pd.to_datetime(
            pd.Index(list(values), dtype=object), format=pattern, errors="coerce"
        )
    out = parsed.to_numpy().astype("datetime64[ns]")
    years = out.astype("datetime64[Y]").astype(np.int64) + 1970
    out[(years < _MIN_YEAR) | (years > _MAX_YEAR)] = np.datetime64("NaT")
    return out


def parse_date_values(
    values: Sequence[str], date_format: str | None = None, *, source: str = "dates"
) -> np.ndarray:
    """datetime64[ns] (NaT where unreadable or missing) of distinct date texts, all read with one
    format: `date_format` when given, else the one the whole column admits (see the module).
    Raises DateFormatError for an ambiguous or mixed column, naming the formats seen."""
    texts = [_strip_time(str(v)) for v in values]
    present = [i for i, t in enumerate(texts) if t.lower() not in _NA]
    out = np.full(len(texts), np.datetime64("NaT"), dtype="datetime64[ns]")
    if not present:
        return out
    cells = [texts[i] for i in present]
    if date_format is not None:
        out[present] = _declared(cells, date_format, source)
        return out
    reads = {name: _parse(cells, pattern) for name, pattern in DATE_FORMATS.items()}
    fits = {name: ~np.isnat(parsed) for name, parsed in reads.items()}
    readable = np.logical_or.reduce(list(fits.values()))
    if not readable.any():
        return out  # nothing is a date: every row is a BAD_DATE
    whole = [name for name, ok in fits.items() if (ok | ~readable).all()]
    if not whole:
        raise DateFormatError(_mixed_message(source, cells, fits, readable))
    first = reads[whole[0]]
    differ = [n for n in whole[1:] if not np.array_equal(reads[n][readable], first[readable])]
    if differ:
        raise DateFormatError(_ambiguous_message(source, cells, [whole[0], *differ], readable))
    out[present] = first
    return out


def _declared(cells: list[str], date_format: str, source: str) -> np.ndarray:
    """The cells read with the stated format; DateFormatError when the column's other evidence
    contradicts it: a known format reads every value the stated one reads, and more, and reads
    some of them as another day (a DD/MM file read as MM/DD: 01/02 taken for 2 January while
    13/01 proves the file day-first)."""
    parsed = _parse(cells, format_pattern(date_format))
    missed = np.isnat(parsed)
    if not missed.any():
        return parsed
    read = ~missed
    for name, pattern in DATE_FORMATS.items():
        other = _parse(cells, pattern)
        fits = ~np.isnat(other)
        if not fits[read].all() or not fits[missed].any():
            continue
        differs = read & (other != parsed)
        if differs.any():
            raise DateFormatError(
                f"{source}: {DATE_OPTION} {date_format} reads {_examples(cells, differs, 2)} as "
                f"another day than the column allows: {name} reads every value it reads and "
                f"{int((fits & missed).sum())} it cannot (e.g. {_examples(cells, fits & missed, 2)}); "
                f"state {DATE_OPTION} {name}, or leave it out to have it found"
            )
    return parsed


def _examples(cells: list[str], mask: np.ndarray, k: int = 3) -> str:
    return ", ".join(repr(c) for c in np.asarray(cells, dtype=object)[mask][:k])


def _ambiguous_message(source: str, cells: list[str], names: list[str], ok: np.ndarray) -> str:
    return (
        f"{source}: the dates are ambiguous: every value reads as {' and as '.join(names)} "
        f"with different dates (e.g. {_examples(cells, ok)}); state the format with "
        f"{DATE_OPTION} {names[0]} (or {names[1]})"
    )


def _mixed_message(
    source: str, cells: list[str], fits: dict[str, np.ndarray], readable: np.ndarray
) -> str:
    """The formats seen: for each format that reads values no earlier-named one does, how many
    and an example."""
    seen, covered = [], np.zeros(len(cells), dtype=bool)
    for name, ok in sorted(fits.items(), key=lambda kv: -int(kv[1].sum())):
        new = ok & ~covered
        if new.any():
            seen.append(f"{name} ({int(ok.sum())} values, e.g. {_examples(cells, new, 2)})")
            covered |= ok
        if covered[readable].all():
            break
    return (
        f"{source}: the dates mix formats: {'; '.join(seen)}; one format per file is read: "
        f"state it with {DATE_OPTION} (values that do not fit it are rejected as BAD_DATE)"
    )
