"""sympy index algebra: symbols with ranges, layouts, proven int widths, target printers."""

from kgen.algebra.expr import (
    INT32_MAX,
    FloorDiv,
    IndexWidth,
    Mod,
    Range,
    Ranges,
    UnboundedError,
    bounds,
    decide_width,
    index_symbol,
    max_abs_intermediate,
)
from kgen.algebra.layout import TensorLayout, flat_offset, strides
from kgen.algebra.printer import PythonPrinter, TritonPrinter

__all__ = [
    "INT32_MAX",
    "FloorDiv",
    "IndexWidth",
    "Mod",
    "PythonPrinter",
    "Range",
    "Ranges",
    "TensorLayout",
    "TritonPrinter",
    "UnboundedError",
    "bounds",
    "decide_width",
    "flat_offset",
    "index_symbol",
    "max_abs_intermediate",
    "strides",
]
