"""kgen.emu.isa: each gfx950 instruction semantic the emulator relies on, against a direct numpy
statement of AMD's documentation (written here independently, element by element), and kgen's
own statement of the same layouts (kgen/targets.py) against the emulator's."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
import torch

from kgen.emu import isa
from kgen.targets import GFX950, elem, lane

RNG = np.random.default_rng(7)


def random_bf16_bits(shape):
    """bf16 values spread over many binades (never zero-filled), as bit patterns."""
    x = RNG.standard_normal(shape) * np.exp2(RNG.integers(-6, 6, size=shape))
    return isa.f32_to_bf16_bits(x.astype(np.float32))


# ---- MFMA ----------------------------------------------------------------------------------------------

# AMD Matrix Instruction Calculator, CDNA3, v_mfma_f32_16x16x16_bf16 (--matrix-entry): register r,
# half h of lane l holds element 2r + h of the lane's operand vector.
CALCULATOR_16X16X16 = {
    "A": {(0, 0): (0, 0), (0, 1): (0, 1), (17, 2): (1, 6), (17, 3): (1, 7), (35, 0): (3, 8), (35, 1): (3, 9),
          (63, 2): (15, 14), (63, 3): (15, 15), (50, 0): (2, 12), (50, 1): (2, 13)},
    "B": {(0, 0): (0, 0), (0, 1): (1, 0), (17, 2): (6, 1), (17, 3): (7, 1), (35, 0): (8, 3), (35, 1): (9, 3),
          (63, 2): (14, 15), (63, 3): (15, 15), (50, 0): (12, 2), (50, 1): (13, 2)},
    "D": {(0, 0): (0, 0), (17, 1): (5, 1), (35, 0): (8, 3), (63, 1): (13, 15), (50, 0): (12, 2)},
}


def documented_layout(k):
    """(row, col) of A, B and D held by lane l, element v: CDNA3/CDNA4 ISA, 16x16xK bf16 MFMA
    (four lane groups of 16 split K; each holds K/4 consecutive K values)."""
    kl = k // 4
    a = {(l, v): (l % 16, (l // 16) * kl + v) for l in range(64) for v in range(kl)}
    b = {(l, v): ((l // 16) * kl + v, l % 16) for l in range(64) for v in range(kl)}
    d = {(l, v): ((l // 16) * 4 + v, l % 16) for l in range(64) for v in range(4)}
    return a, b, d


def test_documented_16x16x16_layout_matches_amd_calculator():
    a, b, d = documented_layout(16)
    for name, table in (("A", a), ("B", b), ("D", d)):
        for key, rc in CALCULATOR_16X16X16[name].items():
            assert table[key] == rc, (name, key)


def random_f16_bits(shape):
    return (RNG.standard_normal(shape) * 4).astype(np.float16).view(np.uint16)


def widen(bits, fmt):
    return isa.bf16_bits_to_f32(bits) if fmt == "bf16" else bits.view(np.float16).astype(np.float32)


@pytest.mark.parametrize("fmt", ["bf16", "f16"])
@pytest.mark.parametrize("k", [16, 32])
def test_mfma_is_a_times_b_plus_c_in_the_documented_layout(k, fmt):
    a_lay, b_lay, d_lay = documented_layout(k)
    random_bits = random_bf16_bits if fmt == "bf16" else random_f16_bits
    A_bits, B_bits = random_bits((16, k)), random_bits((k, 16))
    C = RNG.standard_normal((16, 16)).astype(np.float32)
    a = np.zeros((64, k // 4), np.uint16)
    b = np.zeros((64, k // 4), np.uint16)
    c = np.zeros((64, 4), np.float32)
    for (l, v), (r, kk) in a_lay.items():
        a[l, v] = A_bits[r, kk]
    for (l, v), (kk, col) in b_lay.items():
        b[l, v] = B_bits[kk, col]
    for (l, v), (r, col) in d_lay.items():
        c[l, v] = C[r, col]
    out = isa.mfma_f32_16x16(a, b, c, k, fmt)
    A, B = widen(A_bits, fmt).astype(np.float64), widen(B_bits, fmt).astype(np.float64)
    want = (A @ B + C).astype(np.float32)  # 16-bit float products are exact; one rounding to fp32
    for (l, v), (r, col) in d_lay.items():
        assert out[l, v] == want[r, col], (l, v)


def test_mfma_rounds_once_not_per_product():
    """1 + 2^24 - 2^24 summed in fp32 order would lose the 1; the emulator's D is the exact sum
    rounded once (AMD does not publish the internal order; see README, emulator section)."""
    k = 16
    a = np.zeros((64, 4), np.uint16)
    b = np.zeros((64, 4), np.uint16)
    ones = isa.f32_to_bf16_bits(np.float32(1.0))
    # row 0 of A = [1, 2^24, -2^24, 0...] (lanes 0 holds K 0..3), column 0 of B all ones
    a[0, :3] = isa.f32_to_bf16_bits(np.array([1.0, 2.0**24, -(2.0**24)], np.float32))
    b[[0, 16, 32, 48], :] = ones
    out = isa.mfma_f32_16x16(a, b, np.zeros((64, 4), np.float32), k)
    assert out[0, 0] == 1.0


@pytest.mark.parametrize("mfma", [GFX950.qk_mfma, GFX950.pv_mfma])
def test_kgen_targets_layouts_agree_with_the_documented_ones(mfma):
    """kgen/targets.py states the layouts kgen's proofs use; they must be the documented ones
    the emulator runs."""
    a_lay, b_lay, d_lay = documented_layout(mfma.k)
    for table, expr in ((a_lay, mfma.a_element()), (b_lay, mfma.b_element()), (d_lay, mfma.c_element())):
        f = sympy.lambdify((lane, elem), expr)
        assert {key: tuple(int(x) for x in f(*key)) for key in table} == table


# ---- LDS transpose read --------------------------------------------------------------------------------


def test_ds_read_tr16_b64_gives_each_lane_a_column():
    """CDNA4 ISA 11.4: 16 lanes each read 4 consecutive values of a row-major 4 x 16 block (lane s:
    row s // 4, columns 4 (s % 4) .. + 3); lane i receives column i, rows 0..3 in order."""
    rows = np.zeros((64, 4), np.uint16)
    block = RNG.integers(0, 2**16, size=(4, 4, 16), dtype=np.uint16)  # [group, row, column]
    for g in range(4):
        for s in range(16):
            rows[16 * g + s] = block[g, s // 4, 4 * (s % 4) : 4 * (s % 4) + 4]
    out = isa.ds_read_tr16_b64(rows)
    for g in range(4):
        for i in range(16):
            assert list(out[16 * g + i]) == list(block[g, :, i])


def test_ds_read_tr16_b64_feeds_the_16x16x16_b_operand():
    """What the instruction is for: lane group g reading rows 4g..4g+3 of a row-major K x N tile
    delivers exactly the B operand layout of v_mfma_f32_16x16x16_bf16."""
    tile = RNG.integers(0, 2**16, size=(16, 16), dtype=np.uint16)  # [k][n]
    rows = np.stack([tile[4 * (l // 16) + (l % 16) // 4, 4 * (l % 4) : 4 * (l % 4) + 4] for l in range(64)])
    out = isa.ds_read_tr16_b64(rows)
    _, b_lay, _ = documented_layout(16)
    for (l, v), (kk, n) in b_lay.items():
        assert out[l, v] == tile[kk, n]


def test_kgen_targets_transpose_statement_agrees_with_the_emulator():
    ids = np.arange(256, dtype=np.uint16).reshape(64, 4)  # element c of lane s's row: 4 s + c
    out = isa.ds_read_tr16_b64(ids)
    src_lane, col = (sympy.lambdify((lane, elem), e) for e in GFX950.transpose_source())
    for l in range(64):
        for v in range(4):
            assert divmod(int(out[l, v]), 4) == (src_lane(l, v), col(l, v))


# ---- conversions, scalar instructions, buffer addressing -----------------------------------------------


def test_bf16_conversion_is_round_to_nearest_even():
    bits = np.concatenate([RNG.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32),
                           np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x80000000,
                                     0x00008000, 0x7F800000], np.uint32)])  # ties both ways, max, -0, tiny
    x = bits.view(np.float32)
    got = isa.f32_to_bf16_bits(x)
    # direct statement: the nearer of the two bf16 neighbours, the even one on a tie
    lo = (bits >> 16).astype(np.int64)
    rest = (bits & 0xFFFF).astype(np.int64)
    want = np.where((rest > 0x8000) | ((rest == 0x8000) & (lo & 1 == 1)), lo + 1, lo).astype(np.uint16)
    finite = np.isfinite(x)
    assert np.array_equal(got[finite], want[finite])
    torch_bits = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got[~np.isnan(x)], torch_bits[~np.isnan(x)])  # a second oracle: torch's RNE cast
    nan = np.array([0x7F800001, 0xFFC00000], np.uint32).view(np.float32)
    assert np.isnan(isa.bf16_bits_to_f32(isa.f32_to_bf16_bits(nan))).all()
    assert np.array_equal(isa.bf16_bits_to_f32(got[finite]).view(np.uint32), (want[finite].astype(np.uint32) << 16))


def test_cvt_f32_ubyte_picks_the_byte():
    x = RNG.integers(-(2**31), 2**31, size=64, dtype=np.int64).astype(np.int32)
    for n in range(4):
        assert np.array_equal(isa.cvt_f32_ubyte(x, n), [float((int(v) & 0xFFFFFFFF) >> (8 * n) & 0xFF) for v in x])


def test_exp2_and_rcp_are_correctly_rounded_fp32():
    x = (RNG.standard_normal(4096) * 40).astype(np.float32)
    with np.errstate(over="ignore"):
        assert np.array_equal(isa.exp2_f32(x), np.exp2(x.astype(np.float64)).astype(np.float32))
    assert isa.exp2_f32(np.array([-np.inf, 0.0, 3.0], np.float32)).tolist() == [0.0, 1.0, 8.0]
    y = RNG.standard_normal(4096).astype(np.float32) + np.float32(3.0)
    assert np.array_equal(isa.rcp_f32(y), (1.0 / y.astype(np.float64)).astype(np.float32))


def test_readlane_broadcasts_one_lane():
    x = RNG.integers(0, 1000, size=64).astype(np.int32)
    assert (isa.readlane(x, 37) == x[37]).all()


def test_buffer_offsets_are_unsigned_32_bit():
    v = np.array([0, 16, -4, 2**31 - 1], np.int32)
    s = np.array([8, -8, 0, 1], np.int32)
    assert isa.buffer_offset(v, s).tolist() == [8, 16 + 2**32 - 8, 2**32 - 4, 2**31]
