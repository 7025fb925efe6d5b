"""The risk model's second layer and its next-session forecast in a snapshot (`risk_arrays`
writes them beside F and D; docs/decisions/risk-forecast.md).

Per time chunk c, under `<version>/risk/`, when the served model has the second layer:

- `sexp-<c>.npy` (sessions, n, S): each stock's style exposures of each session (those the
  forecast of the session uses: the descriptors of the close before, 0 outside the layer);
- `sret-<c>.npy` and `stat-<c>.npy` (sessions, S): the style factor returns of each session's
  cross-sectional regression and their t-statistics (NaN: not estimated);
- `sfit-<c>.npy` (sessions, 2): the regression's R^2 and its number of stocks;
- `regime-<c>.npy` (sessions, 2): the regime multipliers of F and D (with the adjustment).

And once per version, the forecast for the session after the last close (data through it):
`next-cov.npy` (K, K), `next-fields.npy` (n, 4: total, factor and specific volatility, D),
`next-sexp.npy` (n, S) and `next-regime.npy` (2,).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from eqrisk.model.risk_model import RiskModel, RiskParams, StyleInputs
from eqrisk.model.styles import STYLE_TEXT

RISK_DIR = "risk"
LAYER_PREFIXES = ("sexp", "sret", "stat", "sfit", "regime")
NEXT_PREFIXES = ("next-cov", "next-fields", "next-sexp", "next-regime")
NEXT_FIELDS = ("risk_total_vol", "risk_factor_vol", "risk_specific_vol", "risk_specific_var")
INTERCEPT_TEXT = "cross-sectional mean of the L3 residuals (the regression's intercept)"


def layer_prefixes(params: RiskParams) -> tuple[str, ...]:
    """The per-chunk files of the layer a model with these settings writes."""
    out = LAYER_PREFIXES[:4] if params.styles is not None else ()
    return (*out, "regime") if params.regime is not None else out


def layer_block(params: RiskParams, k_etf: int) -> dict[str, Any]:
    """The manifest's words on the second layer: its factors (the rows of F from `first` on)
    with what each is, and whether F and D carry the regime adjustment."""
    styles = None
    if params.styles is not None:
        names = params.styles.factor_names
        styles = {
            "first": k_etf,
            "names": names,
            "text": {n: STYLE_TEXT.get(n, INTERCEPT_TEXT) for n in names},
        }
    return {"styles": styles, "regime": params.regime is not None}


def stocks_of(folder: Path, n: int, fidx: np.ndarray, keys: list[str]) -> np.ndarray:
    """(n,) bool: the rows in the second layer's universe: stocks (the symbols table's
    asset_type) with a sector factor, that are not a factor themselves."""
    import pyarrow.parquet as pq

    frame = pq.read_table(
        folder / "symbols.parquet", columns=["ticker", "row", "asset_type"]
    ).to_pandas()
    out = np.zeros(n, dtype=bool)
    own = set(keys)
    for ticker, row, kind in zip(frame["ticker"], frame["row"], frame["asset_type"], strict=True):
        out[int(row)] = kind == "stock" and str(ticker) not in own
    out &= fidx[:, 1] >= 0
    return out


def style_inputs_of(cols: Mapping[str, np.ndarray], stocks: np.ndarray) -> StyleInputs:
    """The second layer's inputs from the stored fields' columns: the caps of the stocks, and
    the turnover volume / shares = volume x raw close / cap (None without volume)."""
    cap = np.where(stocks[:, None], cols["market_cap"], np.nan)
    turnover = None
    if "volume" in cols and "close_raw" in cols:
        with np.errstate(invalid="ignore", divide="ignore"):
            u = cols["volume"] * cols["close_raw"]
            u /= cap  # in place: the same (volume x close) / cap
            np.copyto(u, np.nan, where=~(np.isfinite(u) & (u > 0)))
        turnover = u if bool(np.isfinite(u).any()) else None
    return StyleInputs(cap=cap, turnover=turnover, stocks=stocks)


def save_layer(model: RiskModel) -> dict[str, np.ndarray]:
    """The per-chunk arrays of the layer of a chunk's run (see the module docstring)."""
    out: dict[str, np.ndarray] = {}
    if model.exposures.style is not None and model.style is not None:
        out["sexp"] = np.transpose(model.exposures.style, (2, 1, 0))
        out["sret"] = model.style.returns.T
        out["stat"] = model.style.tstat.T
        out["sfit"] = np.column_stack([model.style.r2, model.style.stocks.astype(np.float64)])
    if model.regime is not None:
        out["regime"] = np.column_stack([model.regime.factor, model.regime.specific])
    return out


def next_day_parts(model: RiskModel, k: int) -> dict[str, np.ndarray]:
    """The forecast of session `k` of a run (its last, padded with no data): F, the stored
    fields, the style exposures and the regime multipliers."""
    rel = k - model.start
    predicted = model.predicted
    out = {
        "next-cov": model.factor_cov.cov[rel],
        "next-fields": np.column_stack(
            [predicted[name][:, rel] for name in NEXT_FIELDS[:3]] + [model.specific.var[:, rel]]
        ),
    }
    if model.exposures.style is not None:
        out["next-sexp"] = model.exposures.style[:, :, rel].T
    if model.regime is not None:
        out["next-regime"] = np.array([model.regime.factor[rel], model.regime.specific[rel]])
    return out


def _grid_chunk(manifest: Mapping[str, Any]) -> int:
    return int(manifest["arrays"]["grid"]["chunk"])


def sessions_of(manifest: Mapping[str, Any]) -> int:
    return int(manifest["arrays"]["grid"]["sessions"])


def is_next(manifest: Mapping[str, Any], t: int) -> bool:
    """Whether session t is the next one (after the last close) of a version that holds it."""
    return t == sessions_of(manifest) and manifest["risk"].get("next") is not None


def read_next(folder: Path, prefix: str) -> np.ndarray:
    return np.array(np.load(folder / RISK_DIR / f"{prefix}.npy", mmap_mode="r"))


def read_style(folder: Path, manifest: Mapping[str, Any], t: int) -> np.ndarray | None:
    """(n, S) style exposures of session t (None: a version without the second layer)."""
    if not manifest["risk"].get("styles"):
        return None
    if is_next(manifest, t):
        return read_next(folder, "next-sexp")
    c, k = divmod(t, _grid_chunk(manifest))
    return np.array(np.load(folder / RISK_DIR / f"sexp-{c:05d}.npy", mmap_mode="r")[k])


def read_chunked(folder: Path, manifest: Mapping[str, Any], prefix: str, t: int) -> np.ndarray:
    """Row t of a per-session layer file (`sret`, `stat`, `sfit`, `regime`)."""
    c, k = divmod(t, _grid_chunk(manifest))
    return np.array(np.load(folder / RISK_DIR / f"{prefix}-{c:05d}.npy", mmap_mode="r")[k])
