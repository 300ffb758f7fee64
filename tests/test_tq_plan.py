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
AXES_BLOCK = SPEC_TEXT[SPEC_TEXT.index("  axes:\n") : SPEC_TEXT.index("\nquant:")]  # axes + exclusions


def spec_text(old: str = "", new: str = "", *, axes=None, backends=None) -> str:
    """The shipped spec with `old` replaced by `new`; `axes` replaces the variant axes (and drops
    the exclusions): one small point keeps a load fast, as every variant is lowered at load."""
    text = SPEC_TEXT
    if old:
        assert old in text, old
        text = text.replace(old, new)
    if axes is not None:
        text = text.replace(AXES_BLOCK, "  axes:\n" + "".join(f"    {k}: {list(v)}\n" for k, v in axes.items()) + "  exclude: []\n")
    if backends is not None:
        text = text.replace("backends: [flydsl, triton]", f"backends: [{', '.join(backends)}]")
    return text


def spec_with(tmp_path, old: str = "", new: str = "", check: bool = True, **kw):
    path = tmp_path / "tq_decode.yaml"
    path.write_text(spec_text(old, new, **kw))
    return load_spec(path, check=check)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.fixture(scope="module")
def shipped():
    return load_spec(ROOT / "specs" / "tq_decode.yaml")


def test_all_shipped_variants_prove_their_mappings(shipped):
    spec = shipped
    flydsl = [v for v in tq_decode.variants(spec) if v.values["backend"] == "flydsl"]
    names = {v.name for v in flydsl}
    assert len(flydsl) == 18 and {"tq_decode_gfx950_d64_qg7_bs16", "tq_decode_gfx950_d128_qg4_bs32", "tq_decode_gfx950_d256_qg7_bs32"} <= names
    for v in flydsl:
        plan = tq_decode.lower(spec, v)
        d = plan.consts["HEAD_DIM"]
        assert len(plan.proofs) >= 8 and all(p.ok for p in plan.proofs), [p for p in plan.proofs if not p.ok]
        assert plan.consts["LDS_BYTES"] == 256 * 4 + 16 * (d * 2 + 16)  # centroid-pair table + one padded bf16 tile
        # what head_dim re-derives: MFMA K-chunks, PV N-chunks, per-lane K/V bytes, q staging
        assert (plan.consts["QK_K_CHUNKS"], plan.consts["PV_N_CHUNKS"]) == (d // 32, d // 16)
        assert plan.consts["KV_LOADS"] * plan.consts["KV_LOAD_WORDS"] * 4 * 64 == 16 * d // 2  # one 16-token tile of packed K
        assert plan.consts["Q_ROWS_PER_PASS"] == 64 * 16 // (2 * d)


def test_unshipped_head_dims_and_qg_prove_their_mappings_too(tmp_path):
    """The exclusions only trim CI time: the excluded (head_dim, QG) points, QG 1, 2, 3, 5 beyond
    the axes and head_dim 512 pass the constraints and every lane-coverage proof (with BS 32,
    two tiles per cache block)."""
    spec = spec_with(tmp_path, axes={"head_dim": [64, 256], "QG": [1, 2, 3, 5, 6, 8, 16], "BS": [32]}, backends=["flydsl"], check=False)
    plans = [tq_decode.lower(spec, v) for v in tq_decode.variants(spec)]  # lower() runs the checks and proofs
    big = spec_with(tmp_path, axes={"head_dim": [512], "QG": [7], "BS": [16]}, backends=["flydsl"], check=False)
    plans.append(tq_decode.lower(big, tq_decode.variants(big)[0]))
    assert len(plans) == 15
    for plan in plans:
        assert all(p.ok for p in plan.proofs) and len(plan.proofs) == 24, plan.variant
        assert plan.consts["Q_STAGE_ROWS"] >= plan.consts["QG"] and plan.consts["Q_STAGE_ROWS"] % plan.consts["Q_ROWS_PER_PASS"] == 0


def test_cache_layout_matches_the_reference_byte_for_byte(shipped):
    spec = shipped
    Hk, slot, kvh = (index_symbol(n) for n in ("Hk", "slot", "kv_head"))
    for v in tq_decode.variants(spec):
        if v.values["backend"] == "flydsl":
            continue  # the layout is the shared lowering's; the Triton variants span every (head_dim, QG, BS)
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


def test_block_base_is_64_bit_and_in_block_offsets_32_bit(shipped):
    plan = tq_decode.lower(shipped, tq_decode.variants(shipped)[0])
    bits = {w.name: w.bits for w in plan.widths}
    assert bits["block_base_bytes"] == 64
    assert bits["k_bytes"] == bits["v_zero_bytes"] == bits["query_row"] == bits["out_parts_row"] == 32


# (change: replace `old` by `new`, or axes/backends; field; the axis or key whose line is named;
#  words of the rule and of the nearest values that work)
REFUSALS = [
    # head_dim: the Hadamard rotation, the MFMA K width, the per-lane load width, q staging
    (dict(axes={"head_dim": [96], "QG": [8], "BS": [16]}), "variants.axes.head_dim", "head_dim: [96]",
     "not a power of two (the Hadamard rotation needs one); nearest that work: 64, 128"),
    (dict(axes={"head_dim": [16], "QG": [8], "BS": [16]}), "variants.axes.head_dim", "head_dim: [16]",
     "does not split into 32-wide MFMA K-chunks (v_mfma_f32_16x16x32_bf16); nearest that work: 32"),
    (dict(axes={"head_dim": [32], "QG": [8], "BS": [16]}), "variants.axes.head_dim", "head_dim: [32]",
     "K/V loads here are buffer_load_dwordx2 or wider (a single-dword vector load aborts LLVM's AMDGPU lowering); nearest that works: 64"),
    (dict(axes={"head_dim": [1024], "QG": [8], "BS": [16]}), "variants.axes.head_dim", "head_dim: [1024]",
     "a query row is staged by 128 lanes of 16 bytes, which must divide the 64 lanes; nearest that works: 512"),
    (dict(old="head_dim:  {doc:", new="head_dim:  {value: 96, doc:", axes={"QG": [8], "BS": [16]}), "dims.head_dim", "head_dim:  {value: 96",
     "not a power of two"),
    # QG: more query rows than one MFMA tile has
    (dict(axes={"head_dim": [128], "QG": [20], "BS": [16]}), "variants.axes.QG", "QG: [20]",
     "QG 20 exceeds the 16 rows of one MFMA tile (query rows of a kv head share its B operand) and this design has no plan for more; nearest that works: 16"),
    # Triton alone: tl.dot's minimum K (even/odd halves), the decode tile and store rotation budgets
    (dict(axes={"head_dim": [16], "QG": [8], "BS": [16]}, backends=["triton"]), "variants.axes.head_dim", "head_dim: [16]",
     "gives 8-wide even/odd halves, below tl.dot's minimum K of 16; nearest that works: 32"),
    (dict(axes={"head_dim": [4096], "QG": [8], "BS": [16]}, backends=["triton"]), "variants.axes.head_dim", "head_dim: [4096]",
     "leaves 8-token tiles within the 16384-byte packed tile budget, below tl.dot's minimum N of 16; nearest that works: 2048"),
    (dict(axes={"head_dim": [1024], "QG": [8], "BS": [16]}, backends=["triton"]), "variants.axes.head_dim", "head_dim: [1024]",
     "leaves 8-column rotation blocks within 8192 elements, below tl.dot's minimum N of 16; nearest that works: 512"),
    # block size, index widths, target, packing, codebook size
    (dict(axes={"head_dim": [128], "QG": [8], "BS": [24]}), "variants.axes.BS", "BS: [24]", "BS 24 must be a multiple of TILE 16"),
    (dict(old="Hk:        {max: 64,", new="Hk:        {max: 1000000,", axes={"head_dim": [128], "QG": [8], "BS": [32]}), "dims", None,
     "needs 64 bits at the declared maxima but is a 32-bit in-program offset"),
    (dict(old="target: gfx950", new="target: gfx942"), "schedule.target", "target: gfx942", "expected one of gfx950"),
    (dict(old="packing: low_first}\n        v:", new="packing: high_first}\n        v:"), "cache.regions.data.fields.k.packing", None, "only low_first"),
    (dict(old="centroids: 16,", new="centroids: 8,"), "quant.key.centroids", "centroids: 8,", "4-bit key indices address exactly 16 centroids, got 8"),
    (dict(old="centroids:    {shape: [16]", new="centroids:    {shape: [8]"), "tensors.centroids.shape", "centroids:    {shape: [8]",
     "expected [16], the codebook size quant.key.centroids gives, got [8]"),
]


@pytest.mark.parametrize("change, field, at, words", REFUSALS, ids=[f"{f}:{w[:40]}" for _, f, _, w in REFUSALS])
def test_unsupported_values_are_refused_with_the_rule(tmp_path, change, field, at, words):
    with pytest.raises(SpecError) as err:
        spec_with(tmp_path, **change)
    assert err.value.field == field
    assert words in err.value.message, err.value.message
    if at is not None:
        assert err.value.line == line_of(spec_text(**change), at), str(err.value)


def _target_with(monkeypatch, **changes):
    """gfx950 with some facts changed, to reach rules no real value of this target reaches."""
    import dataclasses

    monkeypatch.setitem(tq_decode.AMD_TARGETS, "gfx950", dataclasses.replace(GFX950, **changes))


def test_lds_overflow_is_refused_with_the_head_dim_that_fits(tmp_path, monkeypatch):
    _target_with(monkeypatch, lds_bytes=4096)
    with pytest.raises(SpecError) as err:
        spec_with(tmp_path, axes={"head_dim": [128], "QG": [8], "BS": [16]})
    assert err.value.field == "variants.axes.head_dim"
    assert "LDS need 5376 B (pair table 1024 B + 16 rows x 272 B) exceeds gfx950's 4096 B; nearest that works: 64" in err.value.message


def test_partial_words_per_lane_are_refused(tmp_path, monkeypatch):
    """With a 16-deep QK MFMA, head_dim 16 passes the K-chunk rule but leaves the 4 lanes of a
    token 2 bytes each."""
    from kgen.targets import Mfma

    _target_with(monkeypatch, qk_mfma=Mfma(16, 16, 16, "v_mfma_f32_16x16x16_bf16"))
    with pytest.raises(SpecError) as err:
        spec_with(tmp_path, axes={"head_dim": [16], "QG": [8], "BS": [16]})
    assert err.value.field == "variants.axes.head_dim"
    assert "in whole 32-bit words, so head_dim must be a multiple of 32; nearest that work: 32" in err.value.message


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
