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


def test_bench_metered_quick_mode_is_consistent(demo_home, tmp_path) -> None:
    """`measure_metered` in its quick mode (small ledger, half-second loads, the httpx
    generator) on a copy of the demo home: every figure is there, and the money adds up."""
    import shutil

    home = tmp_path / "home"
    shutil.copytree(demo_home / "snapshots", home / "snapshots")
    result = serve.measure_metered(
        home,
        seconds=0.5,
        ledger_rows=2_500,
        balance_calls=20,
        connections=4,
        generator="httpx",
        say=lambda _m: None,
    )
    rows = {r["target"]: r for r in result["results"]}
    assert list(rows) == ["health", "metrics/NVDA, metered key", "balance, large-ledger key"]
    assert rows["health"]["rps_ratio_to_health"] == 1.0
    for row in rows.values():
        assert row["rps"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["server_cpu_us_per_request"] >= 0
        assert row["rps_ratio_to_health"] == row["rps"] / rows["health"]["rps"]
    unpriced = {r["target"]: r for r in result["unpriced"]}
    assert list(unpriced) == ["health (unpriced server)", "metrics/NVDA, same key, price 0"]
    assert all(r["rps"] > 0 for r in unpriced.values())
    assert result["charge_cpu_us_per_request"] == (
        rows["metrics/NVDA, metered key"]["server_cpu_us_per_request"]
        - unpriced["metrics/NVDA, same key, price 0"]["server_cpu_us_per_request"]
    )
    latency = result["balance_latency"]
    assert latency["ledger_rows"] == 2_500
    for account in ("new_account", "large_ledger"):
        assert 0 < latency[account]["p50_ms"] <= latency[account]["p99_ms"]
    checks = result["checks"]
    # Every metered answer was charged once, 250 tokens, with its ledger row.
    assert checks["metered_charges"] > 0
    assert checks["metered_tokens_spent"] == checks["ledger_tokens_charged"]
    assert checks["ledger_tokens_charged"] == 250 * checks["metered_charges"]
    assert checks["large_ledger_usage_requests"] == 2_500
    assert checks["usage_table_equals_ledger"] is True
