"""One lock around `ast.parse` for the whole process, on the Pythons whose AST constructor is not
thread-safe.

CPython before 3.13 keeps the AST constructor's recursion depth in one counter per interpreter
(python/cpython#106905). When the constructor of one thread lets another run (a collection
that calls a finaliser), and that thread builds an AST too, the first one fails with
`SystemError: AST constructor recursion depth mismatch`. Both sides of that race run in every
build: numpy reads each `.npy` header with `ast.literal_eval` (the long table's and the
accuracy record's threads read arrays) and numba parses a kernel's source with `ast.parse`
when it compiles one (the build's thread, on a new installation or after an upgrade). `install`
wraps `ast.parse`, which `literal_eval` calls, in one re-entrant lock; the package installs it
when it is imported (`eqrisk/__init__.py`).
"""

from __future__ import annotations

import ast
import sys
import threading
from functools import wraps
from typing import Any

LOCK = threading.RLock()
FIXED_IN = (3, 13)  # the AST constructor keeps its depth per call from there on


def install() -> bool:
    """Wrap `ast.parse` in `LOCK` (once; not on a Python where the constructor is safe);
    whether it is wrapped now."""
    if sys.version_info >= FIXED_IN:
        return False
    if getattr(ast.parse, "__eqrisk_locked__", False):
        return True
    parse = ast.parse

    @wraps(parse)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with LOCK:
            return parse(*args, **kwargs)

    locked.__eqrisk_locked__ = True  # type: ignore[attr-defined]
    ast.parse = locked
    return True
