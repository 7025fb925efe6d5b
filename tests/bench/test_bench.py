"""The benchmarks run end to end and compare like with like. No timing is asserted: speed is
read from `eqrisk bench`, not from tests."""

from __future__ import annotations

import pytest

from eqrisk.bench import model, serve


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
