"""Tests of eqrisk.snapshot (a package, so that test module names may repeat across folders)."""
