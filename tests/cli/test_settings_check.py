"""Every setting is validated when a command starts: a bad value is one stderr line naming the
variable and why (never a secret's value), exit 3, no traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from eqrisk.settings import Settings, SettingsError, load_settings, metrics_address
from helpers import eqrisk_cli

ENV_PROBLEM = 3
SECRET = "hunter2-not-shown"


def _eqrisk(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return eqrisk_cli(home, *args, timeout=120, cwd=home, **env)  # cwd: no eqrisk.toml there


@pytest.mark.parametrize(
    ("variable", "value", "why"),
    [
        ("EQRISK_PORT", "abc", "valid integer"),
        ("EQRISK_PORT", "70000", "less than or equal to 65535"),
        ("EQRISK_DATABASE_URL", "notaurl", "not a postgresql URL"),
        ("EQRISK_DATABASE_URL", f"mysql://u:{SECRET}@h/db", "not a postgresql URL"),
        ("EQRISK_REDIS_URL", "http://127.0.0.1:6379", "not a redis or rediss or unix URL"),
        ("EQRISK_DATABASE_TIMEOUT_S", "-1", "greater than 0"),
        ("EQRISK_REDIS_TIMEOUT_S", "0", "greater than 0"),
        ("EQRISK_DASK", "nohost", "neither 'local' nor a scheduler address"),
        ("EQRISK_INVALID_KEY_LIMIT", "lots", "is not a rate"),
        ("EQRISK_METRICS", "sometimes", "is not off, public or [HOST:]PORT"),
        ("EQRISK_METRICS", "0.0.0.0:99999", "is not off, public or [HOST:]PORT"),
        ("EQRISK_PROVIDER_URLS", '{"yahoo": "ftp://x"}', "not a http or https URL"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_3(
    tmp_path: Path, variable: str, value: str, why: str
) -> None:
    _one_line(_eqrisk(tmp_path, "config", **{variable: value}), variable, why)


def test_serve_refuses_bad_settings_before_anything_else(tmp_path: Path) -> None:
    for variable, value, why in (
        ("EQRISK_PORT", "abc", "valid integer"),
        ("EQRISK_DATABASE_URL", "notaurl", "not a postgresql URL"),
    ):
        _one_line(_eqrisk(tmp_path, "serve", **{variable: value}), variable, why)


def _one_line(proc: subprocess.CompletedProcess[str], variable: str, why: str) -> None:
    assert proc.returncode == ENV_PROBLEM, proc.stderr
    text = proc.stderr.strip()
    assert "Traceback" not in text and text.count("\n") == 0, text
    assert text.startswith("error: invalid setting: ") and variable in text and why in text
    assert SECRET not in text
    assert proc.stdout == ""


def test_every_bad_setting_is_named_at_once(tmp_path: Path) -> None:
    proc = _eqrisk(tmp_path, "config", EQRISK_PORT="abc", EQRISK_WINDOW="3")
    assert proc.returncode == ENV_PROBLEM
    assert "EQRISK_PORT='abc'" in proc.stderr and "EQRISK_WINDOW='3'" in proc.stderr


def test_good_values_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("EQRISK_")]:
        monkeypatch.delenv(name)
    good = {
        "EQRISK_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
        "EQRISK_REDIS_URL": "redis://127.0.0.1:6379/0",
        "EQRISK_DASK": "127.0.0.1:8786",
        "EQRISK_PORT": "8080",
        "EQRISK_METRICS": "0.0.0.0:9100",
    }
    for name, value in good.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.port == 8080 and settings.dask == "127.0.0.1:8786"
    assert metrics_address(settings.metrics, "127.0.0.1") == ("0.0.0.0", 9100)
    assert metrics_address("9100", "127.0.0.1") == ("127.0.0.1", 9100)
    assert Settings(_env_file=None, dask="local").dask == "local"
    monkeypatch.setenv("EQRISK_DASK", "tcp://:8786")
    with pytest.raises(SettingsError, match="EQRISK_DASK"):
        load_settings()
