"""Generated FlyDSL kernels under kgen.emu: every shipped variant against the PyTorch reference
(the check `kgen verify` runs), and planted bugs (one index expression or mask changed) that the
emulator catches while the gfx950 compile tier, which only compiles and inspects the assembly,
does not."""

from __future__ import annotations

import importlib.util
import re
import shutil

import pytest

from conftest import ROOT
from kgen.spec import load_spec
from kgen.verify import tq

SPEC_PATH = ROOT / "specs" / "tq_decode.yaml"
VARIANTS = sorted((ROOT / "generated" / "tq_decode").glob("tq_decode_gfx950_*.py"))


@pytest.fixture(scope="module")
def spec():
    return load_spec(SPEC_PATH)


def _report(results) -> str:
    return "\n".join(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']}: max abs {r['max_abs']:.3g} {r['detail']}"
                     for r in results)


def test_there_are_flydsl_variants_to_run():
    assert VARIANTS, "no generated FlyDSL TQ decode variant found"


@pytest.mark.parametrize("path", VARIANTS, ids=[p.stem for p in VARIANTS])
def test_flydsl_variant_matches_the_reference_under_the_emulator(spec, path):
    results = tq.check_emulated(path, spec, "cpu")
    assert len(results) == len(spec.options.cases) + 1
    assert all(r["ok"] for r in results), _report(results)


# ---- planted bugs ---------------------------------------------------------------------------------------

# (what the bug is, pattern, replacement): each must apply exactly once to the generated source.
PLANTED = [
    ("seq_len mask dropped", r"valid\[i\]\.select\((\w+), fx\.Float32\(float\(\"-inf\"\)\)\)", r"\1"),
    ("nibble order swapped", r"cvt_f32_ubyte\(lo, j\)\)\n(\s+)levels\.append\(cvt_f32_ubyte\(hi, j\)\)",
     r"cvt_f32_ubyte(hi, j))\n\1levels.append(cvt_f32_ubyte(lo, j))"),
    ("v_scale read from the v_zero field", r"vs = fp16x4_to_f32\(vs_cur\)", "vs = fp16x4_to_f32(vz_cur)"),
]
BASE = next((p for p in VARIANTS if p.stem.endswith("qg8_bs16")), VARIANTS[0] if VARIANTS else None)


def _planted(tmp_path, pattern, replacement):
    source, n = re.subn(pattern, replacement, BASE.read_text(encoding="utf-8"))
    assert n == 1, f"the mutation {pattern!r} applies {n} times to {BASE.name}: update it to the template"
    path = tmp_path / BASE.name
    path.write_text(source, encoding="utf-8")
    return path


@pytest.mark.parametrize("what, pattern, replacement", PLANTED, ids=[p[0] for p in PLANTED])
def test_the_emulator_catches_a_planted_bug(tmp_path, spec, what, pattern, replacement):
    path = _planted(tmp_path, pattern, replacement)
    results = tq.check_emulated(path, spec, "cpu", cases=tq.decode_cases(spec, None, "cpu", extra_cases=False))
    # far outside the tolerance, not a rounding-level miss
    assert any(not r["ok"] and r["max_abs"] > 10 * spec.options.tolerance.atol for r in results), _report(results)


def test_the_empty_partition_contract_is_checked(tmp_path, spec):
    """An empty partition must store max_logit -inf; merge_partitions would skip a finite one
    anyway (its exp_sum is 0), so only the contract check sees this bug."""
    path = _planted(tmp_path, r"m_out = has_tok\.select\(m_run \* LN2, fx\.Float32\(float\(\"-inf\"\)\)\)",
                    "m_out = m_run * LN2")
    results = tq.check_emulated(path, spec, "cpu", cases=tq.decode_cases(spec, None, "cpu", extra_cases=False))
    assert [r["ok"] for r in results] == [False] and "empty partition rows" in results[0]["detail"], _report(results)


def _compiler_available() -> bool:
    return importlib.util.find_spec("flydsl") is not None and bool(shutil.which("ld.lld-19") or shutil.which("ld.lld"))


@pytest.mark.skipif(not _compiler_available(), reason="needs flydsl and ld.lld (Debian lld-19)")
@pytest.mark.parametrize("what, pattern, replacement", PLANTED, ids=[p[0] for p in PLANTED])
def test_the_compile_tier_alone_passes_the_planted_bug(tmp_path, what, pattern, replacement):
    from kgen.targets import GFX950
    from kgen.verify.flydsl import compile_variant, isa_problems

    path = _planted(tmp_path, pattern, replacement)
    report, error = compile_variant(path, "gfx950", tmp_path / "dump")
    assert report is not None, error
    assert isa_problems(report, GFX950, 0) == []


@pytest.mark.skipif(not _compiler_available(), reason="needs flydsl and ld.lld (Debian lld-19)")
def test_the_compiled_kernel_rounds_as_the_emulator_does(tmp_path):
    """The emulator rounds every fp32 operation separately and models exp2, rcp and the bf16
    conversion by their instructions: the gfx950 assembly must use exactly those (no fused fp32
    multiply-add), or the emulator's rounding is not the hardware's."""
    from kgen.verify.flydsl import compile_variant

    report, error = compile_variant(BASE, "gfx950", tmp_path / "dump")
    assert report is not None, error
    ops = report.mnemonics
    fused = sorted(m for m in ops if re.match(r"v_(pk_)?(fma|fmac|mad|mac)_(mix|f32|legacy)", m))
    assert fused == []
    for needed in ("v_exp_f32", "v_rcp_f32", "v_cvt_pk_bf16_f32"):
        assert any(m.startswith(needed) for m in ops), needed
