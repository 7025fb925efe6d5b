"""The benchmarks run end to end and compare like with like. No timing is asserted: speed is
read from `eqrisk bench`, not from tests."""

from __future__ import annotations

import pytest

from eqrisk.bench import model, render, serve
from helpers import TEST_KEY, bearer


def test_bench_model_matches_rollingols() -> None:
    result = model.run(
        model.ModelBench(symbols=40, sessions=600, baseline_symbols=3), say=lambda _m: None
    )
    assert result["max_abs_diff_vs_rollingols"] < 1e-10
    assert result["rollingols_symbols_measured"] == 3
    assert result["speedup"] > 0


@pytest.mark.slow
def test_bench_serve_loads_every_target_with_both_cache_settings() -> None:
    result = serve.run(seconds=0.5, connections=2, generator="httpx", say=lambda _m: None)
    rows = result["results"]
    assert [(r["cache"], r["target"]) for r in rows][:2] == [
        ("off", "health"),
        ("off", "ticker-returns 15y json"),
    ]
    assert len(rows) == 10
    for row in rows:
        assert row["rps"] > 0 and row["p50_ms"] <= row["p99_ms"]
    big = {r["target"]: r["bytes"] for r in rows if r["cache"] == "off"}
    assert big["ticker-returns 15y json"] > big["ticker-returns 15y parquet"] > 100_000
    for row in rows:
        assert row["mb_per_s"] == pytest.approx(row["bytes"] * row["rps"] / 1e6)
    loaded = result["health_under_large_answers"]
    assert loaded["probes"] > 10 and loaded["p50_ms"] <= loaded["p99_ms"] <= loaded["max_ms"]
    assert loaded["connections_fetching_large_answers"] == 8
    assert len(loaded["large_answers"]) == 4  # ticker-returns json and parquet, daily json and csv
    assert [w["answer"] for w in result["writers"]] == list(serve.LARGE_ANSWERS)
    assert all(w["json_identical"] for w in result["writers"])


def test_bench_writers_quick_mode_measures_the_same_rows_every_way(demo_settings) -> None:
    """The in-process half of `bench serve` on small answers: every way writes the rows the
    route handed over, the writer's JSON is the replaced renderer's, the figures add up."""
    requests = [
        ("ticker-returns 2y", "/api/ticker-returns?ticker=NVDA&years=2", bearer(TEST_KEY)),
        ("daily 2 x 1y", "/daily?symbols=NVDA,AAPL&start_time=2024-01-01", {"apikey": TEST_KEY}),
    ]
    answers = render.capture(demo_settings.home_dir, requests)
    assert [a.name for a in answers] == ["ticker-returns 2y", "daily 2 x 1y"]
    assert answers[0].envelope is not None and answers[1].envelope is None
    for answer in answers:
        result = render.measure(answer, repeats=1)
        ways = result["ways"]
        assert result["json_identical"] is True
        n = len(next(iter(answer.columns.values())))
        assert result["rows"] == n > 200 and result["columns"] == len(answer.columns)
        same_rows = [
            "writer json",
            "before json (dict per row + orjson)",
        ]
        assert ways[same_rows[0]]["mb"] == ways[same_rows[1]]["mb"]
        # CSV: the same cells; only where exponent notation starts may differ in length
        assert ways["writer csv"]["mb"] == pytest.approx(ways["before csv (pyarrow)"]["mb"], 0.05)
        # the column layout and orjson's numpy columns hold the same arrays
        assert ways["writer json columns"]["mb"] < ways["writer json"]["mb"]
        for fig in ways.values():
            assert fig["mb"] > 0 and fig["ms"] > 0
            assert fig["mb_per_s"] == pytest.approx(fig["mb"] / (fig["ms"] / 1e3))
        before = ways["before json (dict per row + orjson)"]["ms"]
        assert result["json_speedup"] == pytest.approx(before / ways["writer json"]["ms"])
