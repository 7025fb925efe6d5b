"""The process-wide lock around `ast.parse` (`eqrisk.ast_lock`): numpy's header reads
(`ast.literal_eval`) and numba's source parses (`ast.parse`) on two threads at once fail now and
then on CPython before 3.13 with "AST constructor recursion depth mismatch" (a build's test
did, once, on 3.11.7)."""

from __future__ import annotations

import ast
import gc
import io
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import eqrisk  # noqa: F401  (installs the lock)
from eqrisk import ast_lock

pytestmark = pytest.mark.skipif(
    sys.version_info >= ast_lock.FIXED_IN, reason="the AST constructor is thread-safe there"
)


def test_importing_eqrisk_puts_ast_parse_and_literal_eval_behind_the_lock() -> None:
    """With the lock held by this thread, another thread's `ast.literal_eval` (numpy's header
    read) waits for it, then answers; installing again wraps nothing twice."""
    assert ast_lock.install() is True
    assert getattr(ast.parse, "__eqrisk_locked__", False)
    assert ast.parse.__wrapped__.__name__ == "parse"  # type: ignore[attr-defined]
    answers: list[object] = []
    with ast_lock.LOCK:
        reader = threading.Thread(target=lambda: answers.append(ast.literal_eval("{'a': (1, 2)}")))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and answers == []
    reader.join(10)
    assert answers == [{"a": (1, 2)}]


class _Cycle:
    """An object in a reference cycle with a finaliser that runs Python code: a collection
    inside the AST constructor runs it, and the interpreter may switch threads there."""

    def __del__(self) -> None:
        total = 0
        for i in range(50):
            total += i


def test_headers_read_while_a_source_is_parsed_never_fail() -> None:
    """The race as a build meets it: one thread reads .npy headers as `np.load` does, another
    parses a module's source as numba's compiler does, with collections frequent and thread
    switches as often as the interpreter allows. Without the lock this ran into the
    SystemError about once every 2 seconds on the development VM; with it, never."""
    source = Path(ast.__file__).read_text()  # a module's source, as numba parses one
    header = io.BytesIO()
    np.save(header, np.zeros((928, 128)))
    errors: list[str] = []
    stop = time.monotonic() + 3.0

    def headers() -> None:
        while time.monotonic() < stop:
            header.seek(0)
            try:
                np.lib.format.read_magic(header)
                shape, _, _ = np.lib.format.read_array_header_1_0(header)
                assert shape == (928, 128)
            except SystemError as exc:
                errors.append(str(exc))

    def parses() -> None:
        while time.monotonic() < stop:
            for _ in range(200):
                a, b = _Cycle(), _Cycle()
                a.other, b.other = b, a  # type: ignore[attr-defined]
            try:
                ast.parse(source)
            except SystemError as exc:
                errors.append(str(exc))

    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(50)
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=headers), threading.Thread(target=parses)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)
    assert errors == []
