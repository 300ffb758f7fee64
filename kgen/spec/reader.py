"""Pop-and-check reading of located YAML data (in the manner of torchgen's spec parsing).

A `Section` hands out one key at a time through a validator; `finish()` then rejects whatever
was not consumed, so an unknown or misspelled key is an error with its line, never ignored.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, TypeVar

from kgen.errors import SpecError
from kgen.spec.yaml_loc import LocDict, LocList

T = TypeVar("T")
_REQUIRED = object()


class Invalid(ValueError):
    """Raised by a validator with the 'expected ..., got ...' text."""


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


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

    def get(self, key: str, check: Callable[[Any], T], default: Any = _REQUIRED) -> T:
        """The value at `key`, passed through `check`; a missing required key is an error."""
        self._seen.add(key)
        if key not in self.data:
            if default is _REQUIRED:
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


# ---- validators: each returns the value or raises Invalid("expected ..., got ...") -------------


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and (lo is None or value >= lo) and (hi is None or value <= hi):
            return value
        if lo is not None and hi is not None:
            raise Invalid(f"expected an integer between {lo} and {hi}, got {_show(value)}")
        if lo is not None:
            raise Invalid(f"expected an integer >= {lo}, got {_show(value)}")
        raise Invalid(f"expected an integer, got {_show(value)}")

    return check


def power_of_two(lo: int, hi: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        if ok and value & (value - 1) == 0 and lo <= value <= hi:
            return value
        raise Invalid(f"expected a power of two between {lo} and {hi}, got {_show(value)}")

    return check


def number(lo: float | None = None) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        # YAML 1.1 reads `1e-5` (no dot) as a string; accept any text Python reads as a float.
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if lo is None or value >= lo:
                return float(value)
        floor = f" >= {lo}" if lo is not None else ""
        raise Invalid(f"expected a number{floor}, got {_show(value)}")

    return check


def text(value: Any) -> str:
    if isinstance(value, str) and value:
        return value
    raise Invalid(f"expected a non-empty string, got {_show(value)}")


def name(value: Any) -> str:
    if isinstance(value, str) and value.isidentifier():
        return value
    raise Invalid(f"expected a name (letters, digits, underscores), got {_show(value)}")


def one_of(*choices: Any) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value in choices and type(value) is type(choices[choices.index(value)]):
            return value
        raise Invalid(f"expected one of {', '.join(map(str, choices))}, got {_show(value)}")

    return check


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise Invalid(f"expected true or false, got {_show(value)}")


def list_of(item: Callable[[Any], T], min_len: int = 0) -> Callable[[Any], tuple[T, ...]]:
    def check(value: Any) -> tuple[T, ...]:
        if not isinstance(value, list):
            raise Invalid(f"expected a list, got {_show(value)}")
        if len(value) < min_len:
            raise Invalid(f"expected a list of at least {min_len} item(s), got {len(value)}")
        out = []
        for i, v in enumerate(value):
            try:
                out.append(item(v))
            except Invalid as err:
                raise Invalid(f"item {i}: {err}") from None
        return tuple(out)

    return check
