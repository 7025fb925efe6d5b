"""The route's arithmetic in arrays (`snapshot.portfolio.risk_and_hedge`: each book resolved
once, the hedged book built from the resolved rows) answers what the dict-by-dict route
answered (its logic kept here as the reference) on a 5,000-stock synthetic session with both
layers, ETF rows of its own and the cases a book can hold: unknown tickers, zero positions,
rows without a forecast, an ETF leg on a ticker of the book (used, zero, or without a forecast),
a benchmark as positions or as a ticker, the hedge at the model's level and at another one.
The hedged book's volatility also equals a dense sqrt(w' Sigma w)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest

from eqrisk.bench.risk import dense_sigma, synthetic_day
from eqrisk.model.portfolio_risk import PortfolioRisk, portfolio_risk, resolve
from eqrisk.model.risk_model import RiskModelDay
from eqrisk.snapshot.portfolio import HedgeLegs, risk_and_hedge

N = 5000
REL = 1e-12


def _with_etf_rows(day: RiskModelDay) -> RiskModelDay:
    """The session with a row per ETF factor (exposure 1 to itself, no specific risk, level 1),
    as the served model holds them, and a few stocks without a forecast."""
    etf = [k for k, lv in zip(day.factor_keys, day.factor_level.tolist(), strict=True) if lv < 4]
    k = len(etf)
    index = np.vstack([day.index, np.column_stack([np.arange(k), -np.ones((k, 2), dtype=int)])])
    values = np.vstack([day.values, np.column_stack([np.ones(k), np.zeros((k, 2))])])
    level = np.concatenate([day.level, np.ones(k, dtype=day.level.dtype)])
    specific = np.concatenate([day.specific_var, np.zeros(k)])
    level[[7, 70, 700]] = 0  # no hedge ratios published
    specific[[8, 80]] = np.nan  # no specific risk yet
    assert day.style is not None
    style = np.vstack([day.style, np.zeros((k, day.style.shape[1]))])
    symbols = np.concatenate([day.symbols, np.array(etf)])
    return replace(
        day,
        symbols=symbols,
        index=index,
        values=values,
        level=level,
        specific_var=specific,
        style=style,
    )


def _at_level_2(day: RiskModelDay) -> RiskModelDay:
    """The same session with the exposures of the L2 hedge (no subsector slot)."""
    index = day.index.copy()
    index[:, 2] = -1
    values = day.values.copy()
    values[:, 2] = 0.0
    return replace(day, index=index, values=values, level=np.minimum(day.level, 2))


def _reference(
    day: RiskModelDay,
    at: RiskModelDay,
    positions: Mapping[str, float],
    benchmark: str | Mapping[str, float] | None,
) -> tuple[PortfolioRisk, dict[str, float], list[str], list[float]]:
    """The route as it was: the book, the benchmark and the hedged book resolved from dicts
    (the legs added to the dict of the positions given, the unusable tickers taken out)."""
    if isinstance(benchmark, str):
        benchmark = {benchmark: float(resolve(day, positions).weights.sum())}
    risk = portfolio_risk(day, positions, benchmark=benchmark)
    legs = risk.hedge if at is day else portfolio_risk(at, positions).hedge
    hedged = dict(positions)
    for key, notional, ok in zip(legs.keys, legs.notional.tolist(), legs.tradable, strict=True):
        if ok and key in day.row_of:
            hedged[key] = hedged.get(key, 0.0) + notional
    unusable = set(risk.unusable.tickers)
    used = {k: v for k, v in hedged.items() if k not in unusable}
    return risk, used, legs.keys, legs.notional.tolist()


def _book(day: RiskModelDay, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    stocks = day.symbols[:N].tolist()
    book = dict(zip(stocks, (rng.normal(0.0, 1.0, N) / N).tolist(), strict=True))
    book[stocks[5]] = 0.0  # a zero position
    book.update({"SEC3": 0.02, "SUB4": 0.0, "ZZZZ": 0.1, "NOPE1": -0.05})  # ETFs given, unknown
    del book[stocks[11]]  # 4,999 stocks, then the ETFs and unknown tickers
    return book


def _assert_close(a: np.ndarray | list[float], b: np.ndarray | list[float]) -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=REL, atol=1e-18)


@pytest.fixture(scope="module")
def day() -> RiskModelDay:
    return _with_etf_rows(synthetic_day(N, seed=3)[0])


@pytest.mark.parametrize("level", [3, 2])
@pytest.mark.parametrize("bench", ["positions", "ticker", "none"])
def test_the_route_in_arrays_answers_what_the_dict_route_answered(
    day: RiskModelDay, level: int, bench: str
) -> None:
    at = day if level == 3 else _at_level_2(day)
    book = _book(day, seed=level)
    benchmark: str | dict[str, float] | None = {
        "positions": {**dict(list(book.items())[2000:4500]), "SEC1": 0.3, "ZZ2": 1.0},
        "ticker": "SPY",
        "none": None,
    }[bench]
    risk, hedge = risk_and_hedge(day, at, book, benchmark, level)
    want, used, keys, notional = _reference(day, at, book, benchmark)

    p, q = risk.portfolio, want.portfolio
    assert p.positions.tickers == q.positions.tickers and len(p.positions.tickers) == N - 6
    _assert_close(p.positions.contribution, q.positions.contribution)
    _assert_close([p.vol, p.factor_vol, p.style_vol], [q.vol, q.factor_vol, q.style_vol])
    assert risk.unusable == want.unusable
    assert set(risk.unusable.tickers) == {day.symbols[5], "SUB4", "ZZZZ", "NOPE1"} | {
        day.symbols[i] for i in (7, 8, 70, 80, 700)
    }
    assert (risk.active is None) == (bench == "none")
    if risk.active is not None and want.active is not None:
        assert risk.benchmark_unusable == want.benchmark_unusable
        assert risk.active.positions.tickers == want.active.positions.tickers
        _assert_close(risk.active.positions.contribution, want.active.positions.contribution)
        assert risk.active.vol == pytest.approx(want.active.vol, rel=REL)

    assert isinstance(hedge, HedgeLegs) and hedge.keys == keys
    _assert_close(hedge.notional, notional)
    hedged = portfolio_risk(day, used).portfolio
    assert hedge.vol_after == pytest.approx(hedged.vol, rel=REL)
    assert hedge.after == pytest.approx(dict(hedged.by_level), rel=REL, abs=1e-18)
    x = dict(zip(hedged.factors.keys, hedged.factors.exposure.tolist(), strict=True))
    if at is day:
        _assert_close(hedge.exposure_after, [x.get(k, 0.0) for k in keys])
        # At the model's level the hedged book holds no ETF exposure (but SUB4's, whose leg
        # is left out with the zero position given on it): style and specific risk are left.
        left = dict(zip(keys, hedge.exposure_after, strict=True))
        assert left.pop("SUB4") == pytest.approx(-dict(zip(keys, notional, strict=True))["SUB4"])
        assert max(map(abs, left.values())) < 1e-12 * np.abs(notional).max()
    # The hedged book's volatility is sqrt(w' Sigma w) of its rows, built densely.
    rows = resolve(day, used)
    sigma = dense_sigma(day, rows.rows)
    assert hedge.vol_after == pytest.approx(float(np.sqrt(rows.weights @ sigma @ rows.weights)),
                                            rel=1e-10)  # fmt: skip


def test_a_leg_on_a_ticker_of_the_book_adds_to_it_and_a_zero_one_stays_out(
    day: RiskModelDay,
) -> None:
    """SEC3 held (its leg adds to the position), SUB4 given at zero (not usable: its leg is left
    out, as the dict route left it), the other legs rows of their own after the book's."""
    book = _book(day, seed=9)
    risk, hedge = risk_and_hedge(day, day, book, None, 3)
    _, used, keys, notional = _reference(day, day, book, None)
    leg = dict(zip(keys, notional, strict=True))
    assert used["SEC3"] == book["SEC3"] + leg["SEC3"]
    assert "SUB4" not in used and leg["SUB4"] != 0.0
    assert "SPY" in used and "SPY" not in book  # a leg of its own
    assert "SEC3" in risk.portfolio.positions.tickers
    assert hedge.vol_after == pytest.approx(portfolio_risk(day, used).portfolio.vol, rel=REL)
