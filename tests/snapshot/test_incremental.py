"""Incremental builds on the real data set (60 stocks and every ETF, all sessions): appending
sessions day by day or in one block gives versions equal, bit for bit, to a full rebuild on the
same ingested data (every array, the long table, the symbols table); the chunks before the new
sessions are linked from the previous version unread; a revised price in the past recomputes
from its chunk and says so; changed method settings rebuild fully and say so."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from tests.helpers import shared_file

from eqrisk.build.pipeline import build_snapshot
from eqrisk.data.ingest import ingest
from eqrisk.model.resume import anchors, run_from
from eqrisk.model.run import ModelParams
from eqrisk.snapshot import chunks
from eqrisk.snapshot.risk_arrays import RISK_FIELDS, factor_covariance_of, predicted_of
from eqrisk.snapshot.risk_layer import LAYER_PREFIXES as LAYER
from eqrisk.snapshot.risk_layer import NEXT_PREFIXES, read_style
from eqrisk.snapshot.versions import Snapshot, list_versions, snapshots_dir

TAIL_DAYS = 6  # sessions held back from the first build
KEEP = 20


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Long price rows of 60 stocks (every 8th GICS member) and every ETF, their master CSV."""
    wide = pd.read_csv(shared_file("adjclose_wide_2010_2026.csv.gz"))
    gics = pd.read_csv(shared_file("gics_constituents.csv"))
    stocks = sorted(set(gics["Symbol"]) & set(wide.columns))[::8][:60]
    etfs = sorted(set(wide.columns) - set(gics["Symbol"]) - {"date"})
    long = wide[["date", *stocks, *etfs]].melt(
        id_vars="date", var_name="symbol", value_name="close"
    )
    long = long.dropna()
    members = gics[gics["Symbol"].isin(stocks)]
    root = tmp_path_factory.mktemp("real")
    master = root / "master.csv"
    # One share count per stock (market cap / price of the financials file): the caps of the
    # risk model's second layer.
    fin = pd.read_csv(shared_file("constituents_financials.csv")).set_index("Symbol")
    shares = (fin["Market Cap"] / fin["Price"]).reindex(members["Symbol"]).round()
    pd.DataFrame(
        {
            "symbol": members["Symbol"],
            "name": members["Security"],
            "asset_type": "stock",
            "gics_sector": members["GICS Sector"],
            "gics_sub_industry": members["GICS Sub-Industry"],
            "shares": shares.to_numpy(),
        }
    ).to_csv(master, index=False)
    dates = sorted(long["date"].unique())
    return {"long": long, "master": master, "dates": dates, "root": root, "stocks": stocks}


def _home(real: dict[str, Any], name: str) -> Path:
    """A home with every session but the last TAIL_DAYS ingested and built (fully)."""
    root: Path = real["root"]
    base = root / f"{name}-base.csv"
    long = real["long"]
    long[long["date"] < real["dates"][-TAIL_DAYS]].to_csv(base, index=False)
    home = root / name
    ingest([base], real["master"], home=home, data_source="real")
    first = build_snapshot(home, ModelParams(), keep=KEEP)
    assert first["build"] == {"mode": "full", "reasons": ["no previous version"]}
    return home


def _append(real: dict[str, Any], home: Path, days: list[str], **kw: Any) -> dict[str, Any]:
    path = real["root"] / f"{home.name}-{days[0]}-{len(days)}.csv"
    long = real["long"]
    long[long["date"].isin(days)].to_csv(path, index=False)
    ingest([path], None, home=home, merge=True)
    return build_snapshot(home, ModelParams(), keep=KEEP, **kw)


def _open(home: Path, manifest: dict[str, Any]) -> Snapshot:
    return Snapshot.open(snapshots_dir(home) / manifest["model_version"])


def _assert_equal_versions(home: Path, got: dict[str, Any], want: dict[str, Any]) -> None:
    """Every array bitwise (NaN and -0.0 included), the long table and the symbols table."""
    a, b = _open(home, got), _open(home, want)
    assert got["fields"] == want["fields"] and got["sessions"] == want["sessions"]
    for name in want["fields"]:
        x = np.asarray(a.array(name))
        y = np.asarray(b.array(name))
        assert x.shape == y.shape
        assert x.tobytes() == y.tobytes(), name
    assert np.asarray(a.factor_returns).tobytes() == np.asarray(b.factor_returns).tobytes()
    pd.testing.assert_frame_equal(a.symbols, b.symbols)
    long_a, long_b = a.security_history(), b.security_history()
    assert len(long_a) == len(long_b) > 100_000
    assert long_a.equals(long_b)  # every row, in the same order
    assert got["security_history"] == want["security_history"]
    assert got["arrays"] == want["arrays"]  # the same chunk codes and derived fields
    # The risk model (F per session, D and the predicted volatilities per stock and session).
    assert {k: v for k, v in got["risk"].items() if k != "linked_chunks"} == {
        k: v for k, v in want["risk"].items() if k != "linked_chunks"
    }
    for name in RISK_FIELDS:
        assert np.asarray(a.array(name)).tobytes() == np.asarray(b.array(name)).tobytes(), name
    for t in range(0, got["sessions"], 97):
        f_a = factor_covariance_of(a.path, a.manifest, t).cov
        assert f_a.tobytes() == factor_covariance_of(b.path, b.manifest, t).cov.tobytes()
    assert_same_risk_files(a.path, b.path)


def assert_same_risk_files(a: Path, b: Path) -> None:
    """Every file of the two versions' risk model (F, the fields, the second layer's
    exposures and regression, the regime, the states, the next session) holds the same
    bits; the second layer is there."""
    names = sorted(p.name for p in (b / "risk").iterdir())
    assert sorted(p.name for p in (a / "risk").iterdir()) == names
    assert any(n.startswith("sexp-") for n in names) and "next-cov.npy" in names
    for name in names:
        if name.endswith(".npz"):
            with np.load(a / "risk" / name) as x, np.load(b / "risk" / name) as y:
                assert sorted(x.files) == sorted(y.files)
                for k in x.files:
                    assert x[k].tobytes() == y[k].tobytes(), (name, k)
        else:
            assert (a / "risk" / name).read_bytes() == (b / "risk" / name).read_bytes(), name


def test_a_tail_run_equals_the_full_run_bitwise(real: dict[str, Any]) -> None:
    """run_from from any session (chunk boundary or not) gives the full run's values."""
    from eqrisk.data.master import Mappings, classify
    from eqrisk.data.panel import to_panel
    from eqrisk.model.run import plan_model, run_model

    long = real["long"]
    members = pd.read_csv(real["master"])
    etfs = sorted(set(long["symbol"]) - set(members["symbol"]))
    master = pd.concat([members, pd.DataFrame({"symbol": etfs})], ignore_index=True)
    panel = to_panel(long)
    master = classify(master, Mappings.load())
    params = ModelParams()
    full = run_model(panel, master, params).metrics
    plan = plan_model(panel, master, params)
    n_t = len(panel.sessions)
    for start in (n_t - 1, 29 * chunks.CHUNK_SESSIONS, 600, 300):
        assert anchors(start, params.window)[0] <= max(0, start - 2 * params.window)
        tail = run_from(plan, start)
        assert sorted(tail) == sorted(full)
        for name, arr in tail.items():
            assert arr.tobytes() == np.ascontiguousarray(full[name][:, start:]).tobytes(), name


def test_appending_day_by_day_then_in_a_block_equals_a_full_rebuild(
    real: dict[str, Any],
) -> None:
    home = _home(real, "append")
    tail = real["dates"][-TAIL_DAYS:]
    previous = None
    for day in tail[:3]:  # (a) day by day
        new = _append(real, home, [day])
        build = new["build"]
        assert build["mode"] == "incremental"
        assert build["reasons"][0].startswith(f"new sessions from {day} (1)")
        # Only the end of the data set was read: the years before it proved unchanged by the
        # partitions' digests (see test_tail_build for what the rest of them hold).
        assert "2021-01-01" < build["read_from"] < day
        if previous is not None:
            assert build["previous"] == previous["model_version"]
        previous = new
    assert previous is not None
    rebuilt = build_snapshot(home, ModelParams(), keep=KEEP, full=True)
    assert rebuilt["build"] == {"mode": "full", "reasons": ["--full"]}
    _assert_equal_versions(home, previous, rebuilt)
    block = _append(real, home, tail[3:])  # (b) the rest in one block
    assert block["build"]["mode"] == "incremental"
    assert block["build"]["reasons"][0].startswith(f"new sessions from {tail[3]} (3)")
    assert block["sessions"] == len(real["dates"])
    again = build_snapshot(home, ModelParams(), keep=KEEP, full=True)
    _assert_equal_versions(home, block, again)
    # No look-ahead: the forecasts of the first version's sessions are unchanged by the later
    # sessions (bit for bit), F and D of the last of them included.
    first = Snapshot.open(snapshots_dir(home) / list_versions(home)[0])
    later = _open(home, again)
    width = int(first.manifest["sessions"])
    assert width == int(again["sessions"]) - TAIL_DAYS
    for name in RISK_FIELDS:
        old = np.asarray(first.array(name))
        assert (
            old.tobytes()
            == np.ascontiguousarray(np.asarray(later.array(name))[:, :width]).tobytes()
        )
    f_old = factor_covariance_of(first.path, first.manifest, width - 1).cov
    assert (
        f_old.tobytes() == factor_covariance_of(later.path, later.manifest, width - 1).cov.tobytes()
    )
    # The first version's forecast for the session after its last close (from data through
    # it) is, bit for bit, what the later version stores for that session once it happened:
    # F, D, the predicted volatilities, the style exposures.
    assert first.manifest["risk"]["next"] == str(np.datetime64(later.sessions[width], "D"))
    f_next = factor_covariance_of(first.path, first.manifest, width).cov
    assert f_next.tobytes() == factor_covariance_of(later.path, later.manifest, width).cov.tobytes()
    ahead = predicted_of(first.path, first.manifest, dict.fromkeys(RISK_FIELDS), width)
    stored = predicted_of(later.path, later.manifest, {n: later.array(n) for n in RISK_FIELDS},
                          width)  # fmt: skip
    for name in RISK_FIELDS:
        assert ahead[name].tobytes() == stored[name].tobytes(), name
    style = read_style(first.path, first.manifest, width)
    assert style is not None and (style != 0).any()
    assert (
        style.tobytes()
        == np.ascontiguousarray(read_style(later.path, later.manifest, width)).tobytes()
    )


def test_a_one_session_update_writes_only_the_touched_chunks_and_reads_no_older_one(
    real: dict[str, Any],
) -> None:
    """The files of chunks before the new session are hard links to the previous version's
    (made unreadable here: the build must not open them), the rest are the only new files."""
    home = _home(real, "disk")
    root = snapshots_dir(home)
    old = _open(home, build_snapshot(home, ModelParams(), keep=KEEP, full=True))
    grid = chunks.ChunkGrid.of(old.manifest["arrays"]["grid"])
    c0 = (grid.t - 1) // grid.chunk if grid.t % grid.chunk else grid.chunks
    year_start = int(
        np.flatnonzero(
            old.sessions.astype("datetime64[Y]") == old.sessions[-1].astype("datetime64[Y]")
        )[0]
    )
    # Unreadable: every chunk file (arrays and daily long table) wholly before this year.
    locked = [
        p
        for p in (root / old.manifest["model_version"]).rglob("*.*")
        if p.is_file()
        and _chunk_of(p) is not None
        and (_chunk_of(p) + 1) * grid.chunk <= year_start  # type: ignore[operator]
    ]
    assert len(locked) > 50
    for p in locked:
        p.chmod(0)
    try:
        new = _append(real, home, [real["dates"][-TAIL_DAYS]])
    finally:
        for p in locked:
            p.chmod(0o644)
    assert new["build"]["mode"] == "incremental" and new["build"]["from_chunk"] == c0
    folder = root / new["model_version"]
    added = sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and p.stat().st_nlink == 1
    )
    year = str(new["data_as_of"])[:4]
    own = [n for n, codes in new["arrays"]["chunks"].items() if codes[0][c0] in "BHf"]
    expected = sorted(
        [
            f"arrays/_rows/0.{c0}.npy",
            *(f"arrays/{n}/0.{c0}.npy" for n in own),
            f"security_history/monthly-{year}.parquet",
            *(
                f"risk/{p}-{c0:05d}.npy"
                for p in ("cov", "total", "factor", "specific", "d", *LAYER)
            ),
            f"risk/state-{c0 + 1:05d}.npz",  # (fidx.npy, unchanged, is linked)
            f"risk/accuracy-{c0 + 1:05d}.npz",  # the accuracy record's running state
            *(f"risk/{p}.npy" for p in NEXT_PREFIXES),  # the next session's forecast
            "factors.npy",
            "manifest.json",
            "sessions.npy",
            "symbols.parquet",
        ]
    )
    # (the group's runs index of chunk c0 too where a row's runs changed there)
    assert [p for p in added if p != f"arrays/_rows/0.{c0}.runs.npy"] == expected
    # the array chunks: not the risk files (10 and the accuracy state), the layer's and the next session's
    assert new["storage"]["chunks_written"] == len(expected) - 11 - len(LAYER) - len(NEXT_PREFIXES)
    for rel in new["security_history"]:
        chunk = _chunk_of(folder / rel)
        if chunk is not None and chunk < c0:
            assert os.path.samefile(folder / rel, root / old.manifest["model_version"] / rel)
    whole = sum(
        p.stat().st_size for p in (root / old.manifest["model_version"]).rglob("*") if p.is_file()
    )
    assert sum((folder / p).stat().st_size for p in added) < 0.1 * whole


def _chunk_of(path: Path) -> int | None:
    """The time chunk of an array chunk file (`<b>.<c>.npy`) or a daily long-table file."""
    name = path.name
    if name.startswith("daily-"):
        return int(name[6:11])
    parts = name.split(".")
    if len(parts) == 3 and parts[2] == "npy" and parts[0].isdigit() and parts[1].isdigit():
        return int(parts[1])
    return None


def test_a_revised_past_price_recomputes_from_its_chunk_and_says_why(
    real: dict[str, Any],
) -> None:
    home = _home(real, "revise")
    dates = real["dates"]
    day = dates[20 * chunks.CHUNK_SESSIONS + 5]
    long = real["long"]
    revised = long[(long["date"] == day) & long["symbol"].isin(real["stocks"][:3])].copy()
    revised["close"] = revised["close"] * 1.01
    path = real["root"] / "revised.csv"
    revised.to_csv(path, index=False)
    ingest([path], None, home=home, merge=True)
    new = build_snapshot(home, ModelParams(), keep=KEEP)
    build = new["build"]
    assert build["mode"] == "incremental" and build["from_chunk"] == 20
    names = ", ".join(sorted(real["stocks"][:3]))
    assert build["reasons"] == [
        f"prices revised for 3 symbols ({names}) from {day}; recomputing from "
        f"{dates[20 * chunks.CHUNK_SESSIONS]}"
    ]
    rebuilt = build_snapshot(home, ModelParams(), keep=KEEP, full=True)
    _assert_equal_versions(home, new, rebuilt)


def test_changed_method_settings_rebuild_fully_and_say_why(real: dict[str, Any]) -> None:
    home = _home(real, "method")
    new = _append(real, home, [real["dates"][-TAIL_DAYS]])
    assert new["build"]["mode"] == "incremental"
    other = build_snapshot(home, ModelParams(window=200, min_obs=100), keep=KEEP)
    assert other["build"] == {
        "mode": "full",
        "reasons": ["method settings changed: min_obs, window"],
    }
    # Every group chunk and every n_obs chunk (the window changed); the long table's daily
    # rows are no files of a version any more (before them: > 100 with its daily files).
    grid = chunks.ChunkGrid.of(other["arrays"]["grid"])
    assert other["storage"]["chunks_written"] > 2 * grid.chunks
