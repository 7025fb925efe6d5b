"""Schemathesis over both services with many examples per operation (the quick suite runs 40 to
100): no generated request, valid or not, gets a server error; every answer matches the
documented schema; every error is problem+json carrying the request id of its response."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from conftest import TEST_KEY
from eqrisk.api.app import create_app
from reliability.figures import add_figures

pytestmark = pytest.mark.reliability

EXAMPLES = int(os.environ.get("EQRISK_RELIABILITY_EXAMPLES", "300"))
B_AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
A_AUTH = {"apikey": TEST_KEY}
TALLY: dict[str, Counter[str]] = {"B": Counter(), "A": Counter()}


@schemathesis.check
def problem_json_with_request_id(ctx, response, case) -> None:
    """An error answer is problem+json whose `request_id` is the response's X-Request-ID."""
    if response.status_code < 400:
        return None
    kind = response.headers.get("content-type", [""])[0]
    assert kind.startswith("application/problem+json"), f"{response.status_code} as {kind}"
    body = response.json()
    assert body["status"] == response.status_code and body["error"]
    assert body["request_id"] == response.headers["x-request-id"][0]
    return None


def _tally(service: str, case, response) -> None:
    TALLY[service]["examples"] += 1
    TALLY[service][f"{response.status_code // 100}xx"] += 1
    TALLY[service][case.operation.label] += 0  # counts the operations seen


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    for service, tally in TALLY.items():
        if tally["examples"]:
            add_figures(
                f"schemathesis Service {service}",
                operations=sum(1 for k in tally if k.startswith(("GET ", "POST "))),
                examples_per_operation=EXAMPLES,
                examples_run=tally["examples"],
                statuses={k: v for k, v in sorted(tally.items()) if k.endswith("xx")},
            )


@pytest.fixture(scope="module")
def risk_schema_long(demo_settings):
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(demo_settings))


@pytest.fixture(scope="module")
def daily_schema_long(demo_settings):
    app = create_app(demo_settings, services=("daily",))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


risk = schemathesis.pytest.from_fixture("risk_schema_long").include(path_regex=r"^/api/")
daily = schemathesis.pytest.from_fixture("daily_schema_long")
LONG = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@risk.parametrize()
@LONG
def test_service_b_long(case):
    response = case.call(headers=B_AUTH)
    _tally("B", case, response)
    case.validate_response(
        response,
        checks=[not_a_server_error, response_schema_conformance, problem_json_with_request_id],
    )


@daily.parametrize()
@LONG
def test_service_a_long(case):
    response = case.call(headers=A_AUTH)
    _tally("A", case, response)
    case.validate_response(
        response,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            problem_json_with_request_id,
        ],
    )
