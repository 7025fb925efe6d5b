"""`api.records` writes the bytes orjson writes for a list of row dicts (the portfolio answer's
positions), from columns: numbers from their buffers (NaN as null, -0.0, extremes), text with
every escape, coded columns; several tables into one buffer, grown as it fills; spliced into a
document in their places."""

from __future__ import annotations

import threading

import numpy as np
import orjson
import pytest

from eqrisk.api.records import Coded, coded, records, splice, splice_marks


def _table(n: int, seed: int) -> tuple[dict[str, object], bytes]:
    rng = np.random.default_rng(seed)
    tickers = [f"T{i:05d}" for i in range(n)]
    if n > 4:
        tickers[1:5] = ['A"B', "C,D", "E\\F\n", "\u00e9\u4e2d\x01"]
    x = rng.normal(0.0, 1.0, n) * 10.0 ** rng.integers(-300, 300, n)
    if n > 8:
        x[5:9] = [np.nan, -0.0, np.inf, 5e-324]
    y = rng.normal(0.0, 1e-4, n)
    level = rng.integers(0, 4, n)
    code = np.where(rng.random(n) < 0.1, 4, level)
    words = ["none", "one", "two", "three, with a comma", 'a "factor"']
    table = {
        "ticker": tickers,
        "x": x,
        "y": y,
        "level": level,
        "model": Coded(code, words),
    }
    rows = [
        {"ticker": t, "x": a, "y": b, "level": lv, "model": words[c]}
        for t, a, b, lv, c in zip(
            tickers, x.tolist(), y.tolist(), level.tolist(), code.tolist(), strict=True
        )
    ]
    return table, orjson.dumps(rows)


@pytest.mark.parametrize("n", [0, 1, 9, 5000])
def test_a_table_is_the_bytes_orjson_writes_for_its_rows(n: int) -> None:
    table, want = _table(n, seed=n)
    (got,) = records([table])
    assert bytes(got) == want
    assert orjson.loads(bytes(got)) == orjson.loads(want)


def test_tables_share_a_buffer_that_grows_as_it_fills() -> None:
    small, small_want = _table(3, seed=1)
    records([small])  # the thread's buffers start small
    big, big_want = _table(20000, seed=2)
    first, second, third = records([small, big, small])
    assert bytes(first) == small_want and bytes(third) == small_want
    assert bytes(second) == big_want


def test_each_thread_writes_into_its_own_buffer() -> None:
    tables = [_table(3000, seed=k) for k in range(4)]
    found: dict[int, bool] = {}

    def write(k: int) -> None:
        ok = True
        for _ in range(20):
            (got,) = records([tables[k][0]])
            ok &= bytes(got) == tables[k][1]
        found[k] = ok

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert found == dict.fromkeys(range(4), True)


def test_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        records([{"a": np.zeros(2), "b": ["x"]}])


def test_the_parts_are_spliced_in_their_places() -> None:
    a, a_want = _table(50, seed=3)
    b, b_want = _table(7, seed=4)
    marks = splice_marks(2)
    doc = {"first": {"rows": marks[0]}, "text": "\x00 0 \x00", "second": marks[1], "end": [1]}
    body = splice(orjson.dumps(doc), records([a, b]))
    got = orjson.loads(body)
    assert got == {
        "first": {"rows": orjson.loads(a_want)},
        "text": "\x00 0 \x00",
        "second": orjson.loads(b_want),
        "end": [1],
    }
    with pytest.raises(ValueError, match="placeholder 1"):
        splice(orjson.dumps({"only": marks[0]}), [b"[]", b"[]"])


def test_a_column_of_few_values_is_coded_once_per_value() -> None:
    reasons = ["not in the model's universe", "position is zero", "not in the model's universe"]
    column = coded(reasons)
    assert column.codes.tolist() == [0, 1, 0] and list(column.values) == reasons[:2]
    (got,) = records([{"ticker": ["X", "Y", "Z"], "reason": column}])
    want = [{"ticker": t, "reason": r} for t, r in zip("XYZ", reasons, strict=True)]
    assert bytes(got) == orjson.dumps(want)
