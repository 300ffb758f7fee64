"""Byte layout of a packed, structure-of-arrays cache block, derived symbolically.

A block is a sequence of regions. A *packed* region repeats one record (a list of bit-packed
fields) over its axes; a *meta* region stores one scalar of a fixed dtype per (axes..., field).
Every offset is a sympy expression over the axis extents, so the same declaration drives the
offsets of every backend and the int32/int64 proofs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import sympy


@dataclass(frozen=True)
class PackedField:
    name: str
    bits: int
    count: sympy.Expr  # elements per record
    low_first: bool  # element 2j in the low bits of byte j (for 4-bit fields)

    @property
    def nbytes(self) -> sympy.Expr:
        return self.count * self.bits / 8


@dataclass(frozen=True)
class Region:
    """One region of the block. `axes` map axis names to extents, outermost first; a meta
    region has the axis "field" whose extent is its number of fields."""

    name: str
    axes: tuple[tuple[str, sympy.Expr], ...]
    packed: tuple[PackedField, ...] = ()  # packed region: the record's fields, in order
    meta_fields: tuple[str, ...] = ()  # meta region: field names, in order
    meta_bytes: int = 0  # meta region: bytes per scalar

    @property
    def record_bytes(self) -> sympy.Expr:
        if self.packed:
            return sum((f.nbytes for f in self.packed), sympy.Integer(0))
        return sympy.Integer(self.meta_bytes)

    @property
    def nbytes(self) -> sympy.Expr:
        return sympy.Mul(*(extent for _, extent in self.axes)) * self.record_bytes

    def axis_strides(self) -> dict[str, sympy.Expr]:
        """Byte stride of each axis (row-major over the declared axis order)."""
        strides, step = {}, self.record_bytes
        for name, extent in reversed(self.axes):
            strides[name] = step
            step = step * extent
        return strides


class SoABlock:
    def __init__(self, regions: Sequence[Region]):
        self.regions = {r.name: r for r in regions}
        self.order = [r.name for r in regions]

    @property
    def block_bytes(self) -> sympy.Expr:
        return sum((r.nbytes for r in self.regions.values()), sympy.Integer(0))

    def region_offset(self, name: str) -> sympy.Expr:
        offset = sympy.Integer(0)
        for other in self.order:
            if other == name:
                return offset
            offset += self.regions[other].nbytes
        raise KeyError(name)

    def field_offset(self, region: str, field: str, index: Mapping[str, sympy.Expr]) -> sympy.Expr:
        """Byte offset, from the block start, of `field` at the given axis indices (byte 0 of the
        packed field, or the meta scalar)."""
        r = self.regions[region]
        strides = r.axis_strides()
        index = dict(index)
        if r.packed:
            within = sympy.Integer(0)
            for f in r.packed:
                if f.name == field:
                    break
                within += f.nbytes
            else:
                raise KeyError(f"{region} has no field {field}")
        else:
            index["field"] = sympy.Integer(r.meta_fields.index(field))
            within = sympy.Integer(0)
        missing = [a for a, _ in r.axes if a not in index]
        if missing:
            raise KeyError(f"{region}.{field}: no index for axes {missing}")
        offset = self.region_offset(region) + within
        offset += sum((index[a] * strides[a] for a, _ in r.axes), sympy.Integer(0))
        return sympy.expand(offset)
