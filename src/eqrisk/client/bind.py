"""One definition of a client method for `Client` and `AsyncClient`: `@method` on a function
written in a mixin's class body, without `self`, that takes the method's parameters and returns
the `Call` to send, or for a method of several calls a generator of them (`Steps`: each
`yield call` is the call's answer, the `return` the method's). Read from a `Client` (a `Runs`)
it is a method that runs the calls and returns the answer; from an `AsyncClient` (an
`AsyncRuns`), a coroutine method that awaits them. Both have the function's name, signature and
docstring, so the two clients cannot drift apart."""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, ParamSpec, TypeAlias, TypeVar, cast, overload

from eqrisk.client.calls import Call

P = ParamSpec("P")
T = TypeVar("T")
Steps: TypeAlias = Generator[Call[Any], Any, T]


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

    def __init__(self, build: Callable[P, Call[T] | Steps[T]]) -> None:
        self.build = build
        self.sync = self._sync_function(build)
        self.aio = self._async_function(build)

    @staticmethod
    def _sync_function(build: Callable[P, Call[T] | Steps[T]]) -> Callable[..., T]:
        def run(client: Runs, /, *args: P.args, **kwargs: P.kwargs) -> T:
            made = build(*args, **kwargs)
            if isinstance(made, Call):
                return client._run(made)
            answer: Any = None
            while True:
                try:
                    call = made.send(answer)
                except StopIteration as done:
                    return cast(T, done.value)
                answer = client._run(call)

        return run

    @staticmethod
    def _async_function(
        build: Callable[P, Call[T] | Steps[T]],
    ) -> Callable[..., Coroutine[Any, Any, T]]:
        async def run(client: AsyncRuns, /, *args: P.args, **kwargs: P.kwargs) -> T:
            made = build(*args, **kwargs)
            if isinstance(made, Call):
                return await client._run(made)
            answer: Any = None
            while True:
                try:
                    call = made.send(answer)
                except StopIteration as done:
                    return cast(T, done.value)
                answer = await client._run(call)

        return run

    def __set_name__(self, owner: type, name: str) -> None:
        """Name both functions and give them `build`'s signature after `self`, as a method's,
        returning what the call answers (`T` of `Call[T]` or `Steps[T]`)."""
        signature = inspect.signature(self.build)
        this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        answer = re.fullmatch(r"(?:Call|Steps)\[(.*)\]", str(signature.return_annotation))
        if answer is not None:
            signature = signature.replace(return_annotation=answer.group(1))
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
