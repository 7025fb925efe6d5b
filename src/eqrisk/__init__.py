"""eqrisk: open equity-risk data services."""

from eqrisk.ast_lock import install as _install_ast_lock

__version__ = "0.1.0"

_install_ast_lock()  # threads that read arrays while numba compiles (eqrisk.ast_lock)
