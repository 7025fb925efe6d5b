"""The tail build on the real data set (30 stocks and every ETF): an update reads only the end
of the ingested data set (the years before it proved unchanged by the partitions' digests), and
its version equals, bit for bit, a full rebuild on the same data; the digests a tail plan
computes equal the whole plan's; whatever reaches the history (the return breaks, a data set
without digests, a revised old year) sends the build back to the whole history, saying why."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from tests.helpers import gics_master, shared_file

from eqrisk.build import tail
from eqrisk.build.incremental import input_digests
from eqrisk.build.pipeline import build_snapshot
from eqrisk.build.universe import open_universe
from eqrisk.data.calendar import sessions_between
from eqrisk.data.corporate_actions import return_breaks
from eqrisk.data.ingest import ingest
from eqrisk.data.ingested import (
    PARTS_FILE,
    file_digest,
    ingested_dir,
    part_path,
    read_panel,
    stored,
)
from eqrisk.data.master import Mappings
from eqrisk.data.share_classes import read_share_classes
from eqrisk.model.returns import MEMBER_VOL_WINDOW
from eqrisk.model.run import ModelParams, plan_model
from eqrisk.snapshot import chunks
from eqrisk.snapshot.risk_arrays import RISK_FIELDS
from eqrisk.snapshot.versions import Snapshot, snapshots_dir

HELD_BACK = 2  # sessions left out of the first build


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    wide = pd.read_csv(shared_file("adjclose_wide_2010_2026.csv.gz"))
    gics = pd.read_csv(shared_file("gics_constituents.csv"))
    stocks = sorted(set(gics["Symbol"]) & set(wide.columns))[3::16][:30]
    etfs = sorted(set(wide.columns) - set(gics["Symbol"]) - {"date"})
    long = wide[["date", *stocks, *etfs]].melt(id_vars="date", var_name="symbol")
    long = long.rename(columns={"value": "close"}).dropna()
    members = gics[gics["Symbol"].isin(stocks)]
    root = tmp_path_factory.mktemp("tail")
    master = root / "master.csv"
    gics_master(members).to_csv(master, index=False)
    dates = sorted(long["date"].unique())
    base = root / "base.csv"
    long[long["date"] < dates[-HELD_BACK]].to_csv(base, index=False)
    home = root / "built"
    ingest([base], master, home=home, data_source="real")
    build_snapshot(home, ModelParams(), keep=20)
    return {"long": long, "dates": dates, "root": root, "home": home, "stocks": stocks}


def _copy(real: dict[str, Any], name: str) -> Path:
    home: Path = real["root"] / name
    shutil.copytree(real["home"], home, symlinks=True)
    return home


def _day_file(real: dict[str, Any], days: list[str], name: str) -> Path:
    path: Path = real["root"] / f"{name}.csv"
    long = real["long"]
    long[long["date"].isin(days)].to_csv(path, index=False)
    return path


def _assert_same(got: Path, want: Path) -> None:
    """Two versions hold the same numbers and tables, bit for bit."""
    a, b = Snapshot.open(got), Snapshot.open(want)
    assert a.manifest["fields"] == b.manifest["fields"]
    for name in [*a.manifest["fields"], *RISK_FIELDS]:
        x, y = np.asarray(a.array(name)), np.asarray(b.array(name))
        assert x.shape == y.shape and x.tobytes() == y.tobytes(), name
    assert np.asarray(a.factor_returns).tobytes() == np.asarray(b.factor_returns).tobytes()
    pd.testing.assert_frame_equal(a.symbols, b.symbols)
    assert a.security_history().equals(b.security_history())
    assert a.manifest["model"] == b.manifest["model"]
    assert a.manifest["inputs"] == b.manifest["inputs"]
    # The accuracy record (issue 34): the incremental build added its sessions to the stored
    # running state; state files and record are the full build's, bit for bit.
    assert a.manifest["risk_accuracy"] == b.manifest["risk_accuracy"]
    assert a.manifest["risk_accuracy"]["period"]["last"] == a.manifest["data_as_of"][:10]
    states = sorted(p.name for p in (got / "risk").glob("accuracy-*.npz"))
    assert states == sorted(p.name for p in (want / "risk").glob("accuracy-*.npz")) != []
    for name in states:
        with np.load(got / "risk" / name) as x, np.load(want / "risk" / name) as y:
            assert set(x.files) == set(y.files)
            assert all(chunks.same_bits(x[k], y[k]) for k in x.files), name
            assert "prev_cov_session" in x.files, name  # the previous model's state with it
    one_day = a.manifest["risk_accuracy"]["horizons"]["1d"]
    assert all(isinstance(e["previous_model"], dict) for e in one_day.values())


def _version(home: Path, manifest: dict[str, Any]) -> Path:
    return snapshots_dir(home) / manifest["model_version"]


def test_an_update_reads_only_the_end_and_equals_a_full_rebuild(real: dict[str, Any]) -> None:
    home, other = _copy(real, "update"), _copy(real, "update-full")
    day = real["dates"][-HELD_BACK]
    before = dict(stored(home).digests or {})  # type: ignore[union-attr]
    for h in (home, other):
        ingest([_day_file(real, [day], "day")], None, home=h, merge=True)
    found = stored(home)
    assert found is not None and found.digests is not None
    # The merge rewrote the files of the year in progress only; every other digest is the
    # one its file had, and each digest is its file's.
    changed = {p for p in found.digests if found.digests[p] != before.get(p)}
    assert changed and {year for _, year in changed} == {int(day[:4])}
    for part, digest in found.digests.items():
        assert digest == file_digest(part_path(found.folder, part))
    # The years before the tail are not read: their files are moved out of this home.
    current = Snapshot.open(_version(home, {"model_version": _current(home)}))
    proof = tail.data_proof(found, found.meta.get("return_breaks", []), read_share_classes(None))
    window, why = tail.window_of(proof, current.manifest, full_calendar(home), 252)
    assert window is not None, why
    since = str(window.since.date())
    gone = real["root"] / "gone"
    gone.mkdir()
    moved = [p for p in found.digests if p[1] < int(since[:4])]
    assert len(moved) >= 5  # five years or more of every block
    for part in moved:
        part_path(found.folder, part).rename(gone / f"{part[0]}-{part[1]}.parquet")
    messages: list[str] = []
    new = build_snapshot(home, ModelParams(), progress=messages.append)
    assert new["build"]["mode"] == "incremental" and new["build"]["read_from"] == since
    assert f"reading the ingested data from {since} (the years before: unchanged)" in messages
    assert new["build"]["from_session"] < day
    full = build_snapshot(other, ModelParams(), full=True)
    _assert_same(_version(home, new), _version(other, full))


def _current(home: Path) -> str:
    return (snapshots_dir(home) / "CURRENT").read_text().strip()


def test_a_tail_plans_digests_are_the_whole_plans(real: dict[str, Any]) -> None:
    """Every input digest of the chunks a tail plan computes (from its window's `proved`
    chunk on) equals the one the whole panel's plan computes: the warm-up is long enough; so
    does a plan on the panel a tail build reads (`others_since`: the price fields beyond the
    model's from the first digested chunk's year on)."""
    found, raw, master = open_universe(real["home"], Mappings.load(), "SPY")
    assert found is not None
    params = ModelParams()
    days = found.stats.sessions()
    calendar = sessions_between(days.index.min(), days.index.max()).to_numpy()
    calendar = calendar.astype("datetime64[D]")
    breaks_list = found.meta.get("return_breaks", [])
    whole = read_panel(found, raw)
    whole_breaks = return_breaks(breaks_list, whole.symbols, whole.sessions)
    want = input_digests(plan_model(whole, master, params, exclude=whole_breaks), whole,
                         master, whole_breaks)  # fmt: skip
    L = chunks.CHUNK_SESSIONS
    for proved in (len(calendar) // L - 1, 24, 12):
        base = (proved * L - tail.warmup(params.window)) // params.window * params.window
        assert base > 0 and proved * L - base >= 3 * params.window + MEMBER_VOL_WINDOW
        window = tail.Window(base, proved, calendar)
        panel = read_panel(found, raw, since=window.since)
        assert len(panel.sessions) == len(calendar) - base
        # As a tail build reads it: the fields beyond close and cap from the year of the first
        # chunk not proved on, and held from there only (nothing reads them before).
        assert window.digested is not None
        narrow = read_panel(found, raw, since=window.since, others_since=window.digested)
        year = np.datetime64(f"{window.digested.year}-01-01", "D")
        kept = int(np.searchsorted(panel.sessions, year))
        assert 0 < kept <= proved * L - base
        assert narrow.others_from == kept and panel.others_from == 0
        for name in ("close", "market_cap"):
            np.testing.assert_array_equal(getattr(narrow, name), getattr(panel, name))
        n, n_t = panel.shape
        for name in ("open", "high", "low", "close_raw", "volume"):
            assert getattr(narrow, name).shape == (n, n_t - kept)
            np.testing.assert_array_equal(narrow.field(name, kept), panel.field(name, kept))
            np.testing.assert_array_equal(
                narrow.field(name, kept + 3, kept + 9), panel.field(name, kept + 3, kept + 9)
            )
            with pytest.raises(ValueError, match=f"holds {name} from session {kept} on"):
                narrow.field(name, kept - 1)
        for read in (panel, narrow):
            breaks = return_breaks(breaks_list, read.symbols, read.sessions)
            plan = plan_model(read, master, params, exclude=breaks)
            got = input_digests(plan, read, master, breaks, base=base,
                                proved=want["chunks"][:proved], sessions=len(calendar))  # fmt: skip
            assert got["chunks"][proved:] == want["chunks"][proved:]
            assert len(got["chunks"]) == len(want["chunks"])
            for key in ("symbols", "method", "master", "layout"):
                assert got["universe"][key] == want["universe"][key]
    # A calendar that ends on a chunk boundary with every chunk proved: nothing is narrowed.
    edge = calendar[: len(calendar) // L * L]
    assert tail.Window(0, len(edge) // L, edge).digested is None


def test_whatever_reaches_the_history_sends_the_build_to_the_whole_of_it(
    real: dict[str, Any],
) -> None:
    day = real["dates"][-HELD_BACK]
    # A data set without digests (written before them): the whole history, incremental.
    home = _copy(real, "no-digests")
    (ingested_dir(home) / PARTS_FILE).unlink()
    messages: list[str] = []
    new = build_snapshot(home, ModelParams(), progress=messages.append)
    assert (
        "reading the whole history: the ingested data set records no partition digests "
        "(the next merge does)" in messages
    )
    # The next merge records them (computed from the files it links), and the build after
    # it reads the end only.
    ingest([_day_file(real, [day], "nd")], None, home=home, merge=True)
    after = build_snapshot(home, ModelParams())
    assert after["build"]["mode"] == "incremental" and "read_from" not in after["build"]
    assert after["inputs"]["data"]["parts"]  # recorded now
    ingest([_day_file(real, [real["dates"][-1]], "nd2")], None, home=home, merge=True)
    third = build_snapshot(home, ModelParams())
    assert third["build"]["mode"] == "incremental" and "read_from" in third["build"]
    assert new["inputs"].get("data") is None
    # A revised price of an old year: the tail starts before it (or the whole history).
    home = _copy(real, "revised")
    old = real["dates"][800]  # 2013
    long = real["long"]
    revised = long[(long["date"] == old) & long["symbol"].isin(real["stocks"][:2])].copy()
    revised["close"] *= 1.02
    path = real["root"] / "revised-old.csv"
    revised.to_csv(path, index=False)
    ingest([path], None, home=home, merge=True)
    messages = []
    rev = build_snapshot(home, ModelParams(), progress=messages.append)
    assert rev["build"]["mode"] == "incremental"
    assert rev["build"]["from_session"] <= old
    assert rev["build"].get("read_from", "2010") < old
    full = build_snapshot(home, ModelParams(), full=True)
    _assert_same(_version(home, rev), _version(home, full))
    # Return breaks changed (a return left out at ingest): they reach every session.
    proof = tail.data_proof(stored(home), [["AAPL", "2012-01-03"]], {})  # type: ignore[arg-type]
    window, why = tail.window_of(proof, full, np.asarray(full_calendar(home)), 252)
    assert window is None and why == "the return breaks changed"


def full_calendar(home: Path) -> np.ndarray:
    days = stored(home).stats.sessions()  # type: ignore[union-attr]
    return sessions_between(days.index.min(), days.index.max()).to_numpy().astype("datetime64[D]")
