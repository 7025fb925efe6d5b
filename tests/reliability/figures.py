"""The suite's summary lines: each part adds one line of figures; the conftest prints them in
pytest's terminal summary."""

from __future__ import annotations

LINES: list[str] = []


def add_figures(label: str, **values: object) -> None:
    """One line of figures in the terminal summary, labelled (a test id or a part's name)."""
    LINES.append(f"{label}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
