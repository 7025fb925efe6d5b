"""One immutable version of the snapshot store, read-only (`Snapshot`), and the cheap check
that opening it makes.

    v3-20261121T120000Z/          one immutable version
        manifest.json             model_version, data_as_of, data_source, method, fields, ...
        sessions.npy              (T,) datetime64[D]
        arrays/_rows/<b>.<c>.npy  symbol block b x time chunk c of every float64 metric (`chunks`):
                                  the runs that hold a number, and their index (<b>.<c>.runs.npy)
        arrays/<field>/<b>.<c>.npy  the same chunk of a metric stored narrower (counts: uint8)
        factors.npy               (K x T) Service A factor returns
        symbols.parquet           the spec's `symbols` table (+ row index and hierarchy)
        security_history/         the spec's long table's monthly rows (monthly-<year>.parquet);
                                  its daily rows are the arrays' (`history`)

Versions share history: a chunk (array or Parquet file) equal to the one of the version served
when the build started is a hard link to it, so a new version costs disk only for what changed,
and removing a version (pruning) frees only the files no other version links. Versions written
before chunking (`arrays/<field>.npy`, one `security_history.parquet`), and chunked ones that
store the daily files too (layout `chunks-1`), are still read.

Opening a version checks it cheaply (the manifest parses; every array file or chunk it lists is
there, whole, with the shape the manifest implies), so a damaged version is refused rather than
served; `eqrisk snapshots verify` checks every byte (`verify`).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from eqrisk.snapshot import chunks, history
from eqrisk.snapshot.index import SymbolIndex
from eqrisk.snapshot.risk_arrays import open_risk_arrays


class SnapshotError(RuntimeError):
    """No usable snapshot (none built yet, or the pointer names a missing version)."""


class UnknownVersion(SnapshotError):
    """A version name that names no kept version."""


@dataclass(frozen=True)
class Snapshot:
    """A read-only view of one version. Arrays are memory-mapped: serving N symbols holds no
    per-symbol history in Python objects."""

    path: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, path: Path) -> Snapshot:
        """Open a version after a cheap check (headers and sizes, no data read): a damaged
        version raises SnapshotError here instead of failing a request later."""
        try:
            manifest = json.loads((path / "manifest.json").read_text())
        except FileNotFoundError as exc:
            raise SnapshotError(f"{path} is not a complete snapshot (no manifest.json)") from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise SnapshotError(f"{path}/manifest.json is corrupt: {exc}") from exc
        _check_files(path, manifest)
        return cls(path=path, manifest=manifest)

    @property
    def version(self) -> str:
        return str(self.manifest["model_version"])

    @cached_property
    def sessions(self) -> np.ndarray:
        sessions: np.ndarray = np.load(self.path / "sessions.npy")
        return sessions

    @cached_property
    def session_texts(self) -> np.ndarray:
        """Each session as its YYYY-MM-DD text (object array, aligned with `sessions`), made
        once per version: JSON answers list dates by picking from it."""
        texts: np.ndarray = np.datetime_as_string(
            self.sessions.astype("datetime64[D]"), unit="D"
        ).astype(object)
        return texts

    @cached_property
    def symbols(self) -> pd.DataFrame:
        """The `symbols` table indexed by ticker, with `row` (index into the arrays)."""
        frame = pq.read_table(self.path / "symbols.parquet").to_pandas()
        return frame.set_index("ticker", drop=False)

    @cached_property
    def row_of(self) -> dict[str, int]:
        return dict(zip(self.symbols["ticker"], self.symbols["row"].astype(int), strict=True))

    @property
    def chunked(self) -> bool:
        """Written in chunks shared between versions (else one file per array: older builds)."""
        return "arrays" in self.manifest

    def array(self, field: str) -> chunks.FieldArray:
        """The (n x T) float64 array of one metric, read-only, sliced like a dense array
        (`[row, lo:hi]`, `[:, t]`, `[rows, cols]`) over memory-mapped chunks."""
        return self._arrays[field]

    @cached_property
    def _arrays(self) -> dict[str, chunks.FieldArray]:
        if self.chunked:
            arrays = chunks.open_arrays(self.path, self.manifest["arrays"])
            return {**arrays, **open_risk_arrays(self.path, self.manifest)}
        return {
            name: np.load(self.path / "arrays" / f"{name}.npy", mmap_mode="r")
            for name in self.manifest["fields"]
        }

    @cached_property
    def factor_returns(self) -> np.ndarray:
        factors: np.ndarray = np.load(self.path / "factors.npy", mmap_mode="r")
        return factors

    @property
    def factor_names(self) -> list[str]:
        return list(self.manifest["factors"]["names"])

    @cached_property
    def index(self) -> SymbolIndex:
        """The version's lookups (tickers, sessions, factors), built on first use, kept with it."""
        return SymbolIndex(self)

    @property
    def stores_daily_history(self) -> bool:
        """Whether the long table's daily rows are files of this version (versions written
        before layout `chunks-2`); else they are generated from the arrays on read."""
        return history.stores_daily(self)

    def security_history(self, **filters: Any) -> pd.DataFrame:
        """The spec's long table, optionally filtered by column equality (see `history`)."""
        return history.read(self, filters)

    def export_security_history(self, out: Path) -> list[Path]:
        """Write the spec's long table as a Parquet dataset into the folder `out` (see
        `history.export`). Returns the files written."""
        return history.export(self, out)

    @cached_property
    def symbol_names(self) -> list[str]:
        """Tickers in row order (the arrays' rows)."""
        frame = self.symbols.sort_values("row")
        return [str(t) for t in frame["ticker"]]

    def metadata(self) -> dict[str, Any]:
        """The `_metadata` block every answer carries."""
        m = self.manifest
        return {
            "model_version": m["model_version"],
            "data_as_of": m["data_as_of"],
            "universe_size": m["universe_size"],
            "data_source": m["data_source"],
            "method": m["method"],
        }


# Parsed .npy headers by their bytes: a version's thousands of chunk files share a few headers.
# Bounded: a long-lived server opening version after version (the tail chunk's width changes
# daily) starts over when it holds this many.
_HEADERS: dict[bytes, tuple[tuple[int, ...], np.dtype[Any], int]] = {}
_HEADERS_MAX = 4096


def _npy_shape(path: Path | str) -> tuple[tuple[int, ...], np.dtype[Any] | None, str]:
    """(shape, dtype, problem) of a .npy file from its header and size; problem is '' when
    whole."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(12)  # the magic, the version and the header's length (2 or 4 bytes)
            if len(head) == 12:
                size_of = 2 if head[6] == 1 else 4
                length = int.from_bytes(head[8 : 8 + size_of], "little")
                head += fh.read(max(8 + size_of + length - 12, 0))
            size = os.fstat(fh.fileno()).st_size
        parsed = _HEADERS.get(head)
        if parsed is None:
            parsed = _parse_header(head)
            if len(_HEADERS) >= _HEADERS_MAX:
                _HEADERS.clear()
            _HEADERS[head] = parsed
    except FileNotFoundError:
        return (), None, "is missing"
    except (ValueError, OSError) as exc:
        return (), None, f"has no valid header ({exc})"
    shape, dtype, payload = parsed
    expected = len(head) + payload
    if size != expected:
        return tuple(shape), dtype, f"holds {size} bytes where its header implies {expected}"
    return tuple(shape), dtype, ""


def _parse_header(head: bytes) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """(shape, dtype, the data's size in bytes) of a .npy file's first bytes, its whole header
    (numpy's reader)."""
    fh = io.BytesIO(head)
    major, _minor = np.lib.format.read_magic(fh)
    if major == 1:
        shape, _fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    else:
        shape, _fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    if fh.tell() != len(head):
        raise ValueError(f"a header of {fh.tell()} bytes in {len(head)}")
    return tuple(shape), dtype, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _check_files(path: Path, manifest: dict[str, Any]) -> None:
    """Every file of a version present, whole and of the shape the manifest implies."""
    try:
        n, t = int(manifest["universe_size"]), int(manifest["sessions"])
        expected: dict[Path, tuple[tuple[int | None, ...], str | None]] = {
            Path("sessions.npy"): ((t,), None),
            Path("factors.npy"): ((len(manifest["factors"]["names"]), t), None),
        }
        if "arrays" in manifest:
            grid = chunks.ChunkGrid.of(manifest["arrays"]["grid"])
            if (grid.n, grid.t) != (n, t):
                raise ValueError(f"a chunk grid of {grid.n} x {grid.t} for {n} x {t}")
            for rel, cell, kind in chunks.expected_chunks(manifest["arrays"]):
                expected[rel] = (cell, kind)
            parquet_files = ["symbols.parquet", *manifest["security_history"]]
        else:
            expected.update(
                {Path("arrays") / f"{f}.npy": ((n, t), None) for f in manifest["fields"]}
            )
            parquet_files = ["symbols.parquet", "security_history.parquet"]
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"{path}/manifest.json lacks {exc}: not a snapshot manifest") from exc
    top = str(path)
    for rel, (shape, code) in expected.items():
        found, dtype, problem = _npy_shape(os.path.join(top, rel))  # strings: thousands of files
        if not problem and not chunks.shape_fits(found, shape):
            problem = f"has shape {found} where the manifest implies {shape}"
        if not problem and code is not None and dtype != chunks.FILE_DTYPES.get(code):
            problem = f"holds {dtype} where the manifest implies {chunks.FILE_DTYPES.get(code)}"
        if problem:
            raise SnapshotError(f"snapshot {path.name} is damaged: {rel} {problem}")
    for name in parquet_files:
        try:
            with open(path / name, "rb") as fh:
                fh.seek(-4, os.SEEK_END)
                whole = fh.read(4) == b"PAR1"
        except FileNotFoundError:
            raise SnapshotError(f"snapshot {path.name} is damaged: {name} is missing") from None
        except OSError:
            whole = False
        if not whole:
            raise SnapshotError(f"snapshot {path.name} is damaged: {name} is truncated")
