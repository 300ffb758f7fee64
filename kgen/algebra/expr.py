"""Integer index algebra: symbols with ranges, floor division and modulo, proven bounds.

Every index symbol is an integer with a closed range [lo, hi]. Bounds of an expression come from
interval arithmetic over its tree, which is sound (never under-estimates) and fast; there is no
`sympy.simplify` anywhere, so printing order only depends on the pinned sympy version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import sympy

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def index_symbol(name: str) -> sympy.Symbol:
    """An integer symbol; its range lives in a `Ranges` mapping, not in sympy assumptions."""
    return sympy.Symbol(name, integer=True)


class FloorDiv(sympy.Function):
    """floor(a / b) for a divisor proven positive; folds only when both operands are numbers."""

    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if b == 1:
            return a
        return None


class Mod(sympy.Function):
    """a mod b (non-negative result) for a divisor proven positive; folds only on numbers."""

    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        if b == 1:
            return sympy.Integer(0)
        return None


@dataclass(frozen=True)
class Range:
    """A closed integer interval, with the reason it holds (shown by `kgen show`)."""

    lo: int
    hi: int
    why: str = ""


Ranges = Mapping[sympy.Symbol, Range]


class UnboundedError(ValueError):
    """An expression uses a symbol without a declared range, or an operation we cannot bound."""


def bounds(expr: sympy.Expr, ranges: Ranges) -> tuple[int, int]:
    """Sound [lo, hi] of an integer expression over the declared ranges (interval arithmetic)."""
    lo, hi, _ = _walk(sympy.sympify(expr), ranges)
    return lo, hi


def max_abs_intermediate(expr: sympy.Expr, ranges: Ranges) -> int:
    """The largest magnitude any intermediate value reaches when the expression is evaluated
    left to right as printed (every node and every partial sum/product)."""
    return _walk(sympy.sympify(expr), ranges)[2]


def _mul(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    products = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return min(products), max(products)


def _walk(e: sympy.Expr, ranges: Ranges) -> tuple[int, int, int]:
    """(lo, hi, largest |intermediate|) of `e`."""
    if e.is_Integer:
        v = int(e)
        return v, v, abs(v)
    if e.is_Symbol:
        if e not in ranges:
            raise UnboundedError(f"symbol {e} has no declared range")
        r = ranges[e]
        return r.lo, r.hi, max(abs(r.lo), abs(r.hi))
    if e.is_Add or e.is_Mul:
        parts = [_walk(a, ranges) for a in _ordered_args(e)]
        lo, hi, worst = parts[0]
        for plo, phi, pworst in parts[1:]:
            lo, hi = (lo + plo, hi + phi) if e.is_Add else _mul((lo, hi), (plo, phi))
            worst = max(worst, pworst, abs(lo), abs(hi))
        return lo, hi, worst
    if isinstance(e, (FloorDiv, Mod)):
        (alo, ahi, aworst), (blo, bhi, bworst) = (_walk(a, ranges) for a in e.args)
        if blo <= 0:
            raise UnboundedError(f"divisor of {e} is not proven positive")
        if isinstance(e, Mod):
            if alo >= 0 and ahi < blo:  # a mod b == a when 0 <= a < b
                return alo, ahi, max(aworst, bworst)
            return 0, bhi - 1, max(aworst, bworst)
        quotients = [alo // blo, alo // bhi, ahi // blo, ahi // bhi]
        return min(quotients), max(quotients), max(aworst, bworst)
    if isinstance(e, (sympy.Min, sympy.Max)):
        parts = [_walk(a, ranges) for a in e.args]
        pick = min if isinstance(e, sympy.Min) else max
        return pick(p[0] for p in parts), pick(p[1] for p in parts), max(p[2] for p in parts)
    raise UnboundedError(f"cannot bound {type(e).__name__} in {e}")


def _ordered_args(e: sympy.Expr) -> list[sympy.Expr]:
    """Arguments in printing order (the printer uses the same order, so the proof matches)."""
    if e.is_Add:
        return list(e.as_ordered_terms())
    coeff, factors = e.as_coeff_mul()
    ordered = sorted(factors, key=sympy.default_sort_key)
    return ordered + ([coeff] if coeff != 1 else [])


def ordered_args(e: sympy.Expr) -> list[sympy.Expr]:
    return _ordered_args(e)


@dataclass(frozen=True)
class IndexWidth:
    """The int32/int64 decision for one address expression, with its proof."""

    name: str
    expr: sympy.Expr
    lo: int
    hi: int
    worst: int  # largest |intermediate value| during evaluation
    bits: int  # 32 or 64

    @property
    def reason(self) -> str:
        bound = f"every intermediate stays within ±{_pow2(self.worst)}"
        if self.bits == 32:
            return f"int32: {bound} < 2^31"
        return f"int64: an intermediate reaches {_pow2(self.worst)} >= 2^31 at the declared maxima"


def decide_width(name: str, expr: sympy.Expr, ranges: Ranges) -> IndexWidth:
    """int32 when the value and every intermediate provably fit, else int64."""
    lo, hi = bounds(expr, ranges)
    worst = max_abs_intermediate(expr, ranges)
    fits = INT32_MIN <= lo and hi <= INT32_MAX and worst <= INT32_MAX
    return IndexWidth(name, expr, lo, hi, worst, 32 if fits else 64)


def _pow2(v: int) -> str:
    """A magnitude written as a power of two, e.g. 2^35.0, for readable proofs."""
    import math

    return f"{v} (2^{math.log2(v):.1f})" if v > 0 else "0"
