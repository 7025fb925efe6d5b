"""The README's examples, walked as a newcomer walks them: the curl examples of "Trying it"
run as written in bash (only the address changed to a real `eqrisk serve` of the demo snapshot),
with the evaluation key `eqrisk demo` makes, then the Python client example with that key
exported, then the "Portfolio risk" examples. Every answer is a 200 (no 429 on the way), and a value or two of each is checked
against another route or an identity."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.cli.demo import evaluation_key
from eqrisk.settings import Settings
from helpers import TEST_KEY, Server, bearer, client_for, register_key

README = Path(__file__).resolve().parents[1] / "README.md"
DOCUMENTED_BASE = "http://127.0.0.1:8000"


def readme_block(title: str, language: str) -> str:
    """The first ```language block of the README's `## title` section."""
    section = README.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return section.split(f"```{language}\n", 1)[1].split("```", 1)[0]


@pytest.fixture(scope="module")
def walk_home(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo snapshot, the evaluation key `eqrisk demo` makes (in its file) and, for the
    checks made beside the walk, a test key."""
    home = tmp_path_factory.mktemp("walk-home")
    shutil.copytree(demo_home / "snapshots", home / "snapshots")
    evaluation_key(Settings(home=home, _env_file=None))
    register_key(home, TEST_KEY)
    return home


@pytest.fixture(scope="module")
def walk_server(walk_home: Path) -> Iterator[Server]:
    with Server(walk_home) as server:
        yield server


def headers_of(raw: str) -> tuple[int, dict[str, str]]:
    """Status and headers of the last response in a `curl -D` dump."""
    head = raw.strip().split("\r\n\r\n")[-1].splitlines()
    status = int(head[0].split()[1])
    return status, {
        k.lower(): v.strip() for k, v in (h.split(":", 1) for h in head[1:] if ":" in h)
    }


def test_the_readme_curl_examples_answer_without_a_429(
    walk_home: Path, walk_server: Server, tmp_path: Path
) -> None:
    if shutil.which("curl") is None:
        pytest.skip("the README's examples need curl")
    block = readme_block("Trying it", "bash")
    assert f"export EQRISK_URL={DOCUMENTED_BASE}" in block
    curls = [line for line in block.splitlines() if line.startswith("curl ")]
    # `curl` as written, each answer's headers and body kept per call (a shell function, so
    # that the README's lines run unchanged); only the address is the test server's.
    wrapper = 'n=0; curl() { n=$((n+1)); command curl -sS -D "$OUT/h$n" -o "$OUT/b$n" "$@"; }\n'
    script = wrapper + block.replace(DOCUMENTED_BASE, walk_server.base)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EQRISK_")},
        "HOME": str(tmp_path),
        "EQRISK_HOME": str(walk_home),
        "OUT": str(tmp_path),
    }
    run = subprocess.run(["bash", "-eu", "-c", script], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr

    answer: dict[str, tuple[dict[str, str], str]] = {}
    for n, line in enumerate(curls, 1):
        status, headers = headers_of((tmp_path / f"h{n}").read_text())
        body = (tmp_path / f"b{n}").read_text()
        assert status == 200, (line, body)  # no 429 for the whole sequence
        answer[line] = headers, body
    versions = {headers["x-model-version"] for headers, _ in answer.values()}
    assert len(versions) == 1

    def of(*needles: str) -> tuple[dict[str, str], str]:
        """The answer of the one example whose line holds every needle."""
        (found,) = [a for line, a in answer.items() if all(n in line for n in needles)]
        return found

    nvda_headers, nvda_body = of("$EQRISK_API_KEY", "/api/metrics/NVDA")
    nvda = json.loads(nvda_body)
    assert nvda["ticker"] == "NVDA" and nvda["_metadata"]["model_version"] in versions
    as_of = nvda["_metadata"]["data_as_of"]
    l3 = nvda["hedge_levels"]["L3"]
    assert l3["market_hr"] == nvda["metrics"]["l3_mkt_hr"]
    shares = [l3[k] for k in ("market_er", "sector_er", "subsector_er", "residual_er")]
    assert math.isclose(sum(shares), 1.0, abs_tol=1e-12)
    # The evaluation key: 120 requests a minute, charged at the README's prices.
    assert nvda_headers["x-ratelimit-limit"] == "120"
    assert nvda_headers["x-api-cost-usd"] == "0.00500"

    csv = of("ticker-returns?ticker=AAPL&years=3&format=csv")[1]
    returns = pd.read_csv(StringIO(csv), parse_dates=["date"])
    assert returns["date"].iloc[-1] == pd.Timestamp(as_of)
    assert 3 * 245 <= len(returns) <= 3 * 253  # three years of sessions
    gross = returns["price_close"].pct_change().iloc[1:]
    assert np.allclose(gross, returns["returns_gross"].iloc[1:], rtol=1e-9, atol=1e-12)

    batch_headers, batch_body = of("/api/batch/analyze")
    batch = json.loads(batch_body)
    assert batch["summary"] == {"total": 2, "succeeded": 2, "failed": 0}
    assert batch_headers["x-api-cost-usd"] == "0.01000"  # the batch's minimum
    nvda_batch = batch["results"]["NVDA"]["full_metrics"]
    assert nvda_batch["l3_mkt_hr"] == nvda["metrics"]["l3_mkt_hr"]
    aapl_batch = batch["results"]["AAPL"]["full_metrics"]
    assert returns["l3_mkt_hr"].iloc[-1] == aapl_batch["l3_mkt_hr"]
    assert returns["l1_mkt_hr"].iloc[-1] == aapl_batch["l1_mkt_hr"]

    betas = pd.DataFrame(json.loads(of("/betas?symbols=MSFT&fact=Mkt")[1]))
    assert set(betas["symbol"]) == {"MSFT"} and set(betas["fact"]) == {"Mkt"}
    assert betas["teo"].min() == "2026-01-02" and betas["teo"].max() == as_of
    with client_for(walk_home) as inproc:
        msft = inproc.get("/api/metrics/MSFT", headers=bearer(TEST_KEY)).json()
    assert betas["factor_beta"].iloc[-1] == pytest.approx(msft["metrics"]["l1_mkt_hr"], rel=1e-12)

    demo_headers, demo_body = of("Bearer eqrisk-demo", "/api/metrics/AAPL")
    aapl = json.loads(demo_body)
    assert demo_headers["x-ratelimit-limit"] == "5"
    assert aapl["metrics"]["l3_mkt_hr"] == aapl_batch["l3_mkt_hr"]

    # The evaluation account paid what the answers said (the demo key pays nothing).
    charged = sum(
        float(headers["x-api-cost-usd"])
        for line, (headers, _) in answer.items()
        if "$EQRISK_API_KEY" in line
    )
    assert charged == pytest.approx(0.02) or len(curls) > 5
    key = (walk_home / "demo" / "evaluation-key").read_text().strip()
    with client_for(walk_home) as inproc:
        balance = inproc.get("/api/balance", headers=bearer(key)).json()
    assert balance["balance_usd"] == pytest.approx(20 - charged)


def test_the_readme_client_example_runs_with_the_evaluation_key(
    walk_home: Path, walk_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python example after the curl examples, with the evaluation key exported as the
    README says: every call answered, none refused by the rate limit."""
    code = readme_block("Python client", "python")
    key = (walk_home / "demo" / "evaluation-key").read_text().strip()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EQRISK_URL", walk_server.base)
    monkeypatch.setenv("EQRISK_API_KEY", key)
    scope: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), scope)
    client = scope["c"]
    assert client.api_key == key  # type: ignore[attr-defined]
    last = client.last_call  # type: ignore[attr-defined]
    assert last.status == 200 and last.rate_limit_remaining > 0
    hr, book = scope["hr"], scope["book"]
    assert list(hr.index) == ["NVDA", "AAPL", "MSFT"]  # type: ignore[attr-defined]
    hedge = book.hedge("L3")  # type: ignore[attr-defined]
    l3 = book.notionals[book.notionals["level"] == "L3"].set_index("etf")["notional"]  # type: ignore[attr-defined]
    assert np.allclose(hedge.sort_index(), l3.sort_index())
    assert (tmp_path / "nvda-hedge-ratios.html").stat().st_size > 0


@pytest.mark.parametrize("which", ["evaluation", "demo"])
def test_the_readme_portfolio_risk_examples_run_with_either_key(
    walk_home: Path,
    walk_server: Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    which: str,
) -> None:
    """The "Portfolio risk" section's curl line in bash and its Python block, as written, with
    the evaluation key or the demo key exported: answered (no 403: the demo key may name the
    ETFs its seven imply), no position dropped, and each answer's contributions add up to its
    volatility (Euler), the covariance symmetric with positive variances."""
    if shutil.which("curl") is None:
        pytest.skip("the README's examples need curl")
    key = (
        (walk_home / "demo" / "evaluation-key").read_text().strip()
        if which == "evaluation"
        else "eqrisk-demo"
    )
    block = readme_block("Portfolio risk", "bash")
    assert block.startswith("curl ") and "/api/portfolio/risk" in block
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EQRISK_")},
        "HOME": str(tmp_path),
        "EQRISK_URL": walk_server.base,
        "EQRISK_API_KEY": key,
    }
    run = subprocess.run(
        ["bash", "-eu", "-c", block.replace("curl ", "curl -sS --fail-with-body ", 1)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    answer = json.loads(run.stdout)
    book = answer["portfolio"]
    assert answer["unused"] == [] and answer["used_share"] == 1.0
    assert book["vol_daily"] > 0 and answer["tracking_error"]["vol_daily"] > 0
    assert math.isclose(sum(book["by_level"].values()), book["vol_daily"], rel_tol=1e-12)

    code = readme_block("Portfolio risk", "python")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EQRISK_URL", walk_server.base)
    monkeypatch.setenv("EQRISK_API_KEY", key)
    scope: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), scope)
    risk, cov = scope["risk"], scope["F"]
    total = risk.by_level["portfolio"].sum()  # type: ignore[attr-defined]
    assert total == pytest.approx(risk.vol, rel=1e-12)  # type: ignore[attr-defined]
    assert risk.positions["contribution"].sum() == pytest.approx(risk.vol, rel=1e-12)  # type: ignore[attr-defined]
    assert risk.tracking_error is not None and risk.tracking_error > 0  # type: ignore[attr-defined]
    assert 0 <= risk.vol_after_hedge < risk.vol  # type: ignore[attr-defined]
    assert risk.used_share == 1.0 and not risk.partial  # type: ignore[attr-defined]
    matrix = np.asarray(cov, dtype=float)
    assert matrix.shape[0] == matrix.shape[1] > 1
    # exactly symmetric; a style factor with no forecast that session is not listed (no nulls)
    known = ~np.isnan(np.diag(matrix))
    assert np.array_equal(matrix, matrix.T, equal_nan=True) and known.sum() > 1
    assert (np.diag(matrix)[known] > 0).all() and not np.isnan(matrix[np.ix_(known, known)]).any()
    styles = [k for k, lv in cov.attrs["levels"].items() if lv == "style"]  # type: ignore[attr-defined]
    assert styles and np.isfinite(np.asarray(cov.loc[styles, styles], dtype=float)).all()  # type: ignore[attr-defined]
