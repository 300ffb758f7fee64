"""How fast the TQ decode's own access pattern streams the cache, with no work done on the bytes
(issue 4's gap: is it the access pattern or the loop's work?).

Run from the project root on a CUDA machine:
  python benchmarks/tq_decode_floor.py [--variant d128_qg8_bs16] [--configs 16x32768,...]
      [--forms plain,ahead1,ahead1_kv,staged] [--warps 2,4] [--rounds 3]
Offline, without a GPU (sm_90 registers and global-load SASS counts per floor form):
  python benchmarks/tq_decode_floor.py --sass [--variant ...]

The shipped decode reaches 41-52% of the 4.29 TB/s copy ceiling on the compressed bytes at 16 and
64 sequences of 8K and 32K tokens, and 59% with its nibble unpacking cut out
(benchmarks/tq_decode_ablate.py); the targets ask 75%. What is left in the loop is the paged
access pattern (a block-table entry per 16 tokens, each token's 134 bytes in four places of its
cache block: a 128-byte K+V record and three fp16 fields), the grid and its split-K partitions,
and the bytes each program keeps in flight. The floor kernels here keep exactly that and drop the
rest. They run the decode's grid (a program per sequence, kv head and partition, partitions as
`decode_partitions` picks them for this batch on this GPU), walk each partition in the decode's
tiles (TILE_TOKENS tokens, a 32-token chunk per warp of the decode), and load, for every token
before min(seq_len, the table's tokens), exactly what the decode loads for its kv head: they call
the decode module's own load helpers (`_load_k_tile`, `_load_v_tile`, passed to the floor kernel
as compile-time functions), so the index arithmetic, masks and per-lane widths are the decode's
by construction:

- the block-table entries, as often as the decode loads them (per token for the metadata, per
  16-token run for K and for V: repeats hit L1);
- the K record, D/2 bytes, as 4 lanes of K_VEC contiguous bytes (16-byte vector loads at d128);
- the V record, D/2 bytes, as 8 lanes of V_WORDS separate 4-byte loads;
- the K norm, V scale and V zero, one fp16 each (their bits added as int16).

That is 134 bytes a token and kv head at d128 (D + 6), the bytes issue 4 counts. Tokens past
seq_len, and table entries past the sequence, are never read. Each loaded 32-bit register (and
each sign-extended 16-bit one) is added into an int32 accumulator of the load's shape, and each
program stores the wrapping int32 sum of its accumulators: one integer add per register loaded,
and a result that depends on every byte, so no load can be dropped. Before it is timed, every
floor's per-program checksums are compared with torch's sum of the same bytes (token_sums,
program_checksums), and a mismatch stops the run. Forms (a constexpr):

  plain      a tile's loads, then its adds, then the next tile (no prefetch);
  ahead1     the decode's schedule: K and metadata one tile ahead in registers, V loaded at the
             top of its own tile (V_t, then K_t+1, then the adds of tile t);
  ahead1_kv  K, metadata and V all one tile ahead;
  staged     no prefetch in the source, the loop software-pipelined by Triton
             (`tl.range(num_stages=--stages)`; compiled offline for sm_90 by Triton 3.9, the 4-
             and 16-byte loads become cp.async, the 2-byte metadata loads stay plain loads).

Each runs at 2 and 4 warps (--warps). The decode's bulk configs run 2 warps, a 32-token chunk each;
at 4 warps the floor keeps that 64-token tile over twice the threads (--tile 128 gives the tile
of the decode's own 4-warp launches, which it makes for single-group partitions). Beside them:

  contiguous  the same bytes (the whole cache, every block full here) read front to back as int32,
              16-byte loads, best of a few schedules: what a copy-like read gets on this GPU;
  pipeline    tq_decode as users call it (rotation, decode, merge where there is more than one
              partition), timed as benchmarks/tq_decode.py and tq_decode_ablate.py time it;
  decode      the decode kernel alone (launch_decode_kernel on a precomputed rotated query; its
              partial results are checked to merge into the pipeline's output bitwise).

All times are device times with a cold L2 (benchmarks/timing.py), the items interleaved over
--rounds rounds, median. "of copy" is the compressed bytes over the time, over the H200's 4.29
TB/s copy ceiling (the targets' yardstick; an H100 copies less), "of contig" the contiguous
read's time over the item's (the same bytes streamed on this GPU, in this run).

How to read it: if a floor form at the decode's schedule (ahead1, 2 warps) sits near the decode's
59% with the unpacking free, the access pattern bounds the loop; if it sits near the contiguous
read, the loop's work does. What the floors leave out, and what tilts them in their favour: they
read no rotated query (QG x D bf16, 2 KB a program at d128 qg8) or codebook and write 4 bytes a
program instead of the decode's partial outputs and softmax statistics (about 2 KB); they launch
one kernel, not three; and they need far fewer registers than the decode (200, which holds it to
5 programs an SM), so more of their programs are resident and more bytes are in flight (the regs
column gives each kernel's registers a thread on the GPU). The d128 and d64 variants whose decode
loads K and V in the MMA register layout (K_VEC) are supported; the others (d256, qg16) run
differently shaped kernels.
"""

from __future__ import annotations

import argparse
import functools
import platform
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tq_decode import HK, load, random_decode_inputs  # noqa: E402
from timing import COPY_CEILING_TBPS, bandwidth_fraction, cold_l2_us  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

FORMS = {"plain": 0, "ahead1": 1, "ahead1_kv": 2, "staged": 3}
CONFIGS = "1x32768,16x8192,16x32768,64x8192,64x32768"
CHUNK = 32  # tokens of a tile per decode warp (the decode's K and V load shapes cover 32 tokens)
RUN = 16  # tokens per block-table lookup of the K and V loads (the decode needs BS % 16 == 0)
META_BYTES = 6  # fp16 K norm, V scale and V zero per token and kv head
# Contiguous reference: (int32 words per iteration, iterations per program, warps).
CONTIGUOUS_SCHEDULES = ((1024, 8, 4), (2048, 4, 8), (4096, 4, 8))


@dataclass(frozen=True)
class Geometry:
    """What the floor kernels need of a decode variant: its cache layout and load shapes."""

    head_dim: int
    block_size: int
    group: int  # tokens per tile group (partitions are whole groups)
    tile: int  # tokens per inner-loop tile of the floor
    k_vec: int  # contiguous bytes of a K record per lane
    k_words: int  # ... as int32 words
    v_words: int  # int32 words of a V record per lane (8 lanes a token)
    load_k: object  # the decode's _load_k_tile (a Triton JIT function)
    load_v: object  # the decode's _load_v_tile

    @property
    def token_bytes(self) -> int:
        """Bytes of one token of one kv head: K and V nibbles, then the fp16 metadata."""
        return self.head_dim + META_BYTES

    @property
    def chunks(self) -> int:
        return self.tile // CHUNK


def geometry(decode, tile: int | None = None) -> Geometry:
    """The decode module's geometry; tile defaults to the decode's own (TILE_TOKENS)."""
    name = decode.__name__
    if not hasattr(decode, "K_VEC"):
        raise ValueError(
            f"{name}: this decode does not load K and V in the MMA register layout (no K_VEC); the"
            " floor mirrors the d64 and d128 variants that do"
        )
    tile = tile or decode.TILE_TOKENS
    if tile % CHUNK or tile & (tile - 1):
        raise ValueError(f"tile: expected a power of two multiple of {CHUNK} tokens, got {tile}")
    geo = Geometry(
        decode.HEAD_DIM,
        decode.BS,
        decode.GROUP,
        tile,
        decode.K_VEC,
        decode.K_WORDS,
        decode.V_WORDS,
        decode._load_k_tile,
        decode._load_v_tile,
    )
    assert decode.cache_block_bytes(1) == geo.block_size * geo.token_bytes, name
    assert 4 * geo.k_vec == 8 * 4 * geo.v_words == geo.head_dim // 2, name
    assert geo.block_size % RUN == 0 and geo.group % geo.tile == 0, name
    return geo


@triton.jit
def _k_tile(
    LOAD_K: tl.constexpr,
    chunk_start,
    end,
    table_row,
    cache_ptr,
    kv_head,
    NUM_KV_HEADS: tl.constexpr,
    CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
    K_VEC: tl.constexpr,
    K_WORDS: tl.constexpr,
):
    """The decode's K and metadata loads (its _load_k_tile) for the tile whose chunks start at
    chunk_start [CHUNKS, 1]: K words [CHUNKS, CHUNK, 4 * K_WORDS] and the three fp16 fields
    [CHUNKS, CHUNK] as their int16 bits, widened."""
    k_words, k_norm, v_scale, v_zero = LOAD_K(
        chunk_start, end, table_row, cache_ptr, kv_head, NUM_KV_HEADS, CHUNKS, CHUNK, K_VEC, K_WORDS
    )
    meta = (
        k_norm.to(tl.int16, bitcast=True).to(tl.int32)
        + v_scale.to(tl.int16, bitcast=True).to(tl.int32)
        + v_zero.to(tl.int16, bitcast=True).to(tl.int32)
    )
    return k_words, meta


@triton.jit
def _v_tile(
    LOAD_V: tl.constexpr,
    chunk_start,
    end,
    table_row,
    cache_ptr,
    kv_head,
    NUM_KV_HEADS: tl.constexpr,
    V_WORDS: tl.constexpr,
):
    """The decode's V loads (its _load_v_tile) for the tile whose chunks start at chunk_start:
    its first and second words per lane [TL, JG, CHUNKS, VT, VB] (zeros for the second where
    V_WORDS is 1, where the decode's helper returns one tensor)."""
    if V_WORDS == 2:
        v_words0, v_words1 = LOAD_V(chunk_start, end, table_row, cache_ptr, kv_head, NUM_KV_HEADS, V_WORDS)
    else:
        v_words0 = LOAD_V(chunk_start, end, table_row, cache_ptr, kv_head, NUM_KV_HEADS, V_WORDS)
        v_words1 = tl.zeros_like(v_words0)
    return v_words0, v_words1


@triton.jit(do_not_specialize=["max_blocks", "tile_groups"])
def tq_stream_floor_kernel(
    cache_ptr,
    table_ptr,
    seq_lens_ptr,
    out_ptr,
    max_blocks,
    tile_groups,
    NUM_KV_HEADS: tl.constexpr,
    BS: tl.constexpr,
    GROUP: tl.constexpr,
    CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
    K_VEC: tl.constexpr,
    K_WORDS: tl.constexpr,
    V_WORDS: tl.constexpr,
    LOAD_K: tl.constexpr,
    LOAD_V: tl.constexpr,
    FORM: tl.constexpr,
    STAGES: tl.constexpr,
):
    # The decode's program: one kv head of one sequence over one partition, tokens [start, end).
    TILE: tl.constexpr = CHUNKS * CHUNK
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    chunk = tl.arange(0, CHUNKS)[:, None]
    seq_len = tl.load(seq_lens_ptr + seq)
    start = part * tile_groups * GROUP
    end = tl.minimum(tl.minimum(seq_len, max_blocks * BS), start + tile_groups * GROUP)
    num_tiles = tl.cdiv(tl.maximum(end - start, 0), TILE)
    table_row = table_ptr + max_blocks * seq

    acc_k = tl.zeros((CHUNKS, CHUNK, 4 * K_WORDS), dtype=tl.int32)
    acc_v = tl.zeros((4, 8, CHUNKS, 4, 2), dtype=tl.int32)
    acc_m = tl.zeros((CHUNKS, CHUNK), dtype=tl.int32)
    if FORM == 0:  # plain
        for tile in range(0, num_tiles):
            chunk_start = start + tile * TILE + chunk * CHUNK
            k_words, meta = _k_tile(
                LOAD_K, chunk_start, end, table_row, cache_ptr, kv_head,
                NUM_KV_HEADS, CHUNKS, CHUNK, K_VEC, K_WORDS,
            )  # fmt: skip
            v_words0, v_words1 = _v_tile(
                LOAD_V, chunk_start, end, table_row, cache_ptr, kv_head, NUM_KV_HEADS, V_WORDS
            )
            acc_k += k_words
            acc_v += v_words0 + v_words1
            acc_m += meta
    elif FORM == 1:  # ahead1: the decode's prefetch
        next_k_words, next_meta = _k_tile(
            LOAD_K, start + chunk * CHUNK, end, table_row, cache_ptr, kv_head,
            NUM_KV_HEADS, CHUNKS, CHUNK, K_VEC, K_WORDS,
        )  # fmt: skip
        for tile in range(0, num_tiles):
            chunk_start = start + tile * TILE + chunk * CHUNK
            k_words, meta = next_k_words, next_meta
            v_words0, v_words1 = _v_tile(
                LOAD_V, chunk_start, end, table_row, cache_ptr, kv_head, NUM_KV_HEADS, V_WORDS
            )
            next_k_words, next_meta = _k_tile(
                LOAD_K, chunk_start + TILE, end, table_row, cache_ptr, kv_head,
                NUM_KV_HEADS, CHUNKS, CHUNK, K_VEC, K_WORDS,
            )  # fmt: skip
            acc_k += k_words
            acc_v += v_words0 + v_words1
            acc_m += meta
    elif FORM == 2:  # ahead1_kv: V a tile ahead too
        next_k_words, next_meta = _k_tile(
            LOAD_K, start + chunk * CHUNK, end, table_row, cache_ptr, kv_head,
            NUM_KV_HEADS, CHUNKS, CHUNK, K_VEC, K_WORDS,
        )  # fmt: skip
        next_v_words0, next_v_words1 = _v_tile(
            LOAD_V, start + chunk * CHUNK, end, table_row, cache_ptr, kv_head,
            NUM_KV_HEADS, V_WORDS,
        )  # fmt: skip
        for tile in range(0, num_tiles):
            chunk_start = start + tile * TILE + chunk * CHUNK
            k_words, meta = next_k_words, next_meta
            v_words0, v_words1 = next_v_words0, next_v_words1
            next_k_words, next_meta = _k_tile(
                LOAD_K, chunk_start + TILE, end, table_row, cache_ptr, kv_head,
                NUM_KV_HEADS, CHUNKS, CHUNK, K_VEC, K_WORDS,
            )  # fmt: skip
            next_v_words0, next_v_words1 = _v_tile(
                LOAD_V, chunk_start + TILE, end, table_row, cache_ptr, kv_head,
                NUM_KV_HEADS, V_WORDS,
            )  # fmt: skip
            acc_k += k_words
            acc_v += v_words0 + v_words1
            acc_m += meta
    else:  # staged: plain's body, software-pipelined by Triton
        for tile in tl.range(0, num_tiles, num_stages=STAGES):
            chunk_start = start + tile * TILE + chunk * CHUNK
            k_words, meta = _k_tile(
                LOAD_K, chunk_start, end, table_row, cache_ptr, kv_head,
                NUM_KV_HEADS, CHUNKS, CHUNK, K_VEC, K_WORDS,
            )  # fmt: skip
            v_words0, v_words1 = _v_tile(
                LOAD_V, chunk_start, end, table_row, cache_ptr, kv_head, NUM_KV_HEADS, V_WORDS
            )
            acc_k += k_words
            acc_v += v_words0 + v_words1
            acc_m += meta
    total = tl.sum(tl.reshape(acc_k, (CHUNKS * CHUNK * 4 * K_WORDS,)), axis=0)
    total += tl.sum(tl.reshape(acc_v, (4 * 8 * CHUNKS * 8,)), axis=0)
    total += tl.sum(tl.reshape(acc_m, (CHUNKS * CHUNK,)), axis=0)
    tl.store(out_ptr + (seq * NUM_KV_HEADS + kv_head) * tl.num_programs(2) + part, total)


@triton.jit
def contiguous_floor_kernel(
    words_ptr, out_ptr, n_words, BLOCK: tl.constexpr, ITERS: tl.constexpr, EVEN: tl.constexpr
):
    # BLOCK * ITERS consecutive int32 words per program, all ITERS loads in flight at once.
    base = tl.program_id(0).to(tl.int64) * (BLOCK * ITERS)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in tl.static_range(ITERS):
        at = base + i * BLOCK + offs
        if EVEN:
            acc += tl.load(words_ptr + at)
        else:
            acc += tl.load(words_ptr + at, mask=at < n_words, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def floor_args(
    geo: Geometry, cache, table, seq_lens, out, num_kv_heads, tile_groups, form, stages=3
):
    """(grid, run-time arguments, compile-time arguments and launch options minus num_warps) of a
    floor launch writing out [num_seqs, Hk, P]."""
    num_seqs, _, num_partitions = out.shape
    options = dict(
        NUM_KV_HEADS=num_kv_heads,
        BS=geo.block_size,
        GROUP=geo.group,
        CHUNKS=geo.chunks,
        CHUNK=CHUNK,
        K_VEC=geo.k_vec,
        K_WORDS=geo.k_words,
        V_WORDS=geo.v_words,
        LOAD_K=geo.load_k,
        LOAD_V=geo.load_v,
        FORM=FORMS[form],
        STAGES=stages,
        num_stages=stages if form == "staged" else 1,  # the other forms stay as written
    )
    args = (cache, table, seq_lens, out, table.shape[1], tile_groups)
    return (num_seqs, num_kv_heads, num_partitions), args, options


def stream_floor(
    geo, cache, table, seq_lens, out, num_kv_heads, tile_groups, form, warps=2, stages=3
):
    """Run one floor form: per-program checksums into out [num_seqs, Hk, P] (int32). Returns what
    the launch returns (the compiled kernel on a GPU)."""
    grid, args, options = floor_args(
        geo, cache, table, seq_lens, out, num_kv_heads, tile_groups, form, stages
    )
    return tq_stream_floor_kernel[grid](*args, **options, num_warps=warps)


def contiguous_floor(words, out, schedule):
    block, iters, warps = schedule
    n = words.numel()
    return contiguous_floor_kernel[(out.numel(),)](
        words, out, n, BLOCK=block, ITERS=iters, EVEN=n % (block * iters) == 0, num_warps=warps
    )


def contiguous_programs(words, schedule) -> int:
    return triton.cdiv(words.numel(), schedule[0] * schedule[1])


# ----------------------------------------------------------------------------- torch's checksums


def wrap_int32(x: torch.Tensor) -> torch.Tensor:
    """int64 -> int32, modulo 2**32 (the kernels' wrapping adds)."""
    return ((x + 2**31) % 2**32 - 2**31).to(torch.int32)


def token_sums(cache, table, num_kv_heads, geo: Geometry) -> torch.Tensor:
    """int64 [num_seqs, max_blocks * BS, Hk]: the floor's fold of each token slot the table names,
    for each kv head: the sum of its K and V records as int32 words and of its three fp16
    metadata fields as int16, from the cache layout of operators.md §2 (computed for every slot;
    table entries are clamped into the cache, program_checksums masks what is not read)."""
    num_blocks, bs, hk, d = cache.shape[0], geo.block_size, num_kv_heads, geo.head_dim
    data_bytes = bs * hk * d
    data = cache[:, :data_bytes].view(torch.int32).view(num_blocks, bs, hk, d // 4)
    meta = cache[:, data_bytes:].view(torch.int16).view(num_blocks, hk, 3, bs)
    per_slot = data.sum(-1, dtype=torch.int64) + meta.sum(2, dtype=torch.int64).transpose(1, 2)
    blocks = table.long().clamp(0, num_blocks - 1)
    return per_slot[blocks].reshape(table.shape[0], table.shape[1] * bs, hk)


def live_tokens(seq_lens, num_tokens) -> torch.Tensor:
    """bool [num_seqs, num_tokens]: the tokens the decode reads (before seq_len; num_tokens is
    the table's end)."""
    return torch.arange(num_tokens, device=seq_lens.device) < seq_lens.long()[:, None]


def program_checksums(sums, live, num_partitions, span) -> torch.Tensor:
    """int32 [num_seqs, Hk, P]: per program, the wrapping sum of the live tokens of its partition
    (tokens [p * span, (p + 1) * span))."""
    num_seqs, num_tokens, hk = sums.shape
    covered = num_partitions * span
    assert covered >= num_tokens, "the partitions must cover the block table"
    values = torch.where(live[..., None], sums, 0)
    values = torch.nn.functional.pad(values, (0, 0, 0, covered - num_tokens))
    return wrap_int32(values.view(num_seqs, num_partitions, span, hk).sum(2).transpose(1, 2))


def contiguous_checksums(words, schedule) -> torch.Tensor:
    """int32 [programs]: per program of contiguous_floor, the wrapping sum of its words."""
    per = schedule[0] * schedule[1]
    full = words.numel() // per
    sums = words[: full * per].view(full, per).sum(1, dtype=torch.int64)
    if words.numel() > full * per:
        sums = torch.cat([sums, words[full * per :].sum(dtype=torch.int64).view(1)])
    return wrap_int32(sums)


def check(got, want, what):
    """Fail loudly unless every program's checksum is torch's."""
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        raise AssertionError(
            f"{what}: {bad.shape[0]} of {got.numel()} program checksums differ from torch's sum of"
            f" the same bytes, the first at {tuple(bad[0].tolist())}"
        )


# ----------------------------------------------------------------------------- the benchmark


def decode_warps(decode, num_seqs, num_partitions, tile_groups, device) -> int:
    """Warps (token chunks) of the decode's launch for this batch."""
    if hasattr(decode, "_launch_chunks"):
        return decode._launch_chunks(num_seqs, HK, num_partitions, tile_groups, device)
    return decode.CHUNKS


def compiled_regs(compiled):
    return getattr(compiled, "n_regs", None)


def decode_regs(decode):
    """Registers a thread of the decode kernel's compiled launch (from the module's _run cache)."""
    kernel = getattr(decode, f"{decode.__name__}_kernel")
    regs = [
        compiled_regs(binary) for key, (binary, _) in decode._COMPILED.items() if key[0] is kernel
    ]
    return regs[-1] if regs else None


def measure(decode, store, geo, num_seqs, ctx, args, g, centroids, rotation):
    device = centroids.device
    q, cache, table, seq_lens = random_decode_inputs(
        decode, store, num_seqs, ctx, g, centroids, rotation
    )
    max_blocks = table.shape[1]
    partitions, tile_groups = decode.decode_partitions(max_blocks, num_seqs, HK, device)
    nbytes = int(seq_lens.clamp(max=max_blocks * geo.block_size).sum()) * HK * geo.token_bytes
    assert nbytes == cache.numel()  # every block full: the contiguous read moves the same bytes
    sums = token_sums(cache, table, HK, geo)
    want = program_checksums(
        sums, live_tokens(seq_lens, sums.shape[1]), partitions, tile_groups * geo.group
    )
    del sums

    # name -> (warps, regs, the timed call); each checked before it is listed.
    items = {}
    pipeline = functools.partial(decode.tq_decode, q, cache, table, seq_lens, centroids, rotation)
    reference = pipeline()
    q_rot, codebook = decode.rotate_query(q, rotation, centroids)
    shape = (num_seqs, HK, partitions, decode.QG, decode.HEAD_DIM)
    out_parts = torch.empty(shape, dtype=torch.bfloat16, device=device)
    exp_sums = torch.empty(shape[:4], dtype=torch.float32, device=device)
    max_logits = torch.empty_like(exp_sums)
    scale = decode.resolve_softmax_scale(None)
    kernel_only = functools.partial(
        decode.launch_decode_kernel,
        *(q_rot, cache, codebook, table, seq_lens, out_parts, exp_sums, max_logits, tile_groups),
        scale,
    )
    kernel_only()
    if partitions == 1:
        merged = out_parts.view_as(reference)
    else:
        merged = decode.merge_partitions(out_parts, exp_sums, max_logits, torch.empty_like(q))
    if not torch.equal(merged, reference):
        raise AssertionError("the decode kernel alone does not give the pipeline's output")
    warps = decode_warps(decode, num_seqs, partitions, tile_groups, device)
    items["pipeline"] = (warps, None, pipeline)
    items["decode"] = (warps, decode_regs(decode), kernel_only)

    out = torch.empty(num_seqs, HK, partitions, dtype=torch.int32, device=device)
    for form in args.forms.split(","):
        for w in map(int, args.warps.split(",")):
            out.fill_(0x5A5A5A5A)
            run = functools.partial(
                stream_floor,
                geo,
                cache,
                table,
                seq_lens,
                out,
                HK,
                tile_groups,
                form,
                w,
                args.stages,
            )
            compiled = run()
            check(out, want, f"{form} at {w} warps, {num_seqs} x {ctx}")
            items[f"{form}/{w}"] = (w, compiled_regs(compiled), run)

    words = cache.view(-1).view(torch.int32)
    for schedule in CONTIGUOUS_SCHEDULES:
        sums = torch.empty(contiguous_programs(words, schedule), dtype=torch.int32, device=device)
        run = functools.partial(contiguous_floor, words, sums, schedule)
        compiled = run()
        check(sums, contiguous_checksums(words, schedule), f"contiguous {schedule}")
        items[f"contiguous{schedule}"] = (schedule[2], compiled_regs(compiled), run)

    times = {name: [] for name in items}
    for _ in range(args.rounds):
        for name, (_, _, fn) in items.items():
            times[name].append(cold_l2_us(fn))
    medians = {name: statistics.median(t) for name, t in times.items()}
    # The contiguous read: its best schedule only.
    contiguous = [name for name in items if name.startswith("contiguous")]
    best = min(contiguous, key=medians.get)

    decode_tile = decode.TILE_TOKENS // decode.CHUNKS * warps  # a 32-token chunk per warp
    print(
        f"{num_seqs} x {ctx}: grid {num_seqs} x {HK} x {partitions} partitions of {tile_groups}"
        f" x {geo.group} tokens; the decode runs {warps} warps, {decode_tile}-token tiles;"
        f" {nbytes / 1e6:.1f} MB compressed ({geo.token_bytes} B a token and kv head)",
        flush=True,
    )
    for name in items:
        if name.startswith("contiguous") and name != best:
            continue
        w, regs, _ = items[name]
        us = medians[name]
        label = f"contiguous {best[len('contiguous'):]}" if name == best else name
        print(
            f"  {label:22s} {w:5d} {regs if regs is not None else '-':>5} {us:9.1f}"
            f" {nbytes / us / 1e6:7.2f} {bandwidth_fraction(nbytes, us):8.1%}"
            f" {medians[best] / us:9.1%} {medians['decode'] / us:9.2f}x"
            f"  [{', '.join(f'{t:.1f}' for t in times[name])}]",
            flush=True,
        )
    items.clear()
    del q, cache, table, seq_lens, out_parts, exp_sums, max_logits, q_rot, reference, merged, words
    torch.cuda.empty_cache()


def sass_counts(geo: Geometry, forms, warps_list, stages) -> None:
    """Offline: each floor form compiled for sm_90 (Triton's NVIDIA backend), its registers, stack
    and global loads by kind (LDG by width, LDGSTS: cp.async)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import sm90_compile as sm90

    hk, num_seqs, max_blocks = HK, 2, 8
    cache = torch.zeros(4, hk * geo.block_size * geo.token_bytes, dtype=torch.uint8)
    table = torch.zeros(num_seqs, max_blocks, dtype=torch.int32)
    seq_lens = torch.zeros(num_seqs, dtype=torch.int32)
    out = torch.zeros(num_seqs, hk, 2, dtype=torch.int32)
    for form in forms:
        for warps in warps_list:
            _, args, options = floor_args(geo, cache, table, seq_lens, out, hk, 1, form, stages)
            options["num_warps"] = warps
            compiled = sm90.compile_kernel(tq_stream_floor_kernel, args, options)
            info = sm90.resource_usage(compiled, options)
            sass = sm90.cuobjdump(compiled, "-sass")
            ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
            loads = {}
            for op in ops:
                if op.startswith(("LDG", "LDGSTS")):
                    loads[op] = loads.get(op, 0) + 1
            print(
                f"{form} at {warps} warps: {info['registers']} registers, {info['stack']} B stack,"
                f" {len(ops)} SASS instructions; global loads: "
                + ", ".join(f"{op} {n}" for op, n in sorted(loads.items())),
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="d128_qg8_bs16", help="d{head_dim}_qg{QG}_bs{BS}")
    parser.add_argument("--configs", default=CONFIGS, help="comma-separated SEQSxCONTEXT list")
    parser.add_argument("--forms", default=",".join(FORMS), help=f"of {', '.join(FORMS)}")
    parser.add_argument("--warps", default="2,4", help="warps per floor program, comma-separated")
    parser.add_argument("--stages", type=int, default=3, help="pipeline stages of the staged form")
    parser.add_argument("--tile", type=int, help="floor tile in tokens (default: the decode's)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median)")
    parser.add_argument("--sass", action="store_true", help="offline: sm_90 counts, no timing")
    args = parser.parse_args()
    for form in args.forms.split(","):
        if form not in FORMS:
            parser.error(f"--forms: unknown form {form!r} (known: {', '.join(FORMS)})")
    decode = load(f"tq_decode_triton_{args.variant}")
    geo = geometry(decode, args.tile)
    if args.sass:
        sass_counts(
            geo, args.forms.split(","), [int(w) for w in args.warps.split(",")], args.stages
        )
        return

    store = load(f"tq_store_d{geo.head_dim}_bs{geo.block_size}")
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    centroids, rotation = lloyd_max_centroids(geo.head_dim).to(dev), hadamard_rotation(
        geo.head_dim
    ).to(dev)
    print(
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton"
        f" {triton.__version__}, python {platform.python_version()}"
    )
    print(
        f"variant {args.variant}, Hk = {HK}; floor tile {geo.tile} tokens; us: device time with a"
        f" cold L2, median of {args.rounds} interleaved rounds (each round's time in brackets);"
        " TB/s and 'of copy': compressed bytes / time, and its fraction of"
        f" {COPY_CEILING_TBPS} TB/s;"
        " of contig: the contiguous read's time over this item's; decode/it: the decode kernel's"
        " time over this item's; regs: registers a thread"
    )
    print(
        f"  {'item (form/warps)':22s} {'warps':>5s} {'regs':>5s} {'us':>9s} {'TB/s':>7s}"
        f" {'of copy':>8s} {'of contig':>9s} {'decode/it':>10s}  [rounds]"
    )
    for num_seqs, ctx in (tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")):
        measure(decode, store, geo, num_seqs, ctx, args, g, centroids, rotation)


if __name__ == "__main__":
    main()
