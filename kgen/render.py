"""Strict Jinja rendering, then `ast.parse` and pinned black formatting (byte-stable output)."""

from __future__ import annotations

import ast
import functools
import hashlib
import sys
from pathlib import Path
from typing import Any, Iterable

import black
import jinja2
import jinja2.meta

from kgen.errors import KgenError
from kgen.toolchain import LINE_LENGTH


def _packaged_templates() -> Path:
    """kgen's own templates: the checkout's top-level templates/ (source tree, editable install),
    else the copy shipped inside the installed package as kgen/templates (wheel install)."""
    checkout = Path(__file__).resolve().parent.parent / "templates"
    if (checkout / "triton").is_dir():
        return checkout
    from importlib.resources import files

    return Path(str(files("kgen") / "templates"))


# A project root with a templates/ folder of its own uses that instead.
TEMPLATES_DIR = _packaged_templates()


def templates_dir(root: Path) -> Path:
    """[tool.kgen].templates of the root's pyproject.toml, else root/templates when it exists,
    else kgen's own templates."""
    from kgen.config import load_config

    configured = load_config(root).templates
    if configured is not None:
        return configured
    return root / "templates" if (root / "templates").is_dir() else TEMPLATES_DIR


@functools.lru_cache(maxsize=None)
def _environment(directory: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(template: str, context: dict[str, Any], origin: str, directory: Path = TEMPLATES_DIR) -> str:
    """Render `template`, check it parses as Python, format it. `origin` names the spec/variant."""
    try:
        source = _environment(directory.resolve()).get_template(template).render(**context)
    except jinja2.TemplateError as err:
        raise KgenError(f"{_template_location(template, err)}: {err} (rendering {origin})") from None
    try:
        ast.parse(source)
    except SyntaxError as err:
        raise KgenError(f"templates/{template} rendered invalid Python for {origin}: line {err.lineno}: {err.msg}") from None
    return black.format_str(source, mode=black.Mode(line_length=LINE_LENGTH))


def template_closure(template: str, directory: Path = TEMPLATES_DIR) -> set[str]:
    """The template and every template it includes or extends, transitively."""
    env = _environment(directory.resolve())
    seen, todo = set(), [template]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        source = env.loader.get_source(env, name)[0]
        todo += [t for t in jinja2.meta.find_referenced_templates(env.parse(source)) if t]
    return seen


def templates_sha256(templates: Iterable[str], directory: Path = TEMPLATES_DIR) -> str:
    """One hash over the named templates' bytes (names included, sorted)."""
    digest = hashlib.sha256()
    for name in sorted(set(templates)):
        digest.update(name.encode() + b"\0" + (directory / name).read_bytes() + b"\0")
    return digest.hexdigest()


def _template_location(template: str, err: Exception) -> str:
    """templates/<file>:<line> of the failing template statement, found in the traceback."""
    line = getattr(err, "lineno", None)
    tb = sys.exc_info()[2]
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(".jinja"):
            line = tb.tb_lineno
        tb = tb.tb_next
    return f"templates/{template}:{line}" if line else f"templates/{template}"
