"""Tensor layouts to strides and flat offsets, all symbolic."""

from __future__ import annotations

from typing import Mapping, Sequence

import sympy


def strides(shape: Sequence[sympy.Expr], order: Sequence[int]) -> tuple[sympy.Expr, ...]:
    """Element strides of a dense tensor whose axes lie in memory in `order` (outermost first)."""
    out: list[sympy.Expr] = [sympy.Integer(0)] * len(shape)
    step: sympy.Expr = sympy.Integer(1)
    for axis in reversed(order):
        out[axis] = step
        step = step * shape[axis]
    return tuple(out)


def flat_offset(index: Sequence[sympy.Expr], stride: Sequence[sympy.Expr]) -> sympy.Expr:
    """Σ index_i · stride_i, expanded so each term is one product (clear printing, exact bounds)."""
    return sympy.expand(sum((i * s for i, s in zip(index, stride)), sympy.Integer(0)))


class TensorLayout:
    """One tensor's shape and strides as sympy expressions over the spec's dim symbols."""

    def __init__(self, name: str, shape: Sequence[sympy.Expr], order: Sequence[int], axis_names: Sequence[str]):
        self.name = name
        self.shape = tuple(shape)
        self.axis_names = tuple(axis_names)
        self.strides = strides(self.shape, order)

    def offset(self, **index: sympy.Expr) -> sympy.Expr:
        """Flat element offset of the given per-axis indices (axes not given are at 0)."""
        unknown = set(index) - set(self.axis_names)
        if unknown:
            raise KeyError(f"{self.name} has no axis {sorted(unknown)}")
        return flat_offset([index.get(a, 0) for a in self.axis_names], self.strides)

    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.shape)

    def substitute(self, values: Mapping[sympy.Symbol, int]) -> "TensorLayout":
        """The same layout with compile-time constants folded in."""
        clone = object.__new__(TensorLayout)
        clone.name, clone.axis_names = self.name, self.axis_names
        clone.shape = tuple(sympy.sympify(s).subs(values) for s in self.shape)
        clone.strides = tuple(sympy.sympify(s).subs(values) for s in self.strides)
        return clone
