"""`GET /api/health`: liveness and the served model version (no key, never metered)."""

# No `from __future__ import annotations`: FastAPI reads these annotations at runtime.

from typing import Any

from starlette.responses import Response

from eqrisk.api.answers import snap_headers
from eqrisk.api.deps import SnapshotDep
from eqrisk.api.endpoint import Doc, Endpoint
from eqrisk.api.formats import etag_for, json_response
from eqrisk.api.models import ERRORS, HealthResponse


# The answer is a function of the served version (its manifest): its strong ETag names the
# version, so the compression middleware keeps the compressed bytes and a health check does not
# compress the same 7 kB again on the event loop each time (docs/decisions/request-path.md).
async def health(snap: SnapshotDep) -> Response:
    return json_response(
        {
            "status": "ok",
            "model_version": snap.version,
            "data_as_of": snap.manifest["data_as_of"],
            "risk_accuracy": snap.manifest.get("risk_accuracy"),
        },
        headers={**snap_headers(snap), "ETag": etag_for(snap.version, "/api/health")},
    )


ENDPOINT: Endpoint[Any, Any] = Endpoint(
    path="/api/health",
    service="risk",
    price_key="health",
    open=True,
    handler=health,
    doc=Doc(
        summary="Liveness and the served model version (no key needed)",
        response_model=HealthResponse,
        responses={503: ERRORS[503], 500: ERRORS[500]},
    ),
)
