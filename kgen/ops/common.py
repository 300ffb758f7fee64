"""Pieces every operator lowering uses: plan facts, tolerances, dtype names."""

from __future__ import annotations

from dataclasses import dataclass

from kgen.spec import reader as r

# How a dtype is named in generated code and in variant names.
TORCH_DTYPE = {
    "float64": "torch.float64",
    "float32": "torch.float32",
    "float16": "torch.float16",
    "bfloat16": "torch.bfloat16",
    "int64": "torch.int64",
    "int32": "torch.int32",
    "uint8": "torch.uint8",
}
SHORT_DTYPE = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class Fact:
    """One derived number or expression of a plan, with why it holds (for `kgen show`)."""

    name: str
    value: str
    why: str


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    rel_rms: float | None = None  # per sequence: rms(out - ref) / rms(ref); None: not checked


def parse_tolerances(section: r.Section, dtypes: tuple[str, ...]) -> dict[str, Tolerance]:
    """`{dtype: {atol, rtol}}` with an entry required for every dtype the variants use."""
    out = {}
    for key, raw, line in section.entries():
        entry = r.Section(raw, section.path, section.child_field(key), getattr(raw, "line", line))
        out[key] = Tolerance(entry.get("atol", r.number(0.0)), entry.get("rtol", r.number(0.0)))
        entry.finish()
    for dtype in dtypes:
        if dtype not in out:
            raise section.error(dtype, f"required: a tolerance for {dtype}, which a variant uses")
    return out
