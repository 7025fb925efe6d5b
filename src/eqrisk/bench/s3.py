"""A local server speaking the S3 API (moto's, in a child process), for `eqrisk bench cache`
and the tests of snapshots on a bucket: started on a free port with one empty bucket, stopped
when the block ends. moto keeps the objects in its process's memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from eqrisk.bench.served import free_port, stop

# moto checks no signature: any credentials do, but the client needs some.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "eqrisk-local",
    "AWS_SECRET_ACCESS_KEY": "eqrisk-local",
    "AWS_REGION": "us-east-1",
}


@dataclass(frozen=True)
class LocalS3:
    endpoint: str
    bucket: str
    pid: int

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def env(self, prefix: str = "") -> dict[str, str]:
        """The variables that point eqrisk (and obstore) at this bucket."""
        return {
            **CREDENTIALS,
            "EQRISK_SNAPSHOT_BUCKET": self.url(prefix),
            "EQRISK_SNAPSHOT_BUCKET_ENDPOINT": self.endpoint,
        }


@contextmanager
def local_s3(bucket: str = "eqrisk-snapshots") -> Iterator[LocalS3]:
    """moto's S3 server on 127.0.0.1 with `bucket` created; the credentials it takes are set in
    this process's environment for the block (the child processes inherit them)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto's S3 server exited ({proc.returncode})")
            try:
                httpx.get(endpoint, timeout=5)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not start in 120 s") from None
                time.sleep(0.1)
        httpx.put(f"{endpoint}/{bucket}", timeout=30).raise_for_status()
        os.environ.update(CREDENTIALS)
        yield LocalS3(endpoint, bucket, proc.pid)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        stop(proc, 10)
