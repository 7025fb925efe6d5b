"""In-process speed of the answer writers (`api.writers`), next to orjson on the same rows and
next to the renderers they replaced, all measured in one run on the rows of the bench's large
answers (no HTTP: what rendering alone costs).

The rows are the very columns the routes hand to the renderers: the bench asks the app
in-process (ASGI, no network) for each large answer and keeps what reached the renderer.
"""

from __future__ import annotations

import csv
import io
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from fastapi.testclient import TestClient

from eqrisk.api import formats, writers
from eqrisk.api.app import create_app
from eqrisk.settings import Settings

T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """The rows of one answer as its route hands them over, with its JSON envelope."""

    name: str
    columns: dict[str, Any]
    envelope: dict[str, Any] | None


def capture(home: Path, requests: Sequence[tuple[str, str, Mapping[str, str]]]) -> list[Answer]:
    """(name, path, headers) -> the columns and envelope each answer was rendered from."""
    seen: list[tuple[dict[str, Any], Any]] = []
    json_renderer = formats.RENDERERS[formats.JSON]

    def spy(
        columns: formats.Columns, envelope: Mapping[str, Any] | None, filename: str
    ) -> tuple[bytes, dict[str, str]]:
        seen.append((dict(columns), None if envelope is None else dict(envelope)))
        return json_renderer(columns, envelope, filename)

    settings = Settings(home=home, render_cache_mb=0, _env_file=None)
    answers = []
    formats.RENDERERS[formats.JSON] = spy
    try:
        with TestClient(create_app(settings)) as client:
            for name, path, headers in requests:
                seen.clear()
                client.get(path, headers=dict(headers)).raise_for_status()
                if len(seen) != 1:
                    raise RuntimeError(f"{name}: {len(seen)} renderings, expected one")
                answers.append(Answer(name, *seen[0]))
    finally:
        formats.RENDERERS[formats.JSON] = json_renderer
    return answers


def best_of(ways: Mapping[str, Callable[[], T]], repeats: int) -> dict[str, tuple[float, T]]:
    """Per way, the fastest of `repeats` runs (the machine's noise only ever adds time) and its
    output. The ways take turns, one run each per round, so that a busy spell of the shared
    machine falls on all of them alike rather than on whichever ran then."""
    best: dict[str, tuple[float, T]] = {}
    for _ in range(repeats):
        for way, make in ways.items():
            t0 = time.perf_counter()
            out = make()
            seconds = time.perf_counter() - t0
            best[way] = (min(best[way][0], seconds) if way in best else seconds, out)
    return best


def _before_json(answer: Answer) -> bytes:
    """The JSON renderer the writers replaced: a dict per row, then orjson."""
    rows = formats.rows_of(answer.columns)
    doc = rows if answer.envelope is None else {"data": rows, **answer.envelope}
    return formats.dumps(doc)


def _before_csv(answer: Answer) -> bytes:
    """The CSV renderer the writers replaced: Arrow columns, then pyarrow's CSV writer."""
    sink = io.BytesIO()
    table = writers.arrow_table(answer.columns)
    pacsv.write_csv(table, sink, pacsv.WriteOptions(quoting_style="needed"))
    return sink.getvalue()


def _pyarrow_csv(table: pa.Table) -> bytes:
    """pyarrow's CSV writer alone, on a table built beforehand."""
    sink = io.BytesIO()
    pacsv.write_csv(table, sink, pacsv.WriteOptions(quoting_style="needed"))
    return sink.getvalue()


def same_cells(old: bytes, new: bytes) -> bool:
    """Two CSV texts hold the same cells: the same text, or numbers that parse to the
    identical float64 (where the exponent notation starts may differ)."""
    old_rows = list(csv.reader(io.StringIO(old.decode())))
    new_rows = list(csv.reader(io.StringIO(new.decode())))
    if len(old_rows) != len(new_rows):
        return False
    for a, b in zip(old_rows, new_rows, strict=True):
        if len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=True):
            if x != y and not _same_number(x, y):
                return False
    return True


def _same_number(x: str, y: str) -> bool:
    try:
        return struct.pack("<d", float(x)) == struct.pack("<d", float(y))
    except ValueError:
        return False


def _numpy_columns(columns: Mapping[str, Any]) -> dict[str, Any]:
    """What orjson takes as columns: numeric arrays as they are, other columns as lists."""
    return {
        k: v if isinstance(v, np.ndarray) and v.dtype.kind in "fiub" else list(np.asarray(v))
        for k, v in columns.items()
    }


def measure(answer: Answer, repeats: int) -> dict[str, Any]:
    """MB/s of output of each way to write the answer's rows; each figure is bytes written
    over the fastest time. `json_identical`: the writer's JSON is the replaced renderer's."""
    rows = formats.rows_of(answer.columns)
    numpy_cols = _numpy_columns(answer.columns)
    table = writers.arrow_table(answer.columns)
    env = answer.envelope

    ways: dict[str, Callable[[], bytes]] = {
        "writer json": lambda: formats.RENDERERS[formats.JSON](answer.columns, env, "b")[0],
        "writer json columns": lambda: formats.RENDERERS[formats.JSON_COLUMNS](
            answer.columns, env, "b"
        )[0],
        "writer csv": lambda: formats.RENDERERS[formats.CSV](answer.columns, env, "b")[0],
        "before json (dict per row + orjson)": lambda: _before_json(answer),
        "before csv (pyarrow)": lambda: _before_csv(answer),
        "pyarrow write_csv alone (table built beforehand)": lambda: _pyarrow_csv(table),
        "orjson on row dicts (built beforehand)": lambda: formats.dumps(rows),
        "orjson on numpy columns": lambda: formats.dumps(numpy_cols),
    }
    figures: dict[str, dict[str, float]] = {}
    outputs: dict[str, bytes] = {}
    for way, (seconds, out) in best_of(ways, repeats).items():
        outputs[way] = out
        figures[way] = {
            "mb": len(out) / 1e6,
            "ms": seconds * 1e3,
            "mb_per_s": len(out) / seconds / 1e6,
        }
    before = figures["before json (dict per row + orjson)"]["ms"]
    before_csv = figures["before csv (pyarrow)"]["ms"]
    pyarrow_alone = figures["pyarrow write_csv alone (table built beforehand)"]["ms"]
    return {
        "answer": answer.name,
        "rows": len(rows),
        "columns": len(answer.columns),
        "repeats": repeats,
        "ways": figures,
        # the same rows: the time the replaced renderer took over the writer's
        "json_speedup": before / figures["writer json"]["ms"],
        "csv_speedup": before_csv / figures["writer csv"]["ms"],
        # pyarrow's writer without the Arrow table's construction, over the writer's time
        "csv_speedup_vs_write_csv_alone": pyarrow_alone / figures["writer csv"]["ms"],
        "json_identical": outputs["writer json"] == outputs["before json (dict per row + orjson)"],
        "csv_same_cells": same_cells(outputs["before csv (pyarrow)"], outputs["writer csv"]),
    }
