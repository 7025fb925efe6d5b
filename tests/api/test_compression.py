"""Compressed answers (api/compression.py): negotiation with q-values, the decompressed bytes
equal to the identity answer's (zstd decoded by the zstd program too, the reference decoder),
the same charge either way, never Parquet or a problem, Vary, identity refused, and the
compressed bytes of an immutable answer cached."""

from __future__ import annotations

import gzip
import shutil
import subprocess
from pathlib import Path
from typing import Any

import brotli
import pytest
import zstandard
from fastapi.testclient import TestClient

from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.api.app import create_app
from eqrisk.api.compression import (
    FAST_BYTES,
    MIN_BYTES,
    Accepted,
    choose_encoding,
    compress,
)
from eqrisk.settings import Settings
from helpers import bearer, new_key


def _unzstd(body: bytes) -> bytes:
    """zstd's frame decoded by the `zstd` program (libzstd's reference CLI) where installed,
    and by the zstandard package's decoder, which must agree."""
    out: bytes = zstandard.ZstdDecompressor().decompress(body)
    if shutil.which("zstd"):
        cli = subprocess.run(["zstd", "-dc"], input=body, capture_output=True, check=True).stdout
        assert cli == out
    return out


DECODE = {"br": brotli.decompress, "gzip": gzip.decompress, "zstd": _unzstd}


@pytest.mark.parametrize(
    ("header", "chosen", "large"),
    [
        ("gzip, br", "br", "br"),  # equal q: br under FAST_BYTES
        ("br, gzip", "br", "br"),
        ("gzip, deflate, br, zstd", "br", "zstd"),  # a browser's: zstd from FAST_BYTES on
        ("zstd", "zstd", "zstd"),
        ("gzip, zstd", "zstd", "zstd"),  # equal q, br not offered: zstd before gzip
        ("gzip", "gzip", "gzip"),
        ("x-gzip", "gzip", "gzip"),
        ("br;q=0.5, gzip;q=0.8", "gzip", "gzip"),
        ("br;q=1.0, gzip;q=0.999", "br", "br"),
        ("zstd;q=0.9, br", "br", "br"),
        ("zstd, br;q=0.9", "zstd", "zstd"),
        ("gzip;q=0, br;q=0", None, None),
        ("deflate", None, None),
        ("identity", None, None),
        ("", None, None),
        ("*", "br", "zstd"),
        ("*;q=0.3, br;q=0.1", "zstd", "zstd"),  # * stands for zstd and gzip at 0.3
        ("br;q=0, *", "zstd", "zstd"),
        ("br;q=0, zstd;q=0, *", "gzip", "gzip"),
        ("GZIP ; Q=0.4 , Br ; q=0.2", "gzip", "gzip"),
        ("br;q=nonsense, gzip", "gzip", "gzip"),
    ],
)
def test_the_encoding_follows_the_q_values(
    header: str, chosen: str | None, large: str | None
) -> None:
    assert choose_encoding(header, 0) == chosen
    assert choose_encoding(header, FAST_BYTES - 1) == chosen
    assert choose_encoding(header, FAST_BYTES) == large


@pytest.mark.parametrize(
    ("header", "identity"),
    [
        ("", True),
        ("gzip", True),
        ("identity;q=0, gzip", False),
        ("*;q=0, gzip", False),
        ("*;q=0, identity", True),  # named: the specific entry wins over *
        ("*;q=0, identity;q=0.5", True),
        ("*", True),
        ("identity;q=0", False),
    ],
)
def test_identity_is_refused_only_by_name_or_by_star_at_zero(header: str, identity: bool) -> None:
    assert Accepted(header).identity is identity


@pytest.fixture()
def served(home: Path) -> tuple[TestClient, Accounts, str, str]:
    accounts = Accounts(make_engine(home))
    account_id, key = new_key(accounts)
    client = TestClient(create_app(Settings(home=home, _env_file=None)))
    return client, accounts, account_id, key


def _raw(client: TestClient, url: str, headers: dict[str, str]) -> tuple[Any, bytes]:
    """The response and its body as sent (not decoded by the client)."""
    with client.stream("GET", url, headers=headers) as response:
        body = b"".join(response.iter_raw())
    return response, body


def _charged(accounts: Accounts, account_id: str) -> list[int]:
    return [e["tokens"] for e in accounts.ledger(account_id) if e["kind"] == "charge"]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_a_compressed_answer_is_the_same_bytes_and_the_same_charge(served, fmt: str) -> None:
    client, accounts, account_id, key = served
    url = f"/api/ticker-returns?ticker=NVDA&years=2&format={fmt}"
    plain, identity = _raw(client, url, {**bearer(key), "Accept-Encoding": "identity"})
    assert plain.status_code == 200 and "content-encoding" not in plain.headers
    assert int(plain.headers["content-length"]) == len(identity) > MIN_BYTES
    for encoding in ("br", "gzip", "zstd"):
        response, body = _raw(client, url, {**bearer(key), "Accept-Encoding": encoding})
        assert response.status_code == 200
        assert response.headers["content-encoding"] == encoding
        assert int(response.headers["content-length"]) == len(body) < len(identity) / 2
        assert DECODE[encoding](body) == identity
        assert "Accept-Encoding" in response.headers["vary"]
        assert "Accept" in response.headers["vary"].split(", ")
        assert response.headers["etag"] == "W/" + plain.headers["etag"]
    charges = _charged(accounts, account_id)
    assert len(charges) == 4 and len(set(charges)) == 1 and charges[0] < 0


def test_compressed_bytes_of_an_immutable_answer_are_cached(served) -> None:
    client, _, _, key = served
    cache = client.app.state.compressed  # type: ignore[attr-defined]
    url = "/daily?symbols=AAPL,MSFT&start_time=2025-01-02"
    headers = {"apikey": key, "Accept-Encoding": "gzip, br"}
    first, body = _raw(client, url, headers)
    hits = cache.hits
    again, same = _raw(client, url, headers)
    assert first.headers["content-encoding"] == again.headers["content-encoding"] == "br"
    assert same == body and cache.hits == hits + 1
    # A weak If-None-Match names the compressed answer: 304, still varying on the encoding.
    cached = client.get(url, headers={**headers, "If-None-Match": first.headers["etag"]})
    assert cached.status_code == 304 and "Accept-Encoding" in cached.headers["vary"]


def test_health_is_compressed_once_per_version(served) -> None:
    """/api/health (several kB with the accuracy record) names the served version with a
    strong ETag, so the event loop does not compress it again at every check."""
    client = served[0]
    cache = client.app.state.compressed  # type: ignore[attr-defined]
    plain, identity = _raw(client, "/api/health", {"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and len(identity) > MIN_BYTES
    first, body = _raw(client, "/api/health", {"Accept-Encoding": "br"})
    hits = cache.hits
    again, same = _raw(client, "/api/health", {"Accept-Encoding": "br"})
    assert first.headers["content-encoding"] == again.headers["content-encoding"] == "br"
    assert same == body and cache.hits == hits + 1 and DECODE["br"](body) == identity
    assert first.headers["etag"] == "W/" + plain.headers["etag"]


def test_parquet_problems_and_small_answers_go_as_they_are(served) -> None:
    client, _, _, key = served
    h = {**bearer(key), "Accept-Encoding": "br, gzip"}
    parquet, body = _raw(client, "/api/ticker-returns?ticker=NVDA&years=2&format=parquet", h)
    assert parquet.status_code == 200 and "content-encoding" not in parquet.headers
    assert body[:4] == b"PAR1" and "Accept-Encoding" not in parquet.headers.get("vary", "")
    problem, body = _raw(client, "/api/ticker-returns?ticker=NOPE&years=2", h)
    assert problem.status_code == 404 and "content-encoding" not in problem.headers
    assert problem.headers["content-type"] == "application/problem+json"
    small, body = _raw(client, "/symbol_list?top_n=2", {**h, "apikey": key})
    assert small.status_code == 200 and len(body) < MIN_BYTES
    assert "content-encoding" not in small.headers
    assert "Accept-Encoding" in small.headers["vary"]  # it could have been compressed


@pytest.mark.parametrize("encoding", ["br", "gzip", "zstd"])
def test_a_large_body_is_encoded_fast_and_decodes_to_itself(encoding: str) -> None:
    """From FAST_BYTES on the fast encoders (zstd 1, brotli 1, ISA-L gzip): the body comes back, the
    same body gives the same bytes (gzip without a time), and it is still compressed."""
    rows = b",".join(
        b'{"date":"2020-01-%02d","value":%d.125}' % (i % 28 + 1, i) for i in range(40000)
    )
    body = b"[" + rows + b"]"
    assert len(body) >= FAST_BYTES
    encoded = compress(body, encoding)
    assert DECODE[encoding](encoded) == body
    assert compress(body, encoding) == encoded
    assert len(encoded) < len(body) / 4


def test_a_request_refusing_identity_gets_small_answers_encoded_or_a_free_406(served) -> None:
    """`identity;q=0`: a small answer is encoded all the same (as the client asked); a request
    that also refuses every coding the server writes is a 406 before the gate, not charged."""
    client, accounts, account_id, key = served
    url = "/symbol_list?top_n=2"
    small, plain = _raw(client, url, {"apikey": key, "Accept-Encoding": "identity"})
    assert small.status_code == 200 and len(plain) < MIN_BYTES
    for header, encoding in [("identity;q=0, zstd", "zstd"), ("*;q=0, gzip;q=0.5", "gzip")]:
        response, body = _raw(client, url, {"apikey": key, "Accept-Encoding": header})
        assert response.status_code == 200 and response.headers["content-encoding"] == encoding
        assert DECODE[encoding](body) == plain
    charges = _charged(accounts, account_id)
    for header in ["identity;q=0", "*;q=0", "identity;q=0, deflate", "*;q=0, br;q=0"]:
        paid = {**bearer(key), "Accept-Encoding": header}
        refused = client.get("/api/metrics/NVDA", headers=paid)
        assert refused.status_code == 406, header
        assert refused.headers["content-type"] == "application/problem+json"
        problem = refused.json()
        assert problem["error"] == "NOT_ACCEPTABLE"
        assert problem["accepted"] == ["br", "zstd", "gzip", "identity"]
    assert _charged(accounts, account_id) == charges
    assert client.get("/api/metrics/NVDA", headers=bearer(key)).status_code == 200
    assert len(_charged(accounts, account_id)) == len(charges) + 1  # the route is paid


def test_a_large_body_is_encoded_in_the_apps_lower_priority_threads(served) -> None:
    """A body of OFF_LOOP_BYTES or more is compressed off the event loop, in the app's
    compress pool, whose threads run at the work threads' lower CPU priority."""
    import os
    import sys
    import threading

    from eqrisk.api.compression import OFF_LOOP_BYTES, Compression

    client, _, _, _ = served
    pool = client.app.state.compress_pool  # type: ignore[attr-defined]
    seen: list[tuple[str, int]] = []

    def encoder(body: bytes, encoding: str) -> bytes:
        tid = threading.get_native_id()
        seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, tid)))
        return compress(body, encoding)

    payload = b'{"x": "' + b"ab" * OFF_LOOP_BYTES + b'"}'

    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(payload)),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    wrapped = TestClient(Compression(app, encoder=encoder, pool=pool))
    answer = wrapped.get("/", headers={"Accept-Encoding": "br"})
    assert answer.headers["content-encoding"] == "br" and answer.content == payload
    [(name, nice)] = seen
    assert name.startswith("compress")
    if sys.platform == "linux":
        assert nice > os.getpriority(os.PRIO_PROCESS, 0)
