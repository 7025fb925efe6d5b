"""Tests of eqrisk.bench (a package, so that test module names may repeat across folders)."""
