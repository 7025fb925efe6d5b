"""Tests of eqrisk.model (a package, so that test module names may repeat across folders)."""
