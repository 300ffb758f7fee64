"""Facts about hardware targets that lowerings and proofs rely on.

Operand layouts are stated per lane: for lane `t` and vector element `i`, which (row, col) of
the operand tile the lane holds. They follow AMD's matrix-instruction documentation for CDNA3/4
(wave64): for the 16x16xK bf16 MFMAs, lane t holds row t % 16 of A (and column t % 16 of B) at
the K positions (t // 16) * (K / 4) + i, and the 16x16 fp32 result rows (t // 16) * 4 + i of
column t % 16.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

lane, elem = sympy.symbols("lane elem", integer=True, nonnegative=True)


@dataclass(frozen=True)
class Mfma:
    """A 16 x 16 x k MFMA with 16-bit operands (bf16 or fp16, per mnemonic) and fp32 accumulation (wave64)."""

    m: int
    n: int
    k: int
    mnemonic: str

    @property
    def k_per_lane(self) -> int:
        return self.k // 4  # four lane groups of 16 share the K dimension

    def a_element(self) -> tuple[sympy.Expr, sympy.Expr]:
        """(row m, col k) of A held by (lane, elem), elem < k_per_lane."""
        return lane % 16, (lane // 16) * self.k_per_lane + elem

    def b_element(self) -> tuple[sympy.Expr, sympy.Expr]:
        """(row k, col n) of B held by (lane, elem), elem < k_per_lane."""
        return (lane // 16) * self.k_per_lane + elem, lane % 16

    def c_element(self) -> tuple[sympy.Expr, sympy.Expr]:
        """(row m, col n) of the fp32 result held by (lane, elem), elem < 4."""
        return (lane // 16) * 4 + elem, lane % 16


@dataclass(frozen=True)
class AmdTarget:
    arch: str
    wave: int
    lds_bytes: int  # per workgroup
    vgprs: int  # architected VGPRs addressable per lane (AGPRs aside)
    qk_mfma: Mfma
    pv_mfma: Mfma
    transpose_read: str  # the ISA mnemonic of the 16-bit LDS transpose read
    required_isa: tuple[str, ...]

    @staticmethod
    def transpose_source(row_elems: int = 4) -> tuple[sympy.Expr, sympy.Expr]:
        """ds_read_tr16_b64: lane t's element e comes from the 8-byte row that source lane
        (t // 16) * 16 + e * 4 + (t % 16) // 4 addressed, at 16-bit column t % 4."""
        return (lane // 16) * 16 + elem * row_elems + (lane % 16) // 4, lane % 4


GFX950 = AmdTarget(
    arch="gfx950",
    wave=64,
    lds_bytes=160 * 1024,
    vgprs=512,
    qk_mfma=Mfma(16, 16, 32, "v_mfma_f32_16x16x32_bf16"),
    pv_mfma=Mfma(16, 16, 16, "v_mfma_f32_16x16x16_f16"),
    transpose_read="ds_read_b64_tr_b16",
    required_isa=("v_mfma_f32_16x16x32_bf16", "v_mfma_f32_16x16x16_f16", "ds_read_b64_tr_b16"),
)

AMD_TARGETS = {"gfx950": GFX950}


# ---- NVIDIA (Triton backend) ------------------------------------------------------------------

# The first compute capability whose PTX has a native atomic add for an element type, with the
# instruction (PTX ISA, "atom" / "red": .f32 since sm_20, .f64 since sm_60, .noftz.f16 since sm_70,
# .noftz.bf16 since sm_90; .u64 since sm_20). Lowerings derive accumulation choices from this.
ATOMIC_ADD_SINCE = {
    "float32": (20, "atom.global.add.f32"),
    "float64": (60, "atom.global.add.f64"),
    "float16": (70, "atom.global.add.noftz.f16"),
    "bfloat16": (90, "atom.global.add.noftz.bf16"),
    "int64": (20, "atom.global.add.u64"),
}


@dataclass(frozen=True)
class NvidiaTarget:
    arch: str  # e.g. "sm_90"
    compute_capability: int  # e.g. 90

    def native_atomic_add(self, dtype: str) -> bool:
        since = ATOMIC_ADD_SINCE.get(dtype)
        return since is not None and self.compute_capability >= since[0]

    def atomic_add_reason(self, dtype: str) -> str:
        since = ATOMIC_ADD_SINCE.get(dtype)
        if since is None:
            return f"no native atomic add for {dtype} on NVIDIA GPUs"
        have = "has" if self.native_atomic_add(dtype) else "lacks"
        return f"{self.arch} {have} {since[1]} (native since sm_{since[0]})"


NVIDIA_TARGETS = {
    f"sm_{cc}": NvidiaTarget(f"sm_{cc}", cc) for cc in (70, 75, 80, 86, 89, 90, 100, 120)
}
