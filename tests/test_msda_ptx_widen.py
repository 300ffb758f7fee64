"""The bf16 MSDA forward's fused corner form: its inline PTX widening run exhaustively on a model
of its instructions, and the module compiled for sm_90.

Where a size class's schedule fuses the corners (`corners: fused`, chosen by `kgen tune`), a bf16
forward on NVIDIA widens each pair of gathered bf16 values (one 32-bit register) to two fp32 with
one shift and one mask; the interpreter, which CI's numerics run, takes the plain
`.to(tl.float32)` arm instead. Here the asm text of a generated module is parsed and its
instructions are modelled on numpy words: every bf16 bit pattern in each half of a register must
widen to exactly the fp32 that torch gives. The module also compiles for sm_90 with the PTX
(Triton's bundled ptxas), at each size class's schedule, fused and summed.
"""

from __future__ import annotations

import ast
import json
import re

import numpy as np
import pytest
import torch

from conftest import ROOT
from kgen.generate import generate
from kgen.spec import load_spec
from test_tq_sm90_compile import compile_sm90

VARIANT = "msda_fwd_bf16_m8_d32_l4_k4"
ALL_HALVES = np.arange(1 << 16, dtype=np.uint32)
# One register of two bf16 per lane: every pattern in the low half, a permutation of them in the high half.
WORDS = ALL_HALVES | np.random.default_rng(2).permutation(ALL_HALVES) << 16


@pytest.fixture(scope="module")
def fused_by_class(tmp_path_factory):
    """The bf16 DETR module with the decoder's forward corners fused and the encoder's summed (its
    other schedule fields as shipped)."""
    tmp = tmp_path_factory.mktemp("widen")
    (tmp / "specs").mkdir()
    (tmp / "specs" / "msda.yaml").write_text((ROOT / "specs" / "msda.yaml").read_text())
    shipped = json.loads((ROOT / "specs" / "msda.tuning.json").read_text())
    shipped["schedules"] = {VARIANT: shipped["schedules"][VARIANT]}
    shipped["schedules"][VARIANT]["decoder"]["forward"]["corners"] = "fused"
    shipped["schedules"][VARIANT]["encoder"]["forward"]["corners"] = "summed"
    (tmp / "specs" / "msda.tuning.json").write_text(json.dumps(shipped, indent=2))
    text = next(o.text for o in generate(load_spec(tmp / "specs" / "msda.yaml"), ROOT) if o.variant == VARIANT)
    path = tmp / f"{VARIANT}.py"
    path.write_text(text)
    return path


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


def test_widening_is_exact_for_every_bf16_pattern(fused_by_class):
    asm, constraints, pack = _inline_asm(fused_by_class.read_text(), "_bilinear_corner")
    assert constraints == "=r,=r,r" and pack == 2  # two fp32 out of one register of two bf16 (element 0 low)
    out = _run_asm(asm, WORDS)
    np.testing.assert_array_equal(out[0], _widened(WORDS & 0xFFFF))  # NaN payloads, infinities, subnormals, -0 too
    np.testing.assert_array_equal(out[1], _widened(WORDS >> 16))


def test_only_the_fused_class_widens(fused_by_class, monkeypatch):
    from conftest import load_module

    module = load_module(fused_by_class)
    monkeypatch.setattr(module, "WIDEN_PTX", True)  # as on NVIDIA (the interpreter's module says False)
    decoder, encoder = (module._launch(rows, backward=False)[1] for rows in (8192, 8193))
    assert (decoder["FUSED_CORNERS"], decoder["WIDEN_PTX"]) == (True, True)
    assert (encoder["FUSED_CORNERS"], encoder["WIDEN_PTX"]) == (False, False)


def test_bf16_forward_compiles_for_sm90_with_its_ptx(fused_by_class):
    records = compile_sm90(fused_by_class)
    assert len(records) == 2 and all(r["ok"] and r["stack"] == 0 for r in records), records  # decoder (fused), encoder (summed)
