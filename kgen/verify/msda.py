"""Numerical check of a generated MSDA forward against the float64 PyTorch reference."""

from __future__ import annotations

from typing import Any

import torch

from kgen.reference.msda import derive_level_start_index, msda_forward_grid_sample


def make_inputs(case, heads: int, head_dim: int, points: int, dtype: torch.dtype, device: str, seed: int) -> dict[str, Any]:
    """Random, never-zero inputs for one validation case; some locations snapped to exact pixel
    edges and centres, some far outside, so the corner and padding rules are all exercised."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    shapes = torch.tensor(case.spatial_shapes, dtype=torch.int64)
    levels = shapes.shape[0]
    pixels = int((shapes[:, 0] * shapes[:, 1]).sum())
    B, Q = case.batch, case.queries
    value = torch.randn(B, pixels, heads, head_dim, generator=g)
    lo, hi = case.locations
    loc = lo + (hi - lo) * torch.rand(B, Q, heads, levels, points, 2, generator=g)
    if loc.numel():
        # Exact grid points (i / size) and far-away samples on a fixed fraction of the points.
        size = torch.stack([shapes[:, 1], shapes[:, 0]], -1).to(loc)  # (L, 2) as (W, H)
        snap = torch.rand(loc.shape, generator=g) < 0.15
        grid = torch.floor(loc * size * 2) / (size * 2)  # pixel edges and centres
        loc = torch.where(snap, grid, loc)
        far = torch.rand(loc.shape, generator=g) < 0.02
        loc = torch.where(far, torch.full_like(loc, 3.5), loc)
    weights = torch.rand(B, Q, heads, levels, points, generator=g) + 0.05
    weights = weights / weights.sum(dim=(-1, -2), keepdim=True)
    to = dict(device=device, dtype=dtype)
    return {
        "value": value.to(**to),
        "spatial_shapes": shapes.to(device),
        "sampling_locations": loc.to(**to),
        "attention_weights": weights.to(**to),
    }


def check(module, spec, variant, device: str) -> list[dict[str, Any]]:
    """Run every validation case of the spec through the generated wrapper; one result per case."""
    opts = spec.options
    dtype = getattr(torch, variant.values["dtype"])
    tol = opts.tolerances[variant.values["dtype"]]
    cases = list(opts.cpu_cases) + (list(opts.gpu_cases) if device == "cuda" else [])
    results = []
    for i, case in enumerate(cases):
        inputs = make_inputs(case, module.HEADS, module.HEAD_DIM, module.POINTS, dtype, device, seed=1000 + i)
        # Alternate between an explicit level_start_index and letting the wrapper derive it.
        start = derive_level_start_index(inputs["spatial_shapes"]) if i % 2 == 0 else None
        out = module.msda_forward(
            inputs["value"], inputs["spatial_shapes"], start, inputs["sampling_locations"], inputs["attention_weights"]
        )
        if device == "cuda":
            torch.cuda.synchronize()
        ref = msda_forward_grid_sample(
            inputs["value"].double(), inputs["spatial_shapes"], None,
            inputs["sampling_locations"].double(), inputs["attention_weights"].double(),
        )
        results.append(_compare(out, ref, tol, case, dtype))
    return results


def _compare(out: torch.Tensor, ref: torch.Tensor, tol, case, dtype) -> dict[str, Any]:
    label = f"B={case.batch} Q={case.queries} levels={[list(s) for s in case.spatial_shapes]}"
    if out.shape != ref.shape or out.dtype != dtype:
        return {"case": label, "ok": False, "detail": f"got {tuple(out.shape)} {out.dtype}, expected {tuple(ref.shape)} {dtype}"}
    if out.numel() == 0:
        return {"case": label, "ok": True, "max_abs": 0.0, "max_rel": 0.0, "worst": None}
    diff = (out.double() - ref).abs()
    allowed = tol.atol + tol.rtol * ref.abs()
    excess = diff - allowed
    worst = int(torch.argmax(excess).item())
    finite = bool(torch.isfinite(out).all())
    max_rel = float((diff / ref.abs().clamp_min(1e-6)).max())
    return {
        "case": label,
        "ok": finite and bool((excess <= 0).all()),
        "max_abs": float(diff.max()),
        "max_rel": max_rel,
        "worst": list(map(int, torch.unravel_index(torch.tensor(worst), out.shape))),
        "detail": "" if finite else "non-finite output",
    }
