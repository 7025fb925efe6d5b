"""localstripe (PyPI), a local server speaking Stripe's API, as the tests run it: on 127.0.0.1 and
the port given, nothing kept on disk, and sending the `setup_intent.succeeded` event Stripe
sends when a SetupIntent's confirmation succeeds (localstripe sends events for PaymentIntents
but not for SetupIntents). Run: python stripe_stand_in.py PORT."""

from __future__ import annotations

import sys
from typing import Any

from localstripe import resources


def _no_disk(self: Any) -> None:
    """Every test server's store lives in its own memory (no shared /tmp/localstripe.pickle)."""


def _confirm_and_tell(cls: Any, id: str, **kwargs: Any) -> Any:
    obj = _confirm(id, **kwargs)
    if obj.status == "succeeded":
        resources.schedule_webhook(resources.Event("setup_intent.succeeded", obj))
    return obj


_confirm = resources.SetupIntent._api_confirm
resources.Store.dump_to_disk = _no_disk  # type: ignore[method-assign]
resources.SetupIntent._api_confirm = classmethod(_confirm_and_tell)  # type: ignore[method-assign,assignment]
resources.extra_apis[:] = [
    (method, url, resources.SetupIntent._api_confirm if func == _confirm else func)
    for method, url, func in resources.extra_apis
]

if __name__ == "__main__":
    from aiohttp import web
    from localstripe.server import app

    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
