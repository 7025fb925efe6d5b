"""The one price table of eqrisk (DESIGN section 5).

Money is counted in integer tokens (1 token = $0.00002) so that balances and charges are exact;
prices are written in USD and converted once. The operator overrides any price with a JSON file
(settings `pricing_file`: {"route": {"usd": 0.004, "per": "call", "minimum_usd": 0}}).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

TOKEN_USD = Decimal("0.00002")


def usd_to_tokens(usd: Decimal | str | float) -> int:
    tokens = Decimal(str(usd)) / TOKEN_USD
    if tokens != tokens.to_integral_value():
        raise ValueError(f"{usd} USD is not a whole number of tokens (1 token = {TOKEN_USD} USD)")
    return int(tokens)


def tokens_to_usd(tokens: int) -> float:
    """USD value of a token count, exact to the token (float only at the edge, for JSON)."""
    return float(Decimal(tokens) * TOKEN_USD)


@dataclass(frozen=True)
class Price:
    """The price of one route: per call, or per succeeded ticker (batch), with a minimum."""

    tokens: int
    per: str = "call"  # "call" | "ticker" | "position"
    minimum_tokens: int = 0

    def cost(self, units: int = 1) -> int:
        """Tokens charged for `units` (calls = 1; batch: succeeded tickers; a portfolio: the
        positions used). Zero units cost
        nothing (a batch where every ticker failed is not charged)."""
        if units <= 0:
            return 0
        return max(self.tokens * units, self.minimum_tokens)

    @property
    def usd(self) -> float:
        return tokens_to_usd(self.tokens)

    def describe(self) -> str:
        """The price in words, as the README's price table writes it (a test compares them)."""
        if self.tokens == 0 and self.minimum_tokens == 0:
            return "free"
        unit = {"ticker": "succeeded ticker", "position": "position used"}.get(self.per, "call")
        text = f"{self.usd:g} USD per {unit}"
        if self.minimum_tokens:
            text += f", minimum {tokens_to_usd(self.minimum_tokens):g} USD per call"
        return text


def _usd(value: str, per: str = "call", minimum: str = "0") -> Price:
    return Price(usd_to_tokens(value), per, usd_to_tokens(minimum))


# Route key -> price. Service B keys are the path after /api/; Service A keys its paths.
DEFAULT_PRICES: dict[str, Price] = {
    "tickers": _usd("0"),
    "estimate": _usd("0"),
    "balance": _usd("0"),
    "account": _usd("0"),
    "health": _usd("0"),
    "metrics": _usd("0.005"),
    "ticker-returns": _usd("0.005"),
    "returns": _usd("0.005"),
    "etf-returns": _usd("0.005"),
    "heatmap": _usd("0.005"),
    "l3-decomposition": _usd("0.01"),
    "batch/analyze": _usd("0.002", per="ticker", minimum="0.01"),
    "portfolio/risk": _usd("0.0004", per="position", minimum="0.01"),
    "factor-covariance": _usd("0.005"),
    "specific-risk": _usd("0.02"),
    "style-exposures": _usd("0.02"),
    "daily": _usd("0"),
    "betas": _usd("0"),
    "facts": _usd("0"),
    "gross": _usd("0"),
    "resids": _usd("0"),
    "symbol_list": _usd("0"),
    "factor_list": _usd("0"),
    "decompose": _usd("0.005"),
    "batch/latest-metrics": _usd("0.001"),
    "returns-decomposition": _usd("0.005"),
    "rankings": _usd("0.001"),
    "rankings/top": _usd("0.001"),
    "rankings/screen": _usd("0.001"),
    "macro-factors": _usd("0.001"),
    "etf/factor-returns": _usd("0.005"),
    "correlation": _usd("0.002"),
    "metrics/correlation": _usd("0.002"),
    "lstar": _usd("0.005"),
    "batch/lstar": _usd("0.002", per="ticker", minimum="0.01"),
    "portfolio/risk-index": _usd("0.005"),
    "industry-panel": _usd("0.005"),
    "universe/members": _usd("0.005"),
}


@dataclass(frozen=True)
class PriceTable:
    prices: dict[str, Price]

    @classmethod
    def load(cls, override: Path | None = None) -> PriceTable:
        prices = dict(DEFAULT_PRICES)
        if override is not None:
            doc = json.loads(Path(override).read_text())
            for route, spec in doc.items():
                if route not in prices:
                    raise ValueError(
                        f"{override}: unknown route {route!r}; known: {', '.join(sorted(prices))}"
                    )
                prices[route] = _usd(
                    str(spec["usd"]), spec.get("per", "call"), str(spec.get("minimum_usd", "0"))
                )
        return cls(prices)

    def __getitem__(self, route: str) -> Price:
        return self.prices[route]

    def routes(self) -> list[str]:
        return sorted(self.prices)
