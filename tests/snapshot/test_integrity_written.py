"""The digests a build computes as it writes (`integrity.save_array`) are the files' own: a
version's checksums are the same whether its files were hashed from memory or read back."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from eqrisk.snapshot import integrity


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    wide = rng.normal(size=(40, 128))
    wide[3] = np.nan
    return {
        "float64": wide,
        "float32": wide.astype(np.float32),
        "uint8": rng.integers(0, 255, (9, 7), dtype=np.uint8),
        "empty": np.zeros((0, 5)),
        "scalar": np.array(2.5),
        "fortran": np.asfortranarray(wide),  # written in its own order: read back
        "strided": wide[:, ::3],  # not contiguous: read back
        "objects": np.array(["a", None], dtype=object),  # pickled: read back
    }


def test_remembered_digests_are_the_files(tmp_path: Path) -> None:
    for name, values in _arrays().items():
        integrity.save_array(tmp_path / f"{name}.npy", values)
    remembered = integrity.record(tmp_path)
    for path in tmp_path.iterdir():  # nothing left remembered: every file read back
        assert integrity._remembered(path) is None
    assert integrity.record(tmp_path) == remembered
    assert remembered["files"] == {
        p.name: integrity.file_digest(p) for p in sorted(tmp_path.iterdir())
    }


def test_a_file_changed_after_it_was_written_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.npy"
    integrity.save_array(path, np.arange(64.0))
    with open(path, "r+b") as fh:  # the same size, another byte, another time
        fh.seek(-1, os.SEEK_END)
        fh.write(b"\x01")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert integrity.record(tmp_path)["files"]["a.npy"] == integrity.file_digest(path)
