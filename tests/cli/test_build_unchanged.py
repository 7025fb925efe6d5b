"""Issue 37: `eqrisk build` with no new data publishes no version and prunes none (one line,
exit 0); new data, or a changed setting, builds as before."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.calendar import sessions_between
from eqrisk.data.ingest import ingest
from eqrisk.snapshot.store import VersionStore
from helpers import eqrisk_cli as eqrisk

SYMBOLS = ["SPY", "XLK"] + [f"S{i:02d}" for i in range(6)]


def test_a_build_with_nothing_new_publishes_and_prunes_nothing(tmp_path: Path) -> None:
    sessions = sessions_between(pd.Timestamp("2023-01-03"), pd.Timestamp("2024-03-28"))
    rng = np.random.default_rng(7)
    steps = rng.normal(0.0, 0.01, (len(sessions), len(SYMBOLS)))
    close = pd.DataFrame(100 * np.exp(np.cumsum(steps, axis=0)), index=sessions, columns=SYMBOLS)
    close.index.name = "date"
    close.iloc[:-1].to_csv(tmp_path / "base.csv")
    close.iloc[-1:].to_csv(tmp_path / "day.csv")
    master = pd.DataFrame({"symbol": SYMBOLS[2:], "asset_type": "stock"})
    master["gics_sector"] = "Information Technology"
    master["gics_sub_industry"] = "Application Software"
    master.to_csv(tmp_path / "master.csv", index=False)
    home = tmp_path / "home"
    assert ingest([tmp_path / "base.csv"], tmp_path / "master.csv", home=home).ok
    store = VersionStore(home / "snapshots")
    args = ("build", "--window", "60", "--min-obs", "30", "--keep", "1")

    first = eqrisk(home, *args, "--json")
    assert first.returncode == 0, first.stderr
    v1 = json.loads(first.stdout)["model_version"]
    store.set_pinned(v1, True)  # kept through the next build's pruning
    assert ingest([tmp_path / "day.csv"], None, home=home, merge=True).ok
    second = eqrisk(home, *args, "--json")
    assert second.returncode == 0, second.stderr
    v2 = json.loads(second.stdout)["model_version"]
    store.set_pinned(v1, False)  # now the next build's pruning (keep 1) would remove v1
    before = {p.name: p.stat().st_mtime_ns for p in store.root.iterdir()}

    again = eqrisk(home, *args)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines() == [
        f"nothing new: the ingested data and the settings are those of {v2} (current); no "
        "version published, none pruned"
    ]
    as_json = eqrisk(home, *args, "--json")
    assert json.loads(as_json.stdout) == {"nothing_new": True, "model_version": v2}
    assert store.versions() == [v1, v2] and store.current() == v2
    assert {p.name: p.stat().st_mtime_ns for p in store.root.iterdir()} == before

    # --force publishes the same data again (pruning as usual: keep 1).
    forced = eqrisk(home, *args, "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    v3 = json.loads(forced.stdout)["model_version"]
    assert store.versions() == [v3] and store.current() == v3

    # A changed setting is something new: a version is published (and v1 pruned).
    changed = eqrisk(home, "build", "--window", "40", "--min-obs", "20", "--keep", "1", "--json")
    assert changed.returncode == 0, changed.stderr
    v4 = json.loads(changed.stdout)["model_version"]
    assert store.versions() == [v4] and store.current() == v4


def test_a_release_that_changes_the_risk_model_is_something_new(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The settings' digest covers every field of the served risk model: code that estimates F
    or D differently does not find the old version 'built from the same'."""
    from eqrisk.build import unchanged
    from eqrisk.model.covariance import CovarianceParams
    from eqrisk.model.risk_model import RiskParams
    from eqrisk.model.run import ModelParams

    master = pd.DataFrame({"symbol": SYMBOLS, "asset_type": "stock"})
    params = ModelParams()
    served = unchanged.settings_digest(params, master, "SPY", 256)
    assert unchanged.settings_digest(params, master, "SPY", 256) == served
    raw = RiskParams.served()
    raw = RiskParams(
        covariance=CovarianceParams(corr_standardised=False), styles=raw.styles, regime=raw.regime
    )
    monkeypatch.setattr(RiskParams, "served", classmethod(lambda cls: raw))
    assert unchanged.settings_digest(params, master, "SPY", 256) != served
