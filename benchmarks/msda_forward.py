"""MSDA forward on the GPU: kgen's generated kernels against the PyTorch reference (grid_sample).

Run from the project root on a CUDA machine: `python benchmarks/msda_forward.py`.
Each result is checked against the float64 reference before it is timed.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import bandwidth_fraction, cold_l2_us, do_bench_us  # noqa: E402

from kgen.reference.msda import msda_forward_grid_sample  # noqa: E402

LEVELS = [[100, 167], [50, 84], [25, 42], [13, 21]]  # an 800x1333 image, S = 22,223
CONFIGS = {"decoder B=4 Q=300": (4, 300), "encoder B=2 Q=22223": (2, 22223)}
DTYPES = {"float32": ("f32", torch.float32), "bfloat16": ("bf16", torch.bfloat16), "float16": ("f16", torch.float16)}
M, D, L, K = 8, 32, 4, 4


def load_variant(short: str):
    path = ROOT / "generated" / "msda" / f"msda_fwd_{short}_m{M}_d{D}_l{L}_k{K}.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs(B: int, Q: int, dtype: torch.dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = torch.tensor(LEVELS, dtype=torch.int64, device="cuda")
    S = int((shapes[:, 0] * shapes[:, 1]).sum())
    value = torch.randn(B, S, M, D, device="cuda", generator=g).to(dtype)
    loc = (torch.rand(B, Q, M, L, K, 2, device="cuda", generator=g) * 1.1 - 0.05).to(dtype)
    w = torch.rand(B, Q, M, L, K, device="cuda", generator=g) + 0.05
    w = (w / w.sum(dim=(-1, -2), keepdim=True)).to(dtype)
    start = torch.cumsum(shapes[:, 0] * shapes[:, 1], 0) - shapes[:, 0] * shapes[:, 1]
    return value, shapes, start, loc, w


def must_move_bytes(B: int, Q: int, S: int, elem: int) -> int:
    """Value rows the samples touch (at most all of value), locations, weights, output."""
    corner_rows = B * Q * M * L * K * 4 * D * elem
    value = B * S * M * D * elem
    params = B * Q * M * L * K * 3 * elem
    return min(corner_rows, value) + params + B * Q * M * D * elem


def main() -> None:
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, python {platform.python_version()}")
    print("ours us: device time, cold L2; do_bench and torch ref: do_bench medians; speedup on do_bench")
    print(f"{'config':22s} {'dtype':9s} {'ours us':>9s} {'do_bench':>9s} {'torch ref':>12s} {'speedup':>8s} {'MB':>7s} {'of copy':>8s}  max abs err")
    for label, (B, Q) in CONFIGS.items():
        for dname, (short, dtype) in DTYPES.items():
            module = load_variant(short)
            value, shapes, start, loc, w = inputs(B, Q, dtype)
            out = module.msda_forward(value, shapes, start, loc, w)
            ref = msda_forward_grid_sample(value.double(), shapes, start, loc.double(), w.double())
            err = (out.double() - ref).abs().max().item()
            ours = cold_l2_us(lambda: module.msda_forward(value, shapes, start, loc, w))
            bench = do_bench_us(lambda: module.msda_forward(value, shapes, start, loc, w))
            # The reference reads the level shapes on the host (a sync), so it cannot be captured
            # in a CUDA graph: compare do_bench medians, which both include launch overhead.
            peer = do_bench_us(lambda: msda_forward_grid_sample(value, shapes, start, loc, w))
            nbytes = must_move_bytes(B, Q, value.shape[1], value.element_size())
            print(
                f"{label:22s} {dname:9s} {ours:9.1f} {bench:9.1f} {peer:12.1f} {peer / bench:7.1f}x "
                f"{nbytes / 1e6:7.1f} {bandwidth_fraction(nbytes, ours):7.1%}  {err:.2e}"
            )


if __name__ == "__main__":
    main()
