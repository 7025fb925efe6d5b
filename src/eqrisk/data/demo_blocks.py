"""The demo generator's building blocks: its parameters (factor volatilities, loadings, ticker
syllables), the Student-t and GARCH market factor, the ETF and stock tables, listing windows and
halts, price targets, splits and OHLCV. `demo.generate_demo` draws them in a fixed order."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from eqrisk.data.master import MAG7, Mappings, etf_registry, sector_table

MARKET_ETF = "SPY"
_DF = 4.0  # Student-t degrees of freedom of every shock: fat tails with a finite variance
_T_SCALE = float(np.sqrt((_DF - 2.0) / _DF))  # scales a t(df) draw to unit variance
_MKT_VOL = 0.17 / np.sqrt(252.0)  # long-run daily vol of the market factor (17% a year)
_MKT_DRIFT = 0.10 / 252.0  # daily mean of the market factor
_GARCH_A, _GARCH_B = 0.09, 0.89  # persistence 0.98: calm years, violent clusters
_TRACKING = 0.0002  # daily tracking noise of an ETF around its factor model
VENDOR_COLUMNS = ("date", "symbol", "open", "high", "low", "close", "adjusted_close", "volume")
MAX_MOVE = 0.45  # |daily simple return| cap: below ingest's default 0.5 "suspect move" flag

# Sector ETF market loadings (gamma_s) and daily vol of the sector factor: defensives low.
_SECTOR_PARAMS: dict[str, tuple[float, float]] = {
    "Energy": (1.00, 0.0120),
    "Materials": (1.05, 0.0060),
    "Industrials": (1.05, 0.0045),
    "Consumer Discretionary": (1.15, 0.0050),
    "Consumer Staples": (0.65, 0.0055),
    "Health Care": (0.80, 0.0060),
    "Financials": (1.10, 0.0065),
    "Information Technology": (1.25, 0.0055),
    "Communication Services": (1.05, 0.0065),
    "Utilities": (0.60, 0.0085),
    "Real Estate": (0.85, 0.0075),
}
_SECTOR_START_PRICE: dict[str, float] = {
    "XLE": 88.0, "XLB": 46.0, "XLI": 52.0, "XLY": 66.0, "XLP": 43.0, "XLV": 55.0,
    "XLF": 22.0, "XLK": 36.0, "XLC": 50.0, "XLU": 38.0, "XLRE": 30.0,
}  # fmt: skip

# Mag7: real names, classification and share counts; betas, idio vol and price levels chosen
# to be plausible. Prices: split-adjusted close on the first session, raw close on the last.
_MAG7_INFO: dict[str, dict[str, object]] = {
    "AAPL": dict(name="Apple Inc.", sector="Information Technology",
                 sub="Technology Hardware, Storage & Peripherals", shares=15.0e9,
                 betas=(1.00, 0.30, np.nan), idio=0.012, p0=17.2, p1=230.0, turnover=0.004),
    "MSFT": dict(name="Microsoft Corporation", sector="Information Technology",
                 sub="Systems Software", shares=7.43e9,
                 betas=(0.70, 0.35, 0.30), idio=0.011, p0=37.0, p1=430.0, turnover=0.003),
    "GOOGL": dict(name="Alphabet Inc.", sector="Communication Services",
                  sub="Interactive Media & Services", shares=12.2e9,
                  betas=(0.60, 0.25, 0.50), idio=0.013, p0=27.7, p1=170.0, turnover=0.002),
    "AMZN": dict(name="Amazon.com, Inc.", sector="Consumer Discretionary",
                 sub="Broadline Retail", shares=10.6e9,
                 betas=(0.60, 0.70, 0.15), idio=0.015, p0=19.9, p1=190.0, turnover=0.004),
    "NVDA": dict(name="NVIDIA Corporation", sector="Information Technology",
                 sub="Semiconductors", shares=24.4e9,
                 betas=(0.60, 0.30, 0.90), idio=0.022, p0=0.39, p1=160.0, turnover=0.010),
    "META": dict(name="Meta Platforms, Inc.", sector="Communication Services",
                 sub="Interactive Media & Services", shares=2.52e9,
                 betas=(0.50, 0.30, 0.70), idio=0.019, p0=54.7, p1=560.0, turnover=0.006),
    "TSLA": dict(name="Tesla, Inc.", sector="Consumer Discretionary",
                 sub="Automobile Manufacturers", shares=3.2e9,
                 betas=(1.20, 0.80, np.nan), idio=0.028, p0=10.0, p1=250.0, turnover=0.030),
}  # fmt: skip

# Real split history (effective session, ratio): the raw close divides by the ratio that day.
_SPLITS: dict[str, tuple[tuple[str, float], ...]] = {
    "NVDA": (("2021-07-20", 4.0), ("2024-06-10", 10.0)),
    "TSLA": (("2020-08-31", 5.0), ("2022-08-25", 3.0)),
}

# Synthetic stocks per (sector, GICS sub-industry). Sub-industries with a subsector ETF in the
# default mapping come first in each sector; the others have none, so the model must fall back.
_UNIVERSE: tuple[tuple[str, str, int], ...] = (
    ("Energy", "Oil & Gas Exploration & Production", 5),
    ("Energy", "Oil & Gas Equipment & Services", 4),
    ("Energy", "Integrated Oil & Gas", 3),
    ("Energy", "Oil & Gas Refining & Marketing", 2),
    ("Energy", "Oil & Gas Storage & Transportation", 3),
    ("Materials", "Steel", 3),
    ("Materials", "Copper", 1),
    ("Materials", "Gold", 4),
    ("Materials", "Specialty Chemicals", 3),
    ("Materials", "Industrial Gases", 1),
    ("Materials", "Construction Materials", 2),
    ("Materials", "Paper & Plastic Packaging Products & Materials", 2),
    ("Materials", "Fertilizers & Agricultural Chemicals", 1),
    ("Industrials", "Building Products", 4),
    ("Industrials", "Aerospace & Defense", 4),
    ("Industrials", "Rail Transportation", 2),
    ("Industrials", "Air Freight & Logistics", 1),
    ("Industrials", "Cargo Ground Transportation", 1),
    ("Industrials", "Passenger Airlines", 4),
    ("Industrials", "Industrial Machinery & Supplies & Components", 4),
    ("Industrials", "Electrical Components & Equipment", 2),
    ("Industrials", "Construction & Engineering", 2),
    ("Industrials", "Environmental & Facilities Services", 2),
    ("Consumer Discretionary", "Homebuilding", 4),
    ("Consumer Discretionary", "Home Improvement Retail", 1),
    ("Consumer Discretionary", "Apparel Retail", 2),
    ("Consumer Discretionary", "Other Specialty Retail", 1),
    ("Consumer Discretionary", "Automotive Retail", 1),
    ("Consumer Discretionary", "Restaurants", 4),
    ("Consumer Discretionary", "Automotive Parts & Equipment", 2),
    ("Consumer Discretionary", "Hotels, Resorts & Cruise Lines", 2),
    ("Consumer Discretionary", "Apparel, Accessories & Luxury Goods", 2),
    ("Consumer Staples", "Packaged Foods & Meats", 4),
    ("Consumer Staples", "Soft Drinks & Non-alcoholic Beverages", 2),
    ("Consumer Staples", "Household Products", 2),
    ("Consumer Staples", "Consumer Staples Merchandise Retail", 2),
    ("Consumer Staples", "Tobacco", 1),
    ("Health Care", "Biotechnology", 5),
    ("Health Care", "Pharmaceuticals", 4),
    ("Health Care", "Health Care Equipment", 3),
    ("Health Care", "Health Care Supplies", 1),
    ("Health Care", "Managed Health Care", 3),
    ("Health Care", "Health Care Services", 2),
    ("Health Care", "Life Sciences Tools & Services", 2),
    ("Financials", "Regional Banks", 5),
    ("Financials", "Diversified Banks", 4),
    ("Financials", "Property & Casualty Insurance", 2),
    ("Financials", "Life & Health Insurance", 2),
    ("Financials", "Insurance Brokers", 1),
    ("Financials", "Investment Banking & Brokerage", 2),
    ("Financials", "Asset Management & Custody Banks", 2),
    ("Financials", "Financial Exchanges & Data", 1),
    ("Financials", "Consumer Finance", 3),
    ("Financials", "Transaction & Payment Processing Services", 2),
    ("Financials", "Multi-Sector Holdings", 1),
    ("Information Technology", "Semiconductors", 4),
    ("Information Technology", "Semiconductor Materials & Equipment", 2),
    ("Information Technology", "Application Software", 4),
    ("Information Technology", "Systems Software", 2),
    ("Information Technology", "Internet Services & Infrastructure", 2),
    ("Information Technology", "Technology Hardware, Storage & Peripherals", 2),
    ("Information Technology", "IT Consulting & Other Services", 2),
    ("Information Technology", "Communications Equipment", 2),
    ("Information Technology", "Electronic Components", 2),
    ("Communication Services", "Interactive Media & Services", 2),
    ("Communication Services", "Integrated Telecommunication Services", 2),
    ("Communication Services", "Wireless Telecommunication Services", 1),
    ("Communication Services", "Movies & Entertainment", 2),
    ("Communication Services", "Cable & Satellite", 2),
    ("Communication Services", "Advertising", 1),
    ("Utilities", "Electric Utilities", 4),
    ("Utilities", "Multi-Utilities", 3),
    ("Utilities", "Gas Utilities", 1),
    ("Utilities", "Water Utilities", 1),
    ("Real Estate", "Retail REITs", 2),
    ("Real Estate", "Industrial REITs", 2),
    ("Real Estate", "Multi-Family Residential REITs", 2),
    ("Real Estate", "Health Care REITs", 1),
    ("Real Estate", "Telecom Tower REITs", 1),
    ("Real Estate", "Data Center REITs", 1),
)

_SECTOR_SUFFIX: dict[str, tuple[str, ...]] = {
    "Energy": ("Energy", "Resources", "Petroleum"),
    "Materials": ("Materials", "Industries", "Chemical"),
    "Industrials": ("Industries", "Corporation", "Group"),
    "Consumer Discretionary": ("Brands", "Holdings", "Group"),
    "Consumer Staples": ("Brands", "Company", "Consumer"),
    "Health Care": ("Health", "Medical", "Health Group"),
    "Financials": ("Financial", "Capital", "Holdings"),
    "Information Technology": ("Technologies", "Systems", "Labs"),
    "Communication Services": ("Media", "Communications", "Networks"),
    "Utilities": ("Utilities", "Energy", "Power"),
    "Real Estate": ("Realty", "Properties", "Realty Trust"),
}
_SUB_SUFFIX: dict[str, tuple[str, ...]] = {
    "Oil & Gas Exploration & Production": ("Petroleum", "Oil & Gas"),
    "Oil & Gas Equipment & Services": ("Oilfield Services", "Drilling"),
    "Oil & Gas Storage & Transportation": ("Midstream", "Pipeline"),
    "Steel": ("Steel",),
    "Copper": ("Copper",),
    "Gold": ("Gold", "Mining"),
    "Building Products": ("Building Products",),
    "Aerospace & Defense": ("Aerospace", "Defense Systems"),
    "Rail Transportation": ("Railroad",),
    "Air Freight & Logistics": ("Logistics",),
    "Cargo Ground Transportation": ("Freight",),
    "Passenger Airlines": ("Airlines", "Air"),
    "Homebuilding": ("Homes", "Builders"),
    "Restaurants": ("Restaurants", "Grill"),
    "Packaged Foods & Meats": ("Foods",),
    "Biotechnology": ("Therapeutics", "Biosciences"),
    "Pharmaceuticals": ("Pharmaceuticals", "Pharma"),
    "Health Care Equipment": ("Medical", "Surgical"),
    "Managed Health Care": ("Health Plans",),
    "Regional Banks": ("Bancorp", "Bancshares"),
    "Diversified Banks": ("Bank", "Banking Corporation"),
    "Property & Casualty Insurance": ("Insurance",),
    "Life & Health Insurance": ("Life", "Assurance"),
    "Semiconductors": ("Semiconductor", "Microsystems"),
    "Application Software": ("Software", "Cloud"),
    "Systems Software": ("Software", "Security"),
    "Electric Utilities": ("Electric", "Power & Light"),
    "Gas Utilities": ("Gas",),
    "Water Utilities": ("Water",),
    "Integrated Telecommunication Services": ("Telecom",),
}
_SYLLABLES = (
    "ba", "be", "da", "de", "di", "fa", "ga", "ka", "ke", "ko", "la", "le", "li", "lo", "lu",
    "ma", "me", "mi", "mo", "na", "ne", "no", "pa", "pe", "po", "ra", "re", "ri", "ro", "sa",
    "se", "si", "so", "ta", "te", "ti", "to", "va", "ve", "vi", "vo", "za", "ze", "zo",
    "bra", "cre", "dra", "fla", "gre", "pra", "tre", "qua", "sta", "cor", "mar", "ven", "tal",
)  # fmt: skip
_ENDINGS = (
    "n", "x", "r", "s", "l", "nt", "ra", "ro", "on", "ex", "ia", "is", "ar", "en", "or", "um",
    "a", "", "ta", "na", "co", "va", "ix", "ine",
)  # fmt: skip


def t_shocks(rng: np.random.Generator, size: tuple[int, ...] | int, clip: float) -> np.ndarray:
    """Student-t(df 4) draws clipped at +-clip (in standard deviations) to bound the extremes,
    then rescaled so that the clipped distribution has unit variance again."""
    z = np.clip(rng.standard_t(_DF, size=size) * _T_SCALE, -clip, clip)
    return z / _clipped_t_std(clip)


@lru_cache(maxsize=8)
def _clipped_t_std(clip: float) -> float:
    """Std of a unit-variance t(df) variable clipped at +-clip (numerical integral of its density)."""
    t = np.linspace(0.0, clip / _T_SCALE, 20_001)  # raw t scale
    dens = (1.0 + t * t / _DF) ** (-(_DF + 1.0) / 2.0)
    norm = 2.0 * np.trapezoid(dens, t) + 2.0 * _tail_mass(clip / _T_SCALE)
    inner = 2.0 * np.trapezoid(t * t * dens, t) / norm
    outer = 2.0 * _tail_mass(clip / _T_SCALE) / norm * (clip / _T_SCALE) ** 2
    return float(np.sqrt((inner + outer) * _T_SCALE**2))


def _tail_mass(a: float) -> float:
    """Unnormalised integral of the t(df) kernel (1 + t^2/df)^(-(df+1)/2) from a to infinity."""
    u = np.linspace(0.0, 1.0, 20_001)[1:]  # substitute t = a / u
    t = a / u
    return float(np.trapezoid((1.0 + t * t / _DF) ** (-(_DF + 1.0) / 2.0) * a / (u * u), u))


def market_factor(rng: np.random.Generator, n_t: int) -> tuple[np.ndarray, np.ndarray]:
    """GARCH(1,1) market factor with t(4) shocks; also the vol regime (sigma_t / long-run)."""
    z = t_shocks(rng, n_t, clip=8.0)
    var_bar = _MKT_VOL**2
    omega = var_bar * (1.0 - _GARCH_A - _GARCH_B)
    cap = (5.0 * _MKT_VOL) ** 2  # daily vol at most ~5.4%: worst possible day about -40%
    sigma = np.empty(n_t)
    var = var_bar
    for t in range(n_t):  # the only per-day loop: GARCH is recursive
        sigma[t] = np.sqrt(var)
        shock = sigma[t] * z[t]
        var = min(omega + _GARCH_A * shock * shock + _GARCH_B * var, cap)
    return _MKT_DRIFT + sigma * z, sigma / _MKT_VOL


def etf_table(mappings: Mappings) -> pd.DataFrame:
    """SPY, the 11 SPDR sector ETFs, the subsector ETFs of the mapping; registry names/classes."""
    registry = etf_registry().set_index("symbol")
    sectors = sector_table()
    subs = list(dict.fromkeys(mappings.subsector_etf.values()))
    rows = [(MARKET_ETF, "market", "")]
    rows += [
        (etf, "sector", sec)
        for sec, etf in zip(sectors["gics_sector"], sectors["etf"], strict=True)
    ]
    rows += [(etf, "subsector", "") for etf in subs]
    # a subsector ETF outside the registry takes the sector of the sub-industries it stands for
    sector_of_sub = {sub: sec for sec, sub, _ in _UNIVERSE}
    sector_of_sub.update({str(v["sub"]): str(v["sector"]) for v in _MAG7_INFO.values()})
    sub_sector: dict[str, str] = {}
    for sub, etf in mappings.subsector_etf.items():
        sub_sector.setdefault(etf, sector_of_sub.get(sub, ""))
    out = []
    for symbol, role, sector in rows:
        reg = registry.loc[symbol] if symbol in registry.index else None
        sec = (reg["gics_sector"] if reg is not None else "") or sector or sub_sector.get(symbol)
        if role != "market" and sec not in _SECTOR_PARAMS:
            raise ValueError(f"demo: no GICS sector known for ETF {symbol}")
        out.append(
            {
                "symbol": symbol,
                "role": role,
                "name": reg["name"] if reg is not None else symbol,
                "gics_sector": sec or None,
                "gics_sub_industry": (reg["gics_sub_industry"] if reg is not None else "") or None,
            }
        )
    table = pd.DataFrame(out)
    table["volume"] = np.where(
        table["role"] == "market", 8.0e7, np.where(table["role"] == "sector", 1.0e7, 3.0e6)
    )
    return table


def etf_returns(
    rng: np.random.Generator, etfs: pd.DataFrame, market: np.ndarray, regime: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Daily simple returns of every ETF (rows of `etfs`) and each ETF's loading on the market.

    SPY = m + noise; sector s = gamma_s m + f_s + noise; subsector u = delta_m m + delta_s f_s +
    f_u + noise. Factor shocks scale with sqrt(regime) so sector moves cluster with the market's.
    """
    n_t = len(market)
    sectors = list(_SECTOR_PARAMS)
    reg_scale = np.sqrt(regime)[None, :]
    sec_vol = np.array([_SECTOR_PARAMS[s][1] for s in sectors])
    f_sec = sec_vol[:, None] * reg_scale * t_shocks(rng, (len(sectors), n_t), clip=8.0)
    sec_row = {s: k for k, s in enumerate(sectors)}
    is_sub = (etfs["role"] == "subsector").to_numpy()
    n_sub = int(is_sub.sum())
    delta_m = rng.uniform(0.10, 0.50, n_sub)
    delta_s = rng.uniform(0.60, 1.10, n_sub)
    sub_vol = rng.uniform(0.006, 0.014, n_sub)
    f_sub = sub_vol[:, None] * reg_scale * t_shocks(rng, (n_sub, n_t), clip=8.0)
    noise = _TRACKING * rng.standard_normal((len(etfs), n_t))

    out = np.empty((len(etfs), n_t))
    beta = np.empty(len(etfs))
    k_sub = 0
    for row, rec in enumerate(etfs.itertuples(index=False)):
        if rec.role == "market":
            out[row] = market
            beta[row] = 1.0
        elif rec.role == "sector":
            gamma = _SECTOR_PARAMS[str(rec.gics_sector)][0]
            out[row] = gamma * market + f_sec[sec_row[str(rec.gics_sector)]]
            beta[row] = gamma
        else:
            k = sec_row[str(rec.gics_sector)]
            gamma = _SECTOR_PARAMS[str(rec.gics_sector)][0]
            out[row] = delta_m[k_sub] * market + delta_s[k_sub] * f_sec[k] + f_sub[k_sub]
            beta[row] = delta_m[k_sub] + delta_s[k_sub] * gamma
            k_sub += 1
    return out + noise, beta


def etf_start_prices(rng: np.random.Generator, etfs: pd.DataFrame) -> np.ndarray:
    """Plausible first-session prices: SPY and the sector SPDRs near their 2014 levels."""
    draws = rng.uniform(20.0, 120.0, len(etfs))
    fixed = {MARKET_ETF: 183.0, **_SECTOR_START_PRICE}
    return np.array(
        [fixed.get(s, d) for s, d in zip(etfs["symbol"], draws, strict=True)], dtype=float
    )


def stock_table(rng: np.random.Generator, mappings: Mappings, reserved: set[str]) -> pd.DataFrame:
    """Mag7 (real) then the synthetic universe: names, unique tickers, classification, ETFs."""
    taken = set(reserved) | set(etf_registry()["symbol"]) | set(MAG7)
    names_taken = {str(v["name"]) for v in _MAG7_INFO.values()}
    rows = [
        {"symbol": s, "name": v["name"], "gics_sector": v["sector"], "gics_sub_industry": v["sub"]}
        for s, v in _MAG7_INFO.items()
    ]
    for sector, sub, count in _UNIVERSE:
        suffixes = _SUB_SUFFIX.get(sub, _SECTOR_SUFFIX[sector])
        for _ in range(count):
            stem = _stem(rng)
            name = f"{stem} {suffixes[int(rng.integers(len(suffixes)))]}"
            while name in names_taken:
                stem = _stem(rng)
                name = f"{stem} {suffixes[0]}"
            names_taken.add(name)
            ticker = _ticker(rng, stem, taken)
            taken.add(ticker)
            rows.append(
                {"symbol": ticker, "name": name, "gics_sector": sector, "gics_sub_industry": sub}
            )
    table = pd.DataFrame(rows)
    table["sector_etf"] = table["gics_sector"].map(mappings.sector_etf)
    table["subsector_etf"] = pd.Series(
        [mappings.subsector_etf.get(s) for s in table["gics_sub_industry"]], dtype=object
    )
    n = len(table)
    is_mag = table["symbol"].isin(list(MAG7)).to_numpy()
    mag = [_MAG7_INFO.get(s) for s in table["symbol"]]
    idio = rng.uniform(0.010, 0.030, n)
    turnover = rng.uniform(0.003, 0.012, n)
    mag_idio = np.array([m["idio"] if m else 0.0 for m in mag], dtype=float)
    mag_turnover = np.array([m["turnover"] if m else 0.0 for m in mag], dtype=float)
    table["idio_vol"] = np.where(is_mag, mag_idio, idio)
    table["turnover"] = np.where(is_mag, mag_turnover, turnover)
    table["is_mag7"] = is_mag
    return table


def _stem(rng: np.random.Generator) -> str:
    """A pronounceable made-up word: 1-2 consonant-vowel syllables and an ending ("Velorex")."""
    n_syl = int(rng.integers(1, 3))
    parts = [_SYLLABLES[int(k)] for k in rng.integers(len(_SYLLABLES), size=n_syl)]
    word = "".join(parts) + _ENDINGS[int(rng.integers(len(_ENDINGS)))]
    return word.capitalize() if len(word) >= 4 else (word + "ta").capitalize()


def _ticker(rng: np.random.Generator, stem: str, taken: set[str]) -> str:
    """3-4 letters from the name's stem (first letter + later consonants), else random letters."""
    letters = stem.upper()
    consonants = [c for c in letters[1:] if c not in "AEIOU"]
    for _ in range(6):
        length = int(rng.integers(3, 5))
        pool = consonants if len(consonants) >= length - 1 else list(letters[1:])
        if len(pool) >= length - 1:
            picks = np.sort(rng.choice(len(pool), size=length - 1, replace=False))
            cand = letters[0] + "".join(pool[k] for k in picks)
            if cand not in taken:
                return cand
    while True:
        cand = "".join(chr(65 + int(k)) for k in rng.integers(0, 26, int(rng.integers(3, 5))))
        if cand not in taken:
            return cand


def draw_betas(
    rng: np.random.Generator, stocks: pd.DataFrame, etfs: pd.DataFrame, etf_mkt_beta: np.ndarray
) -> np.ndarray:
    """(n, 3) hr_mkt, hr_sec, hr_sub in realistic ranges, with a total market beta near 0.6-1.8.

    hr_sub and hr_sec are drawn first; hr_mkt takes what a drawn total beta leaves, clipped to
    [0.3, 1.5], so the three ETFs do not stack into an implausible total exposure.
    """
    n = len(stocks)
    beta_of = dict(zip(etfs["symbol"], etf_mkt_beta, strict=True))
    has_sub = stocks["subsector_etf"].notna().to_numpy()
    hr_sub = rng.uniform(0.15, 1.0, n)
    hr_sec = np.where(has_sub, rng.uniform(-0.2, 0.8, n), rng.uniform(0.0, 1.2, n))
    total = rng.uniform(0.6, 1.8, n)
    b_sec = stocks["sector_etf"].map(beta_of).to_numpy(float)
    b_sub = np.array([beta_of.get(s, 0.0) if s else 0.0 for s in stocks["subsector_etf"]])
    hr_mkt = np.clip(total - hr_sec * b_sec - np.where(has_sub, hr_sub * b_sub, 0.0), 0.3, 1.5)
    out = np.column_stack([hr_mkt, hr_sec, np.where(has_sub, hr_sub, np.nan)])
    for i, sym in enumerate(stocks["symbol"]):
        if sym in _MAG7_INFO:
            out[i] = _MAG7_INFO[sym]["betas"]
    return out


def listing_windows(
    rng: np.random.Generator, stocks: pd.DataFrame, n_t: int
) -> tuple[np.ndarray, np.ndarray]:
    """First and last session index per stock: 10 late listings and 3 delistings (not mag7).

    Late listings come at least a sixth of the window (2 years on the default window) after the
    start and keep at least a quarter of it, so their betas are still estimable.
    """
    n = len(stocks)
    first = np.zeros(n, dtype=int)
    last = np.full(n, n_t - 1, dtype=int)
    candidates = np.flatnonzero(~stocks["is_mag7"].to_numpy())
    chosen = rng.choice(candidates, size=13, replace=False)
    late, gone = chosen[:10], chosen[10:]
    first[late] = rng.integers(n_t // 6, n_t - n_t // 4, len(late))
    last[gone] = rng.integers(n_t // 3, n_t - n_t // 12, len(gone))
    return first, last


def halt_sessions(
    rng: np.random.Generator, stocks: pd.DataFrame, first: np.ndarray, last: np.ndarray, n_t: int
) -> dict[int, np.ndarray]:
    """1-3 isolated missing sessions for 4 full-history non-mag7 stocks (trading halts)."""
    full = np.flatnonzero(~stocks["is_mag7"].to_numpy() & (first == 0) & (last == n_t - 1))
    chosen = rng.choice(full, size=4, replace=False)
    blocks = (n_t - 40) // 10
    halts: dict[int, np.ndarray] = {}
    for i in chosen:
        k = int(rng.integers(1, 4))
        picks = np.sort(rng.choice(blocks, size=k, replace=False))
        # one session inside each 10-session block, never at a block edge: never adjacent
        halts[int(i)] = 20 + picks * 10 + rng.integers(2, 8, k)
    return halts


def price_targets(
    rng: np.random.Generator, stocks: pd.DataFrame, years: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Adjusted close on the first row, raw (= adjusted) close on the last row, and shares.

    Shares are set from a drawn end market cap, log-uniform $6B..$500B, so caps span the large-cap
    range; the mag7 keep their real counts and end up the largest ($0.8T..$4T).
    """
    n = len(stocks)
    p1 = np.exp(rng.uniform(np.log(12.0), np.log(450.0), n))
    growth = rng.normal(0.06, 0.08, n) * years  # annual log growth 6% +- 8%
    p0 = np.clip(p1 * np.exp(-growth), 3.0, 600.0)
    for i, sym in enumerate(stocks["symbol"]):
        if sym in _MAG7_INFO:
            p0[i], p1[i] = _MAG7_INFO[sym]["p0"], _MAG7_INFO[sym]["p1"]
    cap = np.exp(rng.uniform(np.log(6e9), np.log(5e11), n))
    shares = np.round(cap / p1)
    for i, sym in enumerate(stocks["symbol"]):
        if sym in _MAG7_INFO:
            shares[i] = float(_MAG7_INFO[sym]["shares"])  # type: ignore[arg-type]
    return p0, p1, shares


def solve_alpha(x: np.ndarray, live: np.ndarray, log_growth: np.ndarray) -> np.ndarray:
    """Per-stock constant alpha with sum log(1 + alpha + x_t) = log_growth over its live days.

    The intercept is free in the regression, so choosing it to land plausible price levels costs
    nothing in beta recovery. Newton on a concave increasing function, clipped to +-50 bp a day.
    """
    n_live = np.maximum(live.sum(axis=1), 1)
    alpha: np.ndarray = (log_growth - np.where(live, np.log1p(x), 0.0).sum(axis=1)) / n_live
    alpha = np.clip(alpha, -0.005, 0.005)
    for _ in range(8):
        g = 1.0 + alpha[:, None] + x
        f = np.where(live, np.log(g), 0.0).sum(axis=1) - log_growth
        df = np.where(live, 1.0 / g, 0.0).sum(axis=1)
        alpha = np.clip(alpha - f / np.maximum(df, 1e-12), -0.005, 0.005)
    return alpha


def split_factors(symbols: np.ndarray, sessions: pd.DatetimeIndex) -> np.ndarray:
    """(n, T) raw / adjusted: the product of the ratios of the splits effective AFTER each date."""
    factor = np.ones((len(symbols), len(sessions)))
    row = {s: i for i, s in enumerate(symbols.tolist())}
    for sym, splits in _SPLITS.items():
        if sym not in row:
            continue
        for day, ratio in splits:
            k = int(sessions.searchsorted(pd.Timestamp(day)))  # first session on/after the day
            if 0 < k < len(sessions):
                factor[row[sym], :k] *= ratio
    return factor


def make_ohlcv(
    rng: np.random.Generator,
    adj: np.ndarray,
    close_raw: np.ndarray,
    ret: np.ndarray,
    first: np.ndarray,
    factor: np.ndarray,
    vol_base: np.ndarray,
) -> dict[str, np.ndarray]:
    """Raw ("as traded") open/high/low and volume consistent with the adjusted closes `adj` and
    the traded closes `close_raw` (returned as they are).

    open = previous close x exp(gap), the gap carrying part of the day's move; on a split day the
    previous close is taken split-adjusted, as an exchange does. High/low wrap open and close with
    an intraday excursion; open/high/low are rounded to 4 decimals outward (high up, low down),
    as the traded close is.
    Volume is lognormal around shares x turnover and higher on big-move days, in shares as traded.
    """
    n, n_t = adj.shape
    t_idx = np.arange(n_t)
    valid = t_idx[None, :] > first[:, None]
    day_vol = np.sqrt(np.where(valid, ret**2, 0.0).sum(axis=1) / np.maximum(valid.sum(axis=1), 1))
    day_vol = np.maximum(day_vol, 0.003)[:, None]
    gap = 0.35 * np.log1p(ret) + 0.25 * day_vol * rng.standard_normal((n, n_t))
    prev = np.concatenate([adj[:, :1], adj[:, :-1]], axis=1)
    open_adj = np.where(valid, prev, adj) * np.exp(gap)
    open_raw = np.round(open_adj * factor, 4)
    up = np.abs(rng.standard_normal((n, n_t))) * 0.5 * day_vol
    down = np.abs(rng.standard_normal((n, n_t))) * 0.5 * day_vol
    top = np.maximum(open_raw, close_raw)
    bottom = np.minimum(open_raw, close_raw)
    high = np.maximum(np.ceil(top * np.exp(up) * 1e4) / 1e4, top)
    low = np.minimum(np.floor(bottom * np.exp(-down) * 1e4) / 1e4, bottom)
    low = np.where(low > 0.0, low, bottom)
    surprise = np.minimum(np.abs(ret) / day_vol, 6.0)
    # centred so the mean volume is about vol_base: E|z| ~ 0.8, lognormal mean 0.35^2 / 2 ~ 0.06
    log_v = 0.35 * rng.standard_normal((n, n_t)) + 0.45 * surprise - 0.45 * 0.8 - 0.06
    volume = np.maximum(np.round(vol_base[:, None] * np.exp(log_v) / factor), 1.0)
    return {"open": open_raw, "high": high, "low": low, "close_raw": close_raw, "volume": volume}
