"""Property-based check of Service B against its own OpenAPI document (schemathesis, in-process):
no generated request, valid or not, gets a server error, and every answer matches the
documented schema for its status and content type."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from eqrisk.api.app import create_app
from helpers import TEST_KEY

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}


@pytest.fixture(scope="module")
def risk_schema(demo_settings):
    app = create_app(demo_settings)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("risk_schema").include(path_regex=r"^/api/")


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_service_b_matches_its_openapi_document(case):
    case.call_and_validate(headers=AUTH, checks=[not_a_server_error, response_schema_conformance])
