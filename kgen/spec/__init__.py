"""Spec loading: YAML (safe, located, strict) into the typed model of `kgen.spec.model`."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kgen.errors import SpecError
from kgen.spec import format as F
from kgen.spec import reader as r
from kgen.spec.model import Dim, Spec, TensorSpec
from kgen.spec.yaml_loc import load_located

__all__ = ["load_spec", "load_specs", "display_path", "Spec"]


def display_path(path: str | os.PathLike) -> str:
    """The path as a user would type it: relative to the working directory when inside it."""
    p = Path(path).resolve()
    try:
        return p.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.as_posix()


def load_spec(path: str | os.PathLike, *, check: bool = True) -> Spec:
    """Read, validate and freeze one spec file; every error is a SpecError with file:line.
    check=False skips the operator's constraint and proof checks (`op.check_spec`, seconds of
    sympy): for callers that need only what the spec declares, such as `kgen list`."""
    from kgen.ops import OPS  # the operator registry imports the spec model; import it late

    shown = display_path(path)
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(shown, None, "", f"cannot read spec: {err}") from None
    _reject_aliases(source, shown)
    try:
        data = load_located(source, shown)
    except RecursionError:
        raise SpecError(shown, None, "", "invalid YAML: nested too deeply") from None
    root = r.Section(data, shown, "", 1)

    name = root.get("name", F.NAME)
    op_name = root.get("op", F.op_field(tuple(sorted(OPS))))
    op = OPS[op_name]
    backends = root.get("backends", F.backends_field(op.backends))
    doc = root.get("doc", F.DOC)
    dims = _parse_dims(root.section("dims"))
    axes, shapes, exclude = _parse_variants(root.section("variants"), dims)
    tensors = _parse_tensors(root.section("tensors"), dims, axes)
    options = op.parse_options(root, dims, dict(axes))
    root.finish()

    spec = Spec(
        path=shown,
        name=name,
        op=op_name,
        backends=backends,
        doc=doc,
        dims=dims,
        tensors=tensors,
        axes=axes,
        exclude=exclude,
        options=options,
        normalized=json.dumps(data, sort_keys=True, separators=(",", ":")),
        shapes=shapes,
    )
    if check:
        op.check_spec(spec, root)
    if not spec.variant_points():
        raise SpecError(shown, root.line_of("variants"), "variants", "the exclusions leave no variant to emit")
    return spec


def load_specs(paths: list[str | os.PathLike], *, check: bool = True) -> list[Spec]:
    """Several spec files, in order; two specs of one name are an error (their outputs collide)."""
    specs = [load_spec(p, check=check) for p in paths]
    seen: dict[str, str] = {}
    for s in specs:
        if s.name in seen:
            raise SpecError(s.path, 1, "name", f"spec name {s.name!r} is also used by {seen[s.name]}")
        seen[s.name] = s.path
    return specs


def _reject_aliases(source: str, shown: str) -> None:
    """Specs are plain data: YAML aliases (`*name`) would let a few lines expand into an endless
    or exponentially large document, so they are an error, with the alias's line."""
    import yaml

    try:
        for event in yaml.parse(source, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                line = event.start_mark.line + 1 if event.start_mark else None
                raise SpecError(shown, line, "", f"YAML aliases (*{event.anchor}) are not supported in specs")
    except yaml.reader.ReaderError as err:  # raised before parsing starts: not a MarkedYAMLError
        line = source[: err.position].count("\n") + 1 if isinstance(err.position, int) else None
        char = f"{err.character:#06x}" if isinstance(err.character, int) else repr(err.character)
        raise SpecError(shown, line, "", f"invalid YAML: character {char} is not allowed") from None
    except yaml.YAMLError:
        return  # load_located reports the syntax error with its line
    except RecursionError:
        raise SpecError(shown, None, "", "invalid YAML: nested too deeply") from None


def _parse_dims(section: r.Section) -> dict[str, Dim]:
    dims = {}
    for key, raw, line in section.entries():
        if not isinstance(key, str) or not key.isidentifier():
            raise section.error(key, "expected a dim name (a Python identifier)")
        entry = r.Section(raw, section.path, section.child_field(key), getattr(raw, "line", line))
        value, maximum, multiple_of, doc = (entry.get(k, F.DIM.fields[k]) for k in ("value", "max", "multiple_of", "doc"))
        entry.finish()
        if value is not None and maximum is not None:
            raise entry.error("max", "a dim is either a constant (value) or a run-time size (max), not both")
        if multiple_of != 1 and maximum is None:
            raise entry.error("multiple_of", "only run-time sizes (with max) take multiple_of")
        dims[key] = Dim(key, doc, value, maximum, multiple_of)
    if not dims:
        raise r.SpecError(section.path, section.line, section.field, "expected at least one dim")
    return dims


def _parse_variants(section: r.Section, dims: dict[str, Dim]) -> tuple[tuple, tuple, tuple]:
    axes_section = section.section("axes")
    axes = []
    for key, raw, line in axes_section.entries():
        field = axes_section.child_field(key)
        if key == "dtype":
            check = F.AXES.fields["dtype"].node
        elif key in dims and not dims[key].is_runtime:
            check = F.AXES.rest.node
        else:
            consts = ", ".join(d.name for d in dims.values() if not d.is_runtime)
            raise r.SpecError(section.path, line, field, f"expected 'dtype' or a constant dim ({consts})")
        try:
            values = check(raw)
        except r.Invalid as err:
            raise r.SpecError(section.path, line, field, str(err)) from None
        if len(set(values)) != len(values):
            raise r.SpecError(section.path, line, field, f"repeated value in {list(values)}")
        axes.append((key, values))
    axis_values = dict(axes)
    shapes = []
    for item in section.items_of("shapes"):
        shape = {}
        for key, raw, line in item.entries():
            if key not in dims or dims[key].is_runtime or key in axis_values:
                consts = ", ".join(d.name for d in dims.values() if not d.is_runtime and d.name not in axis_values)
                raise item.error(key, f"expected a constant dim that is not a variant axis ({consts})")
            shape[key] = item.get(key, F.SHAPE_VALUE)
        if shapes and set(shape) != set(shapes[0]):
            raise r.SpecError(item.path, item.line, item.field, f"expected the dims of the first shape ({', '.join(shapes[0])})")
        if shape in shapes:
            raise r.SpecError(item.path, item.line, item.field, "repeats an earlier shape")
        shapes.append(shape)
    for key in shapes[0] if shapes else ():
        axis_values[key] = tuple(dict.fromkeys(shape[key] for shape in shapes))
    for dim in dims.values():
        if not dim.is_runtime and dim.value is None and dim.name not in axis_values:
            raise r.SpecError(
                section.path, section.line, f"dims.{dim.name}", "needs a value, a max, a variant axis, or an entry in every variants.shapes item"
            )
    exclude = []
    for item in section.items_of("exclude"):
        rule = {}
        for key, raw, line in item.entries():
            if key not in axis_values:
                raise item.error(key, f"not a variant axis (axes: {', '.join(axis_values)})")
            rule[key] = item.get(key, r.AxisValue(axis_values[key]))
        exclude.append(rule)
    section.finish()
    return tuple(axes), tuple(shapes), tuple(exclude)


def _parse_tensors(section: r.Section, dims: dict[str, Dim], axes: tuple) -> dict[str, TensorSpec]:
    shape_item = r.ShapeItem(tuple(dims))
    fields = F.TENSOR.fields
    tensors = {}
    for key, raw, line in section.entries():
        entry = r.Section(raw, section.path, section.child_field(key), getattr(raw, "line", line))
        shape = entry.get("shape", r.list_of(shape_item, min_len=1))
        dtype = entry.get("dtype", r.ElementType(tuple(name for name, _ in axes)))
        order = entry.get("layout", r.list_of(shape_item), default=fields["layout"].default)
        role = entry.get("role", fields["role"])
        entry.finish()
        if order is None:
            axes_order = tuple(range(len(shape)))
        else:
            # A layout lists the shape's dim names from outermost to innermost in memory.
            if sorted(map(str, order)) != sorted(map(str, shape)) or len(set(map(str, shape))) != len(shape):
                raise entry.error("layout", f"expected a permutation of the shape {list(shape)}, got {list(order)}")
            axes_order = tuple(shape.index(o) for o in order)
        tensors[key] = TensorSpec(key, shape, dtype, axes_order, role, line)
    section.finish()
    return tensors
