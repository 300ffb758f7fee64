"""gfx950 instruction semantics the emulator relies on, each a small numpy function over lanes.

Written from AMD's published descriptions; tests/test_emu_isa.py checks each against a direct
numpy statement of the same documentation:
- CDNA3 ISA (MI300), "Matrix Arithmetic Instructions" and AMD's Matrix Instruction Calculator
  (v_mfma_f32_16x16x16_bf16 and _f16 alike): lane l holds A[l % 16][4 * (l // 16) + v],
  B[4 * (l // 16) + v][l % 16] (v < 4) and the fp32 result D[4 * (l // 16) + v][l % 16].
- CDNA4 ISA (MI350), v_mfma_f32_16x16x32_bf16 / _f16, the double-rate shape: the same lane groups,
  each holding 8 consecutive K values: A[l % 16][8 * (l // 16) + v], B[8 * (l // 16) + v][l % 16]
  (v < 8); D as above. (AMD's gfx950 32x32x16 example loads 8 contiguous K per lane group the
  same way.)
- CDNA4 ISA section 11.4, DS_READ_B64_TR_B16: each lane reads 64 bits (four 16-bit elements) at its
  own LDS address; within each group of 16 lanes those 16 x 4 elements form a 4 x 16 matrix (lane s
  supplies row s // 4, columns 4 * (s % 4) .. + 3) and lane i of the group receives column i.
- Buffer instructions (CDNA3 ISA, "Buffer Addressing"): address = base + soffset + voffset, the two
  offsets unsigned 32-bit; with num_records = 0xFFFFFFFF (what make_buffer_ptr sets) nothing is
  range-checked, so the emulator treats any byte outside the kernel argument as a fault.
- V_CVT_F32_UBYTE{0..3}: the float of byte n of the source. V_READLANE_B32: lane n of a VGPR into
  an SGPR. V_EXP_F32 / V_RCP_F32: 2^x and 1/x, specified to 1 ULP; modelled correctly rounded.
- V_CVT_PK_BF16_F32 (gfx950): fp32 -> bf16 rounded to nearest even, NaN kept quiet.
"""

from __future__ import annotations

import functools

import numpy as np

LANES = 64


# ---- conversions -----------------------------------------------------------------------------------


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, round to nearest even; NaN stays a (quiet) NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x0040, rounded).astype(np.uint16)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns -> fp32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def cvt_f32_ubyte(x: np.ndarray, byte: int) -> np.ndarray:
    """V_CVT_F32_UBYTE{byte}: float of byte `byte` (0 = least significant) of each 32-bit lane."""
    return ((np.asarray(x).view(np.uint32) >> (8 * byte)) & 0xFF).astype(np.float32)


def exp2_f32(x: np.ndarray) -> np.ndarray:
    """2^x in fp32, correctly rounded (V_EXP_F32 is specified to 1 ULP; exp2(-inf) = 0)."""
    with np.errstate(all="ignore"):
        return np.exp2(np.asarray(x, dtype=np.float64)).astype(np.float32)


def rcp_f32(x: np.ndarray) -> np.ndarray:
    """1/x in fp32, correctly rounded (V_RCP_F32 is specified to 1 ULP)."""
    with np.errstate(all="ignore"):
        return (np.float32(1.0) / np.asarray(x, dtype=np.float32)).astype(np.float32)


def readlane(x: np.ndarray, lane: int) -> np.ndarray:
    """V_READLANE_B32: lane `lane` of x, broadcast (an SGPR value every lane sees)."""
    return np.repeat(np.asarray(x)[lane : lane + 1], LANES, axis=0)


# ---- matrix instructions -----------------------------------------------------------------------------


def mfma_f32_16x16(a_bits: np.ndarray, b_bits: np.ndarray, c: np.ndarray, k: int, fmt: str = "bf16"):
    """v_mfma_f32_16x16x{k}_{fmt} (k = 16 or 32, fmt bf16 or f16): D = A B + C over the wave.

    a_bits, b_bits: [64, k/4] 16-bit patterns; c: [64, 4] fp32. Returns D in C's layout.
    Products of 16-bit floats are exact in fp64 and their sum nearly so; D is rounded to fp32
    once (the hardware's internal summation order and rounding are not published)."""
    widen = bf16_bits_to_f32 if fmt == "bf16" else (lambda bits: np.asarray(bits, np.uint16).view(np.float16))
    row, kk, dr = _mfma_layout(k)
    A = np.zeros((16, k))
    B = np.zeros((k, 16))
    A[row, kk] = widen(a_bits)
    B[kk, row] = widen(b_bits)
    C = np.zeros((16, 16))
    C[dr, row] = np.asarray(c, dtype=np.float32)
    with np.errstate(all="ignore"):
        D = A @ B + C
    return D[dr, row].astype(np.float32)


@functools.cache
def _mfma_layout(k: int):
    """Per lane and element: the row (of A, and column of B and D), the K index of an A/B
    element, and the D row of a result element."""
    lane = np.arange(LANES)
    kl = k // 4
    row = (lane % 16)[:, None]
    kk = (lane // 16)[:, None] * kl + np.arange(kl)  # [64, k/4]
    dr = (lane // 16)[:, None] * 4 + np.arange(4)  # [64, 4]
    return row, kk, dr


def ds_read_tr16_b64(rows: np.ndarray) -> np.ndarray:
    """DS_READ_B64_TR_B16: rows[l] = the four 16-bit elements at lane l's address; returns what each
    lane receives. Per 16-lane group the 64 elements, read as a row-major 4 x 16 matrix, are
    transposed: lane i gets column i."""
    rows = np.asarray(rows)
    out = np.empty_like(rows)
    for g in range(LANES // 16):
        out[16 * g : 16 * g + 16] = rows[16 * g : 16 * g + 16].reshape(4, 16).T
    return out


# ---- buffer addressing ----------------------------------------------------------------------------


def buffer_offset(voffset: np.ndarray, soffset: np.ndarray) -> np.ndarray:
    """Byte offset from the descriptor base: voffset + soffset, each an unsigned 32-bit value."""
    u32 = np.int64(0xFFFFFFFF)
    return (np.asarray(voffset).astype(np.int64) & u32) + (np.asarray(soffset).astype(np.int64) & u32)
