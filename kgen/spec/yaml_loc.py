"""Safe YAML loading that keeps line numbers and rejects duplicate keys.

The YAML is composed into nodes with PyYAML's SafeLoader (no Python objects, no tags beyond the
core schema), then turned into plain dicts, lists and scalars that remember where they came from,
so every later error can name the file, the line and the dotted field.
"""

from __future__ import annotations

from typing import Any

import yaml

from kgen.errors import SpecError


class LocDict(dict):
    """A mapping that remembers its own line and the line of each key."""

    line: int
    key_lines: dict[str, int]


class LocList(list):
    """A sequence that remembers its own line and the line of each item."""

    line: int
    item_lines: list[int]


def load_located(text: str, path: str) -> Any:
    """Parse one YAML document into LocDict / LocList / scalars; errors name `path` and a line."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        raise SpecError(path, line, "", f"invalid YAML: {err.problem or err.context}") from None
    except yaml.YAMLError as err:
        raise SpecError(path, None, "", f"invalid YAML: {err}") from None
    finally:
        loader.dispose()
    if node is None:
        raise SpecError(path, 1, "", "the spec is empty")
    return _convert(node, loader, path, "")


_CORE_TAGS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}


def _convert(node: yaml.Node, loader: yaml.SafeLoader, path: str, field: str) -> Any:
    line = node.start_mark.line + 1
    if not isinstance(node, yaml.ScalarNode) and node.tag not in _CORE_TAGS:
        raise SpecError(path, line, field, f"invalid value: YAML tag {node.tag} is not allowed in specs")
    if isinstance(node, yaml.MappingNode):
        out = LocDict()
        out.line, out.key_lines = line, {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise SpecError(path, key_node.start_mark.line + 1, field, "keys must be plain names")
            key = str(loader.construct_scalar(key_node))
            key_line = key_node.start_mark.line + 1
            child = f"{field}.{key}" if field else key
            if key == "<<":
                raise SpecError(path, key_line, child, "YAML merge keys are not supported in specs")
            if key in out:
                raise SpecError(
                    path, key_line, child, f"duplicate key (first given on line {out.key_lines[key]})"
                )
            out.key_lines[key] = key_line
            out[key] = _convert(value_node, loader, path, child)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = LocList()
        items.line, items.item_lines = line, []
        for i, item in enumerate(node.value):
            items.item_lines.append(item.start_mark.line + 1)
            items.append(_convert(item, loader, path, f"{field}[{i}]"))
        return items
    try:
        return loader.construct_object(node, deep=True)
    except yaml.YAMLError as err:
        raise SpecError(path, line, field, f"invalid value: {err}") from None
