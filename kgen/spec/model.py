"""The typed, frozen form of a spec: the parts every operator family shares.

Operator-specific sections (schedule, masking, validation) are parsed by the operator's module in
`kgen.ops` into its own frozen dataclass and kept in `Spec.options`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping

# Element types a spec may name, with their size in bytes.
DTYPES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "uint8": 1}
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class Dim:
    """A named size: a compile-time constant (value, or a variant axis) or a run-time size (max)."""

    name: str
    doc: str
    value: int | None = None  # compile-time constant (unless a variant axis overrides it)
    max: int | None = None  # run-time size: declared maximum, used by the int32/int64 proofs
    multiple_of: int = 1  # run-time sizes: what the caller guarantees (drops tail masks)

    @property
    def is_runtime(self) -> bool:
        return self.max is not None


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument: its shape in dim names (or integers), dtype and memory order."""

    name: str
    shape: tuple[str | int, ...]
    dtype: str  # an element type, or the name of the variant axis that picks it ("dtype")
    order: tuple[int, ...]  # axes from outermost to innermost in memory; row-major by default
    role: str  # "input", "output", or "scratch" (allocated by the launcher between kernels)
    line: int | None


@dataclass(frozen=True)
class Variant:
    """One kernel to emit: a point of the variant axes, with its readable name."""

    name: str
    values: Mapping[str, Any]  # axis name -> value


@dataclass(frozen=True)
class Spec:
    path: str  # as the user would type it (relative to the working directory when possible)
    name: str
    op: str
    backends: tuple[str, ...]
    doc: str
    dims: Mapping[str, Dim]
    tensors: Mapping[str, TensorSpec]
    axes: tuple[tuple[str, tuple[Any, ...]], ...]
    exclude: tuple[Mapping[str, Any], ...]
    options: Any  # the operator's own frozen dataclass
    normalized: str  # canonical JSON of the spec's data, hashed into generated headers
    # variants.shapes: listed combinations of constant dims, each joined with every axis point
    shapes: tuple[Mapping[str, int], ...] = ()

    def variant_points(self) -> list[dict[str, Any]]:
        """The product of the axes (each point joined with every listed shape), in declared
        order, minus declared exclusions."""
        names = [name for name, _ in self.axes]
        points = [dict(zip(names, combo)) for combo in itertools.product(*(v for _, v in self.axes))]
        points = [{**p, **shape} for p in points for shape in self.shapes or ({},)]
        return [p for p in points if not any(all(p.get(k) == v for k, v in ex.items()) for ex in self.exclude)]

    def constants(self, point: Mapping[str, Any]) -> dict[str, int]:
        """Compile-time dims of one variant: declared values, overridden by variant axes."""
        out = {d.name: d.value for d in self.dims.values() if not d.is_runtime and d.value is not None}
        out.update({k: v for k, v in point.items() if k in self.dims})
        return out

    def dtype_of(self, tensor: str, point: Mapping[str, Any]) -> str:
        dtype = self.tensors[tensor].dtype
        return point[dtype] if dtype in point else dtype
