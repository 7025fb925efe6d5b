"""The one parser of a JSON request body (docs/decisions/request-path.md).

Accepted: `Content-Type: application/json` (or any `+json` type), without a charset or with
`charset=utf-8`; no `Content-Encoding` (or `identity`); the bytes UTF-8, with or without a
leading byte-order mark (RFC 8259 section 8.1 lets a parser ignore it); one JSON text, strict
(no NaN, no comments, no lone surrogates). Anything else is a 4xx that says what is accepted,
before anything is planned or priced: a declared media type, charset or encoding that is not
the above is a 415, bytes that are not such a JSON text a 400. The route that answers and the
price of its call both read the document this parser returns, and nothing else reads a body.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations of `body_of`'s
# dependency at runtime.

import codecs
import hashlib
from typing import Any, TypeVar

import orjson
from fastapi import Depends, Request
from pydantic import ValidationError

from eqrisk.api.errors import ApiError, validation_api_error
from eqrisk.api.params import Params

JSON_MEDIA_TYPE = "application/json"
ACCEPTED = f"{JSON_MEDIA_TYPE} in UTF-8 (charset absent or utf-8; a byte-order mark is ignored)"
_UTF8_NAMES = {"utf-8", "utf8"}

P = TypeVar("P", bound=Params)


def _media(content_type: str) -> tuple[str, dict[str, str]]:
    """`type/subtype` and the parameters of a Content-Type value, lower-cased, unquoted."""
    media, *rest = content_type.split(";")
    params = {}
    for part in rest:
        name, _, value = part.partition("=")
        params[name.strip().lower()] = value.strip().strip('"').strip().lower()
    return media.strip().lower(), params


def check_headers(content_type: str | None, content_encoding: str | None) -> None:
    """415 unless the headers announce a JSON body this parser reads (see the module doc)."""
    media, params = _media(content_type or "")
    if media != JSON_MEDIA_TYPE and not media.endswith("+json"):
        raise ApiError(
            "UNSUPPORTED_MEDIA_TYPE",
            f"send a JSON body with Content-Type: application/json (got {media or 'none'})",
            accepted=[JSON_MEDIA_TYPE],
        )
    charset = params.get("charset")
    if charset is not None and charset not in _UTF8_NAMES:
        raise ApiError(
            "UNSUPPORTED_MEDIA_TYPE",
            f"the body's charset is {charset!r}; send JSON in UTF-8 ({ACCEPTED})",
            accepted=[JSON_MEDIA_TYPE, f"{JSON_MEDIA_TYPE}; charset=utf-8"],
        )
    encoding = (content_encoding or "identity").strip().lower()
    if encoding != "identity":
        raise ApiError(
            "UNSUPPORTED_MEDIA_TYPE",
            f"the body is sent with Content-Encoding {encoding!r}; send it uncompressed",
            accepted=["identity"],
        )


def decode_json(body: bytes) -> Any:
    """The JSON document of a body: UTF-8, a leading byte-order mark ignored; else a 400."""
    if not body.strip():
        raise ApiError(
            "MISSING_PARAMETER",
            f"the request body is empty; send a JSON object ({ACCEPTED})",
            parameters=["body"],
        )
    text = body[len(codecs.BOM_UTF8) :] if body.startswith(codecs.BOM_UTF8) else body
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ApiError(
            "INVALID_PARAMETER",
            f"the request body is not valid JSON ({exc}); send a JSON object ({ACCEPTED})",
            parameters=["body"],
            accepted=[JSON_MEDIA_TYPE],
        ) from None


async def json_body(request: Request) -> Any:
    """The request's JSON document, by the one parser (headers checked before the body)."""
    check_headers(request.headers.get("content-type"), request.headers.get("content-encoding"))
    return decode_json(await request.body())


def validate_body(model: type[P], doc: Any) -> P:
    """`doc` as `model`, every error located in the body (`null` is a value here, not absent)."""
    if not isinstance(doc, dict):
        kind = "an array" if isinstance(doc, list) else f"a JSON {type(doc).__name__}"
        raise ApiError(
            "INVALID_PARAMETER",
            f"the request body is {kind}; send a JSON object with the fields "
            f"{', '.join(model.accepted())}",
            parameters=["body"],
            accepted=model.accepted(),
        )
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise validation_api_error(errors) from None


DIGEST_KEY = "eqrisk.params_digest"
"""Where a body read in the work threads leaves the call's ledger digest (`endpoint._digest`)."""


def params_digest(path: str, query: bytes, body: bytes) -> str:
    """SHA-256 of the call as sent (path, query string, body): the ledger's params digest."""
    return hashlib.sha256(path.encode() + query + body).hexdigest()


class Received:
    """A JSON body received on the event loop, its headers checked, not yet decoded: the
    route decodes, validates and digests it (`parse`) in the work threads, in the same hop as
    its plan (`endpoint.metered`)."""

    def __init__(self, model: type[Params], request: Request, raw: bytes) -> None:
        self.model = model
        self.request = request
        self.raw = raw

    def parse(self) -> Any:
        """The body as the route's parameters model, the call's digest left in the scope."""
        scope = self.request.scope
        scope[DIGEST_KEY] = params_digest(scope["path"], scope.get("query_string", b""), self.raw)
        return validate_body(self.model, decode_json(self.raw))


def body_of(model: type[P], *, threaded: bool = False) -> Any:
    """A dependency reading `model` from the JSON body (the route's one body parser). With
    `threaded`, the bytes are received on the event loop and handed on as `Received`: decoded,
    validated and digested in the work threads (`api/work.py`) with the plan, in one hop (a
    body of thousands of positions takes milliseconds of CPU that the loop's other requests,
    /api/health, must not wait for)."""

    async def dependency(request: Request) -> P | Received:
        check_headers(request.headers.get("content-type"), request.headers.get("content-encoding"))
        raw = await request.body()
        if threaded:
            return Received(model, request, raw)
        return validate_body(model, decode_json(raw))

    dependency.__name__ = f"{model.__name__}_body"
    return Depends(dependency)
