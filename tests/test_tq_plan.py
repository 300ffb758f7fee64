"""TQ decode lowering: SoA cache layout, coverage proofs, and precise refusals."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

from conftest import ROOT
from kgen.algebra import FloorDiv, Mod, index_symbol
from kgen.algebra.coverage import prove_cover, same_map
from kgen.errors import SpecError
from kgen.ops import tq_decode
from kgen.reference.tq import cache_block_bytes
from kgen.spec import load_spec
from kgen.targets import GFX950, elem, lane

SPEC_TEXT = (ROOT / "specs" / "tq_decode.yaml").read_text()


def spec_with(tmp_path, old: str, new: str):
    assert old in SPEC_TEXT, old
    path = tmp_path / "tq_decode.yaml"
    path.write_text(SPEC_TEXT.replace(old, new))
    return load_spec(path)


def test_all_shipped_variants_prove_their_mappings():
    spec = load_spec(ROOT / "specs" / "tq_decode.yaml")
    flydsl = [v for v in tq_decode.variants(spec) if v.values["backend"] == "flydsl"]
    assert len(flydsl) == 6 and "tq_decode_gfx950_d128_qg8_bs16" in [v.name for v in flydsl]
    for v in flydsl:
        plan = tq_decode.lower(spec, v)
        assert len(plan.proofs) >= 8 and all(p.ok for p in plan.proofs), [p for p in plan.proofs if not p.ok]
        assert plan.consts["LDS_BYTES"] == 5376  # centroid-pair table + one padded bf16 tile


def test_cache_layout_matches_the_reference_byte_for_byte():
    spec = load_spec(ROOT / "specs" / "tq_decode.yaml")
    Hk, slot, kvh = (index_symbol(n) for n in ("Hk", "slot", "kv_head"))
    for v in tq_decode.variants(spec):
        plan = tq_decode.lower(spec, v)
        bs, d = plan.consts["BS"], plan.consts["HEAD_DIM"]
        for hk in (1, 2, 8):
            assert plan.offsets["block_bytes"].subs(Hk, hk) == cache_block_bytes(bs, hk, d)
        env = {Hk: 2, slot: 3, kvh: 1}
        assert plan.offsets["k_bytes"].subs(env) == (3 * 2 + 1) * d
        assert plan.offsets["v_bytes"].subs(env) == (3 * 2 + 1) * d + d // 2
        meta = bs * 2 * d  # data region of a 2-head block
        assert plan.offsets["k_norm_bytes"].subs(env) == meta + ((1 * 3 + 0) * bs + 3) * 2
        assert plan.offsets["v_zero_bytes"].subs(env) == meta + ((1 * 3 + 2) * bs + 3) * 2


def test_block_base_is_64_bit_and_in_block_offsets_32_bit():
    spec = load_spec(ROOT / "specs" / "tq_decode.yaml")
    plan = tq_decode.lower(spec, tq_decode.variants(spec)[0])
    bits = {w.name: w.bits for w in plan.widths}
    assert bits["block_base_bytes"] == 64
    assert bits["k_bytes"] == bits["v_zero_bytes"] == bits["query_row"] == bits["out_parts_row"] == 32


@pytest.mark.parametrize(
    "old, new, field, words",
    [
        ("head_dim:  {value: 128,", "head_dim:  {value: 16,", "dims.head_dim", "does not split into 32-wide MFMA K-chunks (v_mfma_f32_16x16x32_bf16); nearest that work: 32"),
        ("head_dim:  {value: 128,", "head_dim:  {value: 96,", "dims.head_dim", "not a power of two"),
        ("head_dim:  {value: 128,", "head_dim:  {value: 64,", "dims.head_dim", "one 16-byte packed chunk per lane needs"),
        ("QG: [6, 8, 16]", "QG: [6, 8, 20]", "variants.axes.QG", "QG 20 exceeds the 16 rows of one MFMA tile"),
        ("BS: [16, 32]", "BS: [16, 24]", "variants.axes.BS", "BS 24 must be a multiple of TILE 16"),
        ("Hk:        {max: 64,", "Hk:        {max: 1000000,", "dims", "needs 64 bits at the declared maxima but is a 32-bit in-program offset"),
        ("target: gfx950", "target: gfx942", "schedule.target", "expected one of gfx950"),
        ("packing: low_first}\n        v:", "packing: high_first}\n        v:", "cache.regions.data.fields.k.packing", "only low_first"),
    ],
)
def test_unsupported_values_are_refused_with_the_rule(tmp_path, old, new, field, words):
    with pytest.raises(SpecError) as err:
        spec_with(tmp_path, old, new)
    assert err.value.field == field
    assert words in err.value.message


def test_coverage_proof_detects_gaps_and_double_loads():
    ok = prove_cover("ok", {lane: 64}, [FloorDiv(lane, 4), Mod(lane, 4)], [16, 4])
    assert ok.ok
    double = prove_cover("double", {lane: 64}, [FloorDiv(lane, 8), Mod(lane, 4)], [16, 4])
    assert not double.ok and ("twice" in double.detail or "never" in double.detail)
    outside = prove_cover("outside", {lane: 64}, [FloorDiv(lane, 2), Mod(lane, 2)], [16, 4])
    assert not outside.ok and "leaves" in outside.detail
    assert not same_map("differ", {lane: 64}, [lane % 16], [lane % 8]).ok


def test_transpose_read_semantics_against_a_direct_statement():
    """ds_read_tr16_b64 as stated in numpy: within each 16-lane group, the 16 lanes' 4-element
    rows form a 16x4 block; lane t receives column t % 4 of the four rows of lanes
    4*e + (t % 16) // 4 for e = 0..3."""
    rows = np.arange(64 * 4).reshape(64, 4)  # row r holds values r*4 .. r*4+3
    expected = np.empty((64, 4), int)
    for t in range(64):
        group = t // 16
        for e in range(4):
            expected[t, e] = rows[group * 16 + 4 * e + (t % 16) // 4, t % 4]
    src_lane, col = GFX950.transpose_source(4)
    f = sympy.lambdify([lane, elem], [src_lane, col])
    got = np.array([[rows[tuple(int(x) for x in f(t, e))] for e in range(4)] for t in range(64)])
    assert (got == expected).all()


def test_mfma_layouts_cover_their_operands():
    for mfma in (GFX950.qk_mfma, GFX950.pv_mfma):
        assert prove_cover("A", {lane: 64, elem: mfma.k_per_lane}, mfma.a_element(), [16, mfma.k]).ok
        assert prove_cover("B", {lane: 64, elem: mfma.k_per_lane}, mfma.b_element(), [mfma.k, 16]).ok
        assert prove_cover("C", {lane: 64, elem: 4}, mfma.c_element(), [16, 16]).ok
