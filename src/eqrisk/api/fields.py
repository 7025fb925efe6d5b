"""The one field table of both services: each output field once, with the snapshot array it is
read from, its description and its unit.

The response models (`models`), the column maps the routes render (`*_COLUMNS`) and the OpenAPI
descriptions all derive from `FIELDS`, so a field is described in one place. The cascade's field
lists come from the snapshot layer (`snapshot.index`): the API never imports the model, and a
cascade field without a row here fails at import, not in a client.
"""

from __future__ import annotations

from dataclasses import dataclass

from eqrisk.snapshot.index import L1_FIELDS, L2_FIELDS, L3_FIELDS


@dataclass(frozen=True)
class FieldSpec:
    """One output field: its name in answers, the snapshot array behind it (None: an attribute
    of the symbol, not a daily array), what it means, and its unit."""

    name: str
    array: str | None
    description: str
    unit: str  # decimal, share (0 to 1), ratio, USD, shares, rank, code, text


FIELDS: dict[str, FieldSpec] = {
    f.name: f
    for f in (
        # Service B (risk metrics)
        FieldSpec(
            "returns_gross",
            "return",
            "Simple daily return P_t / P_t-1 - 1 (decimal); null after a missing price.",
            "decimal",
        ),
        FieldSpec("returns_log", "log_return", "Log return ln(1 + returns_gross).", "decimal"),
        FieldSpec("price_close", "price_close", "Adjusted close.", "USD"),
        FieldSpec(
            "return_1d", "return", "Simple return of the latest session (decimal).", "decimal"
        ),
        FieldSpec("market_cap", "market_cap", "Market capitalization (USD).", "USD"),
        FieldSpec(
            "vol_23d",
            "vol_23d",
            "Annualized volatility of daily returns over the last 23 sessions.",
            "decimal",
        ),
        FieldSpec(
            "vol_252d_ann",
            "vol_252d_ann",
            "Annualized volatility of daily returns over the last 252 sessions.",
            "decimal",
        ),
        FieldSpec(
            "l1_mkt_hr",
            "l1_mkt_hr",
            "L1 hedge ratio: dollars of the market ETF per $1 of the symbol.",
            "ratio",
        ),
        FieldSpec(
            "l1_mkt_er",
            "l1_mkt_er",
            "L1 share of variance explained by the market (0 to 1).",
            "share",
        ),
        FieldSpec(
            "l1_res_er", "l1_res_er", "L1 residual share of variance (1 - l1_mkt_er).", "share"
        ),
        FieldSpec(
            "l2_mkt_hr",
            "l2_mkt_hr",
            "L2 hedge ratio on the raw market ETF (hedging with market + sector ETFs).",
            "ratio",
        ),
        FieldSpec("l2_sec_hr", "l2_sec_hr", "L2 hedge ratio on the sector ETF.", "ratio"),
        FieldSpec(
            "l2_mkt_er", "l2_mkt_er", "L2 share of variance explained by the market.", "share"
        ),
        FieldSpec(
            "l2_sec_er",
            "l2_sec_er",
            "L2 share explained by the sector ETF cleaned of the market.",
            "share",
        ),
        FieldSpec("l2_res_er", "l2_res_er", "L2 residual share of variance.", "share"),
        FieldSpec(
            "l3_mkt_hr",
            "l3_mkt_hr",
            "L3 hedge ratio on the raw market ETF (hedging with all three ETFs).",
            "ratio",
        ),
        FieldSpec("l3_sec_hr", "l3_sec_hr", "L3 hedge ratio on the raw sector ETF.", "ratio"),
        FieldSpec(
            "l3_sub_hr",
            "l3_sub_hr",
            "L3 hedge ratio on the subsector ETF; null when the symbol has none.",
            "ratio",
        ),
        FieldSpec(
            "l3_mkt_er", "l3_mkt_er", "L3 share of variance explained by the market.", "share"
        ),
        FieldSpec(
            "l3_sec_er",
            "l3_sec_er",
            "L3 share explained by the sector ETF cleaned of the market.",
            "share",
        ),
        FieldSpec(
            "l3_sub_er",
            "l3_sub_er",
            "L3 share explained by the subsector ETF cleaned of market and sector.",
            "share",
        ),
        FieldSpec(
            "l3_res_er",
            "l3_res_er",
            "L3 residual (idiosyncratic) share; the non-null L3 shares sum to 1.",
            "share",
        ),
        # The per-level betas of the real Service B. An orthogonalised regression gives the
        # cleaned factor the same coefficient as the raw ETF, so each beta is the hedge ratio
        # of the ETF the level adds.
        FieldSpec("l1_mkt_beta", "l1_mkt_hr", "L1 beta to the market ETF (= l1_mkt_hr).", "ratio"),
        FieldSpec(
            "l2_sec_beta",
            "l2_sec_hr",
            "L2 beta to the sector ETF cleaned of the market (= l2_sec_hr).",
            "ratio",
        ),
        FieldSpec(
            "l3_sub_beta",
            "l3_sub_hr",
            "L3 beta to the subsector ETF cleaned of market and sector (= l3_sub_hr).",
            "ratio",
        ),
        FieldSpec(
            "l1_cfr",
            "l1_cfr",
            "L1 combined factor return: the hedge of day t-1 applied to day t's ETF returns.",
            "decimal",
        ),
        FieldSpec("l1_rr", "l1_rr", "L1 residual return: returns_gross - l1_cfr.", "decimal"),
        FieldSpec("l2_cfr", "l2_cfr", "L2 combined factor return.", "decimal"),
        FieldSpec("l2_rr", "l2_rr", "L2 residual return: returns_gross - l2_cfr.", "decimal"),
        FieldSpec("l3_cfr", "l3_cfr", "L3 combined factor return.", "decimal"),
        FieldSpec("l3_rr", "l3_rr", "L3 residual return: returns_gross - l3_cfr.", "decimal"),
        FieldSpec(
            "l1_hq",
            "l1_hq",
            "L1 hedge quality: variance of l1_rr over variance of the return, trailing window.",
            "share",
        ),
        FieldSpec(
            "l2_hq",
            "l2_hq",
            "L2 hedge quality: variance of l2_rr over variance of the return, trailing window.",
            "share",
        ),
        FieldSpec(
            "l3_hq",
            "l3_hq",
            "L3 hedge quality: variance of l3_rr over variance of the return, trailing window.",
            "share",
        ),
        # The risk model's forecast (docs/decisions/risk-forecast.md): of session t, from data
        # up to t-1 (no look-ahead), daily.
        FieldSpec(
            "risk_total_vol",
            "risk_total_vol",
            "Predicted daily volatility of the session's return (sqrt(h'Fh + D)), forecast "
            "from data up to the previous session; times sqrt(252) for a yearly figure.",
            "decimal",
        ),
        FieldSpec(
            "risk_factor_vol",
            "risk_factor_vol",
            "Predicted daily volatility from the ETF factors (sqrt(h'Fh)), h the previous "
            "session's L3 hedge ratios.",
            "decimal",
        ),
        FieldSpec(
            "risk_specific_vol",
            "risk_specific_vol",
            "Predicted daily specific volatility (sqrt(D)): what is left after the L3 hedge.",
            "decimal",
        ),
        # Service A (daily stock data, /daily `fields`)
        FieldSpec("open", "open", "Opening price as traded (unadjusted).", "USD"),
        FieldSpec("high", "high", "High price as traded (unadjusted).", "USD"),
        FieldSpec("low", "low", "Low price as traded (unadjusted).", "USD"),
        FieldSpec("close", "price_close", "Split- and dividend-adjusted close.", "USD"),
        FieldSpec("close_raw", "close_raw", "Close as traded (unadjusted).", "USD"),
        FieldSpec("volume", "volume", "Shares traded (as traded).", "shares"),
        FieldSpec(
            "return", "return", "Simple daily return of the adjusted close (decimal).", "decimal"
        ),
        FieldSpec("log_return", "log_return", "ln(1 + return).", "decimal"),
        FieldSpec("mktcap", "market_cap", "Market capitalisation, USD.", "USD"),
        FieldSpec(
            "mktcap_rank",
            "mktcap_rank",
            "Rank by market cap among the stocks that session (1 = largest).",
            "rank",
        ),
        FieldSpec("turnover", "turnover", "Traded value: close as traded x volume.", "USD"),
        FieldSpec("sector_code", None, "GICS 2-digit sector code.", "code"),
        FieldSpec("sector", None, "GICS sector name.", "text"),
    )
}


def columns(*names: str) -> dict[str, str]:
    """Output name -> snapshot array, for fields read from the daily arrays."""
    out: dict[str, str] = {}
    for name in names:
        array = FIELDS[name].array
        if array is None:
            raise ValueError(f"{name} is a symbol attribute, not a daily array")
        out[name] = array
    return out


def describe(name: str) -> str:
    """The OpenAPI description of a field."""
    return FIELDS[name].description


FLOW_FIELDS = ("l1_cfr", "l1_rr", "l2_cfr", "l2_rr", "l3_cfr", "l3_rr")
# Realised next-day hedged variance over unhedged variance, trailing window (issue 12).
QUALITY_FIELDS = ("l1_hq", "l2_hq", "l3_hq")
CASCADE = L3_FIELDS + L1_FIELDS + L2_FIELDS
RISK_FIELDS = ("risk_total_vol", "risk_factor_vol", "risk_specific_vol")

# What Service B's routes render: output column -> snapshot array, per answer.
TICKER_RETURNS_COLUMNS = columns(
    "returns_gross",
    "returns_log",
    "price_close",
    *CASCADE,
    *FLOW_FIELDS,
    *QUALITY_FIELDS,
    *RISK_FIELDS,
)
RETURNS_COLUMNS = columns("returns_gross")
L3_COLUMNS = columns(*L3_FIELDS, *RISK_FIELDS)
HEDGE_RATIO_COLUMNS = columns("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr")
BETA_FIELDS = ("l1_mkt_beta", "l2_sec_beta", "l3_sub_beta")
METRICS_FIELDS = columns(
    "vol_23d",
    "vol_252d_ann",
    "price_close",
    "market_cap",
    "return_1d",
    *CASCADE,
    *BETA_FIELDS,
    *QUALITY_FIELDS,
    *RISK_FIELDS,
)
# The long names the real Service B's readers need where they take no short ones
# (/api/l3-decomposition's arrays, the batch long table).
LONG_NAMES: dict[str, str] = {
    "l3_mkt_hr": "l3_market_hr",
    "l3_sec_hr": "l3_sector_hr",
    "l3_sub_hr": "l3_subsector_hr",
    "l3_mkt_er": "l3_market_er",
    "l3_sec_er": "l3_sector_er",
    "l3_sub_er": "l3_subsector_er",
    "l3_res_er": "l3_residual_er",
}

# Service A: the /daily fields (None: a per-symbol attribute from the symbols table), in order.
DAILY_FIELDS: dict[str, str | None] = {
    name: FIELDS[name].array
    for name in (
        "open",
        "high",
        "low",
        "close",
        "close_raw",
        "volume",
        "return",
        "log_return",
        "mktcap",
        "mktcap_rank",
        "turnover",
        "sector_code",
        "sector",
    )
}
ALWAYS = ("symbol", "teo")

# /symbol_list top_by -> snapshot array.
TOP_BY = columns("mktcap", "mktcap_rank", "close", "return", "turnover", "volume")
