"""Partitions per sequence for a generated Triton TQ decode on the GPU, whole pipeline.

Run from the project root on a CUDA machine:
  python benchmarks/tq_decode_partitions.py d128_qg8_bs16 16x8192,64x1024,... [P,P,...]
For each config and partition count P (powers of two up to 64 and the shipped choice, or the
counts listed: any P works, e.g. one that fills whole waves of resident programs): rotate +
decode + merge with P partitions (tile groups per partition = cdiv(groups, P); at P = 1 the
decode writes the output and no merge runs, as in tq_decode), the cold-L2 device time of the
pipeline and of the decode kernel alone, and max |diff| against the shipped choice's output
(decode_partitions).
"""
import math
import sys
from pathlib import Path
import torch
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import cold_l2_us
from tq_decode import HK, load, random_decode_inputs
from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids

variant = sys.argv[1]
dec = load(f"tq_decode_triton_{variant}")
d, qg, bs = dec.HEAD_DIM, dec.QG, dec.BS
store = load(f"tq_store_d{d}_bs{bs}")
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
cent, rot = lloyd_max_centroids(d).to(dev), hadamard_rotation(d).to(dev)
for num_seqs, ctx in (tuple(int(x) for x in c.split("x")) for c in sys.argv[2].split(",")):
    nb = ctx // bs
    q, cache, table, sl = random_decode_inputs(dec, store, num_seqs, ctx, g, cent, rot)
    base = dec.tq_decode(q, cache, table, sl, cent, rot)
    groups = dec.table_groups(nb)
    shipped_p = dec.decode_partitions(nb, num_seqs, HK, q.device)[0]
    print(f"== {variant} {num_seqs} x {ctx}: shipped P = {shipped_p} (partition_plan: {dec.partition_plan(nb)[0]}), {groups} groups", flush=True)
    counts = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1, 2, 4, 8, 16, 32, 64]
    for P in sorted({*counts, shipped_p}):
        if P > groups:
            continue
        tg = -(-groups // P)
        out = torch.empty_like(q)
        # As tq_decode does: one partition's normalized output is the answer, written in place (no merge).
        out_parts = (out.view(num_seqs, HK, 1, qg, d) if P == 1
                     else torch.empty((num_seqs, HK, P, qg, d), dtype=torch.bfloat16, device=dev))
        es = torch.empty((num_seqs, HK, P, qg), dtype=torch.float32, device=dev); ml = torch.empty_like(es)
        q_rot, cb = dec.rotate_query(q, rot, cent)
        scale = 1 / math.sqrt(d)
        def decode_only():
            dec.launch_decode_kernel(q_rot, cache, cb, table, sl, out_parts, es, ml, tg, scale)
        def pipeline():
            qr, c = dec.rotate_query(q, rot, cent)
            dec.launch_decode_kernel(qr, cache, c, table, sl, out_parts, es, ml, tg, scale)
            if P > 1:
                dec.merge_partitions(out_parts, es, ml, out)
        pipeline()
        diff = (out.float() - base.float()).abs().max().item()
        t_all, t_dec = cold_l2_us(pipeline), cold_l2_us(decode_only)
        print(f"P {P:3d} ({num_seqs * HK * P:5d} programs, {tg * dec.GROUP:6d} tokens each{', shipped' if P == shipped_p else ''}): pipeline {t_all:8.1f} us, "
              f"decode {t_dec:8.1f} us, max |diff| vs shipped {diff:.1e}", flush=True)
    del cache
