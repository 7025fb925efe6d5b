"""`python -m eqrisk`: the `eqrisk` command."""

from eqrisk.cli import main

main()
