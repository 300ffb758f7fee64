"""Numerical check of a generated MSDA module (forward, and the backward through autograd) against
the float64 PyTorch reference."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from torch.autograd.gradcheck import GradcheckError

from kgen.reference.msda import derive_level_start_index, msda_backward_reference, msda_forward_grid_sample


def local_locations(levels, batch: int, queries: int, heads: int, points: int, generator, device="cpu") -> torch.Tensor:
    """fp32 sampling locations [batch, queries, heads, L, points, 2] as a trained Deformable DETR
    draws them: each query's points within 2 pixels (of each level) of one reference point per
    query. Where the queries are the pyramid's pixels (queries == sum of h * w: an encoder), query
    i's reference point is the centre of pixel i, so neighbouring queries sample neighbouring
    pixels; otherwise (a decoder's object queries) reference points are uniform in [0, 1)."""
    if queries == sum(h * w for h, w in levels):
        refs = []
        for h, w in levels:
            ys, xs = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
            refs.append(torch.stack([(xs.flatten() + 0.5) / w, (ys.flatten() + 0.5) / h], -1))
        ref = torch.cat(refs)[None].expand(batch, queries, 2)
    else:
        ref = torch.rand(batch, queries, 2, device=device, generator=generator)
    wh = torch.tensor([[w, h] for h, w in levels], dtype=torch.float32, device=device)  # [L, 2]
    offset_px = torch.rand(batch, queries, heads, len(levels), points, 2, device=device, generator=generator) * 4 - 2
    return ref[:, :, None, None, None, :] + offset_px / wh[None, None, None, :, None, :]


def make_inputs(
    case, heads: int, head_dim: int, points: int, dtype: torch.dtype, device: str, seed: int, snap: bool = True,
    sampling: str = "uniform",
) -> dict[str, Any]:
    """Random, never-zero inputs for one validation case; some locations snapped to exact pixel
    edges and centres, some far outside, so the corner and padding rules are all exercised.
    snap=False leaves out the exact pixel centres, where the location gradient has a kink (for
    gradient checks: a location rounded to the input dtype may fall on either side of it).
    sampling="local" (kgen tune) draws locations by local_locations instead: no snapped or far
    samples, the workload of a trained model rather than the corner cases."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    shapes = torch.tensor(case.spatial_shapes, dtype=torch.int64)
    levels = shapes.shape[0]
    pixels = int((shapes[:, 0] * shapes[:, 1]).sum())
    B, Q = case.batch, case.queries
    value = torch.randn(B, pixels, heads, head_dim, generator=g)
    lo, hi = case.locations
    if sampling == "local":
        loc = local_locations(case.spatial_shapes, B, Q, heads, points, g)
    elif sampling == "uniform":
        loc = lo + (hi - lo) * torch.rand(B, Q, heads, levels, points, 2, generator=g)
        if loc.numel():
            # Exact grid points (i / size) and far-away samples on a fixed fraction of the points.
            size = torch.stack([shapes[:, 1], shapes[:, 0]], -1).to(loc)[:, None, :]  # (L, 1, 2): (W, H) per level, any K
            snap = torch.rand(loc.shape, generator=g) < (0.15 if snap else 0.0)
            grid = torch.floor(loc * size * 2) / (size * 2)  # pixel edges and centres
            loc = torch.where(snap, grid, loc)
            far = torch.rand(loc.shape, generator=g) < 0.02
            loc = torch.where(far, torch.full_like(loc, 3.5), loc)
    else:
        raise ValueError(f"sampling: expected 'uniform' or 'local', got {sampling!r}")
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
    """Run every validation case of the spec through the generated wrapper; one result per case.
    Cases list levels for the deepest variant; this one uses the first LEVELS of them. On the
    CPU, the small cases fall into the first size class: the first CPU case and the gradient
    case run once more under each other schedule the module carries, so every schedule runs."""
    opts = spec.options
    dtype = getattr(torch, variant.values["dtype"])
    tol = opts.tolerances[variant.values["dtype"]]
    cases = list(opts.cpu_cases) + (list(opts.gpu_cases) if device == "cuda" else [])
    cases = [c.first_levels(module.LEVELS) for c in cases]
    results = []
    grad_tol = opts.grad_tolerances[variant.values["dtype"]]
    # The small gradient case: each other schedule's gradient check and the float64 gradcheck.
    first_grad_case = (list(opts.grad_cases) or cases)[0].first_levels(module.LEVELS)
    for row in _other_schedules(module, cases):
        with _forced(module, row):
            tag = f"[{row[0]} schedule] "
            results.append(_forward_result(module, cases[0], dtype, device, tol, 1000, tag))
            results += [dict(r, case=tag + r["case"]) for r in check_gradients(module, first_grad_case, dtype, device, grad_tol, seed=2000)]
    for i, case in enumerate(cases):
        # Alternate between an explicit level_start_index and letting the wrapper derive it.
        results.append(_forward_result(module, case, dtype, device, tol, 1000 + i, explicit_start=i % 2 == 0))
    grad_cases = list(opts.grad_cases) + (list(opts.gpu_cases) if device == "cuda" else [])
    grad_cases = [c.first_levels(module.LEVELS) for c in grad_cases]
    for i, case in enumerate(grad_cases):
        results += check_gradients(module, case, dtype, device, grad_tol, seed=2000 + i)
    # What the float64 variants are for. On the GPU only: on a mismatch gradcheck rebuilds the
    # whole Jacobian for its message, one forward per input element, which takes hours under the
    # interpreter (the CPU tests run it: tests/test_msda_backward.py).
    if dtype == torch.float64 and device == "cuda":
        results.append(gradcheck_result(module, first_grad_case, device))
    return results


# How far two runs of the backward may differ where grad_value is an atomic scatter: float64 adds
# land in a different order each run, which moves the last bits. gradcheck's reentrancy check
# demands bitwise-equal reruns by default; PyTorch's own tests allow 1e-12 for CUDA ops that
# scatter with atomics (GRADCHECK_NONDET_TOL), and so does this. The deterministic (fixed-point)
# backward gets no allowance.
ATOMIC_RERUN_TOL = 1e-12


def gradcheck_result(module, case, device: str, seed: int = 2500) -> dict[str, Any]:
    """torch.autograd.gradcheck of a float64 variant: its backward against finite differences of
    its own forward, independent of the reference. fast_mode (one random direction per input)
    keeps it to a few launches; its tolerance scales with the directions' sums, so it catches a
    gradient off by a few percent, where the float64 reference check catches 1e-10. The detail
    reports how far two backward runs on the same inputs differ, per gradient."""
    inputs = make_inputs(case, module.HEADS, module.HEAD_DIM, module.POINTS, torch.float64, device, seed, snap=False)
    leaves = tuple(inputs[n].requires_grad_(True) for n in ("value", "sampling_locations", "attention_weights"))
    label = f"gradcheck B={case.batch} Q={case.queries} levels={[list(s) for s in case.spatial_shapes]}"

    def forward(value, sampling_locations, attention_weights):
        return module.msda_forward(value, inputs["spatial_shapes"], None, sampling_locations, attention_weights)

    out = forward(*leaves)
    grad_out = torch.randn(out.shape, dtype=out.dtype, device=out.device,
                           generator=torch.Generator(device=out.device).manual_seed(seed))
    runs = [torch.autograd.grad(out, leaves, grad_out, retain_graph=True) for _ in range(2)]
    spread = ", ".join(f"{name} {(a - b).abs().max().item():.1e}"
                       for name, a, b in zip(("grad_value", "grad_locations", "grad_weights"), *runs))
    nondet_tol = 0.0 if module.DETERMINISTIC else ATOMIC_RERUN_TOL
    try:
        torch.autograd.gradcheck(forward, leaves, eps=1e-6, atol=1e-7, rtol=1e-5, nondet_tol=nondet_tol, fast_mode=True)
    except GradcheckError as err:
        return {"case": label, "ok": False, "detail": f"{str(err).splitlines()[0]} (reruns differ by: {spread})"}
    return {"case": label, "ok": True,
            "detail": f"analytical and numerical gradients agree (fast mode); reruns differ by: {spread} (allowed {nondet_tol:g})"}


def _forward_result(module, case, dtype, device, tol, seed: int, prefix: str = "", explicit_start: bool = True,
                    sampling: str = "uniform") -> dict[str, Any]:
    inputs = make_inputs(case, module.HEADS, module.HEAD_DIM, module.POINTS, dtype, device, seed=seed, sampling=sampling)
    start = derive_level_start_index(inputs["spatial_shapes"]) if explicit_start else None
    out = module.msda_forward(
        inputs["value"], inputs["spatial_shapes"], start, inputs["sampling_locations"], inputs["attention_weights"]
    )
    if device == "cuda":
        torch.cuda.synchronize()
    ref = msda_forward_grid_sample(
        inputs["value"].double(), inputs["spatial_shapes"], None,
        inputs["sampling_locations"].double(), inputs["attention_weights"].double(),
    )
    return _compare(out, ref, tol, case, dtype, prefix=prefix)


def _other_schedules(module, cases) -> list[tuple]:
    """SCHEDULES rows whose (forward, backward, accumulation dtype) no case of this run reaches."""
    def row_for(rows: int) -> tuple:
        return next(row for row in module.SCHEDULES if row[1] is None or rows <= row[1])

    reached = {row_for(c.batch * c.queries)[2:] for c in cases}
    out = []
    for row in module.SCHEDULES:
        if row[2:] not in reached:
            reached.add(row[2:])
            out.append(row)
    return out


@contextlib.contextmanager
def _forced(module, row):
    """Every call of the module takes the schedules of one SCHEDULES row."""
    saved = module.SCHEDULES
    module.SCHEDULES = ((row[0], None, *row[2:]),)
    try:
        yield
    finally:
        module.SCHEDULES = saved


def check_gradients(module, case, dtype: torch.dtype, device: str, tol, seed: int, sampling: str = "uniform") -> list[dict[str, Any]]:
    """The backward through autograd (the module's custom op) against float64 autograd through
    the reference: one result per gradient (value, sampling_locations, attention_weights)."""
    inputs, grad_out = _gradient_inputs(case, module.HEADS, module.HEAD_DIM, module.POINTS, dtype, device, seed, sampling)
    value, loc, attn = (inputs[n].detach().clone().requires_grad_(True) for n in ("value", "sampling_locations", "attention_weights"))
    out = module.msda_forward(value, inputs["spatial_shapes"], None, loc, attn)
    grads = torch.autograd.grad(out, (value, loc, attn), grad_out, allow_unused=True)
    if device == "cuda":
        torch.cuda.synchronize()
    refs, kinks = _reference_gradients(case, module.HEADS, module.HEAD_DIM, module.POINTS, dtype, device, seed, sampling)
    results = []
    for name, grad, ref in zip(("grad_value", "grad_locations", "grad_weights"), grads, refs):
        if grad is None:
            label = f"{name} B={case.batch} Q={case.queries}"
            results.append({"case": label, "ok": False, "detail": "no gradient (not connected to autograd)"})
            continue
        if name == "grad_locations" and bool(kinks.any()):
            keep = ~kinks[..., None].expand_as(ref)
            grad, ref = torch.where(keep, grad.double(), 0.0).to(grad.dtype), torch.where(keep, ref, 0.0)
            result = _compare(grad, ref, tol, case, dtype, prefix=f"{name} ")
            result["detail"] = (result.get("detail") or "") + f"{int(kinks.sum())} sample(s) within fp32 rounding of a kink left out"
            results.append(result)
            continue
        results.append(_compare(grad, ref, tol, case, dtype, prefix=f"{name} "))
    return results


def _gradient_inputs(case, heads: int, head_dim: int, points: int, dtype: torch.dtype, device: str, seed: int, sampling: str = "uniform"):
    """(inputs, grad_output) of one gradient check: the same tensors for the same arguments."""
    inputs = make_inputs(case, heads, head_dim, points, dtype, device, seed, snap=False, sampling=sampling)
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    grad_out = torch.randn(case.batch, case.queries, heads * head_dim, generator=g).to(device=device, dtype=dtype)
    return inputs, grad_out


# kgen tune checks every candidate schedule of a variant at the same sizes: the float64 reference
# (an autograd pass through grid_sample, at encoder size too) is computed once per size and
# dtype, not once per candidate.
@functools.lru_cache(maxsize=4)
def _reference_gradients(case, heads: int, head_dim: int, points: int, dtype: torch.dtype, device: str, seed: int, sampling: str = "uniform"):
    """(float64 reference gradients, locations to leave out of the comparison) of one check.

    The location gradient jumps where a pixel coordinate crosses an integer (the bilinear kink).
    The kernel forms x = loc * W - 0.5 in fp32, the reference in float64, so a sample within a
    few fp32 ulps of a kink can fall on the other side; those samples are left out of the
    location comparison (and counted), everything else is compared."""
    inputs, grad_out = _gradient_inputs(case, heads, head_dim, points, dtype, device, seed, sampling)
    loc = inputs["sampling_locations"]
    refs = msda_backward_reference(inputs["value"], inputs["spatial_shapes"], None, loc, inputs["attention_weights"], grad_out)
    return refs, _near_kink(loc.double(), inputs["spatial_shapes"])


def _near_kink(loc: torch.Tensor, spatial_shapes: torch.Tensor) -> torch.Tensor:
    """(B, Q, M, L, K) mask of samples whose pixel x or y is within 16 fp32 ulps (at the level's
    size) of an integer."""
    size = torch.stack([spatial_shapes[:, 1], spatial_shapes[:, 0]], -1).to(loc)  # (L, 2): (W, H)
    pixel = loc * size[:, None, :] - 0.5
    margin = 16 * torch.finfo(torch.float32).eps * size[:, None, :]
    distance = (pixel - torch.round(pixel)).abs()
    return (distance < margin).any(dim=-1)


def _compare(out: torch.Tensor, ref: torch.Tensor, tol, case, dtype, prefix: str = "") -> dict[str, Any]:
    label = f"{prefix}B={case.batch} Q={case.queries} levels={[list(s) for s in case.spatial_shapes]}"
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


class TuneWorkload:
    """kgen tune's view of one candidate module at one size: check a direction against the
    reference (forward: the output; backward: all three gradients), then hand out the call to
    time. Inputs are made once per size, as in `check`."""

    def __init__(self, module, spec, variant, case, device: str, sampling: str = "uniform"):
        self.module, self.device, self.sampling = module, device, sampling
        self.case = case.first_levels(module.LEVELS)
        self.dtype = getattr(torch, variant.values["dtype"])
        self.tol = spec.options.tolerances[variant.values["dtype"]]
        self.grad_tol = spec.options.grad_tolerances[variant.values["dtype"]]
        x = make_inputs(self.case, module.HEADS, module.HEAD_DIM, module.POINTS, self.dtype, device, seed=3000, snap=False, sampling=sampling)
        self.args = (x["value"], x["spatial_shapes"], derive_level_start_index(x["spatial_shapes"]), x["sampling_locations"], x["attention_weights"])
        g = torch.Generator(device="cpu").manual_seed(3001)
        shape = (self.case.batch, self.case.queries, module.HEADS * module.HEAD_DIM)
        self.grad_out = torch.randn(shape, generator=g).to(device=device, dtype=self.dtype)

    def check(self, direction: str) -> str | None:
        """None when this direction matches the reference, else what went wrong."""
        if direction == "forward":
            results = [_forward_result(self.module, self.case, self.dtype, self.device, self.tol, seed=3000, sampling=self.sampling)]
        else:
            results = check_gradients(self.module, self.case, self.dtype, self.device, self.grad_tol, seed=3000, sampling=self.sampling)
        bad = [r for r in results if not r["ok"]]
        return "; ".join(f"{r['case']}: max abs {r.get('max_abs', float('nan')):.3g} {r.get('detail', '')}".strip() for r in bad) or None

    def call(self, direction: str):
        """The zero-argument call to time: the public forward, or the backward custom op alone."""
        module, args = self.module, self.args
        if direction == "forward":
            return lambda: module.msda_forward(*args)
        return lambda: module._backward_op(self.grad_out, *args)
