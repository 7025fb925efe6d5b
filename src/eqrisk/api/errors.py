"""The one error shape of both services: RFC 9457 problem+json with a stable machine code.

`{type, title, status, detail, message, error, request_id}` plus optional context (for example the
accepted values). Every failure, ours or the framework's, goes through `problem_response`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

log = logging.getLogger("eqrisk.api")

PROBLEM_TYPE = "application/problem+json"

# Machine code -> (HTTP status, title). The only place these pairs are defined.
CODES: dict[str, tuple[int, str]] = {
    "MISSING_PARAMETER": (400, "A required parameter is missing"),
    "INVALID_PARAMETER": (400, "A parameter has an invalid value"),
    "MALFORMED_REQUEST": (400, "The request is not valid HTTP/1.1"),
    "AUTHENTICATION_REQUIRED": (401, "An API key is required"),
    "INVALID_API_KEY": (401, "The API key is not valid"),
    "INSUFFICIENT_BALANCE": (402, "The account balance does not cover this request"),
    "ACCOUNT_INACTIVE": (403, "The account cannot make metered requests"),
    "DEMO_RESTRICTED": (403, "The demo key cannot make this request"),
    "TICKER_NOT_FOUND": (404, "Ticker not found"),
    "NOT_FOUND": (404, "No such route"),
    "NO_DATA": (404, "The data set has no data for this request"),
    "VERSION_NOT_FOUND": (404, "No kept snapshot version of that name"),
    "METHOD_NOT_ALLOWED": (405, "Method not allowed"),
    "NOT_ACCEPTABLE": (406, "No acceptable response format"),
    "REQUEST_TIMEOUT": (408, "The request did not arrive in time"),
    "PAYLOAD_TOO_LARGE": (413, "Request body too large"),
    "URI_TOO_LONG": (414, "Request URI too long"),
    "UNSUPPORTED_MEDIA_TYPE": (415, "The request body must be JSON"),
    "WEBHOOK_REJECTED": (400, "The webhook call was refused"),
    "WEBHOOK_REPLAY": (409, "The webhook event was already processed"),
    "RATE_LIMIT_EXCEEDED": (429, "Too many requests"),
    "HEADERS_TOO_LARGE": (431, "Request header fields too large"),
    "INTERNAL_ERROR": (500, "Internal error"),
    "SERVICE_UNAVAILABLE": (503, "The service cannot answer now (no snapshot, or a backend)"),
}


class ApiError(Exception):
    """An error that knows its machine code (hence status) and what the caller should know."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **context: Any,
    ) -> None:
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(detail)
        self.code = code
        self.status, self.title = CODES[code]
        self.detail = detail
        self.headers = headers or {}
        self.context = context


def request_id_of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def problem_body(code: str, detail: str, request_id: str | None, **context: Any) -> bytes:
    status, title = CODES[code]
    body: dict[str, Any] = {
        "type": f"urn:eqrisk:error:{code.lower().replace('_', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "message": detail,  # the sentence again: what the real Service B's clients show
        "error": code,
        "request_id": request_id,
    }
    body.update(context)
    return orjson.dumps(body)


def problem_response(
    request: Request,
    code: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> Response:
    status, _ = CODES[code]
    return Response(
        problem_body(code, detail, request_id_of(request), **context),
        status_code=status,
        media_type=PROBLEM_TYPE,
        headers=headers,
    )


def _describe_validation(exc: RequestValidationError) -> tuple[str, str, dict[str, Any]]:
    """Turn FastAPI's validation errors into one code, one sentence and the offending fields."""
    errors = exc.errors()
    bad_json = [e for e in errors if e.get("type") == "json_invalid"]
    if bad_json:
        reason = (bad_json[0].get("ctx") or {}).get("error", "malformed")
        return (
            "INVALID_PARAMETER",
            f"the request body is not valid JSON ({reason}); send a JSON object",
            {"parameters": ["body"], "accepted": ["application/json"]},
        )
    missing = [e for e in errors if e.get("type") == "missing"]
    fields = [
        ".".join(str(p) for p in e.get("loc", ()) if p not in ("query", "body", "path"))
        for e in errors
    ]
    if missing:
        names = [".".join(str(p) for p in e["loc"][1:]) or "body" for e in missing]
        return (
            "MISSING_PARAMETER",
            f"missing required parameter(s): {', '.join(names)}",
            {"parameters": names},
        )
    parts = []
    for err, field in zip(errors, fields, strict=True):
        msg = str(err.get("msg", "invalid"))
        parts.append(f"{field or 'body'}: {msg}")
    return "INVALID_PARAMETER", "; ".join(parts), {"parameters": [f or "body" for f in fields]}


def validation_api_error(errors: Sequence[Any]) -> ApiError:
    """The ApiError for pydantic errors found outside a route's signature (for example the
    `params` object of /api/estimate), described exactly like FastAPI's own; `loc` starts with
    the location ("query", "body", ...)."""
    code, detail, context = _describe_validation(RequestValidationError(list(errors)))
    return ApiError(code, detail, **context)


class Problem(BaseModel):
    """The error body (RFC 9457 problem+json), for the OpenAPI documents."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="urn:eqrisk:error:<code>")
    title: str
    status: int
    detail: str = Field(description="What was wrong and what is accepted.")
    message: str = Field(description="The same sentence as `detail` (the real Service B's name).")
    error: str = Field(description="Stable machine code, e.g. TICKER_NOT_FOUND.")
    request_id: str | None = Field(description="Quote it when reporting a problem.")


def problem_responses(*statuses: int | str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries documenting the problem+json body for `statuses`."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        titles = sorted({t for s, t in CODES.values() if str(s) == str(status)})
        out[status] = {
            "description": "; ".join(titles) or f"Error ({status}), problem+json",
            "content": {PROBLEM_TYPE: {"schema": Problem.model_json_schema()}},
        }
    return out


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception to the problem+json shape."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return problem_response(request, exc.code, exc.detail, exc.headers, **exc.context)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        code, detail, ctx = _describe_validation(exc)
        return problem_response(request, code, detail, **ctx)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = {
            404: "NOT_FOUND",
            405: "METHOD_NOT_ALLOWED",
            413: "PAYLOAD_TOO_LARGE",
            415: "UNSUPPORTED_MEDIA_TYPE",
        }.get(exc.status_code, "INVALID_PARAMETER")
        detail = str(exc.detail)
        if code == "NOT_FOUND":
            detail = f"no route {request.method} {request.url.path}; see /docs for the routes"
        return problem_response(request, code, detail, dict(exc.headers or {}))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> Response:
        # The client left before its body arrived (or a timeout closed it): nobody reads this
        # answer, and it is no error of ours to log.
        return problem_response(
            request, "INVALID_PARAMETER", "the request body ended early (the client went away)"
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(
            request, "INTERNAL_ERROR", "an internal error occurred; quote the request_id"
        )
