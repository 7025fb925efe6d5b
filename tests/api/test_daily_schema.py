"""Service A against its own OpenAPI document (only Service A's paths): generated requests, with
a valid key, never get a 5xx, and every answer has a documented status, content type and, for
JSON, the documented shape."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from eqrisk.api.app import create_app
from helpers import TEST_KEY

KEY = {"apikey": TEST_KEY}


@pytest.fixture(scope="module")
def daily_schema(demo_settings):
    app = create_app(demo_settings, services=("daily",))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("daily_schema")


@schema.parametrize()
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_service_a_never_fails_and_answers_as_documented(case):
    case.call_and_validate(
        headers=KEY,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
