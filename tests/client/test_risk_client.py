"""`Client.portfolio_risk`, `factor_covariance` and `specific_risk` against the app in process:
the frames hold the route's numbers, and F read as JSON and as Parquet is the same matrix."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from eqrisk.api.app import create_app
from eqrisk.client import Client
from eqrisk.settings import Settings
from helpers import TEST_KEY, register_key


@pytest.fixture(scope="module")
def client(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Client:
    import shutil

    home = tmp_path_factory.mktemp("risk-client")
    shutil.copytree(demo_home / "snapshots", home / "snapshots")
    register_key(home, TEST_KEY)
    app = create_app(Settings(home=home, _env_file=None))
    return Client(api_key=TEST_KEY, transport=httpx.ASGITransport(app))


def test_portfolio_risk_frames_hold_the_routes_numbers(client: Client) -> None:
    book = {"NVDA": 0.5, "AAPL": 0.3, "MSFT": -0.2, "NOPE": 0.1}
    risk = client.portfolio_risk(book, benchmark="SPY", level="L2")
    raw = risk.raw
    assert risk.vol == raw["portfolio"]["vol_daily"]
    assert risk.tracking_error == raw["tracking_error"]["vol_daily"]
    assert list(risk.summary.index) == ["portfolio", "active"]
    assert risk.by_level["portfolio"].sum() == pytest.approx(risk.vol, rel=1e-12)
    assert risk.positions["contribution"].sum() == pytest.approx(risk.vol, rel=1e-12)
    assert list(risk.positions.index) == ["NVDA", "AAPL", "MSFT"]
    assert risk.positions["model_level"].to_dict() == {"NVDA": 3, "AAPL": 2, "MSFT": 3}
    assert risk.notes == raw["notes"] == []
    assert risk.unused == {"NOPE": "not in the model's universe"}
    assert list(risk.hedge.index) == [leg["etf"] for leg in raw["hedge"]["legs"]]
    assert risk.vol_after_hedge == raw["hedge"]["vol_after_daily"]
    assert client.last_call is not None and client.last_call.cost_usd == pytest.approx(0.01)


def test_portfolio_risk_asks_for_the_style_neutral_hedge_only_when_told(client: Client) -> None:
    book = {"NVDA": 0.5, "AAPL": 0.3, "MSFT": -0.2}
    plain = client.portfolio_risk(book)
    assert "style_neutral" not in plain.raw["hedge"]
    asked = client.portfolio_risk(book, style_neutral=True).raw["hedge"]["style_neutral"]
    # The demo market holds none of the factor ETFs: no legs, and the hedge is the plain one.
    assert asked["legs"] == []
    assert asked["vol_after_daily"] == pytest.approx(plain.vol_after_hedge, rel=1e-12)


def test_factor_covariance_and_specific_risk_in_json_and_parquet(client: Client) -> None:
    f = client.factor_covariance("2024-03-01")
    assert f.attrs["date"] <= "2024-03-01" and list(f.index) == list(f.columns)
    assert f.attrs["levels"]["SPY"] == "market"
    g = client.factor_covariance("2024-03-01", format="parquet")
    np.testing.assert_array_equal(g.loc[list(f.index), list(f.columns)].to_numpy(), f.to_numpy())
    d = client.specific_risk("2024-03-01")
    e = client.specific_risk("2024-03-01", format="parquet")
    np.testing.assert_array_equal(
        d["specific_var"].astype(float).to_numpy(), e["specific_var"].to_numpy()
    )
    nvda = d.loc["NVDA"]
    assert nvda["risk_total_vol"] == pytest.approx(
        np.sqrt(nvda["risk_factor_vol"] ** 2 + nvda["specific_var"]), rel=1e-12
    )


def test_style_exposures_frame_holds_the_routes_numbers_in_json_and_parquet(
    client: Client,
) -> None:
    s = client.style_exposures("2024-03-01")
    assert s.attrs["date"] <= "2024-03-01" and len(s) == s.attrs["regression_stocks"] > 0
    factors = s.attrs["factors"]
    assert "size" in factors.index and list(s.columns) == list(factors.index)
    # the exposures are those /api/specific-risk serves as its style_<factor> columns, for the
    # factors with a forecast that session; one without is left out there (its exposures 0)
    d = client.specific_risk("2024-03-01")
    assert 0 < factors["forecast"].sum() < len(factors)  # the demo has both kinds that day
    for name, has in factors["forecast"].items():
        if not has:
            assert f"style_{name}" not in d.columns and (s[name] == 0.0).all()
            continue
        np.testing.assert_array_equal(
            s[name].to_numpy(float), d.loc[s.index, f"style_{name}"].to_numpy(float)
        )
    p = client.style_exposures("2024-03-01", format="parquet")
    np.testing.assert_array_equal(
        p.loc[s.index, list(s.columns)].to_numpy(float), s.to_numpy(float)
    )
    assert client.last_call is not None and client.last_call.cost_usd == pytest.approx(0.02)
