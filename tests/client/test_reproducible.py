"""The client's `version`, `start` and `end`: the rows of the route for that version and range,
compressed on the wire and decoded by the client."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eqrisk.snapshot.versions import SnapshotStore

from .conftest import MakeClient


def test_start_end_and_version_reach_the_route(make: MakeClient, home: Path) -> None:
    c = make()
    snap = SnapshotStore(home).current()
    frame = c.ticker_returns(
        "NVDA", start="2025-03-03", end="2025-03-31", version=snap.version, format="json"
    )
    days = np.datetime_as_string(snap.sessions.astype("datetime64[D]"), unit="D")
    row = int(snap.symbols.loc["NVDA", "row"])
    price = np.asarray(snap.array("price_close")[row])
    want = days[(days >= "2025-03-03") & (days <= "2025-03-31") & np.isfinite(price)]
    got = np.datetime_as_string(frame["date"].to_numpy().astype("datetime64[D]"), unit="D")
    assert list(got) == list(want)
    assert c.last_call is not None and c.last_call.model_version == snap.version
    at = [list(days).index(d) for d in want]
    np.testing.assert_array_equal(frame["vol_23d"].to_numpy(float), snap.array("vol_23d")[row][at])
    records = c.factor_list(format="csv", version=snap.version)
    assert [r["fact"] for r in records] == c.factor_names()
