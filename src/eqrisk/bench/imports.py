"""`eqrisk bench imports`: what the CLI imports, each command in fresh interpreters under
`python -X importtime`, beside the whole package imported at once (what every command would
import were no import lazy):

- `eqrisk --help` and `eqrisk update --help` (the CLI's start: the commands parsed),
- `eqrisk update FILE`, the daily job, on a small synthetic data set (`bench.daily`'s, built
  once by `eqrisk build`; each run on a fresh copy of it, so that each merges the same new
  session and builds incrementally).

A figure is the median over the runs of the import time (the sum of the cumulative times of
the imports made at the top level: everything the process imported, its own modules
included), beside the process's wall time and the number of modules it loaded. The daily job's
largest packages (by their own import time) say where its imports go."""

from __future__ import annotations

import re
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eqrisk.bench.daily import DAY_FILE, Child, _load, _Runner, _verdict

START_MS = 300.0  # issue 35: `eqrisk --help` and the daily job start in under 0.3 s of imports
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)")
# Every module of the package, imported in one interpreter (the reference).
_EAGER = (
    "import importlib, pkgutil, eqrisk\n"
    "for m in pkgutil.walk_packages(eqrisk.__path__, 'eqrisk.'):\n"
    "    if not m.name.endswith('__main__'):\n"
    "        importlib.import_module(m.name)\n"
)


@dataclass(frozen=True)
class ImportsBench:
    repeats: int = 5
    symbols: int = 40  # the daily job's data set
    sessions: int = 300
    seed: int = 0
    folder: Path | None = None  # where to work (a temporary folder by default)


@dataclass(frozen=True)
class Imports:
    """One process's imports: total ms, module names, own ms of each top package."""

    ms: float
    modules: frozenset[str]
    own_ms: Counter[str]


def read_importtime(lines: list[str]) -> Imports:
    """`-X importtime`'s lines (stderr) as one process's imports."""
    total, own, names = 0, Counter[str](), set()
    for line in lines:
        found = _LINE.match(line)
        if found is None:
            continue
        self_us, cumulative_us, indent, name = found.groups()
        names.add(name)
        own[name.split(".")[0]] += int(self_us)
        if not indent:
            total += int(cumulative_us)
    return Imports(total / 1e3, frozenset(names), Counter({k: v / 1e3 for k, v in own.items()}))


def _cli(runner: _Runner, home: Path, *args: str) -> Child:
    """`eqrisk ARGS` in a fresh interpreter under `-X importtime`."""
    return runner.run(home, "-X", "importtime", "-m", "eqrisk.cli", *args)


def _runs(repeats: int, one: Callable[[int], Child]) -> dict[str, Any]:
    """`repeats` processes: the median import ms and wall s, each run's ms, the modules."""
    found = []
    for i in range(repeats):
        child = one(i)
        found.append((read_importtime([line for _, line in child.lines]), child.seconds))
    ms = [imports.ms for imports, _ in found]
    last = found[-1][0]
    return {
        "import_ms": round(statistics.median(ms), 1),
        "import_ms_runs": [round(m, 1) for m in ms],
        "wall_s": round(statistics.median(s for _, s in found), 2),
        "modules": len(last.modules),
        "largest_packages": {k: round(v, 1) for k, v in last.own_ms.most_common(6)},
    }


def run(b: ImportsBench, say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """The bench in a temporary folder (removed after)."""
    work = Path(tempfile.mkdtemp(prefix="eqrisk-bench-imports-", dir=b.folder))
    try:
        return measure(b, work, say)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(b: ImportsBench, work: Path, say: Callable[[str], None]) -> dict[str, Any]:
    runner = _Runner(work)
    home, day = work / "home", work / DAY_FILE
    home.mkdir(parents=True)  # `update --help` asks for an existing home
    out: dict[str, Any] = {"repeats": b.repeats, "load_average_start": _load()}
    say(f"eqrisk --help, eqrisk update --help and the whole package: {b.repeats} runs each")
    for key, args in (("help", ("--help",)), ("update_help", ("update", "--help"))):

        def start(_i: int, args: tuple[str, ...] = args) -> Child:
            return _cli(runner, home, *args)

        figures = _runs(b.repeats, start)
        out.update({f"{key}_{k}": v for k, v in figures.items()})
    eager = _runs(b.repeats, lambda _i: runner.run(home, "-X", "importtime", "-c", _EAGER))
    out.update({f"whole_package_{k}": v for k, v in eager.items()})
    for key in ("help", "update_help"):
        out[f"{key}_over_whole_package"] = round(out[f"{key}_import_ms"] / eager["import_ms"], 3)
        out[f"{key}_target"] = _verdict(out[f"{key}_import_ms"] < START_MS, f"< {START_MS:g} ms")

    say(f"the daily job's data set, {b.symbols} x {b.sessions}, built once (setup)")
    runner.setup((home, b.symbols, b.sessions, b.seed, day))
    runner.cli(home, "build")
    say(f"eqrisk update {DAY_FILE}: {b.repeats} runs, each on a fresh copy of the home")

    def update(i: int) -> Child:
        copy = work / f"home-{i}"
        shutil.copytree(home, copy)
        try:
            return _cli(runner, copy, "update", str(day))
        finally:
            shutil.rmtree(copy, ignore_errors=True)

    job = _runs(b.repeats, update)
    out.update({f"update_{k}": v for k, v in job.items()})
    out["update_over_whole_package"] = round(job["import_ms"] / eager["import_ms"], 3)
    out["python"] = sys.version.split()[0]
    out["load_average_end"] = _load()
    return out
