"""Reference implementations of multi-scale deformable attention (MSDA), forward and backward.

Deformable-DETR convention:

- ``value``               (B, S, M, D); the L levels are concatenated along S,
                          each level stored row-major (index y * W + x).
- ``spatial_shapes``      (L, 2) int64, rows (H_l, W_l).
- ``level_start_index``   (L,) int64, exclusive prefix sum of H_l * W_l, or None.
- ``sampling_locations``  (B, Q, M, L, K, 2), normalised (x, y); nominally in
                          [0, 1] but anything is legal (outside reads zeros).
- ``attention_weights``   (B, Q, M, L, K).
- result                  (B, Q, M * D) in value's dtype.

    out[b, q, m, :] = sum_{l, k} attn[b, q, m, l, k]
                      * bilinear(value[b, level l, m, :], x * W_l - 0.5, y * H_l - 0.5)

where bilinear is ``grid_sample(mode="bilinear", padding_mode="zeros",
align_corners=False)``: the four neighbouring pixels of the sample point each
contribute with their fractional weight, and pixels outside the level contribute 0.

Two implementations:

- ``msda_forward_grid_sample``: the fast reference used to validate generated
  kernels (one ``grid_sample`` call per level).
- ``msda_forward_loop``: a plain loop that spells out the definition corner by
  corner. It is slow and meant for tiny shapes only; it exists as an independent
  statement of the semantics that cross-checks the grid_sample version.
- ``msda_backward_reference``: the three gradients, by float64 autograd through the
  grid_sample version (validates generated backward kernels).

Both compute in float64 when any floating input is float64, otherwise in
float32 (half/bfloat16 inputs are upcast), and return value's dtype.
"""

import itertools

import torch
import torch.nn.functional as F

__all__ = ["derive_level_start_index", "msda_backward_reference", "msda_forward_grid_sample", "msda_forward_loop"]


def derive_level_start_index(spatial_shapes: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum of H_l * W_l: where each level begins along S."""
    sizes = spatial_shapes[:, 0].to(torch.int64) * spatial_shapes[:, 1].to(torch.int64)
    # Shift the inclusive cumsum right by one; the first level starts at 0.
    return torch.cumsum(sizes, 0) - sizes


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    # float64 inputs ask for a float64 answer; everything narrower is evaluated
    # in float32 so the reference is not limited by half-precision arithmetic.
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _prepare(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    """Shared argument handling: upcast, derive starts, read shapes as Python ints."""
    B, S, M, D = value.shape
    Bl, Q, Ml, L, K, two = sampling_locations.shape
    if (Bl, Ml, two) != (B, M, 2) or tuple(attention_weights.shape) != (B, Q, M, L, K):
        raise ValueError("inconsistent MSDA input shapes")
    if level_start_index is None:
        level_start_index = derive_level_start_index(spatial_shapes)
    shapes = [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
    starts = [int(s) for s in level_start_index.tolist()]
    if len(shapes) != L or len(starts) != L or sum(h * w for h, w in shapes) != S:
        raise ValueError("spatial_shapes / level_start_index do not match value and locations")
    cdtype = _compute_dtype(value, sampling_locations, attention_weights)
    return (
        value.to(cdtype),
        sampling_locations.to(cdtype),
        attention_weights.to(cdtype),
        shapes,
        starts,
        (B, Q, M, D, L, K),
    )


def msda_forward_grid_sample(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor | None,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> torch.Tensor:
    """MSDA forward via one ``F.grid_sample`` per level. Returns (B, Q, M*D)."""
    v, loc, attn, shapes, starts, (B, Q, M, D, L, K) = _prepare(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    )
    if B == 0 or Q == 0:
        # grid_sample rejects empty batches/grids; the answer is empty anyway.
        return value.new_zeros((B, Q, M * D))

    out = v.new_zeros((B * M, D, Q))
    for l, ((H, W), start) in enumerate(zip(shapes, starts)):
        # Heads become part of the batch: (B, HW, M, D) -> (B*M, D, H, W).
        img = v[:, start : start + H * W].permute(0, 2, 3, 1).reshape(B * M, D, H, W)
        # grid_sample with align_corners=False maps g in [-1, 1] to pixel
        # coordinate ((g + 1) * W - 1) / 2, so g = 2x - 1 gives x * W - 0.5.
        grid = (2 * loc[:, :, :, l] - 1).permute(0, 2, 1, 3, 4).reshape(B * M, Q, K, 2)
        sampled = F.grid_sample(img, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        # sampled: (B*M, D, Q, K); weight each of the K points and sum them.
        w = attn[:, :, :, l].permute(0, 2, 1, 3).reshape(B * M, 1, Q, K)
        out += (sampled * w).sum(-1)

    # (B*M, D, Q) -> (B, Q, M, D) -> (B, Q, M*D): heads side by side per query.
    return out.reshape(B, M, D, Q).permute(0, 3, 1, 2).reshape(B, Q, M * D).to(value.dtype)


def msda_forward_loop(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor | None,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> torch.Tensor:
    """MSDA forward as an explicit loop over (b, q, m, l, k). Tiny shapes only."""
    v, loc, attn, shapes, starts, (B, Q, M, D, L, K) = _prepare(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    )
    out = v.new_zeros((B, Q, M, D))
    for b, q, m, l, k in itertools.product(range(B), range(Q), range(M), range(L), range(K)):
        H, W = shapes[l]
        # Continuous pixel coordinates; pixel centres sit at integer + 0.5 in
        # normalised space, hence the -0.5. Kept as 0-d tensors so the
        # arithmetic happens in the compute dtype.
        x = loc[b, q, m, l, k, 0] * W - 0.5
        y = loc[b, q, m, l, k, 1] * H - 0.5
        x0 = int(torch.floor(x))
        y0 = int(torch.floor(y))
        lx = x - x0
        ly = y - y0
        corners = (
            (x0, y0, (1 - lx) * (1 - ly)),
            (x0 + 1, y0, lx * (1 - ly)),
            (x0, y0 + 1, (1 - lx) * ly),
            (x0 + 1, y0 + 1, lx * ly),
        )
        sample = v.new_zeros(D)
        for cx, cy, weight in corners:
            # Zero padding: a corner outside the level contributes nothing.
            if 0 <= cx < W and 0 <= cy < H:
                sample += weight * v[b, starts[l] + cy * W + cx, m]
        out[b, q, m] += attn[b, q, m, l, k] * sample
    return out.reshape(B, Q, M * D).to(value.dtype)


def msda_backward_reference(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor | None,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    grad_output: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (value, sampling_locations, attention_weights) of <grad_output, forward>, by
    float64 autograd through ``msda_forward_grid_sample``; returned in float64.

    At a sample exactly on a pixel centre the location gradient is one-sided (bilinear
    interpolation has a kink there); grid_sample and the kernels both take the corner at
    floor(x), so they agree when they compute the same floor.
    """
    v = value.detach().double().requires_grad_(True)
    loc = sampling_locations.detach().double().requires_grad_(True)
    attn = attention_weights.detach().double().requires_grad_(True)
    B, Q = loc.shape[:2]
    if B == 0 or Q == 0:
        return torch.zeros_like(v), torch.zeros_like(loc), torch.zeros_like(attn)
    out = msda_forward_grid_sample(v, spatial_shapes, level_start_index, loc, attn)
    grads = torch.autograd.grad(out, (v, loc, attn), grad_output.double())
    return tuple(g.detach() for g in grads)
