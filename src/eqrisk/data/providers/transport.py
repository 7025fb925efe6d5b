"""The one way a provider's answer is read from the network, distrusting it (issue 33).

`get_json` makes a GET and returns its decoded JSON body, within:
- a deadline: the request (connect, head and every read of the body) ends `Access.timeout`
  seconds after it started, and never after the fetch's own deadline (`Access.deadline`, a
  `time.monotonic()` instant). A body dripped a byte at a time is cut at the deadline, not
  read for as long as each single read keeps arriving;
- a size: a body whose Content-Length is over `Access.max_bytes` is refused unread, and a body
  without one is streamed and refused as soon as it passes the cap (never read whole);
- redirects: followed by hand, at most MAX_REDIRECTS, and only to the provider's own host
  (scheme, host and port of `Access.base_url`); one elsewhere, or a loop, is refused.
Every failure is a `ProviderError` with one line that names the provider, what happened and
the fix (never the key): a network failure, a timeout, a body too large, a body that is not
JSON (an HTML page, a truncated answer).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from eqrisk.data.providers import Access, ProviderError

MAX_REDIRECTS = 5


class Answer:
    """A status, the headers and the decoded JSON body (None when the body is not JSON)."""

    def __init__(self, status: int, headers: httpx.Headers, body: Any, text: str) -> None:
        self.status_code = status
        self.headers = headers
        self.body = body
        self.text = text


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port


_FIX = "check the network, or the address in EQRISK_PROVIDER_URLS, and try again later"


def _remaining(access: Access, started: float) -> float:
    """Seconds this request may still take (its own timeout and the fetch's deadline)."""
    left = access.timeout - (time.monotonic() - started)
    if access.deadline is not None:
        left = min(left, access.deadline - time.monotonic())
    return left


def _timed_out(name: str, url: httpx.URL, access: Access) -> ProviderError:
    return ProviderError(
        f"{name}: no whole answer from {url.host} within the deadline ({access.timeout:g} s a "
        f"request, EQRISK_FEED_TIMEOUT_S; EQRISK_FEED_FETCH_TIMEOUT_S a fetch): {_FIX}"
    )


def _read_body(name: str, response: httpx.Response, access: Access, started: float) -> bytes:
    """The body, streamed under the size cap and the deadline."""
    length = response.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > access.max_bytes:
        raise ProviderError(
            f"{name}: the answer is {int(length):,} bytes, over the {access.max_bytes:,} read "
            "(EQRISK_FEED_MAX_BYTES): not read; check EQRISK_PROVIDER_URLS points at the provider"
        )
    body = bytearray()
    for chunk in response.iter_bytes():  # as it arrives (a chunk size would wait to fill it)
        body += chunk
        if len(body) > access.max_bytes:
            raise ProviderError(
                f"{name}: the answer passed {access.max_bytes:,} bytes (EQRISK_FEED_MAX_BYTES): "
                "reading stopped; check EQRISK_PROVIDER_URLS points at the provider"
            )
        if _remaining(access, started) <= 0:
            raise _timed_out(name, response.request.url, access)
    return bytes(body)


def _decode(body: bytes, response: httpx.Response) -> tuple[Any, str]:
    """(the JSON value or None, the body as text)."""
    text = body.decode(response.encoding or "utf-8", errors="replace")
    try:
        return json.loads(text), text
    except ValueError:
        return None, text


def get_json(
    http: httpx.Client,
    access: Access,
    name: str,
    url: str,
    *,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """GET `url` under the deadline, the size cap and the redirect rule (see the module); the
    status, headers and decoded JSON of the final answer. ProviderError for anything else."""
    started = time.monotonic()
    home = _origin(httpx.URL(access.base_url))
    request = http.build_request("GET", url, params=params, headers=headers)
    for _ in range(MAX_REDIRECTS + 1):
        left = _remaining(access, started)
        if left <= 0:
            raise _timed_out(name, request.url, access)
        request.extensions["timeout"] = httpx.Timeout(left).as_dict()
        try:
            response = http.send(request, stream=True, follow_redirects=False)
            try:
                if response.is_redirect:
                    target = response.next_request
                    if target is None or _origin(target.url) != home:
                        where = target.url.host if target is not None else "nowhere"
                        raise ProviderError(
                            f"{name}: the answer redirects to another host ({where}): refused "
                            f"(only {home[1]} is followed); check EQRISK_PROVIDER_URLS"
                        )
                    request = target
                    continue
                body = _read_body(name, response, access, started)
            finally:
                response.close()
        except httpx.TimeoutException:
            raise _timed_out(name, request.url, access) from None
        except httpx.TransportError as exc:
            raise ProviderError(
                f"{name}: cannot reach {request.url.host} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else 'no answer'}): {_FIX}"
            ) from None
        value, text = _decode(body, response)
        return Answer(response.status_code, response.headers, value, text)
    raise ProviderError(
        f"{name}: more than {MAX_REDIRECTS} redirects (a loop?): refused; check "
        "EQRISK_PROVIDER_URLS"
    )
