"""Host time per eager call of the TQ wrappers, two builds side by side in one process (H200).

`python benchmarks/tq_host_time.py BEFORE_DIR [VARIANT]` loads tq_decode_triton_VARIANT.py and
tq_store_dX_bsY.py from BEFORE_DIR and from generated/tq_decode/, then per build and shape:
outputs compared bit for bit, device time with a cold L2 (timing.cold_l2_us), and host time per
call: alternating runs of back-to-back calls, each timed to a final synchronize (the GPU work of
a call, ~20 us at 1 x 1K, is far below its host time, so the host sets the pace).
"""

from __future__ import annotations

import importlib.util
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import cold_l2_us  # noqa: E402
from tq_decode import HK, random_decode_inputs, use_variant  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

CALLS, RUNS = 300, 5


def load(path: Path, tag: str):
    spec = importlib.util.spec_from_file_location(f"{tag}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def host_us(fn) -> float:
    """Wall time per call of CALLS back-to-back calls, to the last one's completion."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / CALLS * 1e6


def compare_host(label: str, calls: dict) -> None:
    """RUNS alternating runs per build; median and min per call."""
    samples = {name: [] for name in calls}
    for _ in range(RUNS):
        for name, fn in calls.items():
            samples[name].append(host_us(fn))
    shown = ", ".join(f"{name} {statistics.median(s):.1f} (min {min(s):.1f})" for name, s in samples.items())
    print(f"  host per call, {label}: {shown} us", flush=True)


def main() -> None:
    before_dir = Path(sys.argv[1])
    variant = sys.argv[2] if len(sys.argv) > 2 else "d128_qg8_bs16"
    use_variant(variant)
    d, bs = variant.split("_")[0], variant.split("_")[2]
    decode_name, store_name = f"tq_decode_triton_{variant}.py", f"tq_store_{d}_{bs}.py"
    builds = {
        "before": (load(before_dir / decode_name, "before"), load(before_dir / store_name, "before")),
        "after": (load(ROOT / "generated" / "tq_decode" / decode_name, "after"),
                  load(ROOT / "generated" / "tq_decode" / store_name, "after")),
    }
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}, triton {triton.__version__},"
          f" Python {platform.python_version()}; {variant}, Hk {HK}", flush=True)
    dev = torch.device("cuda")
    centroids, rotation = lloyd_max_centroids(builds["after"][0].HEAD_DIM).to(dev), hadamard_rotation(builds["after"][0].HEAD_DIM).to(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    for num_seqs, ctx in ((1, 1024), (16, 8192), (16, 32768)):
        query, cache, table, seq_lens = random_decode_inputs(*builds["after"], num_seqs, ctx, gen, centroids, rotation)
        outs = {name: decode.tq_decode(query, cache, table, seq_lens, centroids, rotation) for name, (decode, _) in builds.items()}
        same = torch.equal(outs["before"], outs["after"])
        times = {name: cold_l2_us(lambda m=decode: m.tq_decode(query, cache, table, seq_lens, centroids, rotation))
                 for name, (decode, _) in builds.items()}
        print(f"decode {num_seqs} x {ctx}: outputs bitwise equal: {same}; device time (cold L2):"
              f" before {times['before']:.1f} us, after {times['after']:.1f} us", flush=True)
        if num_seqs == 1:
            compare_host("decode 1 x 1K", {name: (lambda m=decode: m.tq_decode(query, cache, table, seq_lens, centroids, rotation))
                                           for name, (decode, _) in builds.items()})
        del query, cache, table, seq_lens
    # A decode step's store: one new token per sequence, 16 sequences, into a 1K-token cache each;
    # the second store (new tokens) runs the kernel the first one compiled.
    num_tokens = 16
    caches = {name: torch.zeros(num_tokens * 1024 // store.BS, store.cache_block_bytes(HK), dtype=torch.uint8, device=dev)
              for name, (_, store) in builds.items()}
    for step in range(2):
        k = torch.randn(num_tokens, HK, builds["after"][0].HEAD_DIM, device=dev, generator=gen, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        slots = torch.randperm(num_tokens * 1024, device=dev, generator=gen)[:num_tokens]
        for name, (_, store) in builds.items():
            store.tq_store(caches[name], k, v, slots, centroids, rotation)
        print(f"store {num_tokens} tokens, call {step + 1}: cache bytes equal: {torch.equal(caches['before'], caches['after'])}",
              flush=True)
    compare_host(f"store {num_tokens} tokens", {name: (lambda s=store, c=caches[name]: s.tq_store(c, k, v, slots, centroids, rotation))
                                                  for name, (_, store) in builds.items()})


if __name__ == "__main__":
    main()
