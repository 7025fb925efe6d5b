"""Column names of foreign price and master layouts: common aliases, an explicit mapping given
by the user (`eqrisk ingest --column symbol=Name`), and the symbol of a one-symbol file.

Names are compared normalised: lower-cased, spaces, dashes and dots as underscores.
"""

from __future__ import annotations

import re
from pathlib import Path

# Price-file aliases beyond the canonical names: source (normalised) -> canonical.
PRICE_ALIASES: dict[str, str] = {
    "name": "symbol",  # one CSV per stock with a `Name` column (the S&P 5-year layout)
    "ticker_symbol": "symbol",
    "adj_close": "adjusted_close",
    "adj._close": "adjusted_close",
    "adjclose": "adjusted_close",
    "timestamp": "date",
    "trade_date": "date",
}
# Master aliases: source (normalised) -> canonical.
MASTER_ALIASES: dict[str, str] = {
    "ticker_symbol": "symbol",
    "gics_sub_industry_name": "gics_sub_industry",
    "gics_sector_name": "gics_sector",
}
PRICE_CANONICAL = (
    "date",
    "symbol",
    "close",
    "adjusted_close",
    "open",
    "high",
    "low",
    "volume",
    "shares",
    "market_cap",
    "split_coefficient",
    "dividend_amount",
)


def norm_name(name: str) -> str:
    return re.sub(r"[\s\-.]+", "_", str(name).strip().lower())


def parse_mapping(items: list[str] | None) -> dict[str, str]:
    """`["symbol=Name", "close=Close Price"]` -> {"symbol": "Name", ...} (canonical -> source).
    Raises ValueError naming the accepted canonical names."""
    out: dict[str, str] = {}
    for item in items or []:
        canon, sep, source = item.partition("=")
        canon = norm_name(canon)
        if not sep or not source.strip() or canon not in PRICE_CANONICAL:
            raise ValueError(
                f"--column {item!r}: expected CANONICAL=SOURCE with CANONICAL one of "
                f"{', '.join(PRICE_CANONICAL)}"
            )
        out[canon] = source.strip()
    return out


def canonical_header(header: list[str], mapping: dict[str, str] | None = None) -> list[str]:
    """The header with the user's mapped columns renamed to their canonical names, then the
    aliases of PRICE_ALIASES renamed where the file has no column of that canonical name. A
    column that the user's mapping displaces keeps its name suffixed `_unmapped` (ignored)."""
    mapping = mapping or {}
    by_source = {norm_name(src): canon for canon, src in mapping.items()}
    out = []
    for name in header:
        canon = by_source.get(norm_name(name))
        if canon is not None:
            out.append(canon)
        elif norm_name(name) in mapping:
            out.append(f"{name}_unmapped")
        else:
            out.append(name)
    present = {norm_name(n) for n in out}
    for i, name in enumerate(out):
        canon = PRICE_ALIASES.get(norm_name(name))
        if canon is not None and canon not in present and name not in mapping:
            out[i] = canon
            present.add(canon)
    return out


def symbol_from_file_name(path: Path) -> str:
    """The symbol of a one-symbol file: its name without suffixes, upper-cased, less a trailing
    `_data` (`AAPL.csv`, `aapl_data.csv.gz`, `BRK.B.csv`)."""
    name = Path(path).name
    for suffix in (".gz", ".csv", ".parquet", ".pq", ".txt"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    for suffix in (".csv", ".parquet"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    name = re.sub(r"[_\-]data$", "", name, flags=re.IGNORECASE)
    return name.strip().upper()


def expand_price_paths(paths: list[Path], suffixes: tuple[str, ...]) -> list[Path]:
    """Directories replaced by their price files (sorted by name), files kept as given."""
    out: list[Path] = []
    for path in paths:
        if Path(path).is_dir():
            out += sorted(
                p for p in Path(path).iterdir() if p.is_file() and p.name.lower().endswith(suffixes)
            )
        else:
            out.append(Path(path))
    return out
