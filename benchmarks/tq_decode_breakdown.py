"""Where a TQ decode call's device time goes: the pipeline and each of its kernels alone.

Run from the project root on a CUDA machine: `python benchmarks/tq_decode_breakdown.py
[--variant d128_qg8_bs16] [--configs 1x1024,16x8192,...]`. For each config, cold-L2 device time
(benchmarks/timing.py) of `tq_decode` and, at the partitions it picks, of `rotate_query`,
`launch_decode_kernel` and `merge_partitions` alone, on random inputs stored by the store kernel.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import cold_l2_us  # noqa: E402
from tq_decode import HK, load, random_decode_inputs  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="d128_qg8_bs16", help="d{head_dim}_qg{GQA factor}_bs{block size}")
    parser.add_argument("--configs", default="1x1024,1x8192,16x1024,64x1024,16x8192", help="SEQSxCONTEXT,...")
    args = parser.parse_args()
    dec = load(f"tq_decode_triton_{args.variant}")
    d, qg, bs = dec.HEAD_DIM, dec.QG, dec.BS
    store = load(f"tq_store_d{d}_bs{bs}")
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    cent, rot = lloyd_max_centroids(d).to(dev), hadamard_rotation(d).to(dev)
    scale = 1 / math.sqrt(d)
    print(f"{args.variant}, Hk = {HK}; us: device time with a cold L2")
    for num_seqs, ctx in (tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")):
        q, cache, table, sl = random_decode_inputs(dec, store, num_seqs, ctx, g, cent, rot)
        P, tile_groups = dec.decode_partitions(table.shape[1], num_seqs, HK, q.device)
        out_parts = torch.empty((num_seqs, HK, P, qg, d), dtype=torch.bfloat16, device=dev)
        exp_sums = torch.empty((num_seqs, HK, P, qg), dtype=torch.float32, device=dev)
        max_logits = torch.empty_like(exp_sums)
        out = torch.empty_like(q)
        q_rot, codebook = dec.rotate_query(q, rot, cent)
        pipeline = cold_l2_us(lambda: dec.tq_decode(q, cache, table, sl, cent, rot))
        rotate = cold_l2_us(lambda: dec.rotate_query(q, rot, cent))
        decode = cold_l2_us(lambda: dec.launch_decode_kernel(
            q_rot, cache, codebook, table, sl, out_parts, exp_sums, max_logits, tile_groups, scale))
        merge = cold_l2_us(lambda: dec.merge_partitions(out_parts, exp_sums, max_logits, out))
        print(f"{num_seqs:3d} x {ctx:6d} (P={P}): pipeline {pipeline:7.1f} = rotate {rotate:5.1f} + decode {decode:7.1f} "
              f"+ merge {merge:5.1f} (sum {rotate + decode + merge:7.1f})", flush=True)
        del cache


if __name__ == "__main__":
    main()
