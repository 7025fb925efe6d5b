"""`eqrisk bench wire`: the bytes and the time of compressed answers next to identity.

In process (ASGI, no network), on the demo market: each large answer asked with
`Accept-Encoding: identity`, `gzip` and `br`; per encoding the bytes sent, the time of
compressing the body alone (`compression.compress`, fastest of the repeats), and the time of the
whole request with the compressed cache empty (a miss: the answer is compressed) and filled (a
hit), the render cache on in both (rendering is measured by `eqrisk bench serve`).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from eqrisk.api import compression
from eqrisk.api.app import create_app
from eqrisk.settings import Settings

ENCODINGS = ("identity", "gzip", "br", "zstd")


def _targets(key: str, ten: str) -> list[tuple[str, str, dict[str, str]]]:
    """The answers measured; `ten`: ten symbols the served market holds, comma-separated."""
    b = {"Authorization": f"Bearer {key}"}
    a = {"apikey": key}
    return [
        ("ticker-returns NVDA, all years, JSON", "/api/ticker-returns?ticker=NVDA&years=13", b),
        (
            "ticker-returns NVDA, all years, CSV",
            "/api/ticker-returns?ticker=NVDA&years=13&format=csv",
            b,
        ),
        ("l3-decomposition AAPL, 5 years, JSON", "/api/l3-decomposition?ticker=AAPL&years=5", b),
        (
            "/daily 10 largest stocks from 2016, JSON",
            "/daily?symbols=" + ten + "&start_time=2016-01-04",
            a,
        ),
        ("metrics NVDA (small), JSON", "/api/metrics/NVDA", b),
        (
            "ticker-returns NVDA, Parquet (never compressed)",
            "/api/ticker-returns?ticker=NVDA&years=13&format=parquet",
            b,
        ),
    ]


def _fastest(run: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def _request(client: TestClient, path: str, headers: dict[str, str]) -> tuple[int, bytes, str]:
    with client.stream("GET", path, headers=headers) as response:
        body = b"".join(response.iter_raw())
        if response.status_code != 200:
            raise RuntimeError(f"{path}: {response.status_code} {body[:200]!r}")
        return response.status_code, body, response.headers.get("content-encoding", "identity")


def ten_largest(client: TestClient, key: str) -> str:
    """The served market's ten largest stocks (`/symbol_list`), so that the `/daily` answer
    asks for symbols every market holds (a fixed list named some the 16-year demo lacks)."""
    _, body, _ = _request(client, "/symbol_list?top_n=10", {"apikey": key})
    symbols = json.loads(body)["symbols"]
    if len(symbols) != 10:
        raise RuntimeError(f"the served market lists {len(symbols)} stocks, not 10")
    return ",".join(symbols)


def _cold(cache: compression.CompressedCache, request: Callable[[], Any]) -> None:
    cache.clear()
    request()


def measure(home: Path, key: str, repeats: int, say: Callable[[str], None]) -> list[dict[str, Any]]:
    settings = Settings(home=home, _env_file=None)
    rows: list[dict[str, Any]] = []
    with TestClient(create_app(settings)) as client:
        cache: compression.CompressedCache = client.app.state.compressed  # type: ignore[attr-defined]
        for name, path, headers in _targets(key, ten_largest(client, key)):
            say(f"measuring {name}")
            _, identity, _ = _request(client, path, {**headers, "Accept-Encoding": "identity"})
            for encoding in ENCODINGS:
                asked = {**headers, "Accept-Encoding": encoding}
                _, body, sent = _request(client, path, asked)

                hit = partial(_request, client, path, asked)
                t_miss = _fastest(partial(_cold, cache, hit), repeats)
                t_hit = _fastest(hit, repeats)
                pack = partial(compression.compress, identity, encoding)
                t_compress = _fastest(pack, repeats) if sent != "identity" else 0.0
                rows.append(
                    {
                        "target": name,
                        "encoding": encoding,
                        "sent_as": sent,
                        "bytes": len(body),
                        "identity_bytes": len(identity),
                        "ratio": len(identity) / len(body) if body else 1.0,
                        "compress_ms": t_compress * 1e3,
                        "request_miss_ms": t_miss * 1e3,
                        "request_hit_ms": t_hit * 1e3,
                    }
                )
    return rows


def verified_key(home: Path) -> str:
    """A verified, funded key in `home`'s accounts, with a limit that never interferes."""
    from eqrisk.accounts.book import Accounts
    from eqrisk.accounts.db import make_engine

    accounts = Accounts(make_engine(home))
    account = accounts.create_account("bench")["account_id"]
    accounts.verify_card(account, provider="bench")
    accounts.credit(account, 10**12, "bench credit")
    return str(accounts.create_key(account, rate_limit="100000000/minute")["key"])


def run(
    home: Path | None = None, *, repeats: int = 7, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """The figures on `home` (a home with a snapshot; a key is made there), or on a 16-year
    demo market built in a temporary folder."""
    from eqrisk.bench.serve import prepare_home

    if home is not None:
        return {"repeats": repeats, "results": measure(home, verified_key(home), repeats, say)}
    with tempfile.TemporaryDirectory(prefix="eqrisk-bench-compression-") as tmp:
        key = prepare_home(Path(tmp), say)
        return {"repeats": repeats, "results": measure(Path(tmp), key, repeats, say)}
