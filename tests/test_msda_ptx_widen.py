"""The bf16 MSDA forward's inline PTX widening, run exhaustively on a model of its instructions.

On NVIDIA the bf16 forward widens each pair of gathered bf16 values (one 32-bit register) to two
fp32 with one shift and one mask; the interpreter, which CI's numerics run, takes the plain
`.to(tl.float32)` arm instead. Here the asm text of the generated module is parsed and its
instructions are modelled on numpy words: every bf16 bit pattern in each half of a register
must widen to exactly the fp32 that torch gives. The module also compiles for sm_90 with the PTX
(Triton's bundled ptxas), at each size class's schedule.
"""

from __future__ import annotations

import ast
import re

import numpy as np
import pytest
import torch

from conftest import ROOT
from test_tq_sm90_compile import compile_sm90

GENERATED = ROOT / "generated" / "msda"
BF16 = GENERATED / "msda_fwd_bf16_m8_d32_l4_k4.py"
ALL_HALVES = np.arange(1 << 16, dtype=np.uint32)
# One register of two bf16 per lane: every pattern in the low half, a permutation of them in the high half.
WORDS = ALL_HALVES | np.random.default_rng(2).permutation(ALL_HALVES) << 16


def _inline_asm(source: str, function: str) -> tuple[str, str, int]:
    """(asm text, constraints, pack) of the tl.inline_asm_elementwise call inside `function`."""
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == function)
    call = next(n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "inline_asm_elementwise")
    named = dict(zip(("asm", "constraints"), call.args)) | {k.arg: k.value for k in call.keywords}
    return tuple(ast.literal_eval(named[key]) for key in ("asm", "constraints", "pack"))


def _run_asm(asm: str, word: np.ndarray) -> dict[int, np.ndarray]:
    """The asm's outputs ($0, $1, ...) for input $2 = word, shl.b32 and and.b32 modelled."""
    regs = {2: word}
    for line in (part.strip() for part in asm.strip().strip("{}").split(";")):
        if not line:
            continue
        op, dst, src, imm = re.fullmatch(r"(\S+)\s+\$(\d+),\s*\$(\d+),\s*(\S+)", line).groups()
        value = regs[int(src)]
        if op == "shl.b32":
            regs[int(dst)] = (value << np.uint32(int(imm, 0))) & np.uint32(0xFFFFFFFF)
        elif op == "and.b32":
            regs[int(dst)] = value & np.uint32(int(imm, 0))
        else:
            raise AssertionError(f"unmodelled instruction {op!r}: model it before trusting this test")
    return regs


def _widened(halves: np.ndarray) -> np.ndarray:
    """torch's bf16 -> fp32 of each 16-bit pattern, as fp32 bit patterns."""
    bf16 = torch.from_numpy(halves.astype(np.uint16).view(np.int16)).view(torch.bfloat16)
    return bf16.float().view(torch.int32).numpy().view(np.uint32)


def test_widening_is_exact_for_every_bf16_pattern():
    asm, constraints, pack = _inline_asm(BF16.read_text(), "_bilinear_corner")
    assert constraints == "=r,=r,r" and pack == 2  # two fp32 out of one register of two bf16 (element 0 low)
    out = _run_asm(asm, WORDS)
    np.testing.assert_array_equal(out[0], _widened(WORDS & 0xFFFF))  # NaN payloads, infinities, subnormals, -0 too
    np.testing.assert_array_equal(out[1], _widened(WORDS >> 16))


def test_only_bf16_variants_widen_by_hand():
    for path in sorted(GENERATED.glob("msda_fwd_*.py")):
        assert ("WIDEN_PTX" in path.read_text()) == ("_bf16_" in path.name), path.name


@pytest.mark.parametrize("name", ["msda_fwd_bf16_m8_d32_l4_k4", "msda_fwd_bf16_m1_d24_l3_k4"])
def test_bf16_forward_compiles_for_sm90_with_its_ptx(name):
    records = compile_sm90(GENERATED / f"{name}.py")
    assert len(records) == 2 and all(r["ok"] and r["stack"] == 0 for r in records), records  # decoder, encoder classes
