"""Schedule sweep of a generated Triton TQ decode kernel on the GPU: the decode kernel alone.

Run from the project root on a CUDA machine:
  python benchmarks/tq_decode_schedules.py [--variant d128_qg8_bs16] [--configs 16x32768,...]
      [--schedules 128:4:2:128,128:4:2:0,...]
A schedule is TILE_TOKENS:num_warps:num_stages:maxnreg (maxnreg 0: no cap); the default list is
the shipped schedule and its neighbours. Each candidate's merged output is compared with the
shipped schedule's (a wrong tile shape fails loudly), then its device time with a cold L2 is
printed with the registers and spills the compiler reports.
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

DEFAULT_SCHEDULES = "128:4:1:128,128:4:1:0,128:4:2:128,128:4:2:0,64:4:1:128,128:8:1:128"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="d128_qg8_bs16")
    parser.add_argument("--configs", default="16x32768,1x32768,64x8192")
    parser.add_argument("--schedules", default=DEFAULT_SCHEDULES)
    args = parser.parse_args()
    dec = load(f"tq_decode_triton_{args.variant}")
    d, qg, bs = dec.HEAD_DIM, dec.QG, dec.BS
    store = load(f"tq_store_d{d}_bs{bs}")
    kernel = getattr(dec, f"tq_decode_triton_{args.variant}_kernel")
    schedules = [tuple(int(x) for x in s.split(":")) for s in args.schedules.split(",")]
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    centroids, rotation = lloyd_max_centroids(d).to(dev), hadamard_rotation(d).to(dev)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; variant {args.variant}, Hk = {HK}; shipped: "
          f"tile {dec.TILE_TOKENS}, decode kernel alone, cold L2")
    for num_seqs, ctx in (tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")):
        nb = ctx // bs
        q, cache, table, seq_lens = random_decode_inputs(dec, store, num_seqs, ctx, g, centroids, rotation)
        shipped = dec.tq_decode(q, cache, table, seq_lens, centroids, rotation)
        q_rot, codebook = dec.rotate_query(q, rotation, centroids)
        parts, groups = dec.decode_partitions(nb, num_seqs, HK, q.device)
        out_parts = torch.empty((num_seqs, HK, parts, qg, d), dtype=torch.bfloat16, device=dev)
        exp_sums = torch.empty((num_seqs, HK, parts, qg), dtype=torch.float32, device=dev)
        max_logits = torch.empty_like(exp_sums)
        print(f"== {num_seqs} x {ctx}: {num_seqs * HK * parts} programs", flush=True)
        for tile, warps, stages, regs in schedules:
            options = dict(num_warps=warps, num_stages=stages, **({"maxnreg": regs} if regs else {}))

            # The chunked form (QG <= 8) takes its padded heads and one chunk per warp; the other, padded rows.
            heads = dict(Q_COLS=dec.Q_COLS, CHUNKS=warps) if hasattr(dec, "Q_COLS") else dict(Q_ROWS=dec.Q_ROWS)

            def run():
                return kernel[(num_seqs, HK, parts)](
                    q_rot, cache, codebook, table, seq_lens, out_parts, exp_sums, max_logits, nb, groups,
                    dec.LOG2E / math.sqrt(d), NUM_KV_HEADS=HK, NUM_PARTITIONS=parts, QG=qg, BS=bs,
                    N_CENTROIDS=dec.N_CENTROIDS, PAIRS=dec.PAIRS, NIBBLE_BITS=dec.NIBBLE_BITS,
                    NIBBLE_MASK=dec.NIBBLE_MASK, GROUP=dec.GROUP, TILE_TOKENS=tile, LN2=dec.LN2,
                    FP16_1024_BITS=dec.FP16_1024_BITS, V_LEVEL_MID=dec.V_LEVEL_MID, V_LEVEL_OFFSET=dec.V_LEVEL_OFFSET,
                    PTX_UNPACK=dec.PTX_UNPACK, INTERPRETER_FIXUPS=False, **heads, **options)

            name = f"tile {tile:3d} warps {warps} stages {stages} maxnreg {regs or '-':>3}"
            try:
                out_parts.fill_(float("nan"))
                compiled = run()
                out = dec.merge_partitions(out_parts, exp_sums, max_logits, torch.empty_like(q))
                diff = (out.float() - shipped.float()).abs().max().item()
                us = cold_l2_us(run)
                print(f"{name}: {us:8.1f} us  regs {compiled.n_regs:3d} spills {compiled.n_spills:3d}  "
                      f"max |diff| vs shipped {diff:.1e}", flush=True)
            except Exception as e:  # a schedule Triton cannot build is reported, not fatal
                print(f"{name}: FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
        del cache


if __name__ == "__main__":
    main()
