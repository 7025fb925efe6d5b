"""`python -m eqrisk.cli`."""

from eqrisk.cli import app

app(prog_name="eqrisk")
