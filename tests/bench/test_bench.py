"""The benchmarks run end to end and compare like with like. No timing is asserted: speed is
read from `eqrisk bench`, not from tests."""

from __future__ import annotations

import pytest

from eqrisk.bench import model, render, serve
from helpers import TEST_KEY, bearer


def test_bench_model_quick_mode_figures_are_consistent() -> None:
    """The quick mode runs every part of `eqrisk bench model`; its figures agree with each
    other and the answers with RollingOLS and polars."""
    b = model.QUICK
    r = model.run(b, say=lambda _m: None)
    assert r["symbols"] == b.symbols and r["sessions"] == b.sessions
    assert r["output_arrays"] == 17
    assert r["bytes_written"] == 17 * b.symbols * b.sessions * 8
    floor = r["bytes_written"] / (r["copy_bandwidth_gb_s"] * 1e9)
    assert r["floor_s"] == pytest.approx(floor, rel=0.01, abs=1e-4)
    assert r["rewrite_equals_first_run"] is True
    # The rewrite into existing outputs maps none of their pages (a few faults may come from
    # the kernel's per-block scratch, after polars' round has handed memory back).
    assert r["kernel_page_faults"] < r["bytes_written"] // 4096 // 10
    # New memory's cost is timed on its own (a plain fill of the bytes the kernel writes): its
    # figures agree with each other. (Whether it faults depends on what the process freed
    # before: a small fill may come from memory the allocator kept.)
    for part in ("first_touch", "fresh_outputs"):
        figures = [r[f"{part}_{k}"] for k in ("wall_s", "user_s", "system_s", "page_faults")]
        assert all(x >= 0 for x in figures), (part, figures)
    assert r["fresh_outputs_wall_s"] > 0  # timed (at these sizes a thread wake-up is more)
    assert r["peak_rss_mb"] > 0
    cpu = (r["kernel_user_s"] + r["kernel_system_s"]) / r["threads"]
    assert r["kernel_cpu_per_thread_s"] == pytest.approx(cpu, abs=2e-3)
    # RollingOLS: every one of the >= 50 symbols timed, its spread and extrapolation consistent.
    assert r["rollingols_symbols_measured"] == 50
    q1, q2, q3 = r["rollingols_per_symbol_ms_q1_median_q3"]
    assert 0 < q1 <= q2 <= q3
    lo, hi = r["rollingols_seconds_extrapolated_q1_q3"]
    assert lo <= r["rollingols_seconds_extrapolated"] <= hi
    assert r["rollingols_seconds_extrapolated"] == pytest.approx(q2 / 1e3 * b.symbols, rel=0.02)
    s_lo, s_hi = r["speedup_vs_rollingols_q1_q3"]
    assert s_lo <= r["speedup_vs_rollingols"] <= s_hi
    assert r["max_abs_diff_vs_rollingols"] < 1e-10
    # polars' rolling covariance gives the same market betas on the same sessions.
    assert r["polars_same_publication"] is True
    assert r["max_abs_diff_vs_polars_market_beta"] < 1e-10
    assert r["polars_market_beta_s"] > 0
    # The floor, the fill, the kernel and polars are timed once a round each; the figures are
    # the best rounds, and the per-round ratios are those of the same round's times.
    n = b.rounds
    assert r["rounds"] == n >= 2
    walls, floors = r["kernel_wall_s_rounds"], r["floor_s_rounds"]
    assert len(walls) == len(floors) == len(r["polars_market_beta_s_rounds"]) == n
    assert r["kernel_wall_s"] == pytest.approx(min(walls), abs=1e-3)
    assert r["floor_s"] == pytest.approx(min(floors), rel=0.01, abs=1e-4)
    assert r["polars_market_beta_s"] == pytest.approx(
        min(r["polars_market_beta_s_rounds"]), abs=1e-3
    )
    for w, f, ratio in zip(walls, floors, r["kernel_over_floor_rounds"], strict=True):
        assert ratio == pytest.approx(w / f, rel=0.05, abs=0.02)
    assert r["fill_outputs_s"] == pytest.approx(min(r["fill_outputs_s_rounds"]), abs=1e-4)


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
    assert checks["wal_mb_after_metered_load"] > 0  # the charges went through the WAL


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
        assert result["csv_same_cells"] is True
        n = len(next(iter(answer.columns.values())))
        assert result["rows"] == n > 200 and result["columns"] == len(answer.columns)
        same_rows = [
            "writer json",
            "before json (dict per row + orjson)",
        ]
        assert ways[same_rows[0]]["mb"] == ways[same_rows[1]]["mb"]
        # CSV: the same cells; only where exponent notation starts may differ in length
        assert ways["writer csv"]["mb"] == pytest.approx(ways["before csv (pyarrow)"]["mb"], 0.05)
        alone = ways["pyarrow write_csv alone (table built beforehand)"]
        assert alone["mb"] == ways["before csv (pyarrow)"]["mb"]
        assert result["csv_speedup_vs_write_csv_alone"] == pytest.approx(
            alone["ms"] / ways["writer csv"]["ms"]
        )
        # the column layout and orjson's numpy columns hold the same arrays
        assert ways["writer json columns"]["mb"] < ways["writer json"]["mb"]
        for fig in ways.values():
            assert fig["mb"] > 0 and fig["ms"] > 0
            assert fig["mb_per_s"] == pytest.approx(fig["mb"] / (fig["ms"] / 1e3))
        before = ways["before json (dict per row + orjson)"]["ms"]
        assert result["json_speedup"] == pytest.approx(before / ways["writer json"]["ms"])


def test_bench_compression_figures_are_the_answers_bytes(demo_home, tmp_path) -> None:
    """Each figure's bytes are the identity answer's compressed by the encoding it names (an
    independent gzip/brotli decode gives the identity bytes back); Parquet is never encoded."""
    import shutil

    from eqrisk.bench.compression import run

    home = tmp_path / "home"
    shutil.copytree(demo_home / "snapshots", home / "snapshots")
    figures = run(home, repeats=1, say=lambda _m: None)
    rows = figures["results"]
    assert len(rows) == 24  # 6 answers x identity, gzip, br, zstd
    for row in rows:
        assert row["ratio"] == row["identity_bytes"] / row["bytes"]
        if "Parquet" in row["target"] or row["encoding"] == "identity":
            assert row["sent_as"] == "identity" and row["bytes"] == row["identity_bytes"]
        else:
            assert row["sent_as"] == row["encoding"] and row["ratio"] > 2
            assert row["compress_ms"] > 0 and row["request_hit_ms"] > 0
