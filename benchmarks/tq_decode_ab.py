"""A/B of TQ decode modules on the same inputs: the shipped module against lab copies of it.

Run from the project root on a CUDA machine:
  python benchmarks/tq_decode_ab.py VARIANT CONFIGS BASE.py [OTHER.py ...]
e.g. `python benchmarks/tq_decode_ab.py d128_qg8_bs16 16x32768,1x1024
generated/tq_decode/tq_decode_triton_d128_qg8_bs16.py lab/ahead1.py`. Lab copies are usually
rendered by kgen with a constant of kgen/ops/tq_triton.py patched (a register cap, a load depth).
Per config: random inputs stored by the shipped store kernel, each module's whole pipeline
(tq_decode) timed with a cold L2 in 3 interleaved rounds (median), the ratio to BASE, and '!'
where a module's output is not bitwise BASE's. Then each module's decode kernels' registers and
spills as compiled.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tq_decode as bench  # noqa: E402
from timing import cold_l2_us  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

ROUNDS = 3


def decode_registers(module) -> list[tuple[int, int]]:
    """(registers, spills) of each decode kernel the module has compiled so far."""
    binaries = [binary for key, (binary, _) in module._COMPILED.items() if "decode" in key[0].fn.__name__]
    return sorted({(binary.n_regs, binary.n_spills) for binary in binaries})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variant", help="d{head_dim}_qg{GQA factor}_bs{block size}")
    parser.add_argument("configs", help="comma-separated SEQSxCONTEXT list")
    parser.add_argument("modules", nargs="+", help="the base module's path, then the others'")
    args = parser.parse_args()
    bench.use_variant(args.variant)
    modules = [bench.load(Path(path).stem, Path(path).read_text(), tag="ab") for path in args.modules]
    names = ["base"] + [Path(path).stem for path in args.modules[1:]]
    store = bench.load(f"tq_store_d{bench.D}_bs{bench.BS}")
    dev = "cuda"
    centroids, rotation = lloyd_max_centroids(bench.D).to(dev), hadamard_rotation(bench.D).to(dev)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__};"
          f" {args.variant}, Hk {bench.HK}; whole pipeline, cold L2, us")
    print("config".ljust(10) + "".join(name.rjust(max(16, len(name) + 2)) for name in names))
    for item in args.configs.split(","):
        num_seqs, ctx = (int(x) for x in item.split("x"))
        generator = torch.Generator(device=dev).manual_seed(0)
        q, cache, table, lens = bench.random_decode_inputs(modules[0], store, num_seqs, ctx, generator, centroids, rotation)
        outputs = [m.tq_decode(q, cache, table, lens, centroids, rotation) for m in modules]
        times = [[] for _ in modules]
        for _ in range(ROUNDS):
            for module, samples in zip(modules, times):
                samples.append(cold_l2_us(lambda: module.tq_decode(q, cache, table, lens, centroids, rotation)))
        medians = [statistics.median(samples) for samples in times]
        cells = [f"{t:7.1f} {medians[0] / t:4.2f}x{'' if torch.equal(out, outputs[0]) else '!'}"
                 for t, out in zip(medians, outputs)]
        print(item.ljust(10) + "".join(cell.rjust(max(16, len(name) + 2)) for cell, name in zip(cells, names)), flush=True)
        del q, cache, table, lens, outputs
    for name, module in zip(names, modules):
        print(f"{name}: decode kernels (registers, spills): {decode_registers(module)}")


if __name__ == "__main__":
    main()
