"""MSDA on the GPU (issue 5): forward and forward+backward against every peer, in one run.

Run from the project root on a CUDA machine: `python benchmarks/msda.py [--quick] [--shapes ...]`,
with the deformops 3.0.1 wheel installed beside it (`pip install --no-deps deformops==3.0.1`; skipped
with a note when absent). Peers: the PyTorch reference (grid_sample) and deformops' Triton and CUDA
backends (each where it runs). Two sampling distributions: uniform in [-0.05, 1.05] (worst case
for caches) and local (each query's points within 2 pixels of its reference point; encoder
reference points are the query's own pixel, so neighbouring queries sample neighbouring pixels).

Also measured here: the eager wall time of one decoder forward (host overhead), the cost of the
deterministic backward against the atomic one, bitwise-identical grad_value over 10 runs of the
deterministic backward, and forward+backward under CUDA-graph capture against eager.
Every result is checked against the float64 reference before it is timed.

All of that is for the Deformable DETR shape (M=8 heads, D=32, L=4 levels, K=4 points).
`--shapes m16_d16_l2_k4,m2_d128_l5_k8,...` runs only the peer table, for each shape listed (any shape
in generated/msda/), on the first L levels of the same pyramid.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import platform
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import bandwidth_fraction, cold_l2_median_us, do_bench_us  # noqa: E402

from kgen.reference.msda import msda_forward_grid_sample  # noqa: E402
from kgen.verify.msda import local_locations  # noqa: E402

PYRAMID = [[100, 167], [50, 84], [25, 42], [13, 21], [7, 11]]  # an 800x1333 image; S = 22,223 for 4 levels
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SHORT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


@dataclass(frozen=True, order=True)
class Shape:
    """A variant's compile-time constants: heads, head dim, levels, points per level."""
    m: int
    d: int
    l: int  # noqa: E741 - the spec's name
    k: int

    @property
    def name(self) -> str:  # the suffix of the generated variant names
        return f"m{self.m}_d{self.d}_l{self.l}_k{self.k}"

    @property
    def levels(self) -> list[list[int]]:
        return PYRAMID[:self.l]

    @staticmethod
    def parse(name: str) -> Shape:
        match = re.fullmatch(r"m(\d+)_d(\d+)_l(\d+)_k(\d+)", name)
        if not match:
            raise ValueError(f"not a shape name: {name!r} (want m<M>_d<D>_l<L>_k<K>)")
        return Shape(*map(int, match.groups()))


DETR = Shape(8, 32, 4, 4)
# Every shape generated (each in fp32 and bf16) that PYRAMID has enough levels for.
SHAPES = {s.name: s for s in sorted(Shape.parse(p.stem.removeprefix("msda_fwd_f32_"))
                                    for p in (ROOT / "generated" / "msda").glob("msda_fwd_f32_*.py"))
          if s.l <= len(PYRAMID)}
TARGETS = {  # issue 5, DETR shape, uniform sampling: (forward us, forward+backward us)
    ("decoder", "fp32"): (18, 57), ("decoder", "bf16"): (12, 41),
    ("encoder", "fp32"): (160, 777), ("encoder", "bf16"): (130, 600),
}


def configs(shape: Shape) -> dict[str, tuple[int, int]]:
    """(B, Q) per config; the encoder has one query per pixel of the levels used."""
    return {"decoder": (4, 300), "encoder": (2, sum(h * w for h, w in shape.levels))}


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_variant(shape: Shape, dtype: torch.dtype):
    return load_module(ROOT / "generated" / "msda" / f"msda_fwd_{SHORT[dtype]}_{shape.name}.py")


def rendered_variant(shape: Shape, dtype: torch.dtype, setting: str, replacement: str):
    """The same variant generated with one spec setting replaced (rendered here, not shipped),
    with the same tuning file, so that only that setting differs."""
    from kgen.generate import generate
    from kgen.spec import load_spec

    text = (ROOT / "specs" / "msda.yaml").read_text()
    assert setting in text, setting
    tmp = Path(tempfile.mkdtemp())
    (tmp / "msda.yaml").write_text(text.replace(setting, replacement))
    (tmp / "msda.tuning.json").write_text((ROOT / "specs" / "msda.tuning.json").read_text())
    outputs = {o.variant: o for o in generate(load_spec(tmp / "msda.yaml", check=False), ROOT)}
    name = f"msda_fwd_{SHORT[dtype]}_{shape.name}"
    path = tmp / f"{name}_{replacement.replace(': ', '_')}.py"
    path.write_text(outputs[name].text)
    return load_module(path)


def inputs(shape: Shape, B: int, Q: int, dtype: torch.dtype, local: bool, seed: int = 0):
    M, D, L, K = shape.m, shape.d, shape.l, shape.k
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = torch.tensor(shape.levels, dtype=torch.int64, device="cuda")
    areas = shapes[:, 0] * shapes[:, 1]
    S = int(areas.sum())
    value = torch.randn(B, S, M, D, device="cuda", generator=g).to(dtype)
    if local:  # kgen tune's `local` sampling: an encoder's query i references pixel i (Q == S)
        loc = local_locations(shape.levels, B, Q, M, K, g, "cuda")
    else:
        loc = torch.rand(B, Q, M, L, K, 2, device="cuda", generator=g) * 1.1 - 0.05
    w = torch.rand(B, Q, M, L, K, device="cuda", generator=g) + 0.05
    w = w / w.sum(dim=(-1, -2), keepdim=True)
    start = torch.cumsum(areas, 0) - areas
    return value, shapes, start, loc.to(dtype), w.to(dtype)


def must_move_bytes(shape: Shape, B: int, Q: int, S: int, elem: int) -> int:
    """Value rows the samples touch (at most all of value), locations, weights, output."""
    M, D, L, K = shape.m, shape.d, shape.l, shape.k
    corner_rows = B * Q * M * L * K * 4 * D * elem
    return min(corner_rows, B * S * M * D * elem) + B * Q * M * L * K * 3 * elem + B * Q * M * D * elem


@functools.cache  # once per run: the note on a missing deformops is printed once, not per shape
def deformops_peers():
    """{name: fn(value, shapes, start, loc, w) -> (B, Q, M*D)} for the deformops backends that run."""
    try:
        from deformops.registry import Backend, msda
    except ImportError as exc:
        print(f"note: deformops not installed ({exc}); its columns are skipped")
        return {}
    peers = {}
    # deformops-cuda is left out: its kernel library is downloaded or compiled at first use, and
    # the benchmark machine has no network (its Triton backend is the peer measured here).
    for name, backend in (("deformops-triton", Backend.TRITON),):
        peers[name] = lambda v, s, i, l, w, b=backend: msda(v, s, i, l, w, backend=b)
    return peers


def timed(fn, graph_ok: bool) -> tuple[float, str]:
    """Cold-L2 device time (median of 3 readings) when fn can be graph-captured, else do_bench
    (marked *)."""
    if graph_ok:
        try:
            return cold_l2_median_us(fn), ""
        except Exception:  # noqa: BLE001 - a peer that syncs or allocates on the host
            torch.cuda.synchronize()
    return do_bench_us(fn), "*"


def fwd_bwd(fn, value, shapes, start, loc, w, grad):
    v, l_, w_ = (t.detach().requires_grad_() for t in (value, loc, w))

    def run():
        out = fn(v, shapes, start, l_, w_)
        torch.autograd.backward(out, grad.view_as(out))
        v.grad = l_.grad = w_.grad = None
    return run


def table(shape: Shape, quick: bool, dists: tuple[str, ...] = ("uniform", "local")) -> None:
    peers = deformops_peers()
    print(f"shape {shape.name}: M={shape.m} heads, D={shape.d}, L={shape.l} levels {shape.levels}, "
          f"K={shape.k} points")
    print(f"{'config':8s} {'dist':7s} {'dtype':5s} | {'ours fwd':>8s} {'target':>6s} {'of copy':>7s} | {'ours f+b':>8s} {'target':>6s} |"
          + "".join(f" {n + ' fwd':>21s} {'f+b':>8s} |" for n in peers) + f" {'torch fwd':>9s} {'f+b':>8s} | best-peer ratio fwd, f+b | max err")
    for cname, (B, Q) in configs(shape).items():
        for dist in dists:
            for dname, dtype in DTYPES.items():
                module = load_variant(shape, dtype)
                value, shapes, start, loc, w = inputs(shape, B, Q, dtype, dist == "local")
                ref = msda_forward_grid_sample(value.double(), shapes, start, loc.double(), w.double())
                out = module.msda_forward(value, shapes, start, loc, w)
                err = (out.double() - ref.view_as(out)).abs().max().item()
                grad = torch.randn_like(out)
                ours_f, _ = timed(lambda: module.msda_forward(value, shapes, start, loc, w), True)
                ours_fb, mark = timed(fwd_bwd(module.msda_forward, value, shapes, start, loc, w, grad), True)
                row = f"{cname:8s} {dist:7s} {dname:5s} | {ours_f:8.1f} "
                target = TARGETS[(cname, dname)] if dist == "uniform" and shape == DETR else None
                nbytes = must_move_bytes(shape, B, Q, value.shape[1], value.element_size())
                row += f"{target[0] if target else '':>6} {bandwidth_fraction(nbytes, ours_f):7.1%} | {ours_fb:7.1f}{mark or ' '} {target[1] if target else '':>6} |"
                best_f = best_fb = float("inf")
                for name, fn in peers.items():
                    try:
                        peer_out = fn(value, shapes, start, loc, w)
                        perr = (peer_out.double() - ref.reshape(B, Q, -1)).abs().max().item()
                        pf, mf = timed(lambda: fn(value, shapes, start, loc, w), True)
                        pfb, mfb = timed(fwd_bwd(fn, value, shapes, start, loc, w, grad), True)
                        best_f, best_fb = min(best_f, pf), min(best_fb, pfb)
                        row += f" {pf:12.1f}{mf or ' '} (e{perr:.0e}) {pfb:7.1f}{mfb or ' '} |"
                    except Exception as exc:  # noqa: BLE001 - report, keep going
                        torch.cuda.synchronize()
                        row += f" {'n/a: ' + type(exc).__name__:>30s} |"
                if quick and cname == "encoder":
                    tf = tfb = float("nan")
                else:
                    tf = do_bench_us(lambda: msda_forward_grid_sample(value, shapes, start, loc, w))
                    tfb = do_bench_us(fwd_bwd(msda_forward_grid_sample, value, shapes, start, loc, w, grad))
                row += f" {tf:8.1f}* {tfb:7.1f}* | {best_f / ours_f:5.2f}x {best_fb / ours_fb:5.2f}x | {err:.1e}"
                print(row, flush=True)
                del value, loc, w, out, ref


def host_overhead(shape: Shape) -> None:
    """Host time per eager decoder bf16 forward (500 calls; the GPU keeps up, so the launch queue
    never fills), for ours without and with an input that needs a gradient, for the kernel
    launched directly through Triton's JIT dispatch (which our wrapper skips after a call's first
    launch), and for peers."""
    module = load_variant(shape, torch.bfloat16)
    value, shapes, start, loc, w = inputs(shape, 4, 300, torch.bfloat16, False)
    B, Q, S = value.shape[0], loc.shape[1], value.shape[1]
    out = torch.empty(B, Q, shape.m * shape.d, dtype=value.dtype, device="cuda")
    kernel = getattr(module, f"_msda_fwd_bf16_{shape.name}_kernel")
    block_q, launch = module._launch(B * Q, backward=False)
    grid = (triton.cdiv(Q, block_q), B * shape.m)
    value_grad = value.detach().requires_grad_()
    calls = {
        "ours, no input needs grad": lambda: module.msda_forward(value, shapes, start, loc, w),
        "ours, value needs grad": lambda: module.msda_forward(value_grad, shapes, start, loc, w),
        "the kernel launched directly": lambda: kernel[grid](value, shapes, start, loc, w, out, Q, S, **launch),
    }
    calls.update({name: (lambda fn=fn: fn(value, shapes, start, loc, w)) for name, fn in deformops_peers().items()})
    for name, fn in calls.items():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        n = 500
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(f"eager decoder bf16 forward, {name}: {(t1 - t0) / n * 1e6:.1f} us host time per call, "
              f"{(t2 - t0) / n * 1e6:.1f} us wall per call including the GPU", flush=True)


def deterministic_checks(shape: Shape) -> None:
    MD = shape.m * shape.d
    for dtype in (torch.float32, torch.bfloat16):
        atomic, det = load_variant(shape, dtype), rendered_variant(shape, dtype, "deterministic: false", "deterministic: true")
        for cname, (B, Q) in configs(shape).items():
            value, shapes, start, loc, w = inputs(shape, B, Q, dtype, False, seed=1)
            grad = torch.randn(B, Q, MD, device="cuda").to(dtype)
            grads = []
            for _ in range(10):
                v = value.detach().requires_grad_()
                det.msda_forward(v, shapes, start, loc, w).backward(grad.view(B, Q, MD))
                grads.append(v.grad.clone())
            same = all(torch.equal(grads[0], g) for g in grads[1:])
            va = value.detach().requires_grad_()
            atomic.msda_forward(va, shapes, start, loc, w).backward(grad.view(B, Q, MD))
            diff = (va.grad.double() - grads[0].double()).abs().max().item()
            t_atomic, _ = timed(fwd_bwd(atomic.msda_forward, value, shapes, start, loc, w, grad), True)
            t_det, _ = timed(fwd_bwd(det.msda_forward, value, shapes, start, loc, w, grad), True)
            print(f"deterministic {SHORT[dtype]:4s} {cname}: grad_value bitwise identical over 10 runs: {same}; "
                  f"max |det - atomic| {diff:.1e}; fwd+bwd atomic {t_atomic:.1f} us, deterministic {t_det:.1f} us ({t_det / t_atomic:.2f}x)")


def accumulation_checks(shape: Shape) -> None:
    """bf16 grad_value accumulated in an fp32 buffer against native bf16 atomic adds, at every
    size (both rendered here; the shipped spec picks one per size class): forward+backward time,
    and grad_value's error against float64."""
    dtype = torch.bfloat16
    shipped = "grad_accumulation: {decoder: native, encoder: fp32}"
    variants = {
        "fp32 buffer": rendered_variant(shape, dtype, shipped, "grad_accumulation: fp32"),
        "native bf16 atomics": rendered_variant(shape, dtype, shipped, "grad_accumulation: native"),
    }
    for cname, (B, Q) in configs(shape).items():
        value, shapes, start, loc, w = inputs(shape, B, Q, dtype, False, seed=4)
        grad = torch.randn(B, Q, shape.m * shape.d, device="cuda").to(dtype)
        v64 = value.double().requires_grad_()
        out64 = msda_forward_grid_sample(v64, shapes, start, loc.double(), w.double())
        out64.backward(grad.double().view_as(out64))
        ref = v64.grad
        row = []
        for name, module in variants.items():
            v = value.detach().requires_grad_()
            module.msda_forward(v, shapes, start, loc, w).backward(grad)
            err = v.grad.double() - ref
            t, _ = timed(fwd_bwd(module.msda_forward, value, shapes, start, loc, w, grad), True)
            row.append(f"{name}: f+b {t:.1f} us, grad_value max abs err {err.abs().max().item():.2e}, "
                       f"rel rms {(err.norm() / ref.norm()).item():.2e}")
        print(f"grad_value accumulation, bf16 {cname}: " + "; ".join(row), flush=True)
        del value, loc, w, v64, out64, ref


def graph_capture_check(shape: Shape) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        module = load_variant(shape, dtype)
        value, shapes, start, loc, w = inputs(shape, 4, 300, dtype, False, seed=2)
        grad = torch.randn(4, 300, shape.m * shape.d, device="cuda").to(dtype)
        v, l_, w_ = (t.detach().requires_grad_() for t in (value, loc, w))
        eager_out = module.msda_forward(v, shapes, start, l_, w_)
        eager_out.backward(grad)
        eager = [eager_out.detach().clone(), v.grad.clone(), l_.grad.clone(), w_.grad.clone()]
        del eager_out  # a live autograd graph from outside the capture pins AccumulateGrad's stream
        v.grad = l_.grad = w_.grad = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                module.msda_forward(v, shapes, start, l_, w_).backward(grad)
                v.grad = l_.grad = w_.grad = None
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                g_out = module.msda_forward(v, shapes, start, l_, w_)
                g_out.backward(grad)
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
        got = [g_out, v.grad, l_.grad, w_.grad]
        diffs = [(a.double() - b.double()).abs().max().item() for a, b in zip(got, eager)]
        print(f"CUDA graph capture {SHORT[dtype]}: forward+backward captured and replayed; max |graph - eager| "
              f"out {diffs[0]:.1e}, grad_value {diffs[1]:.1e} (atomics: order may differ), grad_loc {diffs[2]:.1e}, grad_w {diffs[3]:.1e}")


def parse_shapes(text: str) -> list[Shape]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown shape(s) {', '.join(unknown) or '(none given)'}; "
                                         f"generated: {', '.join(SHAPES)}")
    return [SHAPES[n] for n in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the torch reference at encoder size")
    parser.add_argument("--shapes", type=parse_shapes, metavar="m16_d16_l2_k4,...",
                        help=f"run only the peer table, for each of these shapes ({', '.join(SHAPES)})")
    parser.add_argument("--dists", default="uniform,local", help="sampling distributions (default: uniform,local)")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"python {platform.python_version()}, date {time.strftime('%Y-%m-%d')}")
    print("us: device time with a cold L2 (CUDA graph, median of 3 readings), or do_bench's median where marked * (no capture);"
          " of copy: forward bytes that must move / time over 4.29 TB/s; ratio: fastest peer / ours")
    if args.shapes:
        for shape in args.shapes:
            table(shape, args.quick, tuple(args.dists.split(",")))
        return
    table(DETR, args.quick, tuple(args.dists.split(",")))
    host_overhead(DETR)
    accumulation_checks(DETR)
    deterministic_checks(DETR)
    graph_capture_check(DETR)


if __name__ == "__main__":
    main()
