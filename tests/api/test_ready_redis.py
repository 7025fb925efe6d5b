"""Issue 37: `/api/ready` asks Redis (PING, bounded by the Redis timeouts) each time it is
asked, so the state it reports is what Redis does now, whichever worker answers, not what that
worker's last request saw (the backend's retry interval is a minute here: a state remembered
from before would still be shown)."""

from __future__ import annotations

from pathlib import Path

from helpers import REDIS_URL, client_for
from proxy import Proxy


def test_ready_reports_redis_as_it_is_now(demo_home: Path, tmp_path: Path) -> None:
    port = int(REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    with Proxy(port) as proxy:
        client = client_for(
            tmp_path / "home",
            snapshots=demo_home / "snapshots",
            redis_url=f"redis://127.0.0.1:{proxy.port}/0",
            redis_timeout_s=0.5,
            redis_connect_timeout_s=0.5,
            backend_retry_s=60,
        )
        first = client.get("/api/ready")
        assert first.status_code == 200 and first.json()["redis"]["state"] == "up"
        proxy.cut()  # no request uses Redis in between
        down = client.get("/api/ready")
        assert down.status_code == 200  # Redis down alone keeps the server in
        assert down.json()["redis"]["state"] == "down"
        proxy.restore()
        assert client.get("/api/ready").json()["redis"]["state"] == "up"
