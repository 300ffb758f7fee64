"""Static checks on generated Python that the CPU interpreter cannot catch.

A @triton.jit function may only read module globals that are tl.constexpr values or other jit
functions: the interpreter runs such code happily, the GPU compiler rejects it.
"""

from __future__ import annotations

import ast


def _is_jit(decorator: ast.expr) -> bool:
    """@triton.jit or @triton.jit(...) (FlyDSL's @flyc.jit traces in Python and may read globals)."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (
        isinstance(target, ast.Attribute)
        and target.attr == "jit"
        and isinstance(target.value, ast.Name)
        and target.value.id == "triton"
    )


def _is_constexpr_value(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "constexpr"


def jit_global_problems(source: str, filename: str) -> list[str]:
    tree = ast.parse(source)
    plain_globals: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and not _is_constexpr_value(node.value):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    plain_globals[target.id] = node.lineno
    problems = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or not any(_is_jit(d) for d in fn.decorator_list):
            continue
        local = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in plain_globals and n.id not in local:
                problems.append(
                    f"{filename}:{n.lineno}: jit function {fn.name} reads global {n.id} (line {plain_globals[n.id]}),"
                    " which is not a tl.constexpr: the GPU compiler rejects this (the interpreter does not)"
                )
    return problems
