"""Tests of eqrisk.data (a package, so that test module names may repeat across folders)."""
