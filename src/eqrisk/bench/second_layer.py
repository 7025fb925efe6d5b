"""Candidates for the second factor layer, measured on the real data set: what the residuals of
the ETF layer, and of the ETF and style layers, still share, and how much of it each tradable
factor ETF or k statistical factors would explain (docs/decisions/second-layer.md).

    python -m eqrisk.bench.second_layer [--work DIR] [--json FILE]
    eqrisk bench second-layer

The data is ingested and the cascade run as `bench/accuracy.py` does (same work folder); the
served model (both layers, calibrated) gives the residuals after both layers, its style exposures,
F and D; the residuals after the ETF layer are the same run's L3 specific returns. Every estimate
of session t reads sessions before t only. From 2012 on (the cascade's and the descriptors' first
year left out):

(a) common variance: per window of 252 sessions (one a quarter), over the stocks with 90% of
    their residuals there, the top eigenvalues of the residual correlation matrix as shares of
    its trace (beside the largest a pure-noise matrix of that size would show, Marchenko-Pastur)
    and the variance of the equal-weight book of those residuals over the sum of their own
    variances / n^2 (1: independent, what a diagonal D assumes);
(b) each candidate ETF: its return made orthogonal to the hierarchy's ETF factors (and, after
    both layers, to the style factors too) by a regression over the 252 sessions before t, each
    stock's loading on that over the same window, and the out-of-sample R^2 of loading x return
    for single stocks and for random equal-weight books of 50 and 200 names; a placebo (the same
    series in a random order) gives what noise scores;
(c) k statistical factors: principal components of the residuals of the 252 sessions before each
    month, their factor returns the projection of each later session's cross-section; the same
    R^2, and the share of the cross-section's variance they take beside k / n (noise);
(d) the bias statistic b of 50 random equal-weight books each of 50 and 200 names hedged at L3
    (realised: the book's L3 residual; forecast: the served x_s' F_ss x_s + sum w^2 D), then with
    the candidate added as a factor independent of the others (its EWMA variance, half-life 42,
    of the orthogonal return, the books' loadings, each stock's D less its loading's part).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

CANDIDATES = (
    "MTUM", "USMV", "QUAL", "VLUE", "SIZE", "IWM", "IWD", "IWF",
    "TLT", "IEF", "HYG", "LQD", "GLD", "USO", "EEM",
)  # fmt: skip
WINDOW = 252
MIN_OBS = 126
STEP = 63  # sessions between the common-variance windows
REFIT = 21  # sessions between two principal-component fits
FIRST = "2012-01-01"
PCA_KS = (1, 3, 5)
BOOK_SIZES = (50, 200)
BOOKS = 50
HALFLIFE = 42.0
D_FLOOR = 0.2  # a stock's D after a candidate's part is taken out: at least this share of it


@dataclass(frozen=True)
class Residuals:
    """What the measures read, all (rows x sessions) over the whole calendar."""

    sessions: np.ndarray  # (T,) datetime64
    etf: np.ndarray  # (n, T) residuals after the ETF layer (stocks of the style layer)
    both: np.ndarray  # (n, T) after both layers
    hierarchy: np.ndarray  # (K, T) the ETF layer's factor returns
    styles: np.ndarray  # (S, T) the style layer's factor returns
    candidates: dict[str, np.ndarray]  # ticker -> (T,) its returns
    style_exposure: np.ndarray  # (S, n, T) exposures of session t (known at t - 1)
    style_cov: np.ndarray  # (T, S, S) F of the style block
    specific: np.ndarray  # (n, T) D

    @property
    def first(self) -> int:
        return int(np.searchsorted(self.sessions, np.datetime64(FIRST)))


def served_residuals(work: Path, shared: Path, say: Callable[[str], None]) -> Residuals:
    """The real data set's residuals and the served model (cached as `second-layer.npz`)."""
    cache = work / "second-layer.npz"
    if cache.exists():
        z = np.load(cache)
        names = [str(x) for x in z["candidate_names"]]
        return Residuals(
            z["sessions"], z["etf"], z["both"], z["hierarchy"], z["styles"],
            dict(zip(names, z["candidate_returns"], strict=True)),
            z["style_exposure"], z["style_cov"], z["specific"],
        )  # fmt: skip
    from eqrisk.bench.accuracy import ingested_home, prepare, variants
    from eqrisk.model.risk_model import hedge_exposures, risk_model, specific_returns

    prep = prepare(ingested_home("real", work, shared, say), "real", say)
    m, lay, symbols = prep.result.arrays(), prep.layout, prep.result.symbols
    say("real: the served model (both layers)")
    model = risk_model(
        m["return"], lay.factors, lay.fidx, lay.keys, symbols, m, variants()["served"],
        style_inputs=prep.inputs,
    )  # fmt: skip
    assert model.style is not None and model.exposures.style is not None
    own = np.array([lay.keys.index(s) if s in lay.keys else -1 for s in symbols.tolist()])
    first = specific_returns(m["return"], lay.factors, hedge_exposures(m, lay.fidx, own, 3))
    layer = model.style.used
    k0 = model.n_etf
    row = {str(s): i for i, s in enumerate(symbols.tolist())}
    names = [c for c in CANDIDATES if c in row]
    out = Residuals(
        sessions=np.asarray(prep.result.sessions, dtype="datetime64[D]"),
        etf=np.where(layer, first, np.nan),
        both=np.where(layer, model.style.residuals, np.nan),
        hierarchy=lay.factors,
        styles=model.style.returns,
        candidates={c: m["return"][row[c]] for c in names},
        style_exposure=model.exposures.style,
        style_cov=model.factor_cov.cov[:, k0:, k0:],
        specific=model.specific.var,
    )
    np.savez(
        cache, sessions=out.sessions, etf=out.etf, both=out.both, hierarchy=out.hierarchy,
        styles=out.styles, candidate_names=np.array(names),
        candidate_returns=np.array([out.candidates[c] for c in names]),
        style_exposure=out.style_exposure, style_cov=out.style_cov, specific=out.specific,
    )  # fmt: skip
    return out


# (a) common variance ---------------------------------------------------------------------------


def window_common(e: np.ndarray) -> dict[str, float]:
    """One window's figures (e: stocks x sessions, NaN = missing): top eigenvalue shares of the
    correlation matrix, the Marchenko-Pastur edge's share, how many eigenvalues exceed it, and
    the equal-weight book's variance over the sum of the stocks' own / n^2."""
    keep = np.isfinite(e).mean(axis=1) >= 0.9
    x = e[keep]
    n, t = x.shape
    mu = np.nanmean(x, axis=1, keepdims=True)
    sd = np.nanstd(x, axis=1, keepdims=True)
    z = np.nan_to_num((x - mu) / sd)
    lam = np.linalg.svd(z / np.sqrt(t), compute_uv=False) ** 2
    lam = np.sort(lam)[::-1]
    edge = (1.0 + np.sqrt(n / t)) ** 2
    book = np.nanmean(x, axis=0)
    return {
        "stocks": float(n),
        "top1": float(lam[0] / n),
        "top5": float(lam[:5].sum() / n),
        "noise_edge": float(edge / n),
        "above_edge": float(np.sum(lam > edge)),
        "book_ratio": float(np.var(book) / (np.sum(np.nanvar(x, axis=1)) / n**2)),
    }


def common_variance(e: np.ndarray, first: int) -> dict[str, float]:
    """Medians over windows of 252 sessions ending every `STEP` sessions from `first` + 252."""
    rows = [
        window_common(e[:, end - WINDOW : end])
        for end in range(first + WINDOW, e.shape[1] + 1, STEP)
    ]
    return {k: float(np.median([r[k] for r in rows])) for k in rows[0]} | {"windows": len(rows)}


# (b) candidate ETFs ------------------------------------------------------------------------------


def orthogonal(c: np.ndarray, x: np.ndarray, first: int) -> np.ndarray:
    """c_t (T,) less its regression on the rows of x (K x T) over the 252 sessions before the
    last refit (every 21 sessions from `first`) at or before t: the regressors with every value
    of that window and of t; NaN before 126 joint sessions."""
    out = np.full(c.shape, np.nan)
    for t0 in range(first, len(c), REFIT):
        lo = max(t0 - WINDOW, 0)
        y = c[lo:t0]
        have = np.isfinite(y)
        cols = np.isfinite(x[:, lo:t0][:, have]).all(axis=1)
        if have.sum() < MIN_OBS:
            continue
        coef = np.linalg.lstsq(x[cols][:, lo:t0][:, have].T, y[have], rcond=None)[0]
        days = slice(t0, min(t0 + REFIT, len(c)))
        out[days] = c[days] - coef @ x[cols, days]
    return out


def rolling_loadings(e: np.ndarray, f: np.ndarray) -> np.ndarray:
    """(n, T): each row's zero-mean slope on f over the 252 sessions before t, where both are
    there (NaN before 126 of them)."""
    both = np.isfinite(e) & np.isfinite(f)[None, :]
    ef = np.where(both, e * f[None, :], 0.0)
    ff = np.where(both, (f * f)[None, :], 0.0)
    sums = [
        np.concatenate([np.zeros((len(e), 1)), np.cumsum(a, axis=1)], axis=1)
        for a in (ef, ff, both.astype(float))
    ]
    t = np.arange(e.shape[1])
    lo = np.maximum(t - WINDOW, 0)
    s_ef, s_ff, s_n = (s[:, t] - s[:, lo] for s in sums)
    with np.errstate(invalid="ignore", divide="ignore"):
        beta = s_ef / s_ff
    out: np.ndarray = np.where(s_n >= MIN_OBS, beta, np.nan)
    return out


def books(rows: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
    """(BOOKS, size): the rows of random books of `size` of the rows where `rows` (n,) holds."""
    rng = np.random.default_rng(seed + size)
    pool = np.flatnonzero(rows)
    return np.array([np.sort(rng.choice(pool, size=size, replace=False)) for _ in range(BOOKS)])


def book_weights(members: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """(size, T): equal weights over a book's members (rows) with `ok` (n, T) that session."""
    w = ok[members].astype(float)
    count = w.sum(axis=0, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: np.ndarray = np.where(count > 0, w / count, 0.0)
    return out


def r2(actual: np.ndarray, fitted: np.ndarray) -> float:
    """Pooled out-of-sample R^2 over the cells where both are finite."""
    ok = np.isfinite(actual) & np.isfinite(fitted)
    return float(1.0 - np.sum((actual[ok] - fitted[ok]) ** 2) / np.sum(actual[ok] ** 2))


def explained(
    e: np.ndarray, fitted: np.ndarray, books_of: dict[int, np.ndarray], ok: np.ndarray, first: int
) -> dict[str, float]:
    """Out-of-sample R^2 of `fitted` (n, T) for e's cells and for the books' sums, from `first`."""
    e, fitted, ok = e[:, first:], fitted[:, first:], ok[:, first:]
    out = {"stocks": r2(e, np.where(np.isfinite(e), fitted, np.nan))}
    for size, members in books_of.items():
        real, fit = [], []
        for rows in members:
            w = book_weights(rows, ok)
            real.append(np.sum(w * np.nan_to_num(e[rows]), axis=0))
            fit.append(np.sum(w * np.nan_to_num(fitted[rows]), axis=0))
        out[f"books_{size}"] = r2(np.array(real), np.array(fit))
    return out


# (c) statistical factors ---------------------------------------------------------------------------


def pca_loadings(e: np.ndarray, first: int, k: int) -> np.ndarray:
    """(n, k, T): the top k principal components (unit vectors) of the residual covariance of the
    252 sessions before each refit (every 21 sessions from `first`), held until the next; a stock
    with less than 80% of the window has 0."""
    n, n_t = e.shape
    out = np.zeros((n, k, n_t))
    for t0 in range(first, n_t, REFIT):
        x = e[:, t0 - WINDOW : t0]
        keep = np.isfinite(x).mean(axis=1) >= 0.8
        u = np.linalg.svd(np.nan_to_num(x[keep]), full_matrices=False)[0][:, :k]
        out[keep, :, t0 : t0 + REFIT] = u[:, :, None]
    return out


def pca_returns(e: np.ndarray, u: np.ndarray) -> np.ndarray:
    """(k, T): each session's projection u_j' e_t over the stocks with a residual."""
    out: np.ndarray = np.einsum("nkt,nt->kt", u, np.nan_to_num(e))
    return out


# (d) hedged books' bias -----------------------------------------------------------------------------


def ewma_before(x: np.ndarray, halflife: float = HALFLIFE) -> np.ndarray:
    """(..., T): the EWMA mean of x^2 over sessions before t (pandas' weights, NaN skipped)."""
    frame = pd.DataFrame(np.atleast_2d(x).T ** 2)
    mean = frame.ewm(halflife=halflife, min_periods=MIN_OBS // 2).mean().shift(1)
    return mean.to_numpy().T.reshape(x.shape)


def hedged_bias(
    res: Residuals,
    members: np.ndarray,
    ok: np.ndarray,
    extra_var: np.ndarray | None = None,
    extra_load: np.ndarray | None = None,
) -> float:
    """Median over books (`members`, rows) of b = std(R / sigma) from `res.first`: R the book's
    ETF-layer residual, sigma^2 = x_s' F_ss x_s + sum w^2 D; with a candidate, + sum_j (w' l_j)^2
    v_j and each D less sum_j l_ij^2 v_j (at least `D_FLOOR` of it). extra_load (n, k, T),
    extra_var (k, T)."""
    f = res.first
    cov = np.nan_to_num(res.style_cov[f:])
    figures = []
    for rows in members:
        w = book_weights(rows, ok[:, f:])
        real = np.sum(w * np.nan_to_num(res.etf[rows, f:]), axis=0)
        x = np.einsum("nt,snt->st", w, np.nan_to_num(res.style_exposure[:, rows, f:]))
        var = np.einsum("st,tsu,ut->t", x, cov, x)
        d = np.nan_to_num(res.specific[rows, f:])
        if extra_var is not None and extra_load is not None:
            load = np.nan_to_num(extra_load[rows, :, f:])
            v = np.nan_to_num(extra_var[:, f:])
            d = np.maximum(d - np.einsum("nkt,kt->nt", load**2, v), D_FLOOR * d)
            var = var + np.einsum("kt,kt->t", np.einsum("nt,nkt->kt", w, load) ** 2, v)
        var = var + np.sum(w**2 * d, axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            z = real / np.sqrt(var)
        z[~np.isfinite(z) | (w.sum(axis=0) == 0)] = np.nan
        figures.append(float(np.nanstd(z, ddof=1)))
    return float(np.median(figures))


def etf_style_fit(res: Residuals, names: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """How well the style factors' returns explain each ETF's return net of the hierarchy (the
    style-neutral hedge's loadings): median R^2 of the fits over the 252 sessions before each
    month, and the out-of-sample R^2 of each fit over the month after it."""
    from eqrisk.model.style_hedge import style_loadings

    f = res.first
    out = {}
    for name in names:
        cperp = orthogonal(res.candidates[name], res.hierarchy, f - WINDOW)
        fits, num, den = [], 0.0, 0.0
        for t0 in range(f, len(cperp) - REFIT, REFIT):
            b, r2 = style_loadings(cperp[None, t0 - WINDOW : t0], res.styles[:, t0 - WINDOW : t0])
            if not np.isfinite(r2[0]):
                continue
            fits.append(float(r2[0]))
            y = cperp[t0 : t0 + REFIT]
            ok = np.isfinite(y)
            pred = b[0] @ np.nan_to_num(res.styles[:, t0 : t0 + REFIT])
            num += float(np.sum((y[ok] - pred[ok]) ** 2))
            den += float(np.sum(y[ok] ** 2))
        out[name] = {"in_sample": float(np.median(fits)), "out_of_sample": 1.0 - num / den}
    return out


# the run -------------------------------------------------------------------------------------------


def measure(res: Residuals, say: Callable[[str], None]) -> dict[str, Any]:
    """Every figure of the module's docstring."""
    f = res.first
    ok = np.isfinite(res.etf) & np.isfinite(res.specific)
    stocks = ok[:, f:].any(axis=1)
    members = {s: books(stocks, s) for s in BOOK_SIZES}
    out: dict[str, Any] = {"period": [str(res.sessions[f]), str(res.sessions[-1])]}
    say("(a) common variance")
    out["common"] = {"etf": common_variance(res.etf, f), "both": common_variance(res.both, f)}
    out["bias"] = {"served": {s: hedged_bias(res, members[s], ok) for s in BOOK_SIZES}}
    layers = {
        "etf": (res.etf, res.hierarchy),
        "both": (res.both, np.vstack([res.hierarchy, res.styles])),
    }
    out["etfs"] = {}
    rng = np.random.default_rng(1)
    for name, c in res.candidates.items():
        say(f"(b) {name}")
        row: dict[str, Any] = {}
        for layer, (e, x) in layers.items():
            cperp = orthogonal(c, x, f - WINDOW)
            beta = rolling_loadings(e, cperp)
            row[layer] = explained(e, beta * cperp[None, :], members, ok, f)
            if layer == "both":
                row["bias"] = {
                    s: hedged_bias(
                        res, members[s], ok, ewma_before(cperp)[None, :], beta[:, None, :]
                    )
                    for s in BOOK_SIZES
                }
                placebo = cperp.copy()
                have = np.isfinite(placebo)
                placebo[have] = rng.permutation(placebo[have])
                pb = rolling_loadings(e, placebo)
                row["placebo"] = explained(e, pb * placebo[None, :], members, ok, f)
        out["etfs"][name] = row
    out["pca"] = {}
    top = {layer: pca_loadings(e, f, max(PCA_KS)) for layer, (e, _) in layers.items()}
    for k in PCA_KS:
        say(f"(c) {k} statistical factors")
        row = {}
        for layer, (e, _) in layers.items():
            u = top[layer][:, :k]
            g = pca_returns(e, u)
            fitted = np.einsum("nkt,kt->nt", u, g)
            row[layer] = explained(e, fitted, members, ok, f)
            kept = np.abs(u).sum(axis=1) > 0
            cells = np.isfinite(e) & kept
            row[layer]["cross_section_share"] = float(
                np.sum(g[:, f:] ** 2) / np.sum(np.where(cells, e, 0.0)[:, f:] ** 2)
            )
            row[layer]["noise_share"] = float(k / np.median(kept[:, f:].sum(axis=0)))
            if layer == "both":
                row["bias"] = {
                    s: hedged_bias(res, members[s], ok, ewma_before(g), u) for s in BOOK_SIZES
                }
        out["pca"][k] = row
    return out


def report(out: dict[str, Any]) -> str:
    """The figures as the markdown tables of docs/decisions/second-layer.md."""
    lines = [
        f"Period {out['period'][0]} .. {out['period'][1]}.",
        "",
        "| residuals | stocks | top 1 | top 5 | noise edge | eigenvalues above it | book ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for layer, c in out["common"].items():
        lines.append(
            f"| {layer} | {c['stocks']:.0f} | {c['top1']:.4f} | {c['top5']:.4f} | {c['noise_edge']:.4f} | {c['above_edge']:.0f} | {c['book_ratio']:.2f} |"
        )
    served = out["bias"]["served"]
    lines += ["", f"Served b: 50 names {served[50]:.3f}, 200 names {served[200]:.3f}.", "",
              "| candidate | R² stocks, ETF layer | books 50 / 200, ETF layer | R² stocks, both | books 50 / 200, both | placebo both, stocks / 200 | b 50 / 200 with it |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, row in out["etfs"].items():
        e, b, p = row["etf"], row["both"], row["placebo"]
        lines.append(
            f"| {name} | {e['stocks']:.4f} | {e['books_50']:.3f} / {e['books_200']:.3f} | {b['stocks']:.4f} | "
            f"{b['books_50']:.3f} / {b['books_200']:.3f} | {p['stocks']:.4f} / {p['books_200']:.3f} | "
            f"{row['bias'][50]:.3f} / {row['bias'][200]:.3f} |"
        )
    for k, row in out["pca"].items():
        e, b = row["etf"], row["both"]
        lines.append(
            f"| PCA k = {k} | {e['stocks']:.4f} | {e['books_50']:.3f} / {e['books_200']:.3f} | {b['stocks']:.4f} | "
            f"{b['books_50']:.3f} / {b['books_200']:.3f} | share {b['cross_section_share']:.4f} vs noise {b['noise_share']:.4f} | "
            f"{row['bias'][50]:.3f} / {row['bias'][200]:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=Path("../shared/data"))
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "eqrisk-acc")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--etf-styles", action="store_true", help="only the style hedge ETFs' fit on the styles"
    )
    args = parser.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    res = served_residuals(args.work, args.shared, say)
    if args.etf_styles:
        from eqrisk.model.style_hedge import STYLE_ETFS

        for name, fit in etf_style_fit(res, STYLE_ETFS).items():
            print(
                f"{name}: R2 in sample {fit['in_sample']:.3f}, out of sample {fit['out_of_sample']:.3f}"
            )
        return 0
    out = measure(res, say)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    print(report(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
