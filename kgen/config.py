"""Where a project keeps its specs, output and templates: `[tool.kgen]` in pyproject.toml.

    [tool.kgen]
    specs = "specs"          # folder of *.yaml specs (default)
    generated = "generated"  # checked-in output and kgen.lock (default)
    templates = "templates"  # the project's own templates (default: kgen's, unless ./templates exists)

Paths are relative to the project root: the folder given by --root, else the nearest folder at
or above the working directory that has a pyproject.toml with [tool.kgen], or a specs/ folder.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from kgen.errors import KgenError

KEYS = ("specs", "generated", "templates")


@dataclass(frozen=True)
class Config:
    root: Path
    specs: Path
    generated: Path
    templates: Path | None  # None: kgen's rule (root/templates when present, else the packaged ones)


def _tool_table(pyproject: Path) -> dict | None:
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise KgenError(f"{pyproject}: cannot read: {err}") from None
    table = data.get("tool", {}).get("kgen") if isinstance(data.get("tool"), dict) else None
    if table is not None and not isinstance(table, dict):
        raise KgenError(f"{pyproject}: [tool.kgen]: expected a table")
    return table


def find_root(start: Path) -> Path:
    """The project root for `start` (see the module doc); `start` itself when none is found."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / "specs").is_dir() or _tool_table(folder / "pyproject.toml") is not None:
            return folder
    return start


def load_config(root: Path) -> Config:
    table = _tool_table(root / "pyproject.toml") or {}
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise KgenError(f"{root / 'pyproject.toml'}: [tool.kgen].{unknown[0]}: unknown key (known: {', '.join(KEYS)})")
    paths = {}
    for key in KEYS:
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise KgenError(f"{root / 'pyproject.toml'}: [tool.kgen].{key}: expected a path string, got {value!r}")
        paths[key] = root / value if value else None
    return Config(root, paths["specs"] or root / "specs", paths["generated"] or root / "generated", paths["templates"])
