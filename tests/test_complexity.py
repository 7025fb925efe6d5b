"""Functions a reader can hold: no function of the package over cyclomatic complexity 20
(radon's measure), numba kernels exempt (docs/decisions/code-layout.md).

The rule for the exemption: a function compiled by numba (decorated with `njit`, `jit`,
`vectorize`, `guvectorize`, `intrinsic` or `overload`) is exempt, because a kernel's loops and
branches are its arithmetic and splitting it costs a call per element; every other function
is split along its decisions.
"""

from __future__ import annotations

import ast
from pathlib import Path

from radon.complexity import cc_visit

SRC = Path(__file__).resolve().parents[1] / "src" / "eqrisk"
MOST = 20
KERNEL_DECORATORS = {"njit", "jit", "vectorize", "guvectorize", "intrinsic", "overload"}

# Functions over the bound still waiting for their split (the file, the function and its
# complexity when it was listed): the list only shrinks. A listed function that grows fails,
# and one split under the bound must leave the list.
PENDING: dict[tuple[str, str], int] = {}


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _kernels(tree: ast.Module) -> set[int]:
    """The first lines of the numba-compiled functions of a module."""
    return {
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(_decorator_name(d) in KERNEL_DECORATORS for d in node.decorator_list)
    }


def complexities() -> dict[tuple[str, str], int]:
    """Every function over the bound that is not a kernel: (file, name) -> complexity."""
    found: dict[tuple[str, str], int] = {}
    for path in sorted(SRC.rglob("*.py")):
        code = path.read_text()
        kernels = _kernels(ast.parse(code))
        for block in cc_visit(code):
            blocks = [block, *getattr(block, "methods", [])]
            for b in blocks:
                if b.complexity <= MOST or b.lineno in kernels:
                    continue
                if hasattr(b, "methods") and b is block:
                    continue  # a class: its methods are measured one by one
                name = f"{b.classname}.{b.name}" if getattr(b, "classname", None) else b.name
                found[(str(path.relative_to(SRC)), name)] = b.complexity
    return found


def test_no_function_over_complexity_20_outside_kernels() -> None:
    found = complexities()
    new = {k: v for k, v in found.items() if k not in PENDING}
    grown = {k: (PENDING[k], v) for k, v in found.items() if k in PENDING and v > PENDING[k]}
    done = sorted(set(PENDING) - set(found))
    assert not new, f"functions over complexity {MOST}: split them along their decisions: {new}"
    assert not grown, f"listed functions grew (listed, now): {grown}"
    assert not done, f"split under {MOST}: take them off PENDING: {done}"


def test_the_kernel_rule_finds_the_kernels() -> None:
    """The exemption sees the numba kernels (a decorator the rule missed would let a kernel
    fail the bound, or a renamed one slip through as exempt)."""
    tree = ast.parse((SRC / "snapshot" / "row_kernel.py").read_text())
    names = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.lineno in _kernels(tree)
    }
    assert "assemble" in names
