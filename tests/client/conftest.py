"""Fixtures of the client tests: the demo snapshot with test keys, one real `eqrisk serve` per
module, and clients of it or of the app in process."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from eqrisk.api.app import create_app
from eqrisk.client import Client
from eqrisk.settings import Settings
from helpers import Server, register_key

FUNDED = "client-test-funded-key"
SLOW = "client-test-one-per-second"
MakeClient = Callable[..., Client]


@pytest.fixture(scope="module")
def home(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo snapshot with a funded key and a key allowed one call per second."""
    target = tmp_path_factory.mktemp("client-home")
    shutil.copytree(demo_home / "snapshots", target / "snapshots")
    register_key(target, FUNDED)
    register_key(target, SLOW, rate_limit="1/second")
    return target


@pytest.fixture(scope="module")
def server(home: Path) -> Iterator[Server]:
    with Server(home) as running:
        yield running


@pytest.fixture(params=["served", "in-process"])
def make(request: pytest.FixtureRequest, home: Path) -> Iterator[MakeClient]:
    """Clients of a real server, or of the app in process through an httpx.ASGITransport."""
    made: list[Client] = []

    def factory(api_key: str = FUNDED, **kw: object) -> Client:
        if request.param == "served":
            client = Client(request.getfixturevalue("server").base, api_key, **kw)  # type: ignore[arg-type]
        else:
            app = create_app(Settings(home=home, _env_file=None))
            client = Client(api_key=api_key, transport=httpx.ASGITransport(app), **kw)  # type: ignore[arg-type]
        made.append(client)
        return client

    yield factory
    for client in made:
        client.close()
