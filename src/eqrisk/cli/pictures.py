"""`eqrisk pictures`: the README's pictures of the page, made on purpose, never by the tests.

It builds the demo market in a home of its own (a temporary folder), makes that home's local
evaluation key (20 USD of credit, as `eqrisk demo` does), serves it, and photographs the market,
stock and portfolio pages at a desktop's and a phone's width in Debian's headless Chromium
(`apt-get install chromium chromium-driver`; selenium comes with the `test` extra). What the
pictures show is what a newcomer sees with the key `eqrisk demo` prints. The dashboard tests
photograph their own server with the same code (`capture`) into a temporary folder.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from eqrisk.cli.app import app, fail
from eqrisk.cli.output import result, stages

DESKTOP = (1366, 900)
PHONE = (390, 844)
FORMS = {"desktop": DESKTOP, "phone": PHONE}
# page -> (the page's address, a chart that is drawn once the page has its data)
PAGES = {
    "market": ("#/market", "treemap"),
    "stock": ("#/stock/NVDA?years=3", "chart-returns"),
    "portfolio": ("#/portfolio?p=NVDA:40,MSFT:30,FLR:30", "chart-position-shares"),
}
WAIT_S = 60.0


def wait_js(driver: Any, script: str, *args: Any, timeout: float = WAIT_S) -> Any:
    """Poll `script` (a JS function body returning a value) until it is truthy; return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script, *args)
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"the page did not get there in {timeout:.0f} s: {script}")
        time.sleep(0.1)


def plotted(driver: Any, chart_id: str) -> Any:
    return wait_js(
        driver,
        "const g = document.getElementById(arguments[0]); return !!(g && g.data && g.data.length)",
        chart_id,
    )


def _emulate(driver: Any, width: int, height: int, mobile: bool) -> None:
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
    )
    time.sleep(0.5)  # plotly's responsive resize


def _photograph(driver: Any, path: Path, width: int, height: int, mobile: bool) -> Path:
    """The whole page at a given width (the viewport made as tall as the page, since content
    scrolled out of view in an overflow box is not painted), a small PNG."""
    _emulate(driver, width, height, mobile)
    full = min(driver.execute_script("return document.documentElement.scrollHeight"), 2400)
    _emulate(driver, width, max(full, height), mobile)
    # No hover label left over from an earlier mouse.
    driver.execute_cdp_cmd("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": 0, "y": 0})
    driver.execute_script(
        "document.querySelectorAll('.chart').forEach(g => g.data && Plotly.Fx.unhover(g))"
    )
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    path.write_bytes(base64.b64decode(shot["data"]))
    _emulate(driver, width, height, mobile)
    return path


def capture(
    driver: Any, form: str, out: Path, after: Callable[[str], None] | None = None
) -> list[Path]:
    """Each page of PAGES at `form`'s size, as `<page>-<form>.png` in `out`; the page must
    already hold a key. `after(page)` runs once each page is photographed (a test's checks).
    Returns the files written."""
    width, height = FORMS[form]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for page, (address, chart) in PAGES.items():
            _emulate(driver, width, height, mobile=False)
            driver.execute_script("location.hash = arguments[0]", address)
            plotted(driver, chart)
            path = out / f"{page}-{form}.png"
            written.append(_photograph(driver, path, width, height, mobile=form == "phone"))
            if after is not None:
                after(page)
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return written


@contextmanager
def chromium(binary: Path, driver_path: Path) -> Iterator[Any]:
    """Debian's headless Chromium through its chromedriver (the paths given, so Selenium
    Manager has nothing to look up or download)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(binary)
    profile = tempfile.mkdtemp(prefix="eqrisk-chromium-")
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(driver_path)), options=options)
    driver.set_script_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@contextmanager
def _serving(home: Path, key: str) -> Iterator[str]:
    """`eqrisk serve` on `home` in a child process offering `key`; its base URL."""
    from eqrisk.bench.served import eqrisk_serve

    env = {**os.environ, "EQRISK_HOME": str(home), "EQRISK_EVALUATION_KEY": key}
    env.pop("EQRISK_DATABASE_URL", None)
    with eqrisk_serve(env, wait_s=WAIT_S, error=fail) as server:
        yield server.base


@app.command()
def pictures(
    out: Annotated[
        Path, typer.Option(help="Folder to write the PNGs into (the README's pictures).")
    ] = Path("docs/screenshots"),
    chromium_path: Annotated[Path, typer.Option("--chromium", help="The Chromium binary.")] = Path(
        "/usr/bin/chromium"
    ),
    chromedriver: Annotated[Path, typer.Option(help="Its chromedriver.")] = Path(
        "/usr/bin/chromedriver"
    ),
) -> None:
    """Make the README's screenshots of the page. As a newcomer sees it: the demo market is built in a temporary home
    with its local evaluation key (20 USD of credit), served, and its market, stock and
    portfolio pages photographed at a desktop's and a phone's width into --out."""
    from eqrisk.build.demo import build_demo
    from eqrisk.cli.demo import evaluation_key
    from eqrisk.settings import Settings

    missing = [str(p) for p in (chromium_path, chromedriver) if not p.exists()]
    if missing:
        raise fail(f"{', '.join(missing)} not found: apt-get install chromium chromium-driver", 3)
    home = Path(tempfile.mkdtemp(prefix="eqrisk-screenshots-"))
    try:
        with stages("pictures") as say:
            build_demo(home, progress=say)
            key = evaluation_key(Settings(home=home, database_url=None))
            if key is None:  # pragma: no cover - the home is new and holds its own accounts
                raise fail("no evaluation key was made")
            say("serving and photographing")
            written: list[Path] = []
            with _serving(home, key["key"]) as base, chromium(chromium_path, chromedriver) as d:
                d.get(f"{base}/")
                d.execute_script("localStorage.clear()")
                d.get(f"{base}/")
                wait_js(d, "return document.getElementById('key-dialog').open")
                d.find_element("id", "use-evaluation").click()
                plotted(d, "treemap")
                for form in FORMS:
                    written += capture(d, form, out)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    for path in written:
        result(str(path))
