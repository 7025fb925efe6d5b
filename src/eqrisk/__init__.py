"""eqrisk: open equity-risk data services."""

__version__ = "0.1.0"
