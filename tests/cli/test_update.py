"""`eqrisk update` as the daily job runs it: nothing new publishes nothing, the data set's basis
is kept, a partial session is refused (real processes on a demo home)."""

from __future__ import annotations

import gc
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from eqrisk.data.calendar import sessions_between
from eqrisk.data.ingested import ingested_counts, read_ingested
from eqrisk.snapshot.versions import list_versions

from .test_cli import demo_in, run


@pytest.fixture(scope="module")
def daily_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home, _ = demo_in(tmp_path_factory.mktemp("daily-home"))
    return home


def _last_day(home: Path) -> pd.DataFrame:
    prices = pd.read_csv(home / "demo" / "demo_prices.csv.gz")
    return prices[prices["date"] == prices["date"].max()]


def test_an_update_that_changes_nothing_publishes_nothing(daily_home: Path, tmp_path: Path) -> None:
    home = daily_home
    versions = list_versions(home)
    meta = read_ingested(home)[2]
    path = tmp_path / "same.csv"
    _last_day(home).to_csv(path, index=False)
    proc = run(home, "update", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "nothing new" in proc.stdout
    assert list_versions(home) == versions
    assert read_ingested(home)[2] == meta
    as_json = run(home, "update", str(path), "--json")
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["nothing_new"] is True and doc["build"] is None
    assert list_versions(home) == versions


def test_an_update_with_another_basis_is_refused_in_one_line(
    daily_home: Path, tmp_path: Path
) -> None:
    home = daily_home
    path = tmp_path / "same.csv"
    _last_day(home).to_csv(path, index=False)
    proc = run(home, "update", str(path), "--prices", "raw")
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "ingested with --prices auto; this merge gives --prices raw" in lines[0]
    assert "eqrisk ingest FILES --prices raw --replace" in lines[0]


def test_a_partial_session_is_refused_unless_partial(daily_home: Path, tmp_path: Path) -> None:
    home = daily_home
    before = ingested_counts(home)
    assert before is not None
    last = _last_day(home)
    start = pd.Timestamp(last["date"].iloc[0])
    following = sessions_between(start, start + pd.Timedelta(days=10))[1]
    thin = last.head(5).assign(date=following.strftime("%Y-%m-%d"))
    path = tmp_path / "thin.csv"
    thin.to_csv(path, index=False)
    proc = run(home, "update", str(path))
    assert proc.returncode == 1
    symbols = last["symbol"].nunique()
    assert f"has prices for 5 of the {symbols} symbols the session before it had" in proc.stderr
    assert "--partial" in proc.stderr
    assert ingested_counts(home) == before


def test_a_batch_command_freezes_the_collector_at_exit_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch commands skip the interpreter's final collections (0.3 s of the daily job's
    exit): `gc.freeze` is registered to run at exit, once however many commands a process runs."""
    cli_app = importlib.import_module("eqrisk.cli.app")  # `eqrisk.cli.app` names the Typer app
    registered: list[object] = []
    monkeypatch.setattr(cli_app, "_FREEZE_AT_EXIT", [])
    monkeypatch.setattr(cli_app.atexit, "register", registered.append)
    cli_app.skip_final_collections()
    cli_app.skip_final_collections()
    assert registered == [gc.freeze]


def test_heavy_imports_pause_the_collector_and_freeze_what_they_made() -> None:
    """The collector is off while a batch command imports its libraries and on again after
    (off still inside another pause); what exists by then is frozen, so later collections skip
    it. The frozen objects are given back here: this process goes on."""
    cli_app = importlib.import_module("eqrisk.cli.app")
    assert gc.isenabled()
    try:
        with cli_app.heavy_imports():
            assert not gc.isenabled()
            with cli_app.heavy_imports():
                pass
            assert not gc.isenabled()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()


def test_huge_page_advice_is_off_inside_and_put_back_after() -> None:
    """numpy's huge-page advice (a process-wide switch whose setter returns the state it
    replaces) is off inside `without_huge_pages` and back as it was after, either way."""
    from numpy._core import multiarray

    cli_app = importlib.import_module("eqrisk.cli.app")
    switch = multiarray._set_madvise_hugepage
    before = switch(True)
    try:
        with cli_app.without_huge_pages():
            assert switch(False) is False
        assert switch(False) is True
        with pytest.raises(RuntimeError), cli_app.without_huge_pages():
            raise RuntimeError("a failing command")
        assert switch(False) is False  # it was off when entered: still off
    finally:
        switch(before)


def test_the_daily_job_merges_and_builds_without_huge_page_advice(
    daily_home: Path, tmp_path: Path
) -> None:
    """In a real `eqrisk update` process, numpy's advice is on before the command and off while
    it merges (read through the switch, which returns the state it replaces)."""
    path = tmp_path / "same.csv"
    _last_day(daily_home).to_csv(path, index=False)
    code = (
        "import sys\n"
        "from numpy._core import multiarray\n"
        "import eqrisk.cli.data as data\n"
        "from eqrisk.cli import main\n"
        "def state():\n"
        "    was = multiarray._set_madvise_hugepage(False)\n"
        "    multiarray._set_madvise_hugepage(was)\n"
        "    return was\n"
        "real = data._ingest\n"
        "def spy(*args, **kwargs):\n"
        "    print('advice during the merge:', state(), file=sys.stderr)\n"
        "    return real(*args, **kwargs)\n"
        "data._ingest = spy\n"
        "print('advice before:', state(), file=sys.stderr)\n"
        "sys.argv = ['eqrisk', 'update', sys.argv[1]]\n"
        "main()\n"
    )
    # numpy's own default (on, from Linux 4.6), stated: the variable may be set around the tests
    env = {**os.environ, "EQRISK_HOME": str(daily_home), "NUMPY_MADVISE_HUGEPAGE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "advice before: True" in proc.stderr
    assert "advice during the merge: False" in proc.stderr
    assert "nothing new" in proc.stdout
