"""Tests of eqrisk.cli (a package, so that test module names may repeat across folders)."""
