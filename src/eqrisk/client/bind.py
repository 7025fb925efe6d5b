"""One definition of a client method for `Client` and `AsyncClient`: `method(build)`, where
`build` takes the method's parameters and returns the `Call` to send. Read from a `Client` (a
`Runs`) it is a method that runs the call and returns the answer; from an `AsyncClient` (an
`AsyncRuns`), a coroutine method that awaits it. Both have `build`'s signature and docstring,
so the two clients cannot drift apart."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Coroutine
from typing import Any, Generic, ParamSpec, TypeVar, overload

from eqrisk.client.calls import Call

P = ParamSpec("P")
T = TypeVar("T")


class Runs:
    """A sync client: `_run` sends a call and returns its answer."""

    def _run(self, call: Call[T]) -> T:  # pragma: no cover - the client's own _run is called
        raise NotImplementedError


class AsyncRuns:
    """An async client: `_run` sends a call and returns its answer, awaited."""

    async def _run(self, call: Call[T]) -> T:  # pragma: no cover - the client's own _run
        raise NotImplementedError


class method(Generic[P, T]):
    """A client method built from `build`, bound as the client's kind asks (module doc)."""

    def __init__(self, build: Callable[P, Call[T]]) -> None:
        self.build = build
        self.sync = self._sync_function(build)
        self.aio = self._async_function(build)

    @staticmethod
    def _sync_function(build: Callable[P, Call[T]]) -> Callable[..., T]:
        def run(client: Runs, /, *args: P.args, **kwargs: P.kwargs) -> T:
            return client._run(build(*args, **kwargs))

        return run

    @staticmethod
    def _async_function(build: Callable[P, Call[T]]) -> Callable[..., Coroutine[Any, Any, T]]:
        async def run(client: AsyncRuns, /, *args: P.args, **kwargs: P.kwargs) -> T:
            return await client._run(build(*args, **kwargs))

        return run

    def __set_name__(self, owner: type, name: str) -> None:
        """Name both functions and give them `build`'s signature after `self`, as a method's."""
        signature = inspect.signature(self.build)
        this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        functions: tuple[Callable[..., Any], ...] = (self.sync, self.aio)
        for function in functions:
            function.__name__ = name
            function.__qualname__ = f"{owner.__qualname__}.{name}"
            function.__doc__ = self.build.__doc__
            function.__signature__ = signature.replace(  # type: ignore[attr-defined]
                parameters=[this, *signature.parameters.values()]
            )

    @overload
    def __get__(self, obj: None, owner: type) -> Callable[..., Any]: ...

    @overload
    def __get__(self, obj: Runs, owner: type) -> Callable[P, T]: ...

    @overload
    def __get__(self, obj: AsyncRuns, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, obj: object, owner: type) -> Callable[..., Any]:
        function = self.aio if issubclass(owner, AsyncRuns) else self.sync
        return function if obj is None else types.MethodType(function, obj)
