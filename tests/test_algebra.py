"""The sympy layer: strides from layouts, sound bounds, int32/int64 decisions, printers."""

from __future__ import annotations

import itertools
import random

import pytest
import sympy

from conftest import ROOT
from kgen.algebra import (
    FloorDiv,
    Mod,
    PythonPrinter,
    Range,
    TensorLayout,
    TritonPrinter,
    bounds,
    decide_width,
    index_symbol,
    max_abs_intermediate,
    strides,
)
from kgen.ops import msda
from kgen.spec import load_spec

B, S, b, m, q, x = (index_symbol(n) for n in "B S b m q x".split())


def test_row_major_and_permuted_strides():
    assert strides([B, S, 8, 32], [0, 1, 2, 3]) == (S * 256, 256, 32, 1)
    # (B, S, M, D) stored as (B, M, S, D): heads outside the token axis.
    assert strides([B, S, 8, 32], [0, 2, 1, 3]) == (256 * S, 32, 32 * S, 1)
    layout = TensorLayout("v", [B, S, 8, 32], [0, 1, 2, 3], ["B", "S", "M", "D"])
    assert layout.offset(B=b, M=m) == 256 * S * b + 32 * m
    with pytest.raises(KeyError):
        layout.offset(Z=b)


def test_bounds_are_sound_by_brute_force():
    rng = random.Random(0)
    syms = [index_symbol(f"s{i}") for i in range(3)]
    for _ in range(150):
        ranges = {s: Range(*sorted((rng.randint(-9, 9), rng.randint(-9, 9)))) for s in syms}
        coeffs = [rng.randint(-5, 5) for _ in range(4)]
        expr = coeffs[0] * syms[0] * syms[1] + coeffs[1] * syms[2] + coeffs[2] * syms[0] + coeffs[3]
        lo, hi = bounds(expr, ranges)
        worst = max_abs_intermediate(expr, ranges)
        evaluate = sympy.lambdify(syms, expr)
        for point in itertools.product(*(range(r.lo, r.hi + 1) for r in ranges.values())):
            v = evaluate(*point)
            assert lo <= v <= hi and abs(v) <= worst


def test_floor_div_and_mod_bounds_and_folding():
    ranges = {q: Range(0, 99)}
    assert bounds(FloorDiv(q, 8), ranges) == (0, 12)
    assert bounds(Mod(q, 8), ranges) == (0, 7)
    assert bounds(Mod(q, 128), ranges) == (0, 99)
    assert FloorDiv(17, 4) == 4 and Mod(17, 4) == 1 and FloorDiv(q, 1) == q


def test_width_decision_at_the_boundary():
    just_fits = {b: Range(0, 2**31 // 256 - 1)}
    assert decide_width("a", b * 256, just_fits).bits == 32
    crosses = {b: Range(0, 2**31 // 256)}
    w = decide_width("a", b * 256, crosses)
    assert w.bits == 64 and "2^31" in w.reason
    # A sum whose final value fits but whose intermediate does not still needs 64 bits.
    ranges = {b: Range(0, 2**30), m: Range(-(2**30), 0)}
    assert decide_width("c", b * 2 + m * 2, ranges).bits == 64


def test_triton_printer_casts_before_the_first_product():
    ranges = {S: Range(1, 2**21), b: Range(0, 63), m: Range(0, 7)}
    assert TritonPrinter(ranges, bits=64)(256 * S * b + 32 * m) == "S.to(tl.int64) * b * 256 + m * 32"
    assert TritonPrinter(ranges)(32 * m + 5) == "m * 32 + 5"
    assert PythonPrinter()(256 * S) == "S * 256"


def test_triton_printer_refuses_truncating_division_of_negatives():
    ranges = {x: Range(-5, 5)}
    with pytest.raises(ValueError, match="truncate"):
        TritonPrinter(ranges)(FloorDiv(x, 4))
    assert TritonPrinter({q: Range(0, 9)})(FloorDiv(q, 4)) == "q // 4"


def _msda_widths(tmp_path, batch_max: int, tokens_max: int) -> dict[str, int]:
    text = (ROOT / "specs" / "msda.yaml").read_text()
    text = text.replace("B: {max: 64,", f"B: {{max: {batch_max},").replace("S: {max: 2097152,", f"S: {{max: {tokens_max},")
    text = text.replace("Q: {max: 2097152,", f"Q: {{max: {tokens_max},")
    path = tmp_path / "msda.yaml"
    path.write_text(text)
    spec = load_spec(path)
    variant = msda.variants(spec)[0]
    return {w.name: w.bits for w in msda.lower(spec, variant).widths}


def test_msda_int64_only_where_declared_maxima_cross_2_31(tmp_path):
    # Shipped maxima (B=64, Q=S=2^21, M*D=256): B*S*M*D = 2^35 needs 64 bits; the gather
    # offset within one (batch, head) stays below 2^31.
    wide = _msda_widths(tmp_path, 64, 2**21)
    assert wide == {"value_base": 64, "loc_base": 64, "weight_base": 64, "gather": 32, "out": 64}
    # Small declared maxima: everything is proven to fit in 32 bits.
    narrow = _msda_widths(tmp_path, 4, 30000)
    assert set(narrow.values()) == {32}


def test_msda_generated_code_matches_the_decision(tmp_path):
    from kgen.generate import generate

    spec = load_spec(ROOT / "specs" / "msda.yaml")
    text = generate(spec, ROOT)[0].text
    assert "value_base = value_ptr + (S.to(tl.int64) * b * 256 + m * 32)" in text
    assert "d[None, :] + pixel[:, None] * 256" in text  # gather stays int32
    assert "value_base: int64" in text and "gather: int32" in text  # recorded in the header
