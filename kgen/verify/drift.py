"""Drift: regenerate in memory and compare with generated/ and its lock, byte for byte."""

from __future__ import annotations

from pathlib import Path

from kgen.verify.static import jit_global_problems
from kgen.emit import LOCK_NAME, Output, lock_text, plan_lock, read_lock


def drift_problems(generated: Path, outputs: list[Output], spec_paths: list[str]) -> list[str]:
    """Every way generated/ differs from what the specs produce now (empty when in sync)."""
    problems = []
    for out in outputs:
        path = generated / out.relpath
        try:
            on_disk = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            problems.append(f"{_show(path)}: missing")
            continue
        if on_disk != out.text:
            problems.append(f"{_show(path)}: differs from what {out.spec} generates now")
        try:
            problems += jit_global_problems(on_disk, _show(path))
        except SyntaxError as err:
            problems.append(f"{_show(path)}:{err.lineno}: not valid Python: {err.msg}")
    old = read_lock(generated)
    expected, stale = plan_lock(old, outputs, spec_paths)
    for relpath in stale:
        problems.append(f"{_show(generated / relpath)}: no spec produces it any more")
    lock_path = generated / LOCK_NAME
    try:
        lock_on_disk = lock_path.read_text(encoding="utf-8")
    except OSError:
        lock_on_disk = None
    if lock_on_disk != lock_text(expected):
        problems.append(f"{_show(lock_path)}: " + ("missing" if lock_on_disk is None else "out of date"))
    # Files in a spec's output folder that neither the lock nor the spec knows about.
    known = set(expected) | {o.relpath for o in outputs}
    for folder in sorted({Path(o.relpath).parts[0] for o in outputs}):
        for stray in sorted((generated / folder).glob("*.py")):
            rel = stray.relative_to(generated).as_posix()
            if rel not in known and not rel.endswith("__init__.py"):
                problems.append(f"{_show(stray)}: not produced by any spec")
    return problems


def _show(path: Path) -> str:
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()
