"""Schedule exploration for the Triton TQ decode kernel (H200): several kernel shapes, one call.

Run from the project root on a CUDA machine: `python benchmarks/tq_decode_variants.py`.
Each candidate is checked against attention on the dequantized cache (fp32) before it is timed
(decode kernel alone, cold L2). Candidates:
  words: each token's 64 B of K (and V) loaded as 16 int32 words, split into 128 nibbles in
         element order (nibble o of word i is element 8i+o), one K=128 dot each for QK and PV;
         V as fp16 through the 0x6400 exponent trick (1024 + n) or a plain int->fp16 convert.
  bytes: 64 uint8 per token, token-major, even/odd halves (two dots each), like the old kernel.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from timing import cold_l2_us  # noqa: E402
from tq_decode import D, HK, QG, BS, dequantize, load  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

LOG2E = math.log2(math.e)
NCU = "--ncu" in sys.argv
GROUP = 256
BLOCK_HEAD_BYTES = 2144 // 16 * BS  # bytes of one block per kv head (BS * 134)


@triton.jit
def words_kernel(q_ptr, kv_ptr, cent_ptr, bt_ptr, sl_ptr, out_ptr, es_ptr, ml_ptr, max_blocks, tile_groups, qk_scale_log2,
                 NUM_KV_HEADS: tl.constexpr, NUM_PARTITIONS: tl.constexpr, QG: tl.constexpr, BS: tl.constexpr,
                 Q_ROWS: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr, TILE: tl.constexpr, V_TRICK: tl.constexpr,
                 BLOCK_HEAD_BYTES: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    row = tl.arange(0, Q_ROWS)
    dim = tl.arange(0, D)
    lane = tl.arange(0, TILE)
    word = tl.arange(0, D // 8)
    shift = tl.arange(0, 8) * 4
    seq_len = tl.load(sl_ptr + seq)
    start = part * tile_groups * GROUP
    end = tl.minimum(tl.minimum(seq_len, max_blocks * BS), start + tile_groups * GROUP)
    num_tiles = tl.cdiv(tl.maximum(end - start, 0), TILE)
    q = tl.load(q_ptr + (seq * NUM_KV_HEADS + kv_head) * QG * D + row[:, None] * D + dim[None, :], mask=row[:, None] < QG, other=0.0)
    bt_row = bt_ptr + seq * max_blocks
    m_i = tl.full((Q_ROWS,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((Q_ROWS,), dtype=tl.float32)
    acc = tl.zeros((Q_ROWS, D), dtype=tl.float32)
    for tile in range(0, num_tiles):
        token = start + tile * TILE + lane
        live = token < end
        block = tl.load(bt_row + token // BS, mask=live, other=0)
        slot = token % BS
        base = kv_ptr + block.to(tl.int64) * (NUM_KV_HEADS * BLOCK_HEAD_BYTES)
        rec = (base + NUM_KV_HEADS * slot * D + kv_head * D).to(tl.pointer_type(tl.int32))
        meta = (base + NUM_KV_HEADS * BS * D + kv_head * BS * 6 + slot * 2).to(tl.pointer_type(tl.float16))
        kw = tl.load(rec[:, None] + word[None, :], mask=live[:, None], other=0)
        kn = tl.reshape((kw[:, :, None] >> shift[None, None, :]) & 15, (TILE, D))
        k = tl.load(cent_ptr + kn)
        k_norm = tl.load(meta, mask=live, other=0.0)
        v_scale = tl.load(meta + BS, mask=live, other=0.0)
        v_zero = tl.load(meta + 2 * BS, mask=live, other=0.0)
        scores = tl.dot(q, tl.trans(k))
        scores = scores * (k_norm.to(tl.float32) * qk_scale_log2)[None, :]
        scores = tl.where(live[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        probs = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(probs, axis=1)
        vw = tl.load(rec[:, None] + (D // 8 + word)[None, :], mask=live[:, None], other=0)
        vn = tl.reshape((vw[:, :, None] >> shift[None, None, :]) & 15, (TILE, D))
        ps = (probs * v_scale.to(tl.float32)[None, :]).to(tl.float16)
        pz = tl.sum(probs * v_zero.to(tl.float32)[None, :], axis=1)
        if V_TRICK:
            v = (vn | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)  # 1024 + n, exact
            pz = pz - 1024.0 * tl.sum(ps.to(tl.float32), axis=1)
        else:
            v = vn.to(tl.float16)
        acc = tl.dot(ps, v, acc * alpha[:, None]) + pz[:, None]
        m_i = m_new
    inv_l = tl.where(l_i > 0.0, 1.0 / tl.where(l_i > 0.0, l_i, 1.0), 0.0)
    ob = out_ptr + ((seq * NUM_KV_HEADS + kv_head) * NUM_PARTITIONS + part) * QG * D
    tl.store(ob + row[:, None] * D + dim[None, :], (acc * inv_l[:, None]).to(tl.bfloat16), mask=row[:, None] < QG)
    st = ((seq * NUM_KV_HEADS + kv_head) * NUM_PARTITIONS + part) * QG + row
    tl.store(es_ptr + st, l_i, mask=row < QG)
    tl.store(ml_ptr + st, m_i * 0.6931471805599453, mask=row < QG)


@triton.jit
def bytes_kernel(q_ptr, kv_ptr, cent_ptr, kt_ptr, vt_ptr, bt_ptr, sl_ptr, out_ptr, es_ptr, ml_ptr, max_blocks, tile_groups, qk_scale_log2,
                 NUM_KV_HEADS: tl.constexpr, NUM_PARTITIONS: tl.constexpr, QG: tl.constexpr, BS: tl.constexpr,
                 Q_ROWS: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr, TILE: tl.constexpr, V_TRICK: tl.constexpr,
                 BLOCK_HEAD_BYTES: tl.constexpr, PAIR_K: tl.constexpr, PAIR_V: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    row = tl.arange(0, Q_ROWS)
    pair = tl.arange(0, D // 2)
    lane = tl.arange(0, TILE)
    seq_len = tl.load(sl_ptr + seq)
    start = part * tile_groups * GROUP
    end = tl.minimum(tl.minimum(seq_len, max_blocks * BS), start + tile_groups * GROUP)
    num_tiles = tl.cdiv(tl.maximum(end - start, 0), TILE)
    qb = q_ptr + (seq * NUM_KV_HEADS + kv_head) * QG * D + row[:, None] * D + 2 * pair[None, :]
    q_even = tl.load(qb, mask=row[:, None] < QG, other=0.0)
    q_odd = tl.load(qb + 1, mask=row[:, None] < QG, other=0.0)
    bt_row = bt_ptr + seq * max_blocks
    m_i = tl.full((Q_ROWS,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((Q_ROWS,), dtype=tl.float32)
    acc_e = tl.zeros((Q_ROWS, D // 2), dtype=tl.float32)
    acc_o = tl.zeros((Q_ROWS, D // 2), dtype=tl.float32)
    for tile in range(0, num_tiles):
        token = start + tile * TILE + lane
        live = token < end
        block = tl.load(bt_row + token // BS, mask=live, other=0)
        slot = token % BS
        base = kv_ptr + block.to(tl.int64) * (NUM_KV_HEADS * BLOCK_HEAD_BYTES)
        rec = base + NUM_KV_HEADS * slot * D + kv_head * D
        meta = (base + NUM_KV_HEADS * BS * D + kv_head * BS * 6 + slot * 2).to(tl.pointer_type(tl.float16))
        kb = tl.load(rec[:, None] + pair[None, :], mask=live[:, None], other=0)
        if PAIR_K:
            kp = tl.load(kt_ptr + kb)
            k_lo = kp.to(tl.int16).to(tl.bfloat16, bitcast=True)
            k_hi = (kp >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            k_lo = tl.load(cent_ptr + (kb & 15))
            k_hi = tl.load(cent_ptr + (kb >> 4))
        k_norm = tl.load(meta, mask=live, other=0.0)
        v_scale = tl.load(meta + BS, mask=live, other=0.0)
        v_zero = tl.load(meta + 2 * BS, mask=live, other=0.0)
        scores = tl.dot(q_even, tl.trans(k_lo))
        scores = tl.dot(q_odd, tl.trans(k_hi), scores)
        scores = scores * (k_norm.to(tl.float32) * qk_scale_log2)[None, :]
        scores = tl.where(live[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        probs = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(probs, axis=1)
        vb = tl.load(rec[:, None] + D // 2 + pair[None, :], mask=live[:, None], other=0)
        ps = (probs * v_scale.to(tl.float32)[None, :]).to(tl.float16)
        pz = tl.sum(probs * v_zero.to(tl.float32)[None, :], axis=1)
        if PAIR_V:
            vp = tl.load(vt_ptr + vb)
            v_lo = vp.to(tl.int16).to(tl.float16, bitcast=True)
            v_hi = (vp >> 16).to(tl.int16).to(tl.float16, bitcast=True)
        else:
            v_lo = (vb & 15).to(tl.float16)
            v_hi = (vb >> 4).to(tl.float16)
        acc_e = tl.dot(ps, v_lo, acc_e * alpha[:, None]) + pz[:, None]
        acc_o = tl.dot(ps, v_hi, acc_o * alpha[:, None]) + pz[:, None]
        m_i = m_new
    inv_l = tl.where(l_i > 0.0, 1.0 / tl.where(l_i > 0.0, l_i, 1.0), 0.0)
    ob = out_ptr + ((seq * NUM_KV_HEADS + kv_head) * NUM_PARTITIONS + part) * QG * D + row[:, None] * D + 2 * pair[None, :]
    tl.store(ob, (acc_e * inv_l[:, None]).to(tl.bfloat16), mask=row[:, None] < QG)
    tl.store(ob + 1, (acc_o * inv_l[:, None]).to(tl.bfloat16), mask=row[:, None] < QG)
    st = ((seq * NUM_KV_HEADS + kv_head) * NUM_PARTITIONS + part) * QG + row
    tl.store(es_ptr + st, l_i, mask=row < QG)
    tl.store(ml_ptr + st, m_i * 0.6931471805599453, mask=row < QG)


# name, kernel, extra constexprs, schedules (tile, warps, stages)
CANDIDATES = [
    ("bytes", bytes_kernel, dict(PAIR_K=0, PAIR_V=0, V_TRICK=0), [(128, 4, 3), (128, 2, 3), (256, 4, 3), (256, 8, 3), (128, 4, 4)]),
    ("pairK", bytes_kernel, dict(PAIR_K=1, PAIR_V=0, V_TRICK=0), [(128, 4, 3), (128, 2, 3), (256, 4, 3), (256, 8, 2)]),
    ("pairKV", bytes_kernel, dict(PAIR_K=1, PAIR_V=1, V_TRICK=0), [(128, 4, 3), (128, 2, 3), (256, 4, 3)]),
    ("words", words_kernel, dict(V_TRICK=1), [(128, 2, 3), (256, 4, 3)]),
]


def pair_table(lo_hi_bits):
    """int32 [256]: entry b = bits[b & 15] | bits[b >> 4] << 16 (16-bit patterns)."""
    b = torch.arange(256, device=lo_hi_bits.device)
    x = lo_hi_bits[b & 15] | (lo_hi_bits[b >> 4] << 16)
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def main() -> None:
    decode = load(f"tq_decode_triton_d{D}_qg{QG}_bs{BS}")
    store = load(f"tq_store_d{D}_bs{BS}")
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    centroids = lloyd_max_centroids(D).to(dev)
    cent_bf16 = centroids.to(torch.bfloat16)
    rotation = hadamard_rotation(D).to(dev)
    scale = 1 / math.sqrt(D)
    configs = [(1, 32768), (16, 32768)] if not NCU else [(16, 32768)]
    k_table = pair_table(cent_bf16.view(torch.int16).long() & 0xFFFF)
    v_table = pair_table(torch.arange(16, device=dev).half().view(torch.int16).long() & 0xFFFF)
    results = {}
    for num_seqs, ctx in configs:
        blocks_per_seq = ctx // BS
        num_blocks = num_seqs * blocks_per_seq
        k = torch.randn(num_seqs * ctx, HK, D, device=dev, generator=g, dtype=torch.bfloat16)
        v = torch.randn(num_seqs * ctx, HK, D, device=dev, generator=g, dtype=torch.bfloat16)
        q = torch.randn(num_seqs, HK * QG, D, device=dev, generator=g, dtype=torch.bfloat16)
        cache = torch.zeros(num_blocks, decode.cache_block_bytes(HK), dtype=torch.uint8, device=dev)
        block_table = torch.randperm(num_blocks, device=dev, generator=g).view(num_seqs, blocks_per_seq).int()
        slots = (block_table.long()[:, :, None] * BS + torch.arange(BS, device=dev)).reshape(-1)
        store.tq_store(cache, k, v, slots, centroids, rotation)
        del k, v
        seq_lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=dev)
        q_rot = (q.float() @ rotation).bfloat16()
        kd, vd = dequantize(cache, block_table, ctx, centroids)
        want = F.scaled_dot_product_attention(q_rot[:, :, None].float(), kd.float(), vd.float(), scale=scale, enable_gqa=True)[:, :, 0]
        del kd, vd
        P, tg = decode.partition_plan(blocks_per_seq)
        parts = torch.empty(num_seqs, HK, P, QG, D, dtype=torch.bfloat16, device=dev)
        es = torch.empty(num_seqs, HK, P, QG, dtype=torch.float32, device=dev)
        ml = torch.empty_like(es)
        out = torch.empty_like(q)
        q_rot_bf16, codebook = decode.rotate_query(q, rotation, centroids)  # the shipped kernel's operands
        base_us = 0 if NCU else cold_l2_us(lambda: decode.launch_decode_kernel(q_rot_bf16, cache, codebook, block_table, seq_lens, parts, es, ml, tg, scale))
        ref_out = decode.tq_decode(q, cache, block_table, seq_lens, centroids, rotation)
        print(f"current kernel vs reference: max err {(ref_out.float() - want).abs().max().item():.1e}")
        full_us = 0 if NCU else cold_l2_us(lambda: decode.tq_decode(q, cache, block_table, seq_lens, centroids, rotation))
        nbytes = num_seqs * ctx * HK * (D + 6)
        print(f"== {num_seqs}x{ctx}: P={P} TGPP={tg}; current kernel {base_us:.1f} us, current full {full_us:.1f} us; floor {nbytes / 4.29e6:.1f} us", flush=True)
        for name, kern, extra, schedules in CANDIDATES:
            for tile, warps, stages in schedules:
                if NCU and (name, tile, warps, stages) not in (("bytes", 128, 4, 3), ("pairK", 128, 4, 3)):
                    continue
                tables = (k_table, v_table) if kern is bytes_kernel else ()
                def run():
                    return kern[(num_seqs, HK, P)](q_rot, cache, cent_bf16, *tables, block_table, seq_lens, parts, es, ml, blocks_per_seq, tg,
                                            scale * LOG2E, NUM_KV_HEADS=HK, NUM_PARTITIONS=P, QG=QG, BS=BS, Q_ROWS=16, D=D,
                                            GROUP=GROUP, TILE=tile, BLOCK_HEAD_BYTES=BLOCK_HEAD_BYTES,
                                            num_warps=warps, num_stages=stages, **extra)
                try:
                    parts.fill_(float("nan"))
                    ck = run()
                    decode.merge_partitions(parts, es, ml, out)
                    err = (out.float() - want).abs().max().item()
                    if NCU:
                        torch.cuda.synchronize()
                        continue
                    us = cold_l2_us(run)
                    print(f"   regs {ck.n_regs} spills {ck.n_spills} smem {ck.metadata.shared}", end="")
                except Exception as e:  # noqa: BLE001
                    print(f"{name} tile={tile} w={warps} s={stages}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                results.setdefault((name, tile, warps, stages), {})[(num_seqs, ctx)] = us
                print(f"{name:9s} tile={tile:3d} w={warps} s={stages}: {us:7.1f} us  {nbytes / us / 1e6:5.2f} TB/s  err {err:.1e}", flush=True)
        del cache
    print("\nsummary (us):", [f"{n}x{c}" for n, c in configs])
    for key, row in sorted(results.items(), key=lambda kv: sum(kv[1].values())):
        print(key, [f"{row.get(c, float('nan')):.1f}" for c in configs])


if __name__ == "__main__":
    main()
