"""Issue 34: the README's "Model quality" table is written from a build's accuracy record by
`eqrisk model-quality`, never typed. On the demo build the command prints the table of the
current version's record and writes it between the markers of a README; the repository's
README and docs/decisions/risk-forecast.md hold a generated table from the real data set."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from eqrisk.snapshot.quality_table import BEGIN, END, full_tables, marked, summary_table
from eqrisk.snapshot.versions import current_version, snapshots_dir
from helpers import eqrisk_cli

ROOT = Path(__file__).resolve().parents[2]


def _run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return eqrisk_cli(home, "model-quality", *args)


def test_the_command_prints_and_writes_the_current_versions_table(
    demo_home: Path, tmp_path: Path
) -> None:
    version = current_version(demo_home)
    manifest = json.loads((snapshots_dir(demo_home) / str(version) / "manifest.json").read_text())
    want = summary_table(manifest)
    printed = _run(demo_home)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == want
    assert f"Version `{version}`" in want and "| L3-hedged, 200 names |" in want
    b = manifest["risk_accuracy"]["horizons"]["1d"]["random_long_only"]["model"]["bias"]
    assert f"| random long-only | {b:.3f} |" in want
    # the previous model (the ETF layer alone) and the baseline beside it, at both horizons
    figures = manifest["risk_accuracy"]["horizons"]
    prev = [figures[h]["hedged_l3_200"]["previous_model"]["bias"] for h in ("1d", "21d")]
    base = [figures[h]["hedged_l3_200"]["baseline"]["bias"] for h in ("1d", "21d")]
    row = next(line for line in want.splitlines() if line.startswith("| L3-hedged, 200 names"))
    assert row.endswith(f"| {prev[0]:.3f} / {prev[1]:.3f} | {base[0]:.3f} / {base[1]:.3f} |")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{BEGIN}\nold figures\n{END}\nafter\n")
    page = tmp_path / "page.md"
    page.write_text(f"{BEGIN}\n{END}\n")
    wrote = _run(demo_home, "--readme", str(readme), "--docs", str(page))
    assert wrote.returncode == 0, wrote.stderr
    assert marked(readme.read_text()) == want and readme.read_text().endswith(f"{END}\nafter\n")
    assert marked(page.read_text()) == full_tables(manifest)
    assert _run(demo_home, "--readme", str(tmp_path / "none.md")).returncode == 1


def test_the_repositorys_tables_are_generated_from_a_real_data_build() -> None:
    for path in (ROOT / "README.md", ROOT / "docs" / "decisions" / "risk-forecast.md"):
        table = marked(path.read_text())
        source = table.splitlines()[0]
        assert source.startswith("Version `v") and "574 symbols" in source, (path, source)
        assert "| L3-hedged, 200 names |" in table
        assert "previous model b" in table and "n/a" not in table, path  # measured beside it
