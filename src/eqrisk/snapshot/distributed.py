"""`eqrisk build --dask`: the model's per-symbol work on a Dask cluster, block by block.

The builder plans the run (returns, factor layout, flat factors: what needs the universe),
scatters the small shared factor series to every worker once, and sends each block of symbols
its own rows only; the workers run `eqrisk.model.run.run_block`, the very function of the local
build, so the numbers are the same bit for bit. Blocks go out a few per worker at a time, so a
worker holds a bounded number of blocks (plus the shared series), never the universe. Their
arrays come back to the builder, which writes the version as a local build does.

Workers need eqrisk installed (the same version as the builder); they read and write no file.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from eqrisk.data.panel import Panel
from eqrisk.model.run import (
    BlockInput,
    ModelParams,
    ModelResult,
    SharedFactors,
    finish_model,
    plan_model,
    run_block,
)

if TYPE_CHECKING:
    from distributed import Client

# Blocks in flight per worker: one running, one on its way (the transfer hides behind the work).
IN_FLIGHT_PER_WORKER = 2

# numba's default threading layer must not be entered by two threads of one process at once:
# a worker started with several threads runs its blocks one at a time, each in parallel inside.
_KERNEL_LOCK = threading.Lock()


class DaskUnavailable(RuntimeError):
    """No Dask cluster to build on (the scheduler is unreachable, or has no worker)."""


def _block_task(
    shared: SharedFactors, block: BlockInput, threads: int | None
) -> dict[str, np.ndarray]:
    """What a worker runs for one block."""
    import numba

    with _KERNEL_LOCK:
        if threads:
            ceiling = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # set at import
            numba.set_num_threads(max(1, min(threads, ceiling)))
        return run_block(shared, block)


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
    try:
        yield client
    finally:
        client.close()


def _worker_threads(client: Client) -> tuple[int, int | None]:
    """(workers, numba threads per block): the cores of this host shared among the worker
    processes of a LocalCluster; workers elsewhere (or threads of this process) keep numba's
    default, all of their host's cores."""
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
    hosts = {urlsplit(address).hostname for address in workers}
    local = hosts <= {"127.0.0.1", "localhost", "::1"}
    threads = max(1, (os.cpu_count() or 1) // len(workers)) if local else None
    return len(workers), threads


def run_model_dask(
    panel: Panel,
    master: pd.DataFrame,
    params: ModelParams,
    client: Client,
    *,
    exclude: np.ndarray | None = None,
    block_rows: int = 500,
    progress: Callable[[str], None] | None = None,
) -> ModelResult:
    """`run_model` with the blocks run on the cluster of `client` (the same result, bit for
    bit); says `blocks done/total` as they come back."""
    from distributed import as_completed

    say = progress or (lambda _msg: None)
    plan = plan_model(panel, master, params, exclude=exclude)
    bounds = plan.blocks(block_rows)
    workers, threads = _worker_threads(client)
    shared = client.scatter(plan.shared, broadcast=True, hash=False)
    run_id = uuid.uuid4().hex[:8]
    start_of: dict[object, int] = {}
    queue = iter(bounds)
    running = as_completed()

    def submit_next() -> None:
        bound = next(queue, None)
        if bound is None:
            return
        start, stop = bound
        block = client.scatter(plan.block(start, stop), hash=False)
        future = client.submit(
            _block_task, shared, block, threads, key=f"eqrisk-block-{run_id}-{start}", pure=False
        )
        start_of[future.key] = start
        running.add(future)

    for _ in range(workers * IN_FLIGHT_PER_WORKER):
        submit_next()
    n, n_t = plan.returns.shape
    joined: dict[str, np.ndarray] = {}
    say(f"blocks 0/{len(bounds)} done ({workers} workers, {block_rows} symbols a block)")
    for done, future in enumerate(running, start=1):
        arrays: dict[str, np.ndarray] = future.result()
        start = start_of.pop(future.key)
        future.release()
        submit_next()
        for name, arr in arrays.items():
            if name not in joined:
                joined[name] = np.empty((n, n_t), dtype=arr.dtype)
            joined[name][start : start + len(arr)] = arr
        say(f"blocks {done}/{len(bounds)} done")
    return finish_model(plan, [(0, joined)])
