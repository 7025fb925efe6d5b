"""Tests of eqrisk.accounts (a package, so that test module names may repeat across folders)."""
