"""Print index expressions as target code.

The Triton printer differs from Python where the semantics do: Triton's integer `//` and `%`
truncate toward zero (C semantics), so they are printed only for operands proven non-negative;
and a 64-bit expression casts its run-time factors to int64 before the first multiplication, so
no intermediate product is formed in 32 bits.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import sympy

from kgen.algebra.expr import INT32_MAX, FloorDiv, Mod, Ranges, bounds, max_abs_intermediate, ordered_args


class PythonPrinter:
    """Plain Python integer arithmetic (host-side wrappers)."""

    def __init__(self, names: Mapping[sympy.Symbol, str] | None = None):
        self.names = dict(names or {})

    def __call__(self, expr: sympy.Expr) -> str:
        return self._print(sympy.sympify(expr))

    def _symbol(self, s: sympy.Symbol) -> str:
        return self.names.get(s, s.name)

    def _print(self, e: sympy.Expr) -> str:
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            return self._symbol(e)
        if e.is_Add:
            return self._sum(ordered_args(e))
        if e.is_Mul:
            return self._product(e)
        if isinstance(e, FloorDiv):
            return f"{self._atom(e.args[0])} // {self._atom(e.args[1])}"
        if isinstance(e, Mod):
            return f"{self._atom(e.args[0])} % {self._atom(e.args[1])}"
        raise TypeError(f"cannot print {type(e).__name__}: {e}")

    def _sum(self, terms: list[sympy.Expr]) -> str:
        out = self._print(terms[0])
        for t in terms[1:]:
            coeff, rest = t.as_coeff_Mul()
            if coeff < 0:
                out += " - " + self._print(-coeff * rest)
            else:
                out += " + " + self._print(t)
        return out

    def _factors(self, e: sympy.Expr) -> list[sympy.Expr]:
        return ordered_args(e)

    def _product(self, e: sympy.Expr) -> str:
        factors = self._factors(e)
        if factors[-1] == -1:
            return "-" + self._atom(sympy.Mul(*factors[:-1]))
        return " * ".join(self._atom(f) for f in factors)

    def _atom(self, e: sympy.Expr) -> str:
        text = self._print(e)
        return f"({text})" if (e.is_Add or isinstance(e, (FloorDiv, Mod))) else text


class TritonPrinter(PythonPrinter):
    """Triton integer arithmetic over tensors and constexprs.

    `constexprs` are symbols that are compile-time Python ints in the kernel (static_range
    induction variables); every other symbol is a Triton tensor or scalar argument.
    """

    def __init__(
        self,
        ranges: Ranges,
        names: Mapping[sympy.Symbol, str] | None = None,
        constexprs: Iterable[sympy.Symbol] = (),
        bits: int = 32,
    ):
        super().__init__(names)
        self.ranges, self.constexprs, self.bits = ranges, frozenset(constexprs), bits

    def with_bits(self, bits: int) -> "TritonPrinter":
        return TritonPrinter(self.ranges, self.names, self.constexprs, bits)

    def _is_runtime(self, e: sympy.Expr) -> bool:
        return any(s not in self.constexprs for s in e.free_symbols)

    def _print(self, e: sympy.Expr) -> str:
        if isinstance(e, (FloorDiv, Mod)):
            lo, _ = bounds(e.args[0], self.ranges)
            dlo, _ = bounds(e.args[1], self.ranges)
            if lo < 0 or dlo <= 0:
                raise ValueError(f"{e}: Triton's // and % truncate; operands must be proven non-negative")
        if self.bits == 64 and e.is_Symbol and self._is_runtime(e):
            return f"{self._symbol(e)}.to(tl.int64)"
        if self.bits == 64 and isinstance(e, (FloorDiv, Mod)) and self._is_runtime(e):
            return f"({PythonPrinter._print(self.with_bits(32), e)}).to(tl.int64)"
        return super()._print(e)

    def _sum(self, terms: list[sympy.Expr]) -> str:
        if self.bits != 64:
            return super()._sum(terms)
        # Widen the first run-time term (so the running sum is int64 from there on) and any term
        # that does not fit int32 on its own; the other terms are added as int32 and promoted.
        narrow, widened, parts = self.with_bits(32), False, []
        for t in terms:
            wide = self._is_runtime(t) and (not widened or max_abs_intermediate(t, self.ranges) > INT32_MAX)
            widened |= wide
            parts.append((self if wide else narrow)._print(t))
        return " + ".join(parts).replace("+ -", "- ")

    def _factors(self, e: sympy.Expr) -> list[sympy.Expr]:
        factors = ordered_args(e)
        if self.bits == 64:
            # Run-time factors first, so the int64 cast happens before any product is formed.
            factors.sort(key=lambda f: not self._is_runtime(f))
        return factors

    def _product(self, e: sympy.Expr) -> str:
        if self.bits != 64:
            return super()._product(e)
        factors = self._factors(e)
        narrow = self.with_bits(32)
        # Cast only the first run-time factor: int64 * int32 promotes to int64 from then on.
        parts, cast_done = [], False
        for f in factors:
            if not cast_done and self._is_runtime(f):
                parts.append(self._atom(f))
                cast_done = True
            else:
                parts.append(narrow._atom(f))
        return " * ".join(parts)

    def _atom(self, e: sympy.Expr) -> str:
        text = self._print(e)
        return f"({text})" if e.is_Add else text
