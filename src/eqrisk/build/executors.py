"""Where a build's blocks run: one interface, `Executor.map`, and two executors.

`map(task, shared, items, make)` runs `task(shared, make(item))` for every item and yields
`(item, answer)` as the answers come: `shared` is what every block reads (the factor series),
`make(item)` builds one block's inputs (read or sliced when the block is about to run, so that
the builder never holds more than a few blocks' inputs); `ship` names a folder on the store
every host mounts where a cluster's tasks read their inputs.

- `Local`: this process, one block after the other (a block's answer is handed on and dropped
  before the next block is made).
- `OnDask`: the workers of a Dask cluster (`dask_client`). `shared` travels once, as a task of
  its own (the scheduler holds its inputs and recomputes it when the worker that held it is
  lost); each block's inputs travel inside its task, or, with `ship`, in a file there that
  the task reads, never scattered to one worker, so that the scheduler reruns the task of a
  lost worker on another. At most
  IN_FLIGHT_PER_WORKER tasks a worker are submitted at a time. The cluster gone (scheduler
  unreachable, every worker lost) is `DaskUnavailable`, one line.

A task must be a module-level function (Dask pickles it by name) and give the same answer
wherever it runs: the build's blocks give the same version, bit for bit, on either executor.
"""

from __future__ import annotations

import logging
import os
import pickle
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from distributed import Client, Future

# Blocks in flight per worker: one running, one on its way (the transfer hides behind the work).
IN_FLIGHT_PER_WORKER = 2
# A task that raised is tried again this many times (a task whose worker was lost is rerun
# elsewhere by the scheduler anyway, up to distributed.scheduler.allowed-failures times).
TASK_RETRIES = 1

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")
# task(shared, block inputs, numba threads or None) -> the block's answer
Task = Callable[[Any, Any, "int | None"], Any]


class DaskUnavailable(RuntimeError):
    """No Dask cluster to build on (the scheduler is unreachable, or has no worker)."""


class Executor(Protocol):
    """Runs a build's blocks (see the module docstring)."""

    @property
    def workers(self) -> int:
        """How many blocks run at once."""

    def describe(self) -> str:
        """Where the blocks run, for the progress lines."""

    def map(
        self,
        task: Task,
        shared: Any,
        items: Sequence[T],
        make: Callable[[T], Any],
        *,
        name: str = "block",
        ship: Path | None = None,
    ) -> Iterator[tuple[T, Any]]: ...


class Local:
    """The blocks in this process, one after the other (numba's threads inside each)."""

    workers = 1

    def describe(self) -> str:
        return "in process"

    def map(
        self,
        task: Task,
        shared: Any,
        items: Sequence[T],
        make: Callable[[T], Any],
        *,
        name: str = "block",
        ship: Path | None = None,
    ) -> Iterator[tuple[T, Any]]:
        for item in items:
            yield item, task(shared, make(item), None)


class OnDask:
    """The blocks on the workers of the cluster of `client`; with `ship` (a folder on the store
    every host mounts), each block's inputs go through a file there instead of the task."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.workers, self.threads = _worker_threads(client)
        self.run_id = uuid.uuid4().hex[:8]
        self._shared: dict[int, Future[Any]] = {}

    def describe(self) -> str:
        return f"{self.workers} workers"

    def _shared_future(self, shared: Any) -> Future[Any]:
        """`shared` as a task, not scattered data: the scheduler keeps the task's inputs, so
        a worker lost with the only copy (Dask's memory manager drops the replicas a broadcast
        made) costs a recomputation, not the build. Submitted once per object."""
        key = id(shared)
        if key not in self._shared:
            with _large_tasks():
                self._shared[key] = self.client.submit(
                    _identity,
                    shared,
                    key=f"eqrisk-shared-{self.run_id}-{len(self._shared)}",
                    pure=False,
                    retries=TASK_RETRIES,
                )
        return self._shared[key]

    def map(
        self,
        task: Task,
        shared: Any,
        items: Sequence[T],
        make: Callable[[T], Any],
        *,
        name: str = "block",
        ship: Path | None = None,
    ) -> Iterator[tuple[T, Any]]:
        future = self._shared_future(shared)
        tag = uuid.uuid4().hex[:6]

        def submit(numbered: tuple[int, T]) -> Future[Any]:
            i, item = numbered
            key = f"eqrisk-{name}-{self.run_id}-{tag}-{i}"
            if ship is None:
                with _large_tasks():  # the block rides in the task: rerunnable elsewhere
                    return self.client.submit(
                        task, future, make(item), self.threads,
                        key=key, pure=False, retries=TASK_RETRIES,
                    )  # fmt: skip
            path = ship / f"{name}-{tag}-{i}.pickle"
            dump(make(item), path)
            return self.client.submit(
                _from_file, task, future, str(path), self.threads,
                key=key, pure=False, retries=TASK_RETRIES,
            )  # fmt: skip

        numbered = list(enumerate(items))
        for (_i, item), answer in _in_flight(numbered, submit, self.workers):
            yield item, answer


def dump(value: Any, path: Path) -> None:
    """Write a block's inputs where every worker reads them (whole or not at all)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    with open(tmp, "wb") as fh:
        pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def _from_file(task: Task, shared: Any, path: str, threads: int | None) -> Any:
    """A worker's task whose inputs are in a file of the store."""
    with open(path, "rb") as fh:
        inputs = pickle.load(fh)
    return task(shared, inputs, threads)


@contextmanager
def dask_client(address: str, *, workers: int | None = None) -> Iterator[Client]:
    """A client of the cluster `address` names: 'local' starts a LocalCluster of `workers`
    single-threaded worker processes (default: one per core) for the build's duration; anything
    else is a scheduler address (tcp://host:8786) of a running cluster."""
    from distributed import Client, LocalCluster

    if address == "local":
        n = workers or os.cpu_count() or 1
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.WARNING,
        )
        try:
            with Client(cluster) as client:
                yield client
        finally:
            cluster.close()
        return
    try:
        client = Client(address)  # waits distributed.comm.timeouts.connect (30 s by default)
    except OSError as exc:
        raise DaskUnavailable(
            f"no Dask scheduler at {address} ({exc}): start one (`dask scheduler`, then "
            "`dask worker ADDRESS` on each worker host), or build with --dask local or without "
            "--dask"
        ) from None
    # A scheduler lost mid-build is eqrisk's one line (DaskUnavailable); the client's own
    # account of it (an ERROR record, with a traceback at times) would come before it.
    client_log = logging.getLogger("distributed.client")
    level = client_log.level
    client_log.setLevel(logging.CRITICAL)
    try:
        yield client
    finally:
        client.close()
        client_log.setLevel(level)


def _worker_threads(client: Client) -> tuple[int, int | None]:
    """(workers, numba threads per block): the cores of this host shared among the worker
    processes of a LocalCluster; workers elsewhere (or threads of this process) keep numba's
    default, all of their host's cores."""
    from distributed.comm.core import CommClosedError

    try:
        workers: dict[str, int] = client.nthreads()
        if not workers:
            try:
                client.wait_for_workers(1, timeout=60)
            except TimeoutError:
                raise DaskUnavailable(
                    "the Dask scheduler has no worker after 60 s: start some "
                    "(`dask worker SCHEDULER_ADDRESS` on each worker host)"
                ) from None
            workers = client.nthreads()
    except (CommClosedError, OSError) as exc:  # the scheduler gone while we asked or waited
        raise DaskUnavailable(
            f"the Dask cluster went away before the build began ({_one_line(exc)}); nothing "
            "changed: restart it, or build without --dask"
        ) from None
    hosts = {urlsplit(address).hostname for address in workers}
    local = hosts <= {"127.0.0.1", "localhost", "::1"}
    threads = max(1, (os.cpu_count() or 1) // len(workers)) if local else None
    return len(workers), threads


@contextmanager
def _large_tasks() -> Iterator[None]:
    """A block's inputs travel inside its task on purpose (a few MB: what makes it rerunnable
    elsewhere): Dask's warning about large objects in a task graph is not for this case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ll]arge object.*")
        yield


def _identity(value: Any) -> Any:
    return value


def _result(future: Future[Any]) -> Any:
    """A task's result; the cluster gone (the scheduler unreachable, every worker lost, a task
    that killed its workers again and again) is DaskUnavailable, one line."""
    from distributed import KilledWorker
    from distributed.comm.core import CommClosedError

    try:
        return future.result()
    except KilledWorker as exc:
        raise DaskUnavailable(
            f"the Dask build lost its workers ({_one_line(exc)}); nothing changed: check the "
            "workers' memory and logs, or build without --dask"
        ) from None
    except (CommClosedError, CancelledError, OSError) as exc:
        raise DaskUnavailable(
            f"the Dask cluster went away during the build ({_one_line(exc)}); nothing "
            "changed: restart it, or build without --dask"
        ) from None


def _one_line(exc: BaseException, most: int = 200) -> str:
    """An exception as a short line (Dask's messages span lines)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= most else text[: most - 3] + "..."


def _in_flight(
    items: Sequence[Any], submit: Callable[[Any], Future[Any]], workers: int
) -> Iterator[tuple[Any, Any]]:
    """(item, result) of `submit(item)` for every item, as they complete, with at most
    IN_FLIGHT_PER_WORKER tasks per worker submitted at a time: the inputs of a task are sent
    when it is submitted, so the cluster never holds more than a few blocks' inputs."""
    from distributed import as_completed

    queue = iter(items)
    running = as_completed()
    item_of: dict[object, Any] = {}

    def submit_next() -> None:
        item = next(queue, None)
        if item is not None:
            future = submit(item)
            item_of[future.key] = item
            running.add(future)

    for _ in range(workers * IN_FLIGHT_PER_WORKER):
        submit_next()
    for future in running:
        result = _result(future)
        item = item_of.pop(future.key)
        future.release()
        submit_next()
        yield item, result
