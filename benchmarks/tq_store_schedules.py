"""Schedule sweep of the generated Triton TQ store kernel on the GPU.

Run from the project root on a CUDA machine:
  python benchmarks/tq_store_schedules.py [HEAD_DIMS, e.g. 128,256] [one]
For each head dim (BS 16, Hk = 8, bf16 k and v) at 16384 tokens (bulk, as after a prefill) and
64 tokens (one decode step of a 64-sequence batch): the shipped store's cold-L2 time, then each
(tokens per program, warps, rotation columns per block) candidate's time, registers, spills, and
whether its cache bytes equal the shipped kernel's ("one": only 16 tokens, 4 warps, 32 columns).
"""
import itertools
import sys
from pathlib import Path

import torch
from triton import cdiv

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import cold_l2_us  # noqa: E402
from tq_decode import HK, load  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

head_dims = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else (256, 128)
only_one = len(sys.argv) > 2 and sys.argv[2] == "one"
for d in head_dims:
    st = load(f"tq_store_d{d}_bs16")
    kernel = getattr(st, f"tq_store_d{d}_bs16_kernel")
    centroids, rotation = lloyd_max_centroids(d).cuda(), hadamard_rotation(d).cuda()
    ordered, order = torch.sort(centroids)
    midpoints = (ordered[1:] + ordered[:-1]) / 2
    for tokens in (16384, 64):
        k = torch.randn(tokens, HK, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(tokens, HK, d, device="cuda", dtype=torch.bfloat16)
        slots = torch.randperm(tokens, device="cuda")
        shipped_cache = torch.zeros(tokens // 16, st.cache_block_bytes(HK), dtype=torch.uint8, device="cuda")
        st.tq_store(shipped_cache, k, v, slots, centroids, rotation)
        shipped = cold_l2_us(lambda: st.tq_store(shipped_cache, k, v, slots, centroids, rotation))
        print(f"d{d} {tokens} tokens: shipped {shipped:9.1f} us = {shipped * 1e3 / tokens:7.2f} ns/token", flush=True)
        candidates = [(16, 4, 32)] if only_one else itertools.product((16, 32, 64), (4, 8), (32, 64))
        for per_program, warps, cols in candidates:
            if cols > d // 2 or (per_program, warps, cols) == (st.STORE_TOKENS, 8, st.ROT_COLS):
                continue
            cache = torch.zeros_like(shipped_cache)

            def run():
                return kernel[(cdiv(tokens, per_program), HK)](
                    cache, k, v, slots, centroids, midpoints, order.to(torch.int32), rotation, tokens,
                    k.stride(0), k.stride(1), v.stride(0), v.stride(1), NUM_KV_HEADS=HK, NORM_CORRECTION=False,
                    HEAD_DIM=d, PAIRS=d // 2, ROT_COLS=cols, COL_BLOCKS=d // 2 // cols, STORE_TOKENS=per_program,
                    N_MIDPOINTS=st.N_MIDPOINTS, NIBBLE_BITS=st.NIBBLE_BITS, V_LEVELS=st.V_LEVELS,
                    KEY_NORM_EPS=st.KEY_NORM_EPS, V_SCALE_MIN=st.V_SCALE_MIN, num_warps=warps)

            name = f"tokens/program {per_program:2d} warps {warps} rot cols {cols:2d}"
            try:
                compiled = run()
                same = torch.equal(cache, shipped_cache)
                us = cold_l2_us(run)
                print(f"  {name}: {us:9.1f} us = {us * 1e3 / tokens:7.2f} ns/token  regs {compiled.n_regs} "
                      f"spills {compiled.n_spills} bytes {'same' if same else 'DIFFER'}", flush=True)
            except Exception as e:  # a schedule Triton cannot build is reported, not fatal
                print(f"  {name}: FAILED {type(e).__name__} {str(e)[:120]}", flush=True)
