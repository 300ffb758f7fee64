"""A/B of a restructured Triton TQ decode kernel against the generated one (decode kernel alone).

Not generated code: a hand-written candidate for the template, kept here with the measurements
that decide whether it gets there (benchmarks/RESULTS.md, session 13). What it changes, from an
ncu profile of the generated d128 kernel (16 x 32K, H200):
- each warp owns CHUNK = TILE_TOKENS / num_warps tokens of a tile, with its own running max,
  sum and accumulator (a batched tl.dot over [CHUNKS, ...]); the generated kernel shares one
  softmax state between its 4 warps and pays 2 cross-warp reductions (shared memory, 4 barriers)
  per tile. The chunks merge once, after the loop.
- the MMAs are transposed: scores^T = K . q^T (tokens as M, the query heads as N, padded to 8, not
  to 16 rows), out^T = V^T . P^T; half the QK MMAs of the generated kernel at QG <= 8.
- nibbles are unpacked 4 packed bytes per PTX call (PACK4), so the compiler does not split the
  loaded words into bytes and pair them again for the 2-byte calls.
- one pipeline stage: with two, the chunked kernel spills (835 against 425 us at 16 x 32K).
It reuses the generated module's helpers (_unpack_k, _unpack_v, _mma, _to_bf16, partitions) and
computes the cache addresses from the module's HEAD_DIM and BS with the layout of operators.md §2.

Run from the project root:
  python benchmarks/tq_decode_chunked.py --variant d128_qg8_bs16 --configs 16x32768,1x1024   (CUDA)
  TRITON_INTERPRET=1 python benchmarks/tq_decode_chunked.py --check                           (CPU)
--check compares out_parts, exp_sums and max_logits with the generated kernel's on ragged
sequence lengths (0, 1, 17, 40, 300) at one and two partitions.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tq_decode import HK, load  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

# Filled from the generated module before the first compile (Triton resolves them then).
_unpack_k = _unpack_v = _codebook_entry = _mma = _to_bf16 = None


def _k_pair_ptx(src: str, out_low: str, out_high: str, planes: list[str]) -> str:
    """The generated _unpack_k's byte-permute lookup, for the 2 packed bytes in the low half of `src`."""
    return f"""
            and.b32 sel, {src}, 0x7777;
            shl.b32 sign, {src}, 4;
            prmt.b32 upper, sign, {src}, 0xD9C8;
            prmt.b32 a, {planes[0]}, {planes[1]}, sel;
            prmt.b32 b, {planes[2]}, {planes[3]}, sel;
            lop3.b32 low, a, b, upper, 0xD8;
            prmt.b32 a, {planes[4]}, {planes[5]}, sel;
            prmt.b32 b, {planes[6]}, {planes[7]}, sel;
            lop3.b32 high, a, b, upper, 0xD8;
            prmt.b32 {out_low}, low, high, 0x6240;
            prmt.b32 {out_high}, low, high, 0x7351;"""


# pack=4: outputs $0 $1 (low nibbles of bytes 0-1, 2-3), $2 $3 (high nibbles), input word $4, then
# each of the 8 table words passed 4 times ($5, $9, ... are used).
_PLANES4 = [f"${5 + 4 * i}" for i in range(8)]
K4_PTX = tl.constexpr(
    "{\n            .reg .b32 sel, sign, upper, a, b, low, high, x;"
    + _k_pair_ptx("$4", "$0", "$2", _PLANES4)
    + "\n            shr.b32 x, $4, 16;"
    + _k_pair_ptx("x", "$1", "$3", _PLANES4)
    + "\n            }"
)


@triton.jit
def _unpack_k4(k_packed, codebook_ptr, planes, N_CENTROIDS: tl.constexpr, NIBBLE_BITS: tl.constexpr,
               NIBBLE_MASK: tl.constexpr, PTX_UNPACK: tl.constexpr):
    if PTX_UNPACK:
        return tl.inline_asm_elementwise(
            asm=K4_PTX, constraints="=r,=r,=r,=r,r" + ",r" * 32,
            args=[k_packed, planes[0], planes[1], planes[2], planes[3], planes[4], planes[5], planes[6], planes[7]],
            dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        return _unpack_k(k_packed, codebook_ptr, planes, N_CENTROIDS, NIBBLE_BITS, NIBBLE_MASK, PTX_UNPACK)


@triton.jit
def _unpack_v4(v_packed, NIBBLE_BITS: tl.constexpr, NIBBLE_MASK: tl.constexpr, FP16_1024_BITS: tl.constexpr,
               V_LEVEL_OFFSET: tl.constexpr, PTX_UNPACK: tl.constexpr, V_PTX: tl.constexpr):
    if PTX_UNPACK:
        return tl.inline_asm_elementwise(asm=V_PTX, constraints="=r,=r,=r,=r,r", args=[v_packed],
                                         dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    else:
        return _unpack_v(v_packed, NIBBLE_BITS, NIBBLE_MASK, FP16_1024_BITS, V_LEVEL_OFFSET, PTX_UNPACK)


def v4_ptx(dec) -> str:
    """The generated _unpack_v's arithmetic, for 4 packed bytes (its constants read from the module source)."""
    import inspect, re
    src = inspect.getsource(dec._unpack_v.fn)
    const = dict(re.findall(r"mov\.b32 (\w+), (0x[0-9A-Fa-f]+);", src))
    mask = re.search(r"and\.b32 high, whole, (0x[0-9A-Fa-f]+);", src).group(1)
    exps = re.findall(r"mov\.b32 k, (0x[0-9A-Fa-f]+);", src)  # high scale, low offset, low-high weight
    half = """
            prmt.b32 whole, $4, exponent, {sel};
            and.b32 high, whole, {mask};
            fma.rn.f16x2 {hi}, high, kh, th;
            sub.f16x2 t, whole, kl;
            fma.rn.f16x2 {lo}, {hi}, kw, t;"""
    return ("{\n            .reg .b32 exponent, whole, high, t, kh, th, kl, kw;"
            f"\n            mov.b32 exponent, {const['exponent']};"
            f"\n            mov.b32 kh, {exps[0]};\n            mov.b32 th, {const['t']};"
            f"\n            mov.b32 kl, {exps[1]};\n            mov.b32 kw, {exps[2]};"
            + half.format(sel="0x4140", mask=mask, hi="$2", lo="$0")
            + half.format(sel="0x4342", mask=mask, hi="$3", lo="$1")
            + "\n            }")


@triton.jit(do_not_specialize=["max_blocks", "tile_groups"])
def chunked_decode_kernel(
    q_rot_ptr, kv_cache_ptr, codebook_ptr, block_table_ptr, seq_lens_ptr, out_parts_ptr, exp_sums_ptr, max_logits_ptr,
    max_blocks, tile_groups, qk_scale_log2,
    NUM_KV_HEADS: tl.constexpr, NUM_PARTITIONS: tl.constexpr, QG: tl.constexpr, BS: tl.constexpr, HEAD_DIM: tl.constexpr,
    N_CENTROIDS: tl.constexpr, Q_COLS: tl.constexpr, PAIRS: tl.constexpr, NIBBLE_BITS: tl.constexpr,
    NIBBLE_MASK: tl.constexpr, GROUP: tl.constexpr, TILE_TOKENS: tl.constexpr, CHUNKS: tl.constexpr,
    LN2: tl.constexpr, FP16_1024_BITS: tl.constexpr, V_LEVEL_MID: tl.constexpr, V_LEVEL_OFFSET: tl.constexpr,
    PTX_UNPACK: tl.constexpr, INTERPRETER_FIXUPS: tl.constexpr, V_PTX: tl.constexpr,
):
    CHUNK: tl.constexpr = TILE_TOKENS // CHUNKS
    META: tl.constexpr = 2 * BS  # bytes of one fp16 metadata field of one kv head in a block
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    col = tl.arange(0, Q_COLS)  # query heads of the kv head, padded: cols >= QG computed, never stored
    pair = tl.arange(0, PAIRS)
    chunk = tl.arange(0, CHUNKS)[:, None]
    within = tl.arange(0, CHUNK)[None, :]
    seq_len = tl.load(seq_lens_ptr + seq)
    start = part * tile_groups * GROUP
    end = tl.minimum(tl.minimum(seq_len, max_blocks * BS), start + tile_groups * GROUP)
    num_tiles = tl.cdiv(tl.maximum(end - start, 0), TILE_TOKENS)

    # q^T, even and odd elements apart, the same for every chunk (the batched MMA's B operand).
    q_base = q_rot_ptr + (seq * NUM_KV_HEADS + kv_head) * QG * HEAD_DIM
    q_cols = (col < QG)[None, None, :]
    q_offsets = pair[None, :, None] * 2 + col[None, None, :] * HEAD_DIM
    qT_even = tl.broadcast_to(tl.load(q_base + q_offsets, mask=q_cols, other=0.0), (CHUNKS, PAIRS, Q_COLS))
    qT_odd = tl.broadcast_to(tl.load(q_base + q_offsets + 1, mask=q_cols, other=0.0), (CHUNKS, PAIRS, Q_COLS))
    block_table_row = block_table_ptr + max_blocks * seq
    words = codebook_ptr.to(tl.pointer_type(tl.int32))
    planes = (tl.load(words + 0), tl.load(words + 1), tl.load(words + 2), tl.load(words + 3),
              tl.load(words + 4), tl.load(words + 5), tl.load(words + 6), tl.load(words + 7))

    # Softmax state per (chunk, query head).
    m_i = tl.full((CHUNKS, Q_COLS), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((CHUNKS, Q_COLS), dtype=tl.float32)
    z_i = tl.zeros((CHUNKS, Q_COLS), dtype=tl.float32)
    accT_even = tl.zeros((CHUNKS, PAIRS, Q_COLS), dtype=tl.float32)
    accT_odd = tl.zeros((CHUNKS, PAIRS, Q_COLS), dtype=tl.float32)
    for tile in range(0, num_tiles):
        token = start + tile * TILE_TOKENS + chunk * CHUNK + within  # [CHUNKS, CHUNK]
        live = token < end
        block = tl.load(block_table_row + token // BS, mask=live, other=0)
        slot = token % BS
        token_base = kv_cache_ptr + block.to(tl.int64) * NUM_KV_HEADS * (BS * HEAD_DIM + 3 * META)
        record = token_base + (NUM_KV_HEADS * slot + kv_head) * HEAD_DIM  # K bytes, then V bytes
        k_packed = tl.load(record[:, :, None] + pair[None, None, :], mask=live[:, :, None], other=0)
        k_low, k_high = _unpack_k4(k_packed, codebook_ptr, planes, N_CENTROIDS, NIBBLE_BITS, NIBBLE_MASK, PTX_UNPACK)
        meta = token_base + NUM_KV_HEADS * BS * HEAD_DIM + kv_head * 3 * META + slot * 2
        k_norm = tl.load(meta.to(tl.pointer_type(tl.float16)), mask=live, other=0.0)
        v_scale = tl.load((meta + META).to(tl.pointer_type(tl.float16)), mask=live, other=0.0)
        v_zero = tl.load((meta + 2 * META).to(tl.pointer_type(tl.float16)), mask=live, other=0.0)

        scores = _mma(k_low, qT_even, tl.zeros((CHUNKS, CHUNK, Q_COLS), dtype=tl.float32), INTERPRETER_FIXUPS)
        scores = _mma(k_high, qT_odd, scores, INTERPRETER_FIXUPS)
        scores = scores * (k_norm.to(tl.float32) * qk_scale_log2)[:, :, None]
        scores = tl.where(live[:, :, None], scores, float("-inf"))
        # A chunk can be past the end of the sequence (max -inf): it takes 0 as its max.
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        probs = tl.exp2(scores - m_use[:, None, :])
        l_i = l_i * alpha + tl.sum(probs, axis=1)

        v_packed = tl.load(record[:, :, None] + PAIRS + pair[None, None, :], mask=live[:, :, None], other=0)
        v_low, v_high = _unpack_v4(v_packed, NIBBLE_BITS, NIBBLE_MASK, FP16_1024_BITS, V_LEVEL_OFFSET, PTX_UNPACK, V_PTX)
        probs_scaled = (probs * v_scale.to(tl.float32)[:, :, None]).to(tl.float16)
        zero_terms = probs * v_zero.to(tl.float32)[:, :, None] + V_LEVEL_MID * probs_scaled.to(tl.float32)
        z_i = z_i * alpha + tl.sum(zero_terms, axis=1)
        accT_even = _mma(tl.trans(v_low, (0, 2, 1)), probs_scaled, accT_even * alpha[:, None, :], INTERPRETER_FIXUPS)
        accT_odd = _mma(tl.trans(v_high, (0, 2, 1)), probs_scaled, accT_odd * alpha[:, None, :], INTERPRETER_FIXUPS)
        m_i = m_new

    # The chunks merge once; an empty partition writes (0, 0, -inf) as the generated kernel does.
    m = tl.max(m_i, axis=0)
    weight = tl.exp2(m_i - tl.where(m == float("-inf"), 0.0, m)[None, :])
    l = tl.sum(l_i * weight, axis=0)
    z = tl.sum(z_i * weight, axis=0)
    acc_even = tl.sum(accT_even * weight[:, None, :], axis=0)
    acc_odd = tl.sum(accT_odd * weight[:, None, :], axis=0)
    inv_l = tl.where(l > 0.0, 1.0 / tl.where(l > 0.0, l, 1.0), 0.0)
    stats = ((seq.to(tl.int64) * NUM_KV_HEADS + kv_head) * NUM_PARTITIONS + part) * QG
    out_base = out_parts_ptr + stats * HEAD_DIM
    out_offsets = pair[:, None] * 2 + col[None, :] * HEAD_DIM
    out_mask = (col < QG)[None, :]
    tl.store(out_base + out_offsets, _to_bf16((acc_even + z[None, :]) * inv_l[None, :], INTERPRETER_FIXUPS), mask=out_mask)
    tl.store(out_base + out_offsets + 1, _to_bf16((acc_odd + z[None, :]) * inv_l[None, :], INTERPRETER_FIXUPS), mask=out_mask)
    tl.store(exp_sums_ptr + stats + col, l, mask=col < QG)
    tl.store(max_logits_ptr + stats + col, m * LN2, mask=col < QG)


def bind(dec) -> str:
    """Point the kernel's helpers at the generated module's; returns the 4-byte V unpack PTX."""
    g = globals()
    for name in ("_unpack_k", "_unpack_v", "_codebook_entry", "_mma", "_to_bf16"):
        g[name] = getattr(dec, name)
    return v4_ptx(dec)


def launch_chunked(dec, v_ptx, q_rot, kv_cache, codebook, block_table, seq_lens, out_parts, exp_sums, max_logits,
                   tile_groups, softmax_scale, num_warps=4, num_stages=1, maxnreg=128):
    num_seqs, num_kv_heads, num_partitions = out_parts.shape[:3]
    options = dict(num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    chunked_decode_kernel[(num_seqs, num_kv_heads, num_partitions)](
        q_rot, kv_cache, codebook, block_table, seq_lens, out_parts, exp_sums, max_logits,
        block_table.shape[1], tile_groups, softmax_scale * dec.LOG2E,
        NUM_KV_HEADS=num_kv_heads, NUM_PARTITIONS=num_partitions, QG=dec.QG, BS=dec.BS, HEAD_DIM=dec.HEAD_DIM,
        N_CENTROIDS=dec.N_CENTROIDS, Q_COLS=max(8, triton.next_power_of_2(dec.QG)), PAIRS=dec.PAIRS,
        NIBBLE_BITS=dec.NIBBLE_BITS, NIBBLE_MASK=dec.NIBBLE_MASK, GROUP=dec.GROUP, TILE_TOKENS=dec.TILE_TOKENS,
        CHUNKS=num_warps, LN2=dec.LN2, FP16_1024_BITS=dec.FP16_1024_BITS, V_LEVEL_MID=dec.V_LEVEL_MID,
        V_LEVEL_OFFSET=dec.V_LEVEL_OFFSET, PTX_UNPACK=dec.PTX_UNPACK, INTERPRETER_FIXUPS=dec.INTERPRETER_FIXUPS,
        V_PTX=v_ptx, **options)


def partials(dec, num_seqs, partitions, device):
    d, qg = dec.HEAD_DIM, dec.QG
    out_parts = torch.full((num_seqs, HK, partitions, qg, d), 7.0, dtype=torch.bfloat16, device=device)
    exp_sums = torch.full((num_seqs, HK, partitions, qg), 7.0, dtype=torch.float32, device=device)
    return out_parts, exp_sums, torch.full_like(exp_sums, 7.0)


def compare(a, b) -> str:
    """Max relative difference per tensor (inf patterns must agree)."""
    text = []
    for name, x, y in zip(("out", "exp_sums", "max_logits"), a, b):
        x, y = x.float(), y.float()
        if not torch.equal(torch.isinf(x), torch.isinf(y)) or torch.isnan(y).any():
            raise AssertionError(f"{name}: inf/nan pattern differs from the generated kernel's")
        x, y = torch.nan_to_num(x, neginf=0.0), torch.nan_to_num(y, neginf=0.0)
        text.append(f"{name} {((x - y).abs().max() / x.abs().max().clamp_min(1e-30)).item():.1e}")
    return ", ".join(text)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="d128_qg8_bs16")
    parser.add_argument("--configs", default="16x32768,1x32768,16x8192,1x1024")
    parser.add_argument("--schedules", default="1:128", help="STAGES:MAXNREG,... for the chunked kernel (MAXNREG 0: no cap)")
    parser.add_argument("--check", action="store_true", help="compare with the generated kernel on ragged lengths")
    args = parser.parse_args()
    dec = load(f"tq_decode_triton_{args.variant}")
    store = load(f"tq_store_d{dec.HEAD_DIM}_bs{dec.BS}")
    v_ptx = bind(dec)
    dev = "cpu" if dec.INTERPRETER_FIXUPS else "cuda"
    d, bs = dec.HEAD_DIM, dec.BS
    g = torch.Generator(device=dev).manual_seed(0)
    centroids, rotation = lloyd_max_centroids(d).to(dev), hadamard_rotation(d).to(dev)
    scale = 1 / math.sqrt(d)
    if args.check:
        lengths = [0, 1, 17, 40, 300]
        nb = -(-max(lengths) // bs) + 1
        cache = torch.zeros(len(lengths) * nb, dec.cache_block_bytes(HK), dtype=torch.uint8, device=dev)
        table = torch.randperm(len(lengths) * nb, device=dev, generator=g).view(len(lengths), nb).int()
        k = torch.randn(len(lengths) * nb * bs, HK, d, generator=g, device=dev).bfloat16()
        v = torch.randn(len(lengths) * nb * bs, HK, d, generator=g, device=dev).bfloat16()
        store.tq_store(cache, k, v, (table.long()[:, :, None] * bs + torch.arange(bs, device=dev)).reshape(-1), centroids, rotation)
        q = torch.randn(len(lengths), HK * dec.QG, d, generator=g, device=dev).bfloat16()
        seq_lens = torch.tensor(lengths, dtype=torch.int32, device=dev)
        q_rot, codebook = dec.rotate_query(q, rotation, centroids)
        for parts in (1, 2):
            groups = -(-nb * bs // dec.GROUP)
            tile_groups = -(-groups // parts)
            ours, theirs = partials(dec, len(lengths), parts, dev), partials(dec, len(lengths), parts, dev)
            dec.launch_decode_kernel(q_rot, cache, codebook, table, seq_lens, *theirs, tile_groups, scale)
            launch_chunked(dec, v_ptx, q_rot, cache, codebook, table, seq_lens, *ours, tile_groups, scale)
            print(f"{args.variant}, {parts} partition(s), lengths {lengths}: max relative difference {compare(theirs, ours)}")
        return
    from timing import cold_l2_us
    from tq_decode import random_decode_inputs
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; variant {args.variant}, Hk = {HK}; "
          "decode kernel alone, cold L2; ratio = generated / chunked")
    for num_seqs, ctx in (tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")):
        q, cache, table, seq_lens = random_decode_inputs(dec, store, num_seqs, ctx, g, centroids, rotation)
        parts, tile_groups = dec.decode_partitions(table.shape[1], num_seqs, HK, q.device)
        q_rot, codebook = dec.rotate_query(q, rotation, centroids)
        theirs = partials(dec, num_seqs, parts, dev)
        generated = lambda: dec.launch_decode_kernel(q_rot, cache, codebook, table, seq_lens, *theirs, tile_groups, scale)
        generated()
        t_gen = cold_l2_us(generated)
        for schedule in args.schedules.split(","):
            stages, cap = (int(x) for x in schedule.split(":"))
            ours = partials(dec, num_seqs, parts, dev)
            chunked = lambda: launch_chunked(dec, v_ptx, q_rot, cache, codebook, table, seq_lens, *ours, tile_groups, scale,
                                             num_stages=stages, maxnreg=cap)
            chunked(); torch.cuda.synchronize()
            diff = compare(theirs, ours)
            t_chunked = cold_l2_us(chunked)
            kernel = list(chunked_decode_kernel.device_caches[q.device.index][0].values())[-1]
            print(f"{num_seqs:3d} x {ctx:6d} (P {parts:2d}): generated {t_gen:8.1f} us, chunked ({stages} stage(s), cap {cap or 'none'}) "
                  f"{t_chunked:8.1f} us, ratio {t_gen / t_chunked:5.2f}x; {kernel.n_regs} registers, {kernel.n_spills} spills; "
                  f"max relative difference {diff}", flush=True)
        del cache


if __name__ == "__main__":
    main()
