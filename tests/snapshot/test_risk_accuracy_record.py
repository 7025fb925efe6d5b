"""Issue 34 part 4: every build stores the risk forecast's accuracy record, from a running
state kept beside the risk model's (a build that adds nothing carries the same record; the
tail build's test shows an update equal to a full rebuild, state and record), and
/api/health serves it with the model version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.build.demo import build_demo
from eqrisk.build.pipeline import build_snapshot
from eqrisk.model.accuracy_state import ROW_FAMILIES
from eqrisk.model.run import ModelParams
from eqrisk.settings import Settings
from eqrisk.snapshot.versions import snapshots_dir


@pytest.fixture(scope="module")
def short_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("accuracy-home")
    build_demo(home, start="2022-09-01")
    return home


def test_every_build_stores_the_record_and_health_serves_it(short_home: Path) -> None:
    manifest = json.loads(
        (snapshots_dir(short_home) / _current(short_home) / "manifest.json").read_text()
    )
    record = manifest["risk_accuracy"]  # the first (default) build stored it
    assert record["period"]["last"] == manifest["data_as_of"][:10]
    assert record["period"]["sessions"] == manifest["sessions"] - 252
    assert set(record["horizons"]) == {"1d", "21d"}
    one_day = record["horizons"]["1d"]
    assert set(one_day) == set(ROW_FAMILIES) == set(record["families"])
    for family in one_day.values():
        lo, hi = family["band"]
        assert lo < 1 < hi and 0.8 < family["model"]["bias"] < 1.2
        assert family["baseline"]["bias"] > 0 and 0.8 < family["previous_model"]["bias"] < 1.2
    # The demo's specific returns are independent: hedged books sit near 1 with either model
    # (the previous one, the ETF layer alone, beside the served one), and the baseline, which
    # ignores diversification, far below it for a long-short book.
    assert abs(one_day["hedged_l3_50"]["model"]["bias"] - 1) < 0.1
    assert abs(one_day["hedged_l3_50"]["previous_model"]["bias"] - 1) < 0.1
    assert one_day["hedged_l3_50"]["previous_model"] != one_day["hedged_l3_50"]["model"]
    assert one_day["long_short"]["baseline"]["bias"] < 0.5
    again = build_snapshot(short_home, ModelParams())  # nothing new: an incremental build
    assert again["build"]["mode"] == "incremental"
    assert again["risk_accuracy"] == record
    client = TestClient(create_app(Settings(home=short_home, _env_file=None)))
    health = client.get("/api/health").json()
    assert health["model_version"] == again["model_version"]
    assert health["risk_accuracy"] == record


def _current(home: Path) -> str:
    return (snapshots_dir(home) / "CURRENT").read_text().strip()


def test_a_failed_record_step_fails_the_build_and_publishes_nothing(
    short_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's steps run on their own thread (`accuracy_store.RecordThread`): an error
    there is the build's error, raised in the build's thread, and no version is published."""
    from eqrisk.build import accuracy_store

    real = accuracy_store.chunk_step
    steps: list[int] = []

    def failing(state: Any, *args: Any, **kw: Any) -> Any:
        steps.append(state.session)
        if len(steps) == 2:
            raise RuntimeError("the second step failed")
        return real(state, *args, **kw)

    before = _current(short_home)
    versions = sorted(p.name for p in snapshots_dir(short_home).iterdir() if p.is_dir())
    monkeypatch.setattr(accuracy_store, "chunk_step", failing)
    with pytest.raises(RuntimeError, match="the second step failed"):
        build_snapshot(short_home, ModelParams(), full=True)
    assert len(steps) == 2 and steps[0] < steps[1]  # in chunk order, from the first session
    assert _current(short_home) == before
    after = sorted(p.name for p in snapshots_dir(short_home).iterdir() if p.is_dir())
    assert after == versions


def test_record_thread_runs_the_steps_in_order_one_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps in chunk order, each from the state the one before left, with at most one step
    queued behind the running one (`add` waits for the older ones); both models' forecasts
    made by `add`, on the thread that adds (their kernels run in parallel, and only the
    build's thread launches parallel kernels), never on the record's thread."""
    import threading

    from eqrisk.build import accuracy_store

    class Model:  # a model's step id; where its forecasts were made
        def __init__(self, n: int) -> None:
            self.n, self.made_on = n, ""

        @property
        def predicted(self) -> dict[str, Any]:
            self.made_on = threading.current_thread().name
            return {}

    release = threading.Event()
    ran: list[tuple[int, int]] = []
    saved: list[int] = []

    def step(state: int, model: Model, inputs: Any, factors: Any, prev: Model) -> int:
        if model.n == 0:
            release.wait(10)
        ran.append((state, model.n))
        return state + 1

    monkeypatch.setattr(accuracy_store, "chunk_step", step)
    monkeypatch.setattr(
        accuracy_store, "save_state", lambda folder, c, state, previous, parts: saved.append(c)
    )
    models = [(Model(c), Model(c)) for c in range(3)]
    with accuracy_store.RecordThread(tmp_path, 100, None) as record:  # type: ignore[arg-type]
        for c in (0, 1):
            record.add(c, models[c][0], None, None, models[c][1], {})  # type: ignore[arg-type]
        waiting = threading.Thread(
            target=record.add, args=(2, models[2][0], None, None, models[2][1], {}),
            name="adding",
        )  # fmt: skip
        waiting.start()
        waiting.join(0.3)
        assert waiting.is_alive() and ran == []  # a third step waits for the first
        release.set()
        waiting.join(10)
        state: Any = record.finish()  # the fake steps' states are counts
        assert state == 103
    assert ran == [(100, 0), (101, 1), (102, 2)]
    assert saved == [1, 2, 3]
    main = threading.current_thread().name
    made = [model.made_on for pair in models for model in pair]
    assert made == [main] * 4 + ["adding"] * 2


def test_the_long_table_runs_beside_the_risk_model_and_its_error_is_the_builds(
    short_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build whose arrays are files writes the long table on a thread of its own, through
    its own mapping of the arrays, while the risk model is written: its files are those of the
    long table written alone, and an error there fails the build, which publishes nothing."""
    import threading

    from eqrisk.snapshot import tables
    from eqrisk.snapshot.chunks import open_arrays

    real = tables.write_security_history
    seen: list[tuple[str, bool, tuple[Any, ...]]] = []

    def watched(folder: Path, fields: Any, *args: Any, **kw: Any) -> list[str]:
        stores = {id(getattr(f, "_store", None)) for f in fields.values()}
        seen.append((threading.current_thread().name, len(stores) == 1, args))
        return real(folder, fields, *args, **kw)

    monkeypatch.setattr(tables, "write_security_history", watched)
    build_snapshot(short_home, ModelParams(), full=True)
    ((name, one_store, args),) = seen
    assert name.startswith("eqrisk-history") and one_store
    folder = snapshots_dir(short_home) / _current(short_home)
    manifest = json.loads((folder / "manifest.json").read_text())
    # The same files as the long table written alone, in this thread, from the version's arrays.
    alone = tmp_path / "alone"
    alone.mkdir()
    files = real(alone, open_arrays(folder, manifest["arrays"]), *args)
    assert files == manifest["security_history"] and len(files) > 1
    for rel in files:
        assert (folder / rel).read_bytes() == (alone / rel).read_bytes(), rel

    def failing(*args: Any, **kw: Any) -> list[str]:
        raise RuntimeError("the long table failed")

    before = _current(short_home)
    versions = sorted(p.name for p in snapshots_dir(short_home).iterdir() if p.is_dir())
    monkeypatch.setattr(tables, "write_security_history", failing)
    with pytest.raises(RuntimeError, match="the long table failed"):
        build_snapshot(short_home, ModelParams(), full=True)
    assert _current(short_home) == before
    assert sorted(p.name for p in snapshots_dir(short_home).iterdir() if p.is_dir()) == versions
