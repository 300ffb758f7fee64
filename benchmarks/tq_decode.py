"""TQ decode on the GPU: kgen's generated Triton kernel against bf16 SDPA and dequantize+SDPA.

Run from the project root on a CUDA machine: `python benchmarks/tq_decode.py [--quick]
[--variant d64_qg4_bs16] [--configs 16x8192,...]` (default variant: d128_qg8_bs16, Hk = 8).
Each result is checked (cosine similarity with exact bf16 attention on the unquantized K/V, and
max abs and relative rms error against fp32 attention on the dequantized cache) before it is timed.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import platform
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import bandwidth_fraction, cold_l2_median_us, do_bench_us  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

HK = 8
D = QG = BS = OURS_BYTES_PER_TOKEN = BF16_BYTES_PER_TOKEN = 0  # set by use_variant()


def use_variant(name: str) -> None:
    """Head dim, GQA factor and block size of the variant d{D}_qg{QG}_bs{BS} to benchmark."""
    global D, QG, BS, OURS_BYTES_PER_TOKEN, BF16_BYTES_PER_TOKEN
    D, QG, BS = (int(part[2:] if part[:2] in ("qg", "bs") else part[1:]) for part in name.split("_"))
    OURS_BYTES_PER_TOKEN = D + 6  # per kv head: D/2 B of K nibbles, D/2 B of V nibbles, 3 fp16 metadata
    BF16_BYTES_PER_TOKEN = 2 * D * 2  # per kv head: K and V in bf16


def load(name: str, source: str | None = None, tag: str = "derived"):
    """The generated module `name`, or a module derived from its text (`source`, written to a
    temporary file as NAME_TAG.py: the labs that edit a copy of a generated module)."""
    path = ROOT / "generated" / "tq_decode" / f"{name}.py"
    if source is not None:
        path = Path(tempfile.mkdtemp(prefix=f"tq_{tag}_")) / f"{name}_{tag}.py"
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_decode_inputs(decode, store, num_seqs, ctx, generator, centroids, rotation):
    """(query, kv cache, block table, seq_lens) of num_seqs sequences of ctx random tokens each,
    stored by the store kernel into randomly permuted blocks, for timing the decode alone."""
    dev, d, qg, bs = centroids.device, decode.HEAD_DIM, decode.QG, decode.BS
    nb = ctx // bs
    k = torch.randn(num_seqs * ctx, HK, d, device=dev, generator=generator, dtype=torch.bfloat16)
    v = torch.randn(num_seqs * ctx, HK, d, device=dev, generator=generator, dtype=torch.bfloat16)
    query = torch.randn(num_seqs, HK * qg, d, device=dev, generator=generator, dtype=torch.bfloat16)
    cache = torch.zeros(num_seqs * nb, decode.cache_block_bytes(HK), dtype=torch.uint8, device=dev)
    table = torch.randperm(num_seqs * nb, device=dev, generator=generator).view(num_seqs, nb).int()
    slots = (table.long()[:, :, None] * bs + torch.arange(bs, device=dev)).reshape(-1)
    store.tq_store(cache, k, v, slots, centroids, rotation)
    return query, cache, table, torch.full((num_seqs,), ctx, dtype=torch.int32, device=dev)


def dequantize(cache, block_table, seq_len, centroids):
    """PyTorch dequantization of every sequence's cache (the dequantize-then-SDPA peer).
    Returns K (rotated space) and V as [num_seqs, Hk, seq_len, D] bf16."""
    num_seqs, nb = block_table.shape[0], seq_len // BS
    blocks = block_table[:, :nb].reshape(-1).long()
    data = cache[blocks, : BS * HK * D].view(num_seqs, nb, BS, HK, D)
    meta = cache[blocks, BS * HK * D :].view(torch.float16).view(num_seqs, nb, HK, 3, BS).float()
    meta = meta.permute(0, 1, 4, 2, 3)  # [num_seqs, nb, BS, HK, field]

    def unpack(packed):  # byte j -> elements 2j (low nibble), 2j+1 (high nibble)
        return torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2).long()

    k = centroids[unpack(data[..., : D // 2])] * meta[..., 0:1]
    v = unpack(data[..., D // 2 :]).float() * meta[..., 1:2] + meta[..., 2:3]
    shape = (num_seqs, seq_len, HK, D)
    return k.reshape(shape).transpose(1, 2).bfloat16(), v.reshape(shape).transpose(1, 2).bfloat16()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--configs", help="comma-separated SEQSxCONTEXT list, e.g. 1x1024,16x32768 (default: the full grid)")
    parser.add_argument("--variant", default="d128_qg8_bs16", help="d{head_dim}_qg{GQA factor}_bs{block size}")
    args = parser.parse_args()
    use_variant(args.variant)
    decode = load(f"tq_decode_triton_d{D}_qg{QG}_bs{BS}")
    store = load(f"tq_store_d{D}_bs{BS}")
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    centroids = lloyd_max_centroids(D).to(dev)
    rotation = hadamard_rotation(D).to(dev)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, python {platform.python_version()}")
    print(f"variant d{D}_qg{QG}_bs{BS}, Hk = {HK}")
    print("us: device time with a cold L2 (median of 3 readings); ratio = peer / ours; BW: bytes that must move / time, and its fraction of 4.29 TB/s")
    print(f"{'seqs':>4s} {'ctx':>6s} {'ours us':>8s} {'ours db':>8s} {'sdpa us':>8s} {'deq+sdpa':>9s} {'vs sdpa':>8s} {'vs deq':>7s} {'ours BW':>8s} {'of copy':>8s} {'sdpa BW%':>8s} {'cos':>7s} {'maxerr':>8s} {'relrms':>8s}")
    seqs_list = [1, 16] if args.quick else [1, 16, 64]
    ctx_list = [1024, 8192] if args.quick else [1024, 8192, 32768]
    grid = [(n, c) for n in seqs_list for c in ctx_list]
    if args.configs:
        grid = [tuple(int(x) for x in item.split("x")) for item in args.configs.split(",")]
    for num_seqs, ctx in grid:
        blocks_per_seq = ctx // BS
        num_blocks = num_seqs * blocks_per_seq
        k = torch.randn(num_seqs, ctx, HK, D, device=dev, generator=g, dtype=torch.bfloat16)
        v = torch.randn(num_seqs, ctx, HK, D, device=dev, generator=g, dtype=torch.bfloat16)
        q = torch.randn(num_seqs, HK * QG, D, device=dev, generator=g, dtype=torch.bfloat16)
        cache = torch.zeros(num_blocks, decode.cache_block_bytes(HK), dtype=torch.uint8, device=dev)
        block_table = torch.randperm(num_blocks, device=dev, generator=g).view(num_seqs, blocks_per_seq).int()
        slots = (block_table.long()[:, :, None] * BS + torch.arange(BS, device=dev)).reshape(num_seqs, ctx)
        store.tq_store(cache, k.reshape(-1, HK, D), v.reshape(-1, HK, D), slots.reshape(-1), centroids, rotation)
        seq_lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=dev)

        out = decode.tq_decode(q, cache, block_table, seq_lens, centroids, rotation)
        scale = 1 / math.sqrt(D)
        kh, vh = k.transpose(1, 2), v.transpose(1, 2)  # [num_seqs, Hk, ctx, D], contiguous copies below
        kh, vh = kh.contiguous(), vh.contiguous()
        exact = F.scaled_dot_product_attention(q[:, :, None], kh, vh, scale=scale, enable_gqa=True)[:, :, 0]
        cos = F.cosine_similarity(out.float(), exact.float(), dim=-1).mean().item()
        q_rot = (q.float() @ rotation).bfloat16()
        err, sq_err, sq_ref = 0.0, 0.0, 0.0
        chunk = max(1, (1 << 18) // ctx)  # fp32 reference a few sequences at a time (64 x 32K needs >64 GB at once)
        for s0 in range(0, num_seqs, chunk):
            kd, vd = dequantize(cache, block_table[s0 : s0 + chunk], ctx, centroids)
            deq = F.scaled_dot_product_attention(q_rot[s0 : s0 + chunk, :, None].float(), kd.float(), vd.float(),
                                                 scale=scale, enable_gqa=True)[:, :, 0]
            diff = out[s0 : s0 + chunk].float() - deq
            err = max(err, diff.abs().max().item())
            sq_err, sq_ref = sq_err + diff.pow(2).sum().item(), sq_ref + deq.pow(2).sum().item()
        rel_rms = math.sqrt(sq_err / sq_ref)  # the kernel's own error, relative to the output's size

        ours = cold_l2_median_us(lambda: decode.tq_decode(q, cache, block_table, seq_lens, centroids, rotation))
        ours_db = do_bench_us(lambda: decode.tq_decode(q, cache, block_table, seq_lens, centroids, rotation))
        sdpa = cold_l2_median_us(lambda: F.scaled_dot_product_attention(q[:, :, None], kh, vh, scale=scale, enable_gqa=True))
        deq_sdpa = do_bench_us(lambda: F.scaled_dot_product_attention(
            q_rot[:, :, None], *dequantize(cache, block_table, ctx, centroids), scale=scale, enable_gqa=True))
        ours_bytes = num_seqs * ctx * HK * OURS_BYTES_PER_TOKEN
        bf16_bytes = num_seqs * ctx * HK * BF16_BYTES_PER_TOKEN
        print(
            f"{num_seqs:4d} {ctx:6d} {ours:8.1f} {ours_db:8.1f} {sdpa:8.1f} {deq_sdpa:9.1f} {sdpa / ours:7.2f}x {deq_sdpa / ours_db:6.1f}x "
            f"{ours_bytes / ours / 1e6:7.2f}T {bandwidth_fraction(ours_bytes, ours):7.1%} {bandwidth_fraction(bf16_bytes, sdpa):7.1%} {cos:7.4f} {err:8.1e} {rel_rms:8.1e}",
            flush=True,
        )
        del cache, k, v, kh, vh, kd, vd

    # Store kernel: per-token cost and bandwidth (reads bf16 k and v, writes the packed cache), for
    # one decode step of 64 sequences and for a 64K-token prefill.
    for tokens in (64, 65536):
        k = torch.randn(tokens, HK, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(tokens, HK, D, device=dev, dtype=torch.bfloat16)
        cache = torch.zeros(max(tokens // BS, 1024), decode.cache_block_bytes(HK), dtype=torch.uint8, device=dev)
        slots = torch.randperm(cache.shape[0] * BS, device=dev)[:tokens]
        us = cold_l2_median_us(lambda: store.tq_store(cache, k, v, slots, centroids, rotation))
        moved = tokens * HK * (2 * D * 2 + OURS_BYTES_PER_TOKEN) + tokens * 8
        print(f"store: {tokens} tokens x {HK} kv heads in {us:.1f} us = {us * 1e3 / tokens:.2f} ns/token, "
              f"{moved / us / 1e6:.2f} TB/s ({bandwidth_fraction(moved, us):.1%} of copy)")


if __name__ == "__main__":
    main()
