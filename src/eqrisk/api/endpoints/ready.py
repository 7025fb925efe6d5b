"""`GET /api/ready`: readiness, the state of the snapshot, the accounts database and Redis (no
key, never metered). 200 while this server can answer keyed calls; else 503 with the same
states, so that a load balancer takes it out (docs/decisions/outages.md)."""

# No `from __future__ import annotations`: FastAPI reads these annotations at runtime.

from typing import Any

import anyio
from fastapi import Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from eqrisk.api.endpoint import Doc, open_route
from eqrisk.api.errors import problem_response, problem_responses
from eqrisk.api.formats import json_response
from eqrisk.api.outages import database_state, redis_state, snapshot_state


class ReadyResponse(BaseModel):
    ready: bool = Field(description="Serving: a snapshot is served and the database answers.")
    snapshot: dict[str, Any] = Field(description="state (up/down), version or error.")
    database: dict[str, Any] = Field(
        description="state (up/down/unknown), since (unix time of the last change), kind."
    )
    redis: dict[str, Any] = Field(
        description="state (up/down/off), since; limits: where they are counted (while Redis "
        "is down, in each process)."
    )


async def ready(request: Request) -> Response:
    app = request.app
    database = await anyio.to_thread.run_sync(database_state, app.state.accounts)
    redis = await anyio.to_thread.run_sync(redis_state, app.state.limiter)
    # The drivers' messages name hosts and ports: they stay in the log, not in a public answer.
    states = {
        "snapshot": snapshot_state(app.state.snapshots),
        "database": {k: v for k, v in database.items() if k != "error"},
        "redis": {k: v for k, v in redis.items() if k != "error"},
    }
    if states["snapshot"]["state"] == "up" and states["database"]["state"] == "up":
        return json_response({"ready": True, **states})
    down = [name for name in ("snapshot", "database") if states[name]["state"] != "up"]
    retry = str(max(1, round(app.state.accounts.backend.retry_s)))
    return problem_response(
        request,
        "SERVICE_UNAVAILABLE",
        f"not ready: {' and '.join(down)} unavailable",
        {"Retry-After": retry},
        ready=False,
        **states,
    )


ENDPOINT = open_route(
    "/api/ready",
    ready,
    Doc(
        summary="Readiness: the snapshot, the database and Redis (no key needed)",
        description=(
            "200 while this server can answer keyed calls: a snapshot is served and the "
            "accounts database answers. Otherwise 503 (problem+json, with the same states and "
            "`Retry-After`), so that a load balancer takes it out. Redis down is reported but "
            "not a reason to be out: limits are then counted in each process."
        ),
        response_model=ReadyResponse,
        responses=problem_responses(503),
    ),
    method="GET",
)
