"""How close MSDA is to the memory work it cannot avoid, at the benchmark's sizes (issue 5's gaps).

Run from the project root on a CUDA machine: `python benchmarks/msda_floor.py`.

For the Deformable DETR shape (benchmarks/msda.py's inputs, same seed; uniform and local
sampling), every sample is listed once on the host as one int32: the row of value at its top-left
corner and which of its four corners lie inside its level (grid_sample's zero padding drops the
others). Three kernels then move exactly those corner rows and do nothing else, each at its best
of a small schedule sweep:

- gather: the forward's memory work, every in-range corner row read and summed per query;
- scatter: the backward's grad_value work, a per-query row atomically added at every corner,
  with the accumulation ours uses at that size (native 16-bit adds, or an fp32 buffer);
- gather+scatter: the backward's value reads and grad_value adds together.

Programs are laid out as ours are (BLOCK_Q queries of one (batch, head) pair), the sample lists
are read coalesced, and nothing else is computed, so each time is a floor for a kernel that
moves these rows from this memory system in this order. Ours and deformops (when installed) are
timed in the same run: their ratios to the floors say how much is left above the memory work,
for ours and for the fastest peer (the local-sampling target is 1.5x that peer).
"""

from __future__ import annotations

import argparse
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from msda import DETR, DTYPES, TARGETS, configs, deformops_peers, fwd_bwd, inputs, load_variant, timed  # noqa: E402
from timing import cold_l2_us  # noqa: E402

DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
SCHEDULES = [(block_q, warps, unrolled) for block_q in (16, 32, 64) for warps in (2, 4, 8) for unrolled in (True, False)]


# A sample as the floor kernels read it, one int32: bits 0-26 the row of its top-left corner plus
# a bias (the row may be negative: a corner left of or above its level), bits 27-30 which of its
# four corners (top-left, top-right, bottom-left, bottom-right) lie inside the level. Ours read 6
# (bf16) or 12 (fp32) bytes a sample; the floors read 4.
INSIDE_SHIFT = tl.constexpr(27)
ROW_MASK = tl.constexpr((1 << 27) - 1)


def sample_list(shapes: torch.Tensor, start: torch.Tensor, loc: torch.Tensor, S: int) -> tuple[torch.Tensor, int]:
    """(samples, bias): every sample packed as above, int32 [B*M, L*K, Q] (one (batch, head)
    pair's list per program column, coalesced over q), and the bias its rows carry."""
    B, Q, M, L, K, _ = loc.shape
    height = shapes[:, 0].view(1, 1, 1, L, 1).float()
    width = shapes[:, 1].view(1, 1, 1, L, 1).float()
    # Pixel coordinates as the kernels compute them (align_corners=False).
    x0 = torch.floor(loc[..., 0].float() * width - 0.5)
    y0 = torch.floor(loc[..., 1].float() * height - 0.5)
    inside = torch.zeros(x0.shape, dtype=torch.int64, device=loc.device)
    for corner, (dy, dx) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
        xi, yi = x0 + dx, y0 + dy
        inside |= ((xi >= 0) & (xi < width) & (yi >= 0) & (yi < height)).long() << corner
    # A top-left corner further out than one pixel has no corner inside (its bits are 0 by now):
    # clamped, its row stays small.
    x0, y0 = x0.clamp(min=-1).minimum(width), y0.clamp(min=-1).minimum(height)
    batch = torch.arange(B, device=loc.device).view(B, 1, 1, 1, 1)
    head = torch.arange(M, device=loc.device).view(1, 1, M, 1, 1)
    top_left = (batch * S + start.view(1, 1, 1, L, 1) + (y0 * width + x0).long()) * M + head
    bias = (int(shapes[:, 1].max()) + 1) * M
    assert 0 <= int((top_left + bias).min()) and int((top_left + bias).max()) < 1 << INSIDE_SHIFT.value
    packed = (top_left + bias) | (inside << INSIDE_SHIFT.value)
    return packed.permute(0, 2, 3, 4, 1).reshape(B * M, L * K, Q).int().contiguous(), bias


@triton.jit
def _corners(samples, j, Q, q, q_in, bias):
    """A sample's packed word per query -> its top-left row and its inside bits (0 past Q)."""
    packed = tl.load(samples + j * Q + q, mask=q_in, other=0)
    return (packed & ROW_MASK) - bias, packed >> INSIDE_SHIFT


@triton.jit
def _gather_sample(acc, samples, j, Q, q, q_in, width, bias, value_ptr, d, M: tl.constexpr, D: tl.constexpr):
    top_left, inside = _corners(samples, j, Q, q, q_in, bias)
    for corner in tl.static_range(4):
        row = top_left + (corner % 2) * M + (corner // 2) * width * M
        valid = ((inside >> corner) & 1) != 0
        acc += tl.load(value_ptr + row[:, None] * D + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    return acc


@triton.jit
def _gather(samples_ptr, shapes_ptr, value_ptr, out_ptr, Q, bias, M: tl.constexpr, D: tl.constexpr,
            LEVELS: tl.constexpr, POINTS: tl.constexpr, BLOCK_Q: tl.constexpr, UNROLLED: tl.constexpr):
    pid_q = tl.program_id(0)
    pair = tl.program_id(1)
    q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    d = tl.arange(0, D)
    q_in = q < Q
    samples = samples_ptr + pair * LEVELS * POINTS * Q
    acc = tl.zeros((BLOCK_Q, D), dtype=tl.float32)
    for level in tl.static_range(LEVELS):
        width = tl.load(shapes_ptr + 2 * level + 1).to(tl.int32)
        if UNROLLED:
            for k in tl.static_range(POINTS):
                acc = _gather_sample(acc, samples, level * POINTS + k, Q, q, q_in, width, bias, value_ptr, d, M, D)
        else:
            for k in tl.range(POINTS):
                acc = _gather_sample(acc, samples, level * POINTS + k, Q, q, q_in, width, bias, value_ptr, d, M, D)
    tl.store(out_ptr + (pair * Q + q)[:, None] * D + d[None, :], acc.to(out_ptr.dtype.element_ty), mask=q_in[:, None])


@triton.jit
def _scatter_sample(dots, grad, samples, j, Q, q, q_in, width, bias, value_ptr, buffer_ptr, d, M: tl.constexpr,
                    D: tl.constexpr, GATHER: tl.constexpr):
    top_left, inside = _corners(samples, j, Q, q, q_in, bias)
    for corner in tl.static_range(4):
        at = (top_left + (corner % 2) * M + (corner // 2) * width * M)[:, None] * D + d[None, :]
        valid = (((inside >> corner) & 1) != 0)[:, None]
        if GATHER:
            dots += tl.sum(tl.load(value_ptr + at, mask=valid, other=0.0).to(tl.float32) * grad, 1)
        tl.atomic_add(buffer_ptr + at, grad.to(buffer_ptr.dtype.element_ty), mask=valid, sem="relaxed")
    return dots


@triton.jit
def _scatter(samples_ptr, shapes_ptr, grad_ptr, value_ptr, buffer_ptr, dot_ptr, Q, bias, M: tl.constexpr,
             D: tl.constexpr, LEVELS: tl.constexpr, POINTS: tl.constexpr, BLOCK_Q: tl.constexpr,
             UNROLLED: tl.constexpr, GATHER: tl.constexpr):
    """grad rows added at every corner (GATHER: and the corner rows read, dotted with them)."""
    pid_q = tl.program_id(0)
    pair = tl.program_id(1)
    q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    d = tl.arange(0, D)
    q_in = q < Q
    samples = samples_ptr + pair * LEVELS * POINTS * Q
    grad = tl.load(grad_ptr + (pair * Q + q)[:, None] * D + d[None, :], mask=q_in[:, None], other=0.0).to(tl.float32)
    dots = tl.zeros((BLOCK_Q,), dtype=tl.float32)
    for level in tl.static_range(LEVELS):
        width = tl.load(shapes_ptr + 2 * level + 1).to(tl.int32)
        if UNROLLED:
            for k in tl.static_range(POINTS):
                dots = _scatter_sample(dots, grad, samples, level * POINTS + k, Q, q, q_in, width, bias, value_ptr,
                                       buffer_ptr, d, M, D, GATHER)
        else:
            for k in tl.range(POINTS):
                dots = _scatter_sample(dots, grad, samples, level * POINTS + k, Q, q, q_in, width, bias, value_ptr,
                                       buffer_ptr, d, M, D, GATHER)
    if GATHER:
        tl.store(dot_ptr + pair * Q + q, dots, mask=q_in)


@dataclass(frozen=True)
class Samples:
    """The packed sample list with what the kernels need to expand it."""
    packed: torch.Tensor  # int32 [B*M, L*K, Q]
    bias: int
    shapes: torch.Tensor  # [L, 2] (height, width) per level
    heads: int

    @property
    def pairs(self) -> int:
        return self.packed.shape[0]

    @property
    def queries(self) -> int:
        return self.packed.shape[2]

    @property
    def levels(self) -> int:
        return self.shapes.shape[0]

    @property
    def points(self) -> int:
        return self.packed.shape[1] // self.levels


def corner_rows(samples: Samples) -> torch.Tensor:
    """The rows the kernels reach from each packed sample: int64 [B*M, L*K*4, Q], -1 for a corner
    outside its level (torch's own arithmetic, for the checks)."""
    packed, M = samples.packed.long(), samples.heads
    width = samples.shapes[:, 1].repeat_interleave(samples.points).view(1, -1, 1)  # each sample's level width
    top_left = (packed & ROW_MASK.value) - samples.bias
    rows = [torch.where((packed >> (INSIDE_SHIFT.value + corner)) & 1 == 1, top_left + dx * M + dy * width * M, -1)
            for corner, (dy, dx) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1)))]
    return torch.stack(rows, 2).reshape(samples.pairs, -1, samples.queries)


def gather(samples: Samples, value, schedule):
    block_q, warps, unrolled = schedule
    D, Q = value.shape[-1], samples.queries
    out = torch.empty(samples.pairs, Q, D, dtype=value.dtype, device=value.device)
    _gather[(triton.cdiv(Q, block_q), samples.pairs)](
        samples.packed, samples.shapes, value, out, Q, samples.bias, samples.heads, D, samples.levels,
        samples.points, block_q, unrolled, num_warps=warps)
    return out


def scatter(samples: Samples, grad, value, buffer, schedule, with_gather):
    block_q, warps, unrolled = schedule
    D, Q = value.shape[-1], samples.queries
    dots = torch.empty(samples.pairs, Q, dtype=torch.float32, device=grad.device)
    _scatter[(triton.cdiv(Q, block_q), samples.pairs)](
        samples.packed, samples.shapes, grad, value, buffer, dots, Q, samples.bias, samples.heads, D, samples.levels,
        samples.points, block_q, unrolled, with_gather, num_warps=warps)
    return dots


def check(samples: Samples, value, grad):
    """The floor kernels move the right rows: their results against torch's gather and index_add
    over the rows corner_rows expands the same samples to."""
    Q = samples.queries
    table = value.reshape(-1, value.shape[-1]).float()
    rows = corner_rows(samples)
    flat = rows.permute(0, 2, 1).reshape(-1, rows.shape[1])  # [pairs*Q, corners]
    picked = torch.where((flat >= 0)[..., None], table[flat.clamp(min=0)], 0.0)
    got = gather(samples, table.view_as(value), SCHEDULES[0]).reshape(-1, value.shape[-1])
    assert torch.allclose(got, picked.sum(1), rtol=1e-4, atol=1e-3), (got - picked.sum(1)).abs().max()
    g = grad.reshape(-1, grad.shape[-1]).float()
    buffer = torch.zeros_like(table)
    dots = scatter(samples, g.view(samples.pairs, Q, -1), table.view_as(value), buffer, SCHEDULES[0], True)
    want = torch.zeros_like(table).index_add_(0, flat[flat >= 0], g[:, None, :].expand(-1, flat.shape[1], -1)[flat >= 0])
    assert torch.allclose(buffer, want, rtol=1e-4, atol=1e-3), (buffer - want).abs().max()
    assert torch.allclose(dots.reshape(-1), (picked * g[:, None, :]).sum((1, 2)), rtol=1e-4, atol=1e-2)


def best(fn) -> tuple[float, tuple]:
    times = {}
    for schedule in SCHEDULES:
        times[schedule] = cold_l2_us(lambda: fn(schedule))
    schedule = min(times, key=times.get)
    return times[schedule], schedule


def measure(module, cname: str, dist: str, dtype: torch.dtype, B: int, Q: int) -> None:
    shape = DETR
    value, shapes, start, loc, w = inputs(shape, B, Q, dtype, dist == "local")
    S = value.shape[1]
    packed, bias = sample_list(shapes, start, loc, S)
    samples = Samples(packed, bias, shapes, shape.m)
    grad = torch.randn(B, Q, shape.m * shape.d, device=value.device, dtype=dtype)
    # The floor kernels take grad per (batch, head) pair, the order ours read it in.
    grad_pairs = grad.view(B, Q, shape.m, shape.d).permute(0, 2, 1, 3).contiguous().view(B * shape.m, Q, shape.d)
    check(samples, value, grad_pairs)
    valid = int((corner_rows(samples) >= 0).sum())
    row_bytes = shape.d * value.element_size()

    ours_f = cold_l2_us(lambda: module.msda_forward(value, shapes, start, loc, w))
    ours_fb = cold_l2_us(fwd_bwd(module.msda_forward, value, shapes, start, loc, w, grad))
    ours_b = ours_fb - ours_f
    peers = {}
    for name, fn in deformops_peers().items():
        try:
            # (us, mark): marked "*" where the peer could not be graph-captured (do_bench instead)
            peers[name] = (timed(lambda: fn(value, shapes, start, loc, w), True),
                           timed(fwd_bwd(fn, value, shapes, start, loc, w, grad), True))
        except Exception as exc:  # noqa: BLE001 - report the peer, keep the floors
            torch.cuda.synchronize()
            print(f"  {name}: n/a ({type(exc).__name__}: {exc})")
    # grad_value's accumulation as ours does it at this size: native adds into value's dtype, or
    # an fp32 buffer (zero-filled, then cast: timed apart below).
    native = module.GRAD_VALUE_ACCUMULATION[cname] == "native"
    buffer = torch.zeros(value.shape, dtype=value.dtype if native else torch.float32, device=value.device)
    gather_us, gather_at = best(lambda s: gather(samples, value, s))
    scatter_us, scatter_at = best(lambda s: scatter(samples, grad_pairs, value, buffer, s, False))
    both_us, both_at = best(lambda s: scatter(samples, grad_pairs, value, buffer, s, True))
    accumulation = f"native {DTYPE_NAMES[dtype]} atomics" if native else "fp32 atomics"
    if native or dtype == torch.float32:
        fill_cast = cold_l2_us(lambda: buffer.zero_())
        fill_note = "zero fill"
    else:
        fill_cast = cold_l2_us(lambda: buffer.zero_()) + cold_l2_us(lambda: buffer.to(dtype))
        fill_note = "fp32 buffer zero fill + cast"

    target = TARGETS[(cname, DTYPE_NAMES[dtype])] if dist == "uniform" else None
    print(f"{cname} {dist} {DTYPE_NAMES[dtype]}: B={B} Q={Q} S={S}; {valid:,} in-range corner rows of {4 * packed.numel():,} "
          f"({valid * row_bytes / 1e6:.1f} MB of rows; value {value.numel() * value.element_size() / 1e6:.1f} MB)")
    print(f"  forward  ours {ours_f:7.1f}{f'  target {target[0]}' if target else ''} | gather floor {gather_us:7.1f} at "
          f"{gather_at} ({valid * row_bytes / gather_us / 1e6:.2f} TB/s of rows) | ours / floor {ours_f / gather_us:.2f}x")
    print(f"  backward ours {ours_b:7.1f} (f+b {ours_fb:.1f}{f', target {target[1]}' if target else ''}) | with {accumulation}: "
          f"scatter floor {scatter_us:7.1f} at {scatter_at}, gather+scatter floor {both_us:7.1f} at {both_at} | "
          f"{fill_note} {fill_cast:.1f} | ours / (gather+scatter + {fill_note}) {ours_b / (both_us + fill_cast):.2f}x")
    print(f"  f+b floor (gather + gather+scatter + {fill_note}): {gather_us + both_us + fill_cast:.1f}"
          + (f" against target {target[1]}" if target else ""))
    for name, ((peer_f, mark_f), (peer_fb, mark_fb)) in peers.items():
        print(f"  {name}: fwd {peer_f:.1f}{mark_f} (ours {peer_f / ours_f:.2f}x, the floor {peer_f / gather_us:.2f}x), "
              f"f+b {peer_fb:.1f}{mark_fb} (ours {peer_fb / ours_fb:.2f}x, the floor {peer_fb / (gather_us + both_us + fill_cast):.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="decoder,encoder")
    parser.add_argument("--dists", default="uniform,local")
    parser.add_argument("--dtypes", default="fp32,bf16")
    args = parser.parse_args()
    print(f"Device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"python {platform.python_version()}")
    print("us: device time with a cold L2 (CUDA graph); floors: best of block_q {16,32,64} x warps {2,4,8} x "
          "unrolled/run-time loop; backward = f+b - forward; a peer's Nx: its time over ours, and over the floor's; "
          "* a peer timed by do_bench (no graph capture)")
    for cname, (B, Q) in configs(DETR).items():
        for dist in args.dists.split(","):
            for dname in args.dtypes.split(","):
                if cname in args.configs.split(","):
                    measure(load_variant(DETR, DTYPES[dname]), cname, dist, DTYPES[dname], B, Q)


if __name__ == "__main__":
    main()
