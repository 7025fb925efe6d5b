"""The pieces that make a one-session build cheap give the very values of the slow paths: the
price metrics (cap rank included) computed on the tail only, the latest values gathered at once
from an in-memory array or a spliced one, and the XXH3 input digests (same data, same digest;
one changed value, another digest)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.bench.incremental import _cut, synthetic_market
from eqrisk.build.incremental import digest
from eqrisk.build.pipeline import publish_panel
from eqrisk.data.panel import Panel
from eqrisk.model.run import ModelParams, cap_rank, plan_model
from eqrisk.snapshot.spliced import Spliced
from eqrisk.snapshot.tables import _clean, latest_values
from eqrisk.snapshot.versions import Snapshot, snapshots_dir


def _capped(n: int, t: int) -> tuple[Panel, pd.DataFrame]:
    """The bench's synthetic market with market caps (ties, gaps, ETFs unranked) and volume."""
    panel, master = synthetic_market(n, t, seed=3)
    rng = np.random.default_rng(5)
    cap = np.round(rng.uniform(1, 20, panel.close.shape)) * 1e9  # many ties
    cap[rng.random(cap.shape) < 0.2] = np.nan
    volume = rng.uniform(1e5, 1e6, panel.close.shape)
    close_raw = np.where(rng.random(cap.shape) < 0.5, panel.close * 2.0, np.nan)
    fields = {k: getattr(panel, k) for k in ("close", "open", "high", "low")}
    return (
        Panel(
            symbols=panel.symbols,
            sessions=panel.sessions,
            close_raw=close_raw,
            volume=volume,
            market_cap=cap,
            **fields,
        ),
        master,
    )


@pytest.mark.parametrize("cached_first", [False, True])
def test_price_metrics_of_the_tail_equal_the_whole_history_slices(cached_first: bool) -> None:
    panel, master = _capped(60, 700)
    plan = plan_model(panel, master, ModelParams(window=60, min_obs=30))
    other = plan_model(panel, master, ModelParams(window=60, min_obs=30))
    whole = other.price_metrics
    if cached_first:
        assert plan.price_metrics.keys() == whole.keys()
    assert np.isfinite(whole["mktcap_rank"]).sum() > 1000
    assert np.isfinite(whole["turnover"]).sum() > 1000
    for start in (0, 1, 255, 256, 699):
        tail = plan.price_metrics_from(start)
        assert sorted(tail) == sorted(whole)
        for name, arr in tail.items():
            assert arr.shape == (60, 700 - start)
            want = np.ascontiguousarray(whole[name][:, start:]).tobytes()
            assert np.ascontiguousarray(arr).tobytes() == want, (name, start)
    # The rank is per session: ranking the tail alone is ranking it within the whole.
    eligible = np.arange(60) >= 12
    assert np.array_equal(
        cap_rank(panel.market_cap[:, 400:], eligible),
        cap_rank(panel.market_cap, eligible)[:, 400:],
        equal_nan=True,
    )


def test_latest_values_gather_what_one_read_per_row_gives() -> None:
    rng = np.random.default_rng(1)
    whole = rng.normal(size=(40, 300))
    whole[rng.random(whole.shape) < 0.1] = np.nan
    last = rng.integers(-1, 300, 40)
    last[:5] = 299
    last[5:8] = -1
    start = 250
    assert ((last >= 0) & (last < start)).sum() > 5  # rows read from before the tail
    tail = Spliced(whole[:, start:].copy(), start, whole)  # type: ignore[arg-type]
    want = [_clean(whole[i, t]) if t >= 0 else None for i, t in enumerate(last.tolist())]
    assert want.count(None) >= 3
    assert latest_values(whole, last) == want
    assert latest_values(tail, last) == want

    class Slow:
        """An array read one element at a time (neither an ndarray nor a spliced one)."""

        def __getitem__(self, key: tuple[int, int]) -> float:
            return float(whole[key])

    assert latest_values(Slow(), last) == want


def test_input_digests_see_one_changed_value() -> None:
    a = np.random.default_rng(2).normal(size=(30, 128))
    b = a.copy()
    assert digest(a[:, 10:50]) == digest(np.ascontiguousarray(b[:, 10:50]))
    b[17, 33] = np.nextafter(b[17, 33], np.inf)
    assert digest(a[:, 10:50]) != digest(b[:, 10:50])
    assert digest(a[:, :0]) != digest(a[:0, :])  # the shape is part of the digest
    assert digest(["x", 1]) != digest(["x", 2])


def test_a_one_session_build_with_caps_and_volume_equals_a_full_rebuild(tmp_path: Path) -> None:
    """The bench's market has no caps: here the cap rank, the cap-weighted groups and the
    turnover take the incremental path too, and every array equals a full rebuild's."""
    panel, master = _capped(60, 701)
    home = tmp_path / "home"
    params = ModelParams(window=60, min_obs=30)
    publish_panel(home, _cut(panel, 700), master, params, keep=5, full=True)
    step = publish_panel(home, panel, master, params, keep=5)
    assert step["build"]["mode"] == "incremental" and step["build"]["from_chunk"] == 5
    again = publish_panel(home, panel, master, params, keep=5, full=True)
    root = snapshots_dir(home)
    a = Snapshot.open(root / step["model_version"])
    b = Snapshot.open(root / again["model_version"])
    assert np.isfinite(np.asarray(b.array("mktcap_rank"))[:, 640:]).sum() > 1000
    assert sorted(step["fields"]) == sorted(again["fields"])
    for f in again["fields"]:
        assert np.asarray(a.array(f)).tobytes() == np.asarray(b.array(f)).tobytes(), f
    assert a.security_history().equals(b.security_history())
    assert a.symbols.equals(b.symbols)


@pytest.mark.parametrize("halflife", [None, 30.0])
def test_a_block_run_from_start_equals_the_whole_run(halflife: float | None) -> None:
    """`run_block(..., start=s)` on a block whose column 0 is a re-anchoring point gives the
    whole run's values at t >= s bit for bit (each series computed from the point it needs),
    every field but the 23-session volatility (computed by run_from on its own anchor)."""
    from eqrisk.model.resume import from_column
    from eqrisk.model.run import BlockInput, run_block

    panel, master = _capped(60, 700)
    params = ModelParams(window=60, min_obs=30, halflife=halflife)
    plan = plan_model(panel, master, params)
    shared = plan.in_process()
    whole = run_block(shared, plan.block(0, plan.size, own_rows=False))
    for o, s in [(0, 120), (0, 185), (120, 299), (240, 640), (540, 700)]:
        sliced = from_column(shared, o)
        block = BlockInput(
            start=0,
            stop=plan.size,
            returns=np.ascontiguousarray(plan.returns[:, o:]),
            own_factors=np.empty((0, 700 - o)),
            model_fidx=plan.layout.model_fidx,
            exposure=plan.flat.exposure,
        )
        tail = run_block(sliced, block, start=s - o)
        assert list(tail) == [name for name in whole if name != "vol_23d"]
        for name, arr in tail.items():
            want = np.ascontiguousarray(whole[name][:, s:])
            assert arr.shape == want.shape, name
            assert np.ascontiguousarray(arr).tobytes() == want.tobytes(), (name, o, s)
        assert s == 700 or np.isfinite(tail["l2_hq"]).any()
    with pytest.raises(ValueError, match="two windows"):
        run_block(shared, plan.block(0, plan.size, own_rows=False), start=119)


def test_a_tail_array_reads_a_chunked_version_chunk_by_chunk(tmp_path: Path) -> None:
    """Slices of all rows before the tail (the long table's monthly file) are copied from the
    chunks, across blocks and chunks, narrow dtypes and all-NaN chunks: the dense values."""
    from eqrisk.snapshot import chunks

    rng = np.random.default_rng(4)
    n, t, start = 50, 200, 170
    whole = rng.normal(size=(n, t))
    whole[:, 32:64] = np.nan  # an all-NaN chunk of every block (not stored)
    whole[16:32, 96:128] = np.round(whole[16:32, 96:128] * 10) % 7 + 1  # stored as uint8
    grid = chunks.ChunkGrid(n, t, block=16, chunk=32)
    arrays, _stats = chunks.write_arrays(tmp_path, {"x": whole}, grid)
    assert set(arrays["chunks"]["x"][1]) == {"d", ".", "B"}
    stored = chunks.open_arrays(tmp_path, arrays)["x"]
    tail = Spliced(whole[:, start:].copy(), start, stored)
    for rows, lo, hi in [
        (slice(None, n), 0, t),
        (slice(0, n), 40, 190),
        (slice(5, 37), 100, 170),
        (slice(17, 18), 0, 31),
    ]:
        got = tail[rows, lo:hi]
        assert got.dtype == np.float64
        assert got.tobytes() == np.ascontiguousarray(whole[rows, lo:hi]).tobytes(), (rows, lo)
