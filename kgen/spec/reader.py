"""Pop-and-check reading of located YAML data (in the manner of torchgen's spec parsing), and the
declarations the spec format is described by.

A `Section` hands out one key at a time through a validator; `finish()` then rejects whatever
was not consumed, so an unknown or misspelled key is an error with its line, never ignored.

Validators (`Check`) and declarations (`Field`, `Struct`, `Items`, `Either`) describe
themselves: `schema()` gives JSON Schema and `words` the text of the spec reference. The spec
format is declared once with them (`kgen.spec.format`); `kgen schema` and docs/spec-reference.md
are generated from those declarations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, TypeVar

from kgen.errors import SpecError
from kgen.spec.model import DTYPES
from kgen.spec.yaml_loc import LocDict, LocList

T = TypeVar("T")
REQUIRED = object()  # a Field's default when the key must be present


class Invalid(ValueError):
    """Raised by a validator with the 'expected ..., got ...' text."""


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _num(n: int) -> str:
    """A bound as the reference prints it: 2^62 rather than 4611686018427387904."""
    return f"2^{n.bit_length() - 1}" if n >= 1 << 16 and n & (n - 1) == 0 else str(n)


class Section:
    """One mapping of a spec, read key by key."""

    def __init__(self, data: Any, path: str, field: str, line: int | None):
        if not isinstance(data, dict):
            raise SpecError(path, line, field, f"expected a mapping, got {_show(data)}")
        self.data, self.path, self.field, self.line = data, path, field, line
        self._seen: set[str] = set()

    def child_field(self, key: str) -> str:
        return f"{self.field}.{key}" if self.field else key

    def line_of(self, key: str) -> int | None:
        lines = getattr(self.data, "key_lines", {})
        return lines.get(key, self.line)

    def error(self, key: str, message: str) -> SpecError:
        return SpecError(self.path, self.line_of(key), self.child_field(key), message)

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, check: "Callable[[Any], T] | Field", default: Any = REQUIRED) -> T:
        """The value at `key`, passed through `check` (a validator, or a declared Field, which
        brings its default); a missing required key is an error."""
        if isinstance(check, Field):
            check, default = check.node, check.default if default is REQUIRED else default
            default = None if default is OPTIONAL else default
        self._seen.add(key)
        if key not in self.data:
            if default is REQUIRED:
                raise SpecError(self.path, self.line, self.child_field(key), "required key is missing")
            return default
        try:
            return check(self.data[key])
        except Invalid as err:
            raise self.error(key, str(err)) from None

    def section(self, key: str, required: bool = True) -> "Section":
        """A nested mapping (an empty one when optional and absent)."""
        self._seen.add(key)
        if key not in self.data:
            if required:
                raise SpecError(self.path, self.line, self.child_field(key), "required section is missing")
            return Section(LocDict(), self.path, self.child_field(key), self.line)
        value = self.data[key]
        return Section(value, self.path, self.child_field(key), getattr(value, "line", self.line_of(key)))

    def entries(self) -> Iterator[tuple[str, Any, int | None]]:
        """Every (key, raw value, line) of a mapping whose keys are names chosen by the user."""
        for key, value in self.data.items():
            self._seen.add(key)
            yield key, value, self.line_of(key)

    def items_of(self, key: str) -> list["Section"]:
        """A sequence of mappings, each as a Section."""
        self._seen.add(key)
        raw = self.data.get(key, LocList())
        if not isinstance(raw, list):
            raise self.error(key, f"expected a list, got {_show(raw)}")
        lines = getattr(raw, "item_lines", [self.line_of(key)] * len(raw))
        return [Section(item, self.path, f"{self.child_field(key)}[{i}]", lines[i]) for i, item in enumerate(raw)]

    def finish(self) -> None:
        unknown = [k for k in self.data if k not in self._seen]
        if unknown:
            allowed = ", ".join(sorted(self._seen)) or "none"
            raise self.error(unknown[0], f"unknown key (allowed here: {allowed})")


# ---- declarations: what a section holds, field by field ----------------------------------------

OPTIONAL = object()  # a Field's default when it may be left out and has no default value


@dataclass(frozen=True)
class Field:
    """One key of a mapping: what its value is, what it means, and its default."""

    node: "Check | Struct | Items | Either | Callable[[Any], Any]"
    doc: str
    default: Any = REQUIRED  # REQUIRED, OPTIONAL, or the value used when the key is left out

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def schema(self) -> dict:
        out = dict(_schema(self.node))
        out["description"] = self.doc
        if self.default not in (REQUIRED, OPTIONAL, None):  # None: left out means "not set"
            out["default"] = list(self.default) if isinstance(self.default, tuple) else self.default
        return out


@dataclass(frozen=True)
class Struct:
    """A mapping with declared keys; `rest` declares the value under any other key (names the
    spec's author picks, such as dims or tensors), `keys` what such names may be."""

    fields: Mapping[str, Field] = field(default_factory=dict)
    rest: Field | None = None
    rest_name: str = "name"  # how the reference shows such a key: <name>
    keys: "Check | None" = None
    title: str = ""  # names the form when it is one of an Either's

    def schema(self) -> dict:
        out: dict = {"type": "object"}
        if self.title:
            out["title"] = self.title
        if self.fields:
            out["properties"] = {key: f.schema() for key, f in self.fields.items()}
        required = [key for key, f in self.fields.items() if f.required]
        if required:
            out["required"] = required
        if self.keys is not None:
            out["propertyNames"] = self.keys.schema()
        out["additionalProperties"] = self.rest.schema() if self.rest else False
        return out

    @property
    def words(self) -> str:
        return "mapping"


@dataclass(frozen=True)
class Items:
    """A list of mappings of one form."""

    item: Struct
    min_len: int = 0

    def schema(self) -> dict:
        out = {"type": "array", "items": self.item.schema()}
        if self.min_len:
            out["minItems"] = self.min_len
        return out

    @property
    def words(self) -> str:
        return f"list (at least {self.min_len}) of mappings" if self.min_len else "list of mappings"


@dataclass(frozen=True)
class Either:
    """A mapping of one of several forms (each a titled Struct)."""

    forms: tuple[Struct, ...]

    def schema(self) -> dict:
        return {"anyOf": [form.schema() for form in self.forms]}

    @property
    def words(self) -> str:
        return " or ".join(form.title for form in self.forms)


def _schema(node: Any) -> dict:
    return node.schema() if hasattr(node, "schema") else {}


def words(node: Any) -> str:
    """How the spec reference names what a node accepts."""
    return node.words if hasattr(node, "words") else "any value"


# ---- validators --------------------------------------------------------------------------------
#
# Each validator returns the value or raises Invalid("expected ..., got ..."), and describes the
# values it accepts twice over, from the same numbers: `schema()` in JSON Schema (never stricter
# than the check itself, so a spec kgen reads always validates) and `words` for the spec
# reference. A plain function also works as a validator; it is then described as "any value".


class Check:
    """Base of the self-describing validators."""

    spec_dependent = False  # True: what it accepts also depends on the spec (e.g. its dim names)

    def __call__(self, value: Any) -> Any:
        raise NotImplementedError

    def schema(self) -> dict:
        raise NotImplementedError

    @property
    def words(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Integer(Check):
    lo: int | None = None
    hi: int | None = None

    def __call__(self, value: Any) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        lo, hi = self.lo, self.hi
        if ok and (lo is None or value >= lo) and (hi is None or value <= hi):
            return value
        if lo is not None and hi is not None:
            raise Invalid(f"expected an integer between {lo} and {hi}, got {_show(value)}")
        if lo is not None:
            raise Invalid(f"expected an integer >= {lo}, got {_show(value)}")
        raise Invalid(f"expected an integer, got {_show(value)}")

    def schema(self) -> dict:
        bounds = {"minimum": self.lo, "maximum": self.hi}
        return {"type": "integer", **{k: v for k, v in bounds.items() if v is not None}}

    @property
    def words(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"integer, {self.lo} to {_num(self.hi)}"
        return f"integer >= {self.lo}" if self.lo is not None else "integer"


@dataclass(frozen=True)
class PowerOfTwo(Check):
    lo: int
    hi: int

    def __call__(self, value: Any) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        if ok and value & (value - 1) == 0 and self.lo <= value <= self.hi:
            return value
        raise Invalid(f"expected a power of two between {self.lo} and {self.hi}, got {_show(value)}")

    def schema(self) -> dict:
        return {"enum": [1 << k for k in range(self.hi.bit_length()) if self.lo <= 1 << k <= self.hi]}

    @property
    def words(self) -> str:
        return f"power of two, {self.lo} to {_num(self.hi)}"


# YAML 1.1 (PyYAML) reads `1e-5` (no dot) as a string; the number check accepts such text.
_NUMBER_TEXT = r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"


@dataclass(frozen=True)
class Number(Check):
    lo: float | None = None

    def __call__(self, value: Any) -> float:
        if isinstance(value, str):  # accept any text Python reads as a float
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.lo is None or value >= self.lo:
                return float(value)
        floor = f" >= {self.lo}" if self.lo is not None else ""
        raise Invalid(f"expected a number{floor}, got {_show(value)}")

    def schema(self) -> dict:
        number = {"type": "number"} if self.lo is None else {"type": "number", "minimum": self.lo}
        return {"anyOf": [number, {"type": "string", "pattern": _NUMBER_TEXT}]}

    @property
    def words(self) -> str:
        return "number" if self.lo is None else f"number >= {self.lo:g}"


@dataclass(frozen=True)
class Text(Check):
    def __call__(self, value: Any) -> str:
        if isinstance(value, str) and value:
            return value
        raise Invalid(f"expected a non-empty string, got {_show(value)}")

    def schema(self) -> dict:
        return {"type": "string", "minLength": 1}

    @property
    def words(self) -> str:
        return "text"


_IDENTIFIER = r"^[^\W\d]\w*$"  # Python's str.isidentifier, as a regular expression


@dataclass(frozen=True)
class Name(Check):
    def __call__(self, value: Any) -> str:
        if isinstance(value, str) and value.isidentifier():
            return value
        raise Invalid(f"expected a name (letters, digits, underscores), got {_show(value)}")

    def schema(self) -> dict:
        return {"type": "string", "pattern": _IDENTIFIER}

    @property
    def words(self) -> str:
        return "name (letters, digits, `_`)"


@dataclass(frozen=True)
class OneOf(Check):
    choices: tuple

    def __call__(self, value: Any) -> Any:
        if value in self.choices and type(value) is type(self.choices[self.choices.index(value)]):
            return value
        raise Invalid(f"expected one of {', '.join(map(str, self.choices))}, got {_show(value)}")

    def schema(self) -> dict:
        return {"enum": list(self.choices)}

    @property
    def words(self) -> str:
        shown = [f"`{json.dumps(c)}`" if not isinstance(c, str) else f"`{c}`" for c in self.choices]
        return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


@dataclass(frozen=True)
class Boolean(Check):
    def __call__(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        raise Invalid(f"expected true or false, got {_show(value)}")

    def schema(self) -> dict:
        return {"type": "boolean"}

    @property
    def words(self) -> str:
        return "`true` or `false`"


@dataclass(frozen=True)
class ListOf(Check):
    item: Callable[[Any], Any]
    min_len: int = 0
    max_len: int | None = None

    def __call__(self, value: Any) -> tuple:
        if not isinstance(value, list):
            raise Invalid(f"expected a list, got {_show(value)}")
        if self.max_len is not None and not self.min_len <= len(value) <= self.max_len:
            raise Invalid(f"expected a list of {self._size()}, got {len(value)}")
        if len(value) < self.min_len:
            raise Invalid(f"expected a list of at least {self.min_len} item(s), got {len(value)}")
        out = []
        for i, v in enumerate(value):
            try:
                out.append(self.item(v))
            except Invalid as err:
                raise Invalid(f"item {i}: {err}") from None
        return tuple(out)

    def _size(self) -> str:
        if self.max_len == self.min_len:
            return f"exactly {self.min_len} item(s)"
        return f"{self.min_len} to {self.max_len} items"

    def schema(self) -> dict:
        out = {"type": "array", "items": self.item.schema() if isinstance(self.item, Check) else {}}
        if self.min_len:
            out["minItems"] = self.min_len
        if self.max_len is not None:
            out["maxItems"] = self.max_len
        return out

    @property
    def words(self) -> str:
        item = self.item.words if isinstance(self.item, Check) else "any value"
        if self.max_len is not None:
            count = self.min_len if self.max_len == self.min_len else f"{self.min_len} to {self.max_len}"
            return f"list of {count}: {item}"
        return f"list (at least {self.min_len}) of: {item}" if self.min_len else f"list of: {item}"


@dataclass(frozen=True)
class DimName(Check):
    """A name declared under `dims` (or one of `extra` words)."""

    dims: tuple[str, ...] = ()  # empty: describe only (schema and reference)
    extra: tuple[str, ...] = ()
    spec_dependent = True

    def __call__(self, value: Any) -> str:
        if isinstance(value, str) and (value in self.dims or value in self.extra):
            return value
        also = "".join(f" or {e!r}" for e in self.extra)
        raise Invalid(f"expected a dim name ({', '.join(self.dims)}){also}, got {_show(value)}")

    def schema(self) -> dict:
        return {"type": "string", "pattern": _IDENTIFIER}

    @property
    def words(self) -> str:
        return "a dim name" + "".join(f" or `{e}`" for e in self.extra)


@dataclass(frozen=True)
class ShapeItem(Check):
    """One entry of a tensor's shape or layout: a dim name, a product of dim names ("Hk*QG"),
    or a positive integer. Parsed, never evaluated as code."""

    dims: tuple[str, ...] = ()  # empty: describe only
    spec_dependent = True

    def __call__(self, value: Any) -> str | int:
        if isinstance(value, str) and all(part.strip() in self.dims for part in value.split("*")):
            return "*".join(part.strip() for part in value.split("*"))
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        raise Invalid(f"expected a dim name ({', '.join(self.dims)}), a product such as A*B, or a positive integer, got {value!r}")

    def schema(self) -> dict:
        product = r"^\s*[^\W\d]\w*\s*(\*\s*[^\W\d]\w*\s*)*$"
        return {"anyOf": [{"type": "string", "pattern": product}, {"type": "integer", "minimum": 1}]}

    @property
    def words(self) -> str:
        return "dim name, product of dim names (`Hk*QG`) or positive integer"


@dataclass(frozen=True)
class ElementType(Check):
    """A tensor's dtype: an element type, or the name of the variant axis that picks it."""

    axes: tuple[str, ...] = ()  # empty: describe only
    spec_dependent = True

    def __call__(self, value: Any) -> str:
        if isinstance(value, str) and (value in DTYPES or value in self.axes):
            return value
        raise Invalid(f"expected an element type ({', '.join(DTYPES)}) or a variant axis, got {value!r}")

    def schema(self) -> dict:
        return {"type": "string", "pattern": _IDENTIFIER}

    @property
    def words(self) -> str:
        return ", ".join(f"`{d}`" for d in DTYPES) + ", or a variant axis (`dtype`)"


@dataclass(frozen=True)
class AxisValue(Check):
    """One of the values a variant axis declares."""

    values: tuple = ()  # empty: describe only
    spec_dependent = True

    def __call__(self, value: Any) -> Any:
        if value in self.values:
            return value
        raise Invalid(f"expected one of the axis values {list(self.values)}, got {value!r}")

    def schema(self) -> dict:
        return {"type": ["string", "integer"]}

    @property
    def words(self) -> str:
        return "one of the axis's values"


# The factories the parsers call (kept as functions: `r.integer(1, 8)`).
def integer(lo: int | None = None, hi: int | None = None) -> Integer:
    return Integer(lo, hi)


def power_of_two(lo: int, hi: int) -> PowerOfTwo:
    return PowerOfTwo(lo, hi)


def number(lo: float | None = None) -> Number:
    return Number(lo)


def one_of(*choices: Any) -> OneOf:
    return OneOf(choices)


def list_of(item: Callable[[Any], T], min_len: int = 0, max_len: int | None = None) -> ListOf:
    return ListOf(item, min_len, max_len)


text, name, boolean = Text(), Name(), Boolean()
