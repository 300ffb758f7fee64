"""FlyDSL TQ decode: lane-mapping proofs, the FlyDSL printer, the rendered module, and (where
flydsl and ld.lld are installed) a gfx950 compile of every variant checked on its assembly."""

from __future__ import annotations

import ast
import importlib.util
import shutil

import pytest
import sympy

from conftest import ROOT, load_module
from kgen.algebra import FloorDiv, Mod, Range, index_symbol
from kgen.errors import SpecError
from kgen.ops import tq_decode, tq_flydsl
from kgen.ops.tq_flydsl import FlyDslPrinter
from kgen.render import render
from kgen.spec import load_spec
from kgen.targets import GFX950, lane

SPEC = ROOT / "specs" / "tq_decode.yaml"
# The shipped set (specs/tq_decode.yaml says why): every QG at head_dim 128, QG 4 and 7 at 64 and 256.
VARIANTS = [
    f"tq_decode_gfx950_d{d}_qg{qg}_bs{bs}"
    for d, qgs in ((64, (4, 7)), (128, (4, 6, 7, 8, 16)), (256, (4, 7)))
    for qg in qgs
    for bs in (16, 32)
]


@pytest.fixture(scope="module")
def spec():
    return load_spec(SPEC)


@pytest.fixture(scope="module")
def variants(spec):
    return {v.name: v for v in tq_decode.variants(spec) if v.values["backend"] == "flydsl"}


@pytest.fixture(scope="module")
def plans(spec, variants):
    return {name: tq_decode.lower(spec, v) for name, v in variants.items()}


@pytest.fixture(scope="module")
def sources(variants, plans):
    return {name: render(tq_decode.template_for(v), {"p": plans[name]}, name) for name, v in variants.items()}


# ---- proofs ---------------------------------------------------------------------------------------


def test_every_variant_proves_its_lane_mappings(plans):
    assert sorted(plans) == sorted(VARIANTS)
    expected = {
        "centroid-pair table fill",
        "q rows staged to LDS (padded pitch)",
        "packed K chunks per lane",
        "K tile to LDS (padded pitch)",
        "V level writes land where their nibbles came from",
        "QK A operand == K tile (token, dim)",
        "QK B operand == staged q (query, dim)",
        "k_norm loads in accumulator layout (slot == QK result row)",
        "V transpose read == PV A operand",
        "output rows < QG stored once",
        "exp_sums/max_logits rows < QG (lane group 0 of 4 identical)",
    }
    for name, plan in plans.items():
        failed = [p for p in plan.proofs if not p.ok]
        assert not failed, (name, failed)
        assert expected <= {p.name.split(" (")[0] if p.name.startswith("packed") else p.name for p in plan.proofs}, name
        # one centroid-pair table (u32 per packed byte) + one padded 16-row bf16 tile
        d = plan.consts["HEAD_DIM"]
        assert plan.consts["LDS_BYTES"] == 256 * 4 + 16 * (d * 2 + 16)
        # a token's packed bytes: 8 B (dwordx2) per lane at 64, 16 B at 128, 2 x 16 B at 256
        loads = {64: "1 x dwordx2", 128: "1 x dwordx4", 256: "2 x dwordx4"}[d]
        assert f"packed V chunks per lane ({loads})" in {p.name for p in plan.proofs}, name


def _plant(monkeypatch, name, change):
    original = tq_flydsl.lane_maps

    def planted(ctx, consts, lanes_per_token):
        maps = original(ctx, consts, lanes_per_token)
        maps.exprs[name] = change(maps.exprs[name])
        return maps

    monkeypatch.setattr(tq_flydsl, "lane_maps", planted)


@pytest.mark.parametrize(
    "name, change, proof",
    [
        # K/V tile rows written with the unpadded pitch (256 B = 32 words instead of 34)
        ("kv_lds_word", lambda e: e - 2 * tq_flydsl.tok4, "K tile to LDS (padded pitch)"),
        # transpose address: lanes of one token 16 B apart instead of 8 B
        ("tr_byte", lambda e: e + 8 * tq_flydsl.c4, "V transpose read == PV A operand"),
        # metadata of lane group g4 taken from tokens 8*g4 .. instead of 4*g4 ..
        ("meta_lane_byte", lambda e: 2 * e, "k_norm loads in accumulator layout"),
        # K chunk per lane: 8 B steps between the lanes of a token (overlapping loads)
        ("kv_lane_byte", lambda e: e - 8 * tq_flydsl.c4, "packed K chunks per lane"),
        # QK B operand read from the K-tile row of the lane's group instead of its query row
        ("q_b_word", lambda e: e.subs(tq_flydsl.q_b_row, tq_flydsl.g4), "QK B operand"),
    ],
)
def test_a_planted_mapping_error_is_refused(spec, variants, monkeypatch, name, change, proof):
    _plant(monkeypatch, name, change)
    with pytest.raises(SpecError) as err:
        tq_decode.lower(spec, variants["tq_decode_gfx950_d128_qg8_bs32"])
    assert "does not cover its tile exactly once" in err.value.message
    assert proof in err.value.message


@pytest.mark.parametrize(
    "name, change, proof",
    [
        # head_dim 256, two loads per lane: the second one 16 B on instead of 64 (overlaps the
        # next lane's first load, the token's last 48 B are never read)
        ("kv_load_byte", lambda e: e / 4, "packed K chunks per lane (2 x dwordx4)"),
        # the second load's words written over the first one's in LDS
        ("kv_lds_word", lambda e: e.subs(tq_flydsl.ld, 0), "K tile to LDS (padded pitch)"),
        # the LDS row pitch of head_dim 128 (272 B) kept at 256
        ("tr_byte", lambda e: e.subs(tq_flydsl.tok4, tq_flydsl.tok4 * 272 / 528), "V transpose read == PV A operand"),
    ],
)
def test_a_planted_head_dim_256_error_is_refused(spec, variants, monkeypatch, name, change, proof):
    _plant(monkeypatch, name, change)
    with pytest.raises(SpecError) as err:
        tq_decode.lower(spec, variants["tq_decode_gfx950_d256_qg7_bs32"])
    assert "does not cover its tile exactly once" in err.value.message
    assert proof in err.value.message


# ---- printer --------------------------------------------------------------------------------------


def test_printer_shifts_masks_and_widens():
    x, n = index_symbol("x"), index_symbol("n")
    ranges = {x: Range(0, 1000), n: Range(0, 1 << 30), lane: Range(0, 63)}
    p = FlyDslPrinter(ranges, {n: "num_blocks"}, constexprs=())
    assert p(FloorDiv(lane, 16)) == "lane >> 4"
    assert p(Mod(lane, 4)) == "lane & 3"
    # >> and & bind looser than + and * in Python: the printer parenthesizes them
    assert p(FloorDiv(lane, 16) + 4 * x) == "x * 4 + (lane >> 4)"
    assert p(sympy.Min(x, 5)) == "(x < 5).select(x, 5)"
    with pytest.raises(ValueError, match="power-of-two"):
        p(FloorDiv(x, 6))
    with pytest.raises(ValueError, match="non-negative"):
        p(FloorDiv(x - 2000, 8))
    wide = FlyDslPrinter(ranges, {n: "block"}, constexprs=(), bits=64)
    assert wide(n * 2144 + x) == "fx.Int64(block) * 2144 + fx.Int64(x)"


def test_cache_addresses_are_the_plans_offsets(plans):
    """The kernel's printed cache addresses add up to the shared plan's byte offsets."""
    Hk, kvh, slot = (index_symbol(n) for n in ("Hk", "kv_head", "slot"))
    for plan in plans.values():
        k = plan.printed["kernel"]
        assert "fx.Int64(block)" in k["block_base_words"]
        # block stride in int32 words == block_bytes / 4, for a few Hk
        words = plan.offsets["block_base_bytes"].subs(index_symbol("phys_block"), 1) / 4
        for hk in (1, 3, 8):
            assert int(words.subs(Hk, hk)) * 4 == int(plan.offsets["block_bytes"].subs(Hk, hk))
        # lane part + tile part == the spec's k/v offsets at slot = slot0 + tok4
        env = {"num_kv_heads": 3, "kv_head": 2, "tok4": 5, "c4": 0, "slot0": 0, "g4": 1, "ld": 0}
        for field, tile in (("k", "k_tile_byte"), ("v", "v_tile_byte")):
            got = eval(k["kv_lane_byte"], {}, env) + eval(k["kv_load_byte"], {}, env) + eval(k[tile], {}, env)
            assert got == plan.offsets[f"{field}_bytes"].subs({Hk: 3, kvh: 2, slot: 5})
        # the last load of the last lane of a token ends where the token's packed K (or V) ends
        last = dict(env, c4=3, ld=plan.consts["KV_LOADS"] - 1)
        end = eval(k["kv_lane_byte"], {}, last) + eval(k["kv_load_byte"], {}, last) + plan.consts["KV_LOAD_WORDS"] * 4
        assert end - eval(k["kv_lane_byte"], {}, env) == plan.consts["KEY_BYTES"]
        got = eval(k["meta_lane_byte"], {}, env) + eval(k["v_zero_tile_byte"], {}, env)
        assert got == plan.offsets["v_zero_bytes"].subs({Hk: 3, kvh: 2, slot: 4})


# ---- rendered module ------------------------------------------------------------------------------


def test_rendered_module_parses_and_prints_the_plan(plans, sources):
    for name, src in sources.items():
        plan, k = plans[name], plans[name].printed["kernel"]
        tree = ast.parse(src)
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert {"torch", "triton", "flydsl"} <= imported <= {"torch", "triton", "flydsl", "os", "math", "functools"}, imported
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert {"launch_decode_kernel", "tq_decode", "partition_plan", "validate_inputs", plan.kernel} <= defined
        # every cache/tensor address is the printed plan expression, verbatim
        flat = " ".join(src.split())
        for key in ("block_base_words", "kv_lane_byte", "k_tile_byte", "v_tile_byte", "k_norm_tile_byte", "v_scale_tile_byte", "v_zero_tile_byte", "query_base", "q_load_byte", "out_parts_base", "out_byte", "partials_base", "block_table_base", "kv_lds_word", "tr_byte", "k_a_word", "q_b_word"):
            assert k[key] in flat, (name, key, k[key])
        # derived numbers appear only where the plan put them
        stride_words = str(sympy.Poly(plan.offsets["block_bytes"]).coeffs()[0] // 4)
        assert [ln for ln in src.splitlines() if stride_words in ln] == [ln for ln in src.splitlines() if "fx.Int64(block)" in ln]
        pitch = str(plan.consts["LDS_ROW_PITCH"])
        assert [ln.split("=")[0].strip() for ln in src.splitlines() if f" {pitch} " in f" {ln} " and "=" in ln] in (["LDS_ROW_PITCH"], ["LDS_ROW_PITCH", "tr_ptr"]), name
        # variant choices are made while rendering, not tested at run time
        assert "TILES_PER_BLOCK)" not in src or plan.consts["TILES_PER_BLOCK"] > 1
        assert ("q_src" in src) == (plan.consts["Q_STAGE_ROWS"] != plan.consts["QG"])


def test_module_api_and_empty_batch(tmp_path, sources):
    pytest.importorskip("flydsl")
    import torch

    path = tmp_path / "tq_decode_gfx950_d128_qg8_bs16.py"
    path.write_text(sources[path.stem])
    mod = load_module(path)
    assert mod.KERNEL_NAME == f"{path.stem}_kernel_0"
    hk, d = 2, mod.HEAD_DIM
    out = mod.tq_decode(
        torch.zeros(0, hk * mod.QG, d, dtype=torch.bfloat16),
        torch.zeros(3, mod.cache_block_bytes(hk), dtype=torch.uint8),
        torch.zeros(0, 4, dtype=torch.int32),
        torch.zeros(0, dtype=torch.int32),
        torch.zeros(mod.N_CENTROIDS, dtype=torch.float32),
        torch.eye(d, dtype=torch.float32),
    )
    assert out.shape == (0, hk * mod.QG, d) and out.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="kv_cache"):
        mod.tq_decode(
            torch.zeros(1, hk * mod.QG, d, dtype=torch.bfloat16),
            torch.zeros(3, mod.cache_block_bytes(hk) + 4, dtype=torch.uint8),
            torch.zeros(1, 4, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32),
            torch.zeros(mod.N_CENTROIDS, dtype=torch.float32),
            torch.eye(d, dtype=torch.float32),
        )


# ---- compile tier (gfx950, compile-only, one subprocess per variant) -------------------------------


def _compiler_available() -> bool:
    return importlib.util.find_spec("flydsl") is not None and bool(shutil.which("ld.lld-19") or shutil.which("ld.lld"))


@pytest.mark.skipif(not _compiler_available(), reason="needs flydsl and ld.lld (Debian lld-19)")
@pytest.mark.parametrize("name", VARIANTS)
def test_variant_compiles_for_gfx950(tmp_path, name, plans, sources):
    from kgen.verify.flydsl import compile_variant, isa_problems

    path = tmp_path / f"{name}.py"
    path.write_text(sources[name])
    report, error = compile_variant(path, "gfx950", tmp_path / "dump")
    assert report is not None, error
    c = plans[name].consts
    assert isa_problems(report, GFX950, c["LDS_BYTES"]) == []
    # per 256-token group (16 tiles): QK_K_CHUNKS QK MFMAs, PV_N_CHUNKS PV MFMAs and transpose
    # reads per tile (64, 128, 128 at head_dim 128); no waterfall loops
    m = report.mnemonics
    tiles = c["TILES_PER_GROUP"]
    assert (m[GFX950.qk_mfma.mnemonic], m[GFX950.pv_mfma.mnemonic], m[GFX950.transpose_read]) == (
        tiles * c["QK_K_CHUNKS"],
        tiles * c["PV_N_CHUNKS"],
        tiles * c["PV_N_CHUNKS"],
    )
    # K/V loads of the width the plan chose, 2 per tile and load, prefetched (plus tile 0's)
    width = {2: "buffer_load_dwordx2", 4: "buffer_load_dwordx4"}[c["KV_LOAD_WORDS"]]
    assert m.get(width, 0) >= 2 * tiles * c["KV_LOADS"]
    # registers: at least 4 waves per SIMD (512 VGPRs per lane) up to head_dim 128, 2 at 256
    assert report.basic_blocks <= 4 and report.summary()["vgprs"] <= {64: 128, 128: 128, 256: 256}[c["HEAD_DIM"]]


def test_show_explains_which_lane_loads_which_bytes():
    """`kgen show` of a head_dim 256 variant: two 16-byte loads per lane and stream, where they
    land, and the derived MFMA counts and LDS bytes, in a few lines."""
    from conftest import run_kgen

    proc = run_kgen("show", "tq_decode_gfx950_d256_qg7_bs32", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout[proc.stdout.index("which lane loads which bytes:") : proc.stdout.index("address expressions")]
    assert "lane t loads 2 x 16 B (ld < 2) of token tok4 of each 16-token tile (buffer_load_dwordx4)" in text
    assert "bytes (4*ld + c4)*16 .. +15 of its 128 packed bytes = head_dim elements (4*ld + c4)*32 .. +31" in text
    assert "+ ld * 64 +" in text and "staged row 7 repeats row 6" in text
    assert "QK: 8 x 16x16x32 MFMA" in text and "PV: 16 x 16x16x16 MFMA" in text and "= 9472 B" in text
    assert len(text.splitlines()) <= 12
