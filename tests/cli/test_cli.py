"""The command line as a user runs it: real processes, stdout for results, stderr for progress."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path

import httpx
import pytest

from eqrisk.data.ingested import read_ingested
from helpers import eqrisk_cli, free_port


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return eqrisk_cli(home, *args, inherit=True)


def demo_run(home: Path) -> tuple[Path, dict, str]:
    """`eqrisk demo --no-serve --json` in `home`: the home, the printed summary, its stderr."""
    proc = run(home, "demo", "--no-serve", "--json")
    assert proc.returncode == 0, proc.stderr
    return home, json.loads(proc.stdout), proc.stderr


def demo_in(home: Path) -> tuple[Path, dict]:
    """`eqrisk demo --no-serve --json` in `home`: the home and the printed summary."""
    home, summary, _ = demo_run(home)
    return home, summary


@pytest.fixture(scope="module")
def demo_cli_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    return demo_run(tmp_path_factory.mktemp("cli-home"))


@pytest.fixture(scope="module")
def demo_cli_home(demo_cli_run: tuple[Path, dict, str]) -> tuple[Path, dict]:
    return demo_cli_run[0], demo_cli_run[1]


def test_demo_builds_a_snapshot_and_prints_one_json_document(demo_cli_home) -> None:
    home, summary = demo_cli_home
    assert summary["data_source"] == "demo-synthetic"
    assert summary["universe_size"] >= 180
    assert summary["method"]["window"] == 252
    listing = run(home, "snapshots", "--json")
    assert listing.returncode == 0
    doc = json.loads(listing.stdout)
    assert doc["current"] == summary["model_version"]
    assert [v["current"] for v in doc["versions"]] == [True]


def test_demo_away_from_a_terminal_says_each_stage_on_its_own_line(demo_cli_run) -> None:
    """Issue 39: with stderr a pipe (a log, a container) the demo's build is not silent for
    minutes: a line per stage, in order, then the closing line; stdout stays the one JSON."""
    _home, _summary, stderr = demo_cli_run
    lines = stderr.splitlines()
    stages = [line for line in lines if line.startswith("demo: ")]
    wanted = ["generating the demo market", "validating", "reading ingested", "estimating"]
    at = [next(k for k, line in enumerate(stages) if line.startswith(f"demo: {w}")) for w in wanted]
    assert at == sorted(at), stages
    assert all(re.search(r" \(\d+\.\ds\)$", line) for line in stages), stages
    assert len(stages) < 60, stages  # counters ("block 3/40") do not flood the log
    assert re.fullmatch(r"done demo in \d+\.\ds", lines[-1]), lines[-1]


def test_the_serve_banner_prints_the_install_hint_whole(demo_cli_home) -> None:
    """Issue 39: without the MCP SDK the banner says `pip install 'eqrisk[mcp]'`, the extra's
    brackets included (rich markup used to swallow `[mcp]`)."""
    home, _ = demo_cli_home
    hide_mcp = (
        "import eqrisk.cli.mcp as m; m.mcp_available = lambda: False; "
        "from eqrisk.cli import app; app(prog_name='eqrisk')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", hide_mcp, "serve", "--port", str(free_port())],
        env={**os.environ, "EQRISK_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    banner: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the banner's last line is the metrics line
            banner.append(line.rstrip("\n"))
            if line.lstrip().startswith("metrics:"):
                break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    (mcp,) = [line for line in banner if line.lstrip().startswith("MCP:")]
    assert mcp.split("MCP:", 1)[1].strip() == "off (pip install 'eqrisk[mcp]')", banner


def test_build_adds_a_version_with_the_requested_method(demo_cli_home) -> None:
    home, first = demo_cli_home
    proc = run(home, "build", "--halflife", "90", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["method"]["weighting"] == "ewma" and summary["method"]["halflife"] == 90
    assert summary["model_version"] != first["model_version"]


def test_accounts_verify_says_the_credit_it_granted(tmp_path: Path) -> None:
    """Issue 39: the first verification says the starting credit and the balance; a second
    says that nothing was granted; --json carries the amount."""
    home = tmp_path / "h"
    made = run(home, "accounts", "create", "--name", "Ada", "--json")
    account = json.loads(made.stdout)["account_id"]
    first = run(home, "accounts", "verify", account)
    assert first.returncode == 0, first.stderr
    assert first.stdout == (
        f"account {account} verified; starting credit of 20.00 USD granted; balance 20.00 USD\n"
    )
    again = run(home, "accounts", "verify", account, "--json")
    doc = json.loads(again.stdout)
    assert doc["starting_credit_granted"] is False and doc["credit_granted_usd"] == 0.0
    (listed,) = json.loads(run(home, "accounts", "list", "--json").stdout)
    assert listed["balance_usd"] == 20.0 and doc["balance_tokens"] == listed["balance_tokens"]


def test_config_masks_secrets(tmp_path: Path) -> None:
    env_home = tmp_path / "h"
    proc = subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", "config", "--json"],
        env={**os.environ, "EQRISK_HOME": str(env_home), "EQRISK_REDIS_URL": "redis://:pw@x:1/0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(proc.stdout)
    assert doc["home"] == str(env_home)
    assert doc["redis_url"] == "**********"
    assert "pw" not in proc.stdout


def test_bad_input_is_refused_whole_unless_skip_bad_rows_keeps_the_good_rows(
    tmp_path: Path,
) -> None:
    prices = tmp_path / "prices.csv"
    prices.write_text(
        "date,symbol,close\n"
        "2024-07-01,AAA,10\n2024-07-02,AAA,10.5\n2024-07-03,AAA,abc\n"
        "2024-07-04,AAA,11\n2024-07-05,AAA,-3\n2024-07-08,AAA,11.2\n"
    )
    master = tmp_path / "master.csv"
    master.write_text(
        "symbol,name,asset_type,gics_sector,gics_sub_industry\nAAA,Aaa Inc,stock,Energy,Steel\n"
    )
    home = tmp_path / "home"
    proc = run(home, "ingest", str(prices), "--master", str(master), "--json")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "refused: 3 of 6 rows rejected" in " ".join(proc.stderr.split())
    assert not (home / "ingested").exists()  # all or nothing: nothing stored
    proc = run(home, "ingest", str(prices), "--master", str(master), "--json", "--skip-bad-rows")
    assert proc.returncode == 0, proc.stderr
    assert "took 3 good rows of 6" in " ".join(proc.stderr.split())
    report = json.loads(proc.stdout)
    assert report["rows_read"] == 6 and report["rows_kept"] == 3 and report["rows_rejected"] == 3
    codes = {i["code"]: i["count"] for i in report["issues"]}
    assert codes["NON_NUMERIC_PRICE"] == 1 and codes["NON_POSITIVE_PRICE"] == 1
    assert codes["NOT_A_SESSION"] == 1  # 2024-07-04 is a holiday
    assert (Path(report["report_dir"]) / "rejected.csv").read_text().count("\n") == 4
    kept, _, _ = read_ingested(home)
    assert sorted(kept["close"]) == [10.0, 10.5, 11.2]


def test_usage_errors_exit_2_and_say_what_is_wrong(tmp_path: Path) -> None:
    proc = run(tmp_path, "ingest", str(tmp_path / "missing.csv"))
    assert proc.returncode == 2
    assert "no such file" in proc.stderr
    proc = run(tmp_path, "serve", "--service", "both")
    assert proc.returncode == 2
    assert "all, daily" in proc.stderr


def test_build_without_data_says_how_to_get_some(tmp_path: Path) -> None:
    proc = run(tmp_path, "build")
    assert proc.returncode == 1
    assert "eqrisk ingest" in proc.stderr


def test_update_merges_and_builds_incrementally_and_build_full_rebuilds(
    demo_cli_home, tmp_path: Path
) -> None:
    """`eqrisk update FILE` = ingest --merge + build: the last day's rows again, one close
    revised, change no history, so the build reuses every full chunk; `build --full` says it
    was forced."""
    import pandas as pd

    home, _ = demo_cli_home
    assert run(home, "build", "--json").returncode == 0  # default settings as the baseline
    prices = pd.read_csv(home / "demo" / "demo_prices.csv.gz")
    day = prices[prices["date"] == prices["date"].max()].copy()
    day.loc[day.index[0], "close"] *= 1.001
    path = tmp_path / "day.csv"
    day.to_csv(path, index=False)
    proc = run(home, "update", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    build = json.loads(proc.stdout)["build"]
    assert build["mode"] == "incremental"
    assert build["reasons"][0].startswith("the last chunk recomputed from")
    full = run(home, "build", "--full", "--json")
    assert full.returncode == 0, full.stderr
    assert json.loads(full.stdout)["build"] == {"mode": "full", "reasons": ["--full"]}


# --------------------------------------------------------------------------- the first visit


@pytest.fixture(scope="module")
def visit_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A demo home that only the first-visit tests use (the others change theirs)."""
    return demo_in(tmp_path_factory.mktemp("visit-home"))


def test_demo_makes_one_evaluation_key_in_its_home_prints_it_and_keeps_it(
    visit_home: tuple[Path, dict],
) -> None:
    """`eqrisk demo` makes a verified account with the starting credit and a key in its own
    home (the key also in a 0600 file there); a second run prints the same key, on one line of
    stdout, and makes no second account."""
    from eqrisk.accounts.book import Accounts
    from eqrisk.accounts.db import make_engine
    from eqrisk.accounts.evaluation import EVALUATION_ACCOUNT_NAME

    home, summary = visit_home
    made = summary["evaluation_key"]
    accounts = Accounts(make_engine(home))
    record = accounts.authenticate(made["key"])
    assert record is not None and record.account_id == made["account_id"]
    assert record.account_state == "verified" and not record.is_demo
    assert made["balance_usd"] == 20.0 and record.rate_limit == "120/minute"
    key_file = home / "demo" / "evaluation-key"
    assert key_file.read_text() == made["key"] + "\n"
    assert key_file.stat().st_mode & 0o777 == 0o600

    again = run(home, "demo", "--no-serve")
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("snapshot v")
    assert lines[1].startswith(f"evaluation key: {made['key']} (account {made['account_id']}")
    assert "done demo" in again.stderr and made["key"] not in again.stderr
    names = [a["name"] for a in accounts.list_accounts() if a["name"] == EVALUATION_ACCOUNT_NAME]
    assert names == [EVALUATION_ACCOUNT_NAME]
    accounts.engine.dispose()


def test_demo_checks_the_port_before_it_builds(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run(home, "demo", "--host", "127.0.0.1", "--port", str(port))
    assert proc.returncode == 3, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "--port" in proc.stderr
    assert "done demo" not in proc.stderr
    assert not (home / "snapshots").exists() and not (home / "demo").exists()
    bad = run(home, "demo", "--port", "70000")
    assert bad.returncode == 2 and "--port" in bad.stderr and "65535" in bad.stderr


def _page_offers(base: str) -> str:
    """The evaluation key the page at `base` offers ('' for none)."""
    page = httpx.get(f"{base}/", timeout=10).text
    found = re.search(r'<meta name="eqrisk-evaluation-key" content="([^"]*)">', page)
    assert found is not None
    return found.group(1)


@contextmanager
def _serving(home: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`eqrisk ARGS --port P` in a child process until the block ends; its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "eqrisk.cli", *args, "--port", str(port)],
        env={**os.environ, "EQRISK_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{base}/api/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert proc.poll() is None, "the server stopped"
        yield base, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_demo_server_offers_its_key_and_serve_offers_none(
    visit_home: tuple[Path, dict],
) -> None:
    """The server `eqrisk demo` starts puts its evaluation key on the page (and the key opens
    a paid route); `eqrisk serve` on the same home offers none and makes no account or key."""
    from eqrisk.accounts.book import Accounts
    from eqrisk.accounts.db import make_engine

    home, _ = visit_home
    accounts = Accounts(make_engine(home))
    with _serving(home, "demo", "--host", "127.0.0.1") as (base, _proc):
        key = _page_offers(base)
        assert key == (home / "demo" / "evaluation-key").read_text().strip()
        paid = httpx.get(f"{base}/api/metrics/FLR", headers={"Authorization": f"Bearer {key}"})
        assert paid.status_code == 200 and float(paid.headers["x-api-cost-usd"]) > 0
    before = (accounts.list_accounts(), accounts.list_keys())
    with _serving(home, "serve") as (base, _proc):
        assert _page_offers(base) == ""
    assert (accounts.list_accounts(), accounts.list_keys()) == before
    accounts.engine.dispose()


# --------------------------------------------------------------------------- output


def _commands() -> list[list[str]]:
    """Every command path of the typer app (`[]` is `eqrisk` itself)."""
    import typer
    from typer.core import TyperGroup

    from eqrisk.cli import app

    paths: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        paths.append(path)
        if isinstance(command, TyperGroup):  # each command as the app loads it when asked
            for name in command.list_commands(None):
                walk(command.get_command(None, name), [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


# typer's placeholder for a value named by its Python type: `<str>`, `<list[Path]>`, `<int>`...
TYPE_PLACEHOLDER = re.compile(r"<(?:str|int|float|bool|path|file|datetime|uuid|list\[[^>]*\])>")

WIDTH = 78  # click's help width in an 80-column terminal (and away from one)


def _paragraphs(help_text: str) -> list[list[str]]:
    """The description's paragraphs: the indented lines between the usage line and the first
    section (Arguments, Options, Commands)."""
    lines = help_text.splitlines()
    body: list[str] = []
    for line in lines[1:]:
        if line.endswith(":") and not line.startswith(" "):
            break
        body.append(line)
    paragraphs: list[list[str]] = [[]]
    for line in body:
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


def test_every_help_reads_well_at_80_columns() -> None:
    """`eqrisk ... --help` for every command, without a terminal: lines of at most 80 columns,
    no `<bool>`, `<str>` or other type placeholder, paragraphs filled to the width (no line broken early, mid-sentence),
    and command lists whose one-line help is a whole sentence (never cut with '...')."""
    paths = _commands()
    assert len(paths) > 20 and ["demo"] in paths and ["keys", "create"] in paths
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "eqrisk.cli", *path, "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "80"},
        )
        for path in paths
    ]
    for path, proc in zip(paths, procs, strict=True):
        out, errors = proc.communicate(timeout=300)
        name = " ".join(["eqrisk", *path])
        assert proc.returncode == 0 and not errors, (name, errors)
        assert out.startswith(f"Usage: {name} "), out
        assert all(len(line) <= 80 for line in out.splitlines()), (name, out)
        assert "<bool>" not in out and "\x1b" not in out and "╭" not in out, (name, out)
        # Issue 39: values are named (`--since SINCE`, `--out PATH`), never by a Python type.
        assert not TYPE_PLACEHOLDER.search(out), (name, TYPE_PLACEHOLDER.findall(out))
        paragraphs = _paragraphs(out)
        assert paragraphs, (name, out)
        for lines in paragraphs:
            for line, following in pairwise(lines):
                first_word = following.split()[0]
                assert len("  " + line) + 1 + len(first_word) > WIDTH, (name, line, following)
        if "\nCommands:\n" in out:
            listed = out.split("\nCommands:\n", 1)[1].splitlines()
            assert listed and not any(line.rstrip().endswith("...") for line in listed), out


def test_results_go_to_stdout_whole_and_progress_to_stderr(
    demo_cli_home: tuple[Path, dict],
) -> None:
    """Without a terminal: `snapshots` lists every version name whole; a new key is one line
    of stdout, the key that works; `keys list` and `accounts list` show whole identifiers; a
    build's summary is on stdout and its progress on stderr."""
    from eqrisk.accounts.book import Accounts
    from eqrisk.accounts.db import make_engine

    home, _ = demo_cli_home
    listing = run(home, "snapshots")
    assert listing.returncode == 0 and "…" not in listing.stdout
    versions = json.loads(run(home, "snapshots", "--json").stdout)["versions"]
    for version in versions:
        assert version["model_version"] in listing.stdout

    account = json.loads(run(home, "accounts", "create", "--name", "A" * 60, "--json").stdout)
    account_id = account["account_id"]
    made = run(home, "keys", "create", "--account", account_id, "--label", "L" * 70)
    assert made.returncode == 0 and made.stderr == ""
    (line,) = made.stdout.splitlines()
    key = re.search(r"(eqk_\S+)", line)
    assert key is not None and line.endswith("(shown once)")
    accounts = Accounts(make_engine(home))
    record = accounts.authenticate(key.group(1))
    assert record is not None and record.account_id == account_id
    accounts.engine.dispose()
    keys = run(home, "keys", "list", "--account", account_id)
    assert record.key_id in keys.stdout and account_id in keys.stdout and "L" * 70 in keys.stdout
    assert "A" * 60 in run(home, "accounts", "list").stdout
    revoked = run(home, "keys", "revoke", record.key_id)
    assert revoked.stdout == f"key {record.key_id} revoked\n" and revoked.stderr == ""

    build = run(home, "build", "--force")  # the same data as the current version's
    assert build.returncode == 0, build.stderr
    assert build.stdout.startswith("snapshot v") and " build (" in build.stdout
    assert "done build in" in build.stderr and "snapshot v" not in build.stderr
