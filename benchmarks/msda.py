"""MSDA on the GPU (issue 5): forward and forward+backward against every peer, in one run.

Run from the project root on a CUDA machine: `python benchmarks/msda.py [--quick]`, with the
deformops 3.0.1 wheel installed beside it (`pip install --no-deps deformops==3.0.1`; skipped with a
note when absent). Peers: the PyTorch reference (grid_sample) and deformops' Triton and CUDA
backends (each where it runs). Two sampling distributions: uniform in [-0.05, 1.05] (worst case
for caches) and local (each query's points within 2 pixels of its reference point; encoder
reference points are the query's own pixel, so neighbouring queries sample neighbouring pixels).

Also measured here: the eager wall time of one decoder forward (host overhead), the cost of the
deterministic backward against the atomic one, bitwise-identical grad_value over 10 runs of the
deterministic backward, and forward+backward under CUDA-graph capture against eager.
Every result is checked against the float64 reference before it is timed.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import bandwidth_fraction, cold_l2_us, do_bench_us  # noqa: E402

from kgen.reference.msda import msda_forward_grid_sample  # noqa: E402

LEVELS = [[100, 167], [50, 84], [25, 42], [13, 21]]  # an 800x1333 image, S = 22,223
CONFIGS = {"decoder": (4, 300), "encoder": (2, 22223)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SHORT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
M, D, L, K = 8, 32, 4, 4
TARGETS = {  # issue 5, uniform sampling: (forward us, forward+backward us)
    ("decoder", "fp32"): (18, 57), ("decoder", "bf16"): (12, 41),
    ("encoder", "fp32"): (160, 777), ("encoder", "bf16"): (130, 600),
}


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_variant(dtype: torch.dtype):
    return load_module(ROOT / "generated" / "msda" / f"msda_fwd_{SHORT[dtype]}_m{M}_d{D}_l{L}_k{K}.py")


def deterministic_variant(dtype: torch.dtype):
    """The same variant generated with schedule.deterministic: true (rendered here, not shipped)."""
    from kgen.generate import generate
    from kgen.spec import load_spec

    text = (ROOT / "specs" / "msda.yaml").read_text()
    assert "deterministic: false" in text
    tmp = Path(tempfile.mkdtemp())
    (tmp / "msda.yaml").write_text(text.replace("deterministic: false", "deterministic: true"))
    outputs = {o.variant: o for o in generate(load_spec(tmp / "msda.yaml", check=False), ROOT)}
    name = f"msda_fwd_{SHORT[dtype]}_m{M}_d{D}_l{L}_k{K}"
    path = tmp / f"{name}_deterministic.py"
    path.write_text(outputs[name].text)
    return load_module(path)


def inputs(B: int, Q: int, dtype: torch.dtype, local: bool, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = torch.tensor(LEVELS, dtype=torch.int64, device="cuda")
    areas = shapes[:, 0] * shapes[:, 1]
    S = int(areas.sum())
    value = torch.randn(B, S, M, D, device="cuda", generator=g).to(dtype)
    if local:
        if Q == S:  # encoder: query i is pixel i of the flattened pyramid
            refs = []
            for h, w in LEVELS:
                ys, xs = torch.meshgrid(torch.arange(h, device="cuda"), torch.arange(w, device="cuda"), indexing="ij")
                refs.append(torch.stack([(xs.flatten() + 0.5) / w, (ys.flatten() + 0.5) / h], -1))
            ref = torch.cat(refs)[None].expand(B, Q, 2)
        else:
            ref = torch.rand(B, Q, 2, device="cuda", generator=g)
        wh = torch.tensor([[w, h] for h, w in LEVELS], dtype=torch.float32, device="cuda")  # [L, 2]
        offset_px = torch.rand(B, Q, M, L, K, 2, device="cuda", generator=g) * 4 - 2
        loc = ref[:, :, None, None, None, :] + offset_px / wh[None, None, None, :, None, :]
    else:
        loc = torch.rand(B, Q, M, L, K, 2, device="cuda", generator=g) * 1.1 - 0.05
    w = torch.rand(B, Q, M, L, K, device="cuda", generator=g) + 0.05
    w = w / w.sum(dim=(-1, -2), keepdim=True)
    start = torch.cumsum(areas, 0) - areas
    return value, shapes, start, loc.to(dtype), w.to(dtype)


def must_move_bytes(B: int, Q: int, S: int, elem: int) -> int:
    """Value rows the samples touch (at most all of value), locations, weights, output."""
    corner_rows = B * Q * M * L * K * 4 * D * elem
    return min(corner_rows, B * S * M * D * elem) + B * Q * M * L * K * 3 * elem + B * Q * M * D * elem


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
    """Cold-L2 device time when fn can be graph-captured, else do_bench (marked *)."""
    if graph_ok:
        try:
            return cold_l2_us(fn), ""
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


def table(quick: bool) -> None:
    peers = deformops_peers()
    print(f"{'config':8s} {'dist':7s} {'dtype':5s} | {'ours fwd':>8s} {'target':>6s} {'of copy':>7s} | {'ours f+b':>8s} {'target':>6s} |"
          + "".join(f" {n + ' fwd':>21s} {'f+b':>8s} |" for n in peers) + f" {'torch fwd':>9s} {'f+b':>8s} | best-peer ratio fwd, f+b | max err")
    for cname, (B, Q) in CONFIGS.items():
        for dist in ("uniform", "local"):
            for dname, dtype in DTYPES.items():
                module = load_variant(dtype)
                value, shapes, start, loc, w = inputs(B, Q, dtype, dist == "local")
                ref = msda_forward_grid_sample(value.double(), shapes, start, loc.double(), w.double())
                out = module.msda_forward(value, shapes, start, loc, w)
                err = (out.double() - ref.view_as(out)).abs().max().item()
                grad = torch.randn_like(out)
                ours_f, _ = timed(lambda: module.msda_forward(value, shapes, start, loc, w), True)
                ours_fb, mark = timed(fwd_bwd(module.msda_forward, value, shapes, start, loc, w, grad), True)
                row = f"{cname:8s} {dist:7s} {dname:5s} | {ours_f:8.1f} "
                target = TARGETS[(cname, dname)] if dist == "uniform" else None
                nbytes = must_move_bytes(B, Q, value.shape[1], value.element_size())
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


def host_overhead() -> None:
    module = load_variant(torch.bfloat16)
    value, shapes, start, loc, w = inputs(4, 300, torch.bfloat16, False)
    for _ in range(20):
        module.msda_forward(value, shapes, start, loc, w)
    torch.cuda.synchronize()
    n = 500
    t0 = time.perf_counter()
    for _ in range(n):
        module.msda_forward(value, shapes, start, loc, w)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"eager decoder bf16 forward: {(t1 - t0) / n * 1e6:.1f} us host time per call (launch queue not full), "
          f"{(t2 - t0) / n * 1e6:.1f} us wall per call including the GPU")


def deterministic_checks() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        atomic, det = load_variant(dtype), deterministic_variant(dtype)
        for cname, (B, Q) in CONFIGS.items():
            value, shapes, start, loc, w = inputs(B, Q, dtype, False, seed=1)
            grad = torch.randn(B, Q, M * D, device="cuda").to(dtype)
            grads = []
            for _ in range(10):
                v = value.detach().requires_grad_()
                det.msda_forward(v, shapes, start, loc, w).backward(grad.view(B, Q, M * D))
                grads.append(v.grad.clone())
            same = all(torch.equal(grads[0], g) for g in grads[1:])
            va = value.detach().requires_grad_()
            atomic.msda_forward(va, shapes, start, loc, w).backward(grad.view(B, Q, M * D))
            diff = (va.grad.double() - grads[0].double()).abs().max().item()
            t_atomic, _ = timed(fwd_bwd(atomic.msda_forward, value, shapes, start, loc, w, grad), True)
            t_det, _ = timed(fwd_bwd(det.msda_forward, value, shapes, start, loc, w, grad), True)
            print(f"deterministic {SHORT[dtype]:4s} {cname}: grad_value bitwise identical over 10 runs: {same}; "
                  f"max |det - atomic| {diff:.1e}; fwd+bwd atomic {t_atomic:.1f} us, deterministic {t_det:.1f} us ({t_det / t_atomic:.2f}x)")


def graph_capture_check() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        module = load_variant(dtype)
        value, shapes, start, loc, w = inputs(4, 300, dtype, False, seed=2)
        grad = torch.randn(4, 300, M * D, device="cuda").to(dtype)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"python {platform.python_version()}, date {time.strftime('%Y-%m-%d')}")
    print("us: device time with a cold L2 (CUDA graph), or do_bench's median where marked * (no capture);"
          " of copy: forward bytes that must move / time over 4.29 TB/s; ratio: fastest peer / ours")
    table(args.quick)
    host_overhead()
    deterministic_checks()
    graph_capture_check()


if __name__ == "__main__":
    main()
