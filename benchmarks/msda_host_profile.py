"""Where an eager MSDA forward spends its host time, piece by piece, on a CUDA machine:
`python benchmarks/msda_host_profile.py` (bf16 DETR variant, B=1 Q=4 so that the GPU never holds
the host back; then cProfile of 2,000 msda_forward calls). benchmarks/msda.py reports the totals."""
import cProfile
import io
import pstats
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
import msda as bench  # noqa: E402


@triton.jit
def _one_ptr(x_ptr, n):
    i = tl.arange(0, 128)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


def per_call(fn, n=3000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    m = bench.load_variant(bench.DETR, torch.bfloat16)
    args = bench.inputs(bench.DETR, 1, 4, torch.bfloat16, False)
    value, shapes, start, loc, w = args
    B, Q, S = 1, 4, value.shape[1]
    kern = [getattr(m, k) for k in dir(m) if k.startswith("_msda_fwd") and k.endswith("_kernel")][0]
    block_q, launch = m._launch(B * Q, backward=False)
    out = torch.empty((B, Q, 256), dtype=value.dtype, device="cuda")
    grid = (triton.cdiv(Q, block_q), B * m.HEADS)
    x = torch.randn(128, device="cuda")
    rows = {
        "torch.add(x, 1)": lambda: torch.add(x, 1),
        "torch.empty": lambda: torch.empty((B, Q, 256), dtype=value.dtype, device="cuda"),
        "triton 1-pointer kernel": lambda: _one_ptr[(1,)](x, 100),
        "msda kernel[grid] direct": lambda: kern[grid](value, shapes, start, loc, w, out, Q, S, **launch),
        "_forward_impl": lambda: m._forward_impl(value, shapes, start, loc, w),
        "_EagerMsda.apply": lambda: m._EagerMsda.apply(value, shapes, start, loc, w),
        "custom op": lambda: m._forward_op(value, shapes, start, loc, w),
        "msda_forward": lambda: m.msda_forward(value, shapes, start, loc, w),
        "msda_forward, value needs grad": lambda: m.msda_forward(vg, shapes, start, loc, w),
        "_usual_call": lambda: m._usual_call(value, shapes, start, loc, w),
        "_check_arguments": lambda: m._check_arguments(value, shapes, start, loc, w),
    }
    vg = value.detach().requires_grad_()
    print(f"torch {torch.__version__} triton {triton.__version__} python {sys.version.split()[0]}")
    for name, fn in rows.items():
        print(f"{name:28s} {per_call(fn):7.1f} us host per call (B=1 Q=4)", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        m.msda_forward(value, shapes, start, loc, w)
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue())


main()
