"""Tests of eqrisk.api (a package, so that test module names may repeat across folders)."""
