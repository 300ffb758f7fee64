"""Triton part of the TQ lowering: the decode and store kernels' own numbers and addresses.

The Triton decode keeps the QG query heads of one kv head together and streams the kv head's
cache once per partition, in tiles of TILE_TOKENS tokens, loading each token's packed K (and V)
bytes token-major so the loads are coalesced. Up to 8 query heads, each warp owns a chunk of
every tile with its own softmax state and the MMAs are transposed (tokens as M, the heads as N,
padded to Q_COLS = 8); more heads share one softmax state over the tile as a padded matrix of
Q_ROWS rows (the chunked form's accumulators would not fit the register budget).
Packed bytes are never interleaved: byte j of a 4-bit field holds elements 2j and 2j+1, so the
kernels work on the even and odd halves of head_dim separately (q_even . C[lo] + q_odd . C[hi]).
In the chunked form the loads are shaped so that Triton's layouts put every byte in the lane
the MMA operand needs it in (`_chunk_lanes`): the reduction order of QK is renumbered to the K
loads' byte order (q is loaded in that order), and PV's rows are head_dim elements in the V
loads' order (the store undoes it), so neither operand goes through shared memory. The loop loads
K (as int32 words) and the per-token metadata LOAD_AHEAD tiles ahead, into registers, and unpacks
K two words per call, pairing the same nibble of both words in one register: QK's reduction
numbers those as neighbouring elements, the pairs the MMA operand holds.

Every address the kernels form is printed here from the shared lowering's sympy offsets (cache
block stride, field offsets per slot and kv head, tensor bases), each with the int width that
`decide_width` proves over the declared ranges; the templates only place the printed text. Tiles
and MMA layouts are Triton's business, so these kernels are checked numerically (the
interpreter on CPU, the GPU when present) rather than by lane proofs.
"""

from __future__ import annotations

import struct
from typing import Mapping

import sympy

from kgen.algebra import FloorDiv, Mod, Range, TensorLayout, TritonPrinter, decide_width, index_symbol

MIN_DOT = 16  # the smallest M, N and K that tl.dot accepts
# Decode schedule, measured on an H200. 128-token tiles with 4 warps beat 64-token tiles and 8
# warps at every size (benchmarks/tq_decode_variants.py, 2026-11-30, 16 x 32K at Hk=8: 699 us
# against 829-1229 us); 2 warps or 256-token tiles spilled registers. With the nibbles unpacked by
# PTX byte permutes (the template's _unpack_k/_unpack_v) this holds at every head dim
# (benchmarks/tq_decode_schedules.py, 2026-11-30, decode kernel alone, 16 x 32K, Hk=8): d64
# 299-303 us against 365-395 with 64-token tiles; d256 944 against 1139-1229.
TILE_TOKENS_TARGET = 128  # tokens per inner-loop tile (QK's N, PV's K)
# ... up to the d256 tile's packed bytes per K (or V) field, the largest measured: 255 registers
# and no spills. Larger head dims take fewer tokens per tile.
TILE_PACKED_BYTES = 128 * 128
DECODE_WARPS = 4  # warps per program
DECODE_STAGES = 2  # software-pipeline depth of the tile loop's cache loads (3: 493 us against 479 at d128)
# The chunked form (one softmax state per warp, transposed MMAs; benchmarks/RESULTS.md, session
# 13) against the shared-tile form, decode kernel alone, H200, Hk 8
# (benchmarks/logs/tq_chunked_ab_s13_h200.log):
# 16 x 32K 1.18-1.19x at d128 QG 4-8, 1.12x at d64, 1.11x at d256; 1 x 1K 0.96-1.09x. At QG 16
# (N = 16) its accumulators spill: 0.70x capped, 0.80x uncapped. With two pipeline stages it
# spills too (835 against 425 us at d128 16 x 32K), so it runs one.
CHUNKED_MAX_QG = 8
# The chunked form loads K and V straight into the lanes of the MMA operands (session 16, H200,
# whole pipeline at d128 16 x 32K: 419.6 -> 302.3 us; d64 281.7 -> 183.8): that lane plan is
# written for chunks of 32 tokens in runs of 16 from one cache block, and for head dims whose V
# record spans 8 lanes of one or two int32 words (d = 64, 128). At d256 (four words, uncapped
# registers) it measured slower than session 13's chunked kernel (16 x 32K 1149.5 against 838.6
# us, not profiled; the shared-tile form: 922.7), so d256 and other shapes take the shared-tile form.
CHUNK_TOKENS = 32
# Warps per chunked program (one 32-token chunk each), by K words per lane. d128 (4 words) runs
# 2-warp programs: a finer grain than 4 warps evens out the SMs' work. H200, 2026-12-05, d128
# qg8 bs16 at Hk 8, whole pipeline, cold L2 (benchmarks/tq_decode_schedules.py,
# benchmarks/logs/tq_schedules_s24_h200.log), 4 warps / 2 warps: 64 x 32K 1039.5 / 1006.9 us,
# 16 x 32K 274.9 / 270.4, 4 x 32K 82.9 / 79.4, 16 x 8K 82.9 / 81.6, 1 x 32K 33.2 / 31.3, and the
# one loss, 1 x 1K 14.4 / 16.0 (a 256-token partition is 4 tiles in a row instead of 2). On an
# H100 the same change took 64 x 32K from 1553.0 to 1113.8 us: 512 4-warp programs for 396
# resident slots left a second wave on part of the SMs (3 to 6 programs an SM); 2-warp programs,
# 6 an SM, fit one.
# d64 (2 words) keeps 4 warps: 2-warp programs measured 163.0 against 169.5 us at 16 x 32K but
# 617.7 against 612.7 at 64 x 32K and level at 1 x 32K (H100, session 25), too mixed to change on
# one card.
CHUNKED_WARPS = {2: 4, 4: 2}
# Where those 2-warp programs lose: a batch whose partitions are single 256-token groups (short or
# few sequences) is latency-bound, and a group is 4 tiles in a row in a 2-warp program against 2
# in a 4-warp one. Such launches run 4-warp programs when one wave of them holds the grid. H100,
# 2026-12-05, d128 qg8 bs16, Hk 8, whole pipeline (benchmarks/logs/tq_schedules_short_s25_h100.log),
# 2 / 4 warps:
# 1 x 1K 15.9 / 14.2 us, 1 x 2K 16.1 / 14.9, 1 x 4K 16.9 / 15.7, 4 x 1K 16.8 / 15.4 (H200,
# session 24: 1 x 1K 16.0 / 14.4); 16 x 1K (512 programs, past one 4-warp wave) 24.2 / 23.6 and
# 64 x 1K (4-group partitions) 49.9 / 64.1 keep 2 warps.
SHORT_PARTITION_WARPS = {4: 4}
CHUNK_RUN = 16
CHUNK_HEAD_DIM_STEP = 64
CHUNK_MAX_V_WORDS = 2
CHUNKED_MIN_N = 8  # the query heads are padded to at least mma.sync's N of 8
CHUNKED_STAGES = 1
# The chunked loop loads K (and the per-token metadata) a tile ahead, into registers, and runs QK
# two K words per lane at a time and PV one V word at a time, so fewer unpacked values are live
# (session 17, H200, decode kernel alone, d128 qg8 at Hk=8, lab A/B against session 16's loop:
# 16 x 32K 314.9 -> 251.9 us, 64 x 32K 1061.4 -> 937.8, 1 x 32K 31.1 -> 26.0, 1 x 1K 9.2 -> 7.5).
# Registers per thread by K words per lane: d128 (4 words) loading one tile ahead needed ~165, so
# capped at 168 12 warps shared an SM (capped at 128, 16 warps, it spilled and ran at 0.93-1.01x of
# session 16's loop); two tiles ahead it takes ~190, capped at 200 (8 warps an SM, 2 a scheduler:
# any cap from 169 to 255 gives that; see CHUNKED_LOAD_AHEAD for why 168 is not kept). d64 (2
# words) needs 128 uncapped (offline sm_90 compile, Triton 3.6), so 16 warps fit.
CHUNKED_MAX_REGISTERS = {2: 128, 4: 200}
# Tiles ahead of the one computing that K, its metadata and (in long partitions) V are loaded, by K
# words per lane. ncu of the 1-ahead d128 loop (H100, 16 x 32K, session 37): 17% of its warp stall
# samples sit on the first QK MMA waiting for K (long scoreboard), 8% on the multiply before PV
# waiting for a global load too, with 3.9 programs an SM resident. H100, session 37, whole
# pipeline, d128 qg8 bs16 at Hk 8, cold L2, bitwise-equal outputs (benchmarks/logs/
# tq_load_ahead_ab_s37_h100.log), 1 ahead at 168 registers / 2 ahead at 200: 16 x 32K 282.7 /
# 240.8 us, 64 x 32K 1057.9 / 901.7, 128 x 8K 676.7 / 466.1, 1 x 32K 30.7 / 30.7. Two ahead
# within 168 registers compiles without a spill (offline) but runs 322.6, 1198.8, 648.2 and 30.9;
# three ahead at 255 registers 243.6, 931.4, 474.2 and 33.8 (the same 4 programs an SM as at 200).
# At mid-size batches whose power-of-two partitions left the two-ahead grid at 0.55-0.61 of its
# wave (5-10 x 32K, 40 x 8K), one ahead at 168 registers (6 an SM) was 1.11-1.16x faster (H100,
# session 38). With partition counts that fill the wave (decode_partitions, session 39) two ahead
# is 1.05-1.20x faster than that one-ahead form at its power-of-two counts (5 x 32K 89.0 / 104.4
# us, 9 x 32K 150.0 / 180.5, 10 x 32K 166.7 / 185.9, 40 x 8K 177.3 / 186.6), so it stays.
# d64 (2 words) keeps 1: two ahead measured 0.94-0.98x within its 128 registers (2 spills in one
# of its launches) and 0.75-1.00x at 168 (3 programs an SM, not 4); H100, session 38, d64 qg4 bs16,
# 16 x 32K / 64 x 32K / 128 x 8K / 1 x 32K, one ahead: 159.1 / 590.1 / 307.3 / 22.3 us
# (benchmarks/logs/tq_d64_ahead_ab_s38_h100.log).
CHUNKED_LOAD_AHEAD = {2: 1, 4: 2}
K_WORDS_PER_STEP = 2  # K words per lane unpacked at a time: the unpacking pairs two words per call
K_LANES = 4  # lanes holding one token's K record: the 4 lanes of an MMA operand row
V_LANES = 8  # lanes holding one token's V record
WORD_BYTES = 4  # bytes of the int32 words the loads and the unpacking work on
WARP_LANES = 32  # threads of an NVIDIA warp; the lanes a record does not take hold other tokens
# Long partitions look K's bytes up in a byte-pair table in shared memory (entry b: the bf16
# codebook entries of b's two nibbles), one copy per lane so that a warp's 32 reads fall in 32
# distinct banks: one read and two integer instructions a byte, against 5.5 byte-permute
# instructions, which held the integer ALU pipe 61% busy (ncu, H100, 16 x 32K: 73.7M -> 40.8M ALU
# instructions; benchmarks/RESULTS.md session 35).
SHARED_BYTES_PER_SM = 228 * 1024  # shared memory of an SM (sm_90)
SHARED_BYTES_RESERVED = 1024  # ... that the driver keeps per resident program (sm_90)
# Registers: the d128 kernel asks for ~240 per thread, so 2 programs fit an SM; capped at 128 (6
# values spilled) 4 fit, and 16 x 32K takes 476-479 us against 608-611 (64 x 32K: 1831 against
# 2367; caps of 96, 112 and 144: 542-625 us; grids of one wave lose 1-2 us: 1 x 32K 46.4 against
# 44.7). The d256 tile holds twice the packed bytes, and capped it spills 208 values (2225 us
# against 944); d64 needs 128 registers anyway. So the cap applies up to d128's tile of packed
# bytes per K (or V) field.
DECODE_MAX_REGISTERS = 128
REGISTER_CAP_PACKED_BYTES = 128 * 64  # tile tokens x packed bytes per token, the d128 tile
REGISTERS_PER_SM = 65536  # 32-bit registers of an SM (sm_80, sm_90)
# The register file is split between the SM's warp schedulers: a warp takes its registers from its
# own scheduler's quarter, rounded up to whole allocation units. So 2-warp programs capped at 200
# registers fit 4 an SM, not the 5 that 65536 / (64 x 200) suggests: 6400 registers a warp leave
# room for 2 warps in a quarter's 16384, not 2.5 (ncu, H100, session 38: "Block Limit Registers 4",
# 7.7 warps an SM achieved at 16 x 32K). The host's waves follow: with 4, not 5, session 38's
# decode_partitions halved P for grids of 528 to 659 programs, which had run in 1.0-1.25 waves.
# H100, d128 qg8 bs16, Hk 8, whole pipeline (benchmarks/logs/tq_wave4_ab_s38_h100.log), 5 / 4 an
# SM: 5 x 32K 121.2 / 115.9 us, 10 x 32K 223.3 / 210.8, 40 x 8K 228.5 / 211.8, 9 x 32K 201.4 /
# 211.0, 36 x 8K 205.4 / 210.1, 16 x 32K (unchanged P) 239.9 / 240.0.
SM_SUBPARTITIONS = 4
REGISTER_ALLOCATION_UNIT = 256  # registers a warp's allocation is rounded up to a multiple of
MAX_THREAD_REGISTERS = 255  # what an uncapped thread may take
# q . rotation for every query row in one launch (instead of torch's cast, GEMM and cast): 16 rows
# per program in 4 warps, the rotation streamed 32 rows at a time through a tf32x3 tl.dot (fp32-accurate).
# H200, 2026-11-30: 7.5 us for 64 or 4096 rows against 10.5-16.4 us for torch's three kernels;
# an fp32 FMA dot ("ieee") takes 9-47 us and whole-matrix operands spill.
# The chunks' loads go through a software pipeline up to ROTATE_MAX_STAGES deep, so they are in
# flight together: unrolled, each chunk's loads waited for the previous chunk's MMAs (one cold
# round trip per chunk). H200, 2026-12-03, d128, cold L2 (lab A/B, same bits): 64 rows 6.1 -> 4.1 us,
# 1024 rows 6.5 -> 3.8, 4096 rows 7.2 -> 6.0; 2 stages 5.6-6.7; 64 rows per program 14-20 us; the
# whole rotation loaded at once spills at 4 warps and takes 4.7-8.6 us at 8. Four stages of a d256
# chunk (32 x 256 fp32) take 132 KB of shared memory.
# Small rotations are split over output columns too, down to ROTATE_MIN_COLS a program, while the
# grid stays within ROTATE_PROGRAMS_PER_SM programs an SM: more, smaller programs spread the cold
# loads of the matrix. H100, session 26, cold L2, rotation alone (whole pipeline) in us, d128:
# 64 rows 4.6 (12.6) at 128 columns, 3.9 (11.6) at 64, 3.4 (11.4) at 32; 1024 rows 4.8 (23.4),
# 4.0 (22.7), 3.7 (22.4); 4096 rows 6.2 (50.9), 6.6 (51.2), 7.6 (52.0). d256: 32 rows 9.9 (27.6) at
# 256, 7.0 (24.7) at 128, 5.4 (23.1) at 64; 2048 rows 10.1 (135.9), 9.7 (135.5), 10.4 (136.2).
ROTATE_ROWS = MIN_DOT
ROTATE_MIN_COLS = 32
ROTATE_PROGRAMS_PER_SM = 2
ROTATE_CHUNK = 32
ROTATE_WARPS = 4
ROTATE_MAX_STAGES = 4
# Store schedule: 16 tokens per program, 4 warps; whole k and v rows loaded (vector loads), y =
# x . rotation in tf32x3 dots over blocks of at most ROT_BLOCK_ELEMENTS rotation elements, the
# blocks' loads software-pipelined ROT_MAX_STAGES deep. H200, 2026-12-03, cold L2 (lab A/B, Hk 8),
# against the earlier even/odd-split schedule (four [64 x 64] blocks of stride-2 rotation columns
# whose loads waited for the codebook): a 64-token step 10.2 -> 6.3 us at d64, 20.5 -> 10.5 at
# d128, 81.3 -> 30.5 at d256; bulk 18.5 -> 8.0, 55.2 -> 19.0, 301.6 -> 59.5 ns per token. At d128,
# blocks of 32 columns (4 blocks) took 13.2 us / 22.4 ns, 16 columns 18.7 / 43.2; bucketizing
# against all midpoints at once (a [tokens x pairs x centroids] compare) 16.1 / 25.8; 32 tokens per
# program 29.7 / 35.3 (spills); 8 warps 10.0 / 31.3. At d256, 64-column blocks spill (36.5 / 76.5).
STORE_WARPS = 4
# Triton emits `.reqntid` and no register limit, so ptxas picks a register count for occupancy; at
# d256 it settled on 32 registers and 6 KB of spills (3x slower on an H200, session 7; a small
# change of the kernel body tips it either way). `.maxnreg` at the most a thread can address turns
# that choice off: ptxas then uses the registers the code needs.
STORE_MAX_REGISTERS = MAX_THREAD_REGISTERS
ROT_BLOCK_ELEMENTS = 128 * 64  # rotation elements per block of columns (32 KB of fp32 per pipeline stage)
ROT_MAX_STAGES = 2  # rotation column blocks whose loads are in flight at once


def lower_kernel(ctx):
    """Numbers and printed addresses of the decode kernel."""
    from kgen.ops.tq_decode import KernelPart

    c = ctx.consts
    d, qg, bs, group = c["HEAD_DIM"], c["QG"], c["BS"], c["GROUP"]
    per_byte, pairs = _packing(ctx)
    if pairs < MIN_DOT:
        raise ctx.reject("dims.head_dim", f"head_dim {d} gives {pairs}-wide even/odd halves, below tl.dot's minimum K of {MIN_DOT}", f"nearest that works: {per_byte * MIN_DOT}")
    tile = min(TILE_TOKENS_TARGET, group, TILE_PACKED_BYTES // pairs)
    if tile < MIN_DOT:
        raise ctx.reject("dims.head_dim", f"head_dim {d} leaves {tile}-token tiles within the {TILE_PACKED_BYTES}-byte packed tile budget, below tl.dot's minimum N of {MIN_DOT}", f"nearest that works: {per_byte * TILE_PACKED_BYTES // MIN_DOT}")
    # The chunked form's lane plan needs whole 32-token chunks within the packed tile budget
    # (head dims past 256 take shorter tiles, and a warp's chunk is PV's K). Eligibility is
    # judged on the 4-warp tile, the one the lane plan was measured on at every head dim; the
    # chunked tile is then one chunk per warp of CHUNKED_WARPS.
    chunked = (
        qg <= CHUNKED_MAX_QG and tile // DECODE_WARPS == CHUNK_TOKENS and bs % CHUNK_RUN == 0
        and d % CHUNK_HEAD_DIM_STEP == 0 and _words_per_lane(pairs)[1] <= CHUNK_MAX_V_WORDS
    )
    lanes = _chunk_lanes(ctx, pairs) if chunked else {}
    warps = CHUNKED_WARPS[lanes["K_WORDS"]] if chunked else DECODE_WARPS
    short_warps = None
    if chunked:
        tile = CHUNK_TOKENS * warps  # one chunk per warp
        max_registers = CHUNKED_MAX_REGISTERS[lanes["K_WORDS"]]
        short_warps = SHORT_PARTITION_WARPS.get(lanes["K_WORDS"])
    else:
        max_registers = DECODE_MAX_REGISTERS if tile * pairs <= REGISTER_CAP_PACKED_BYTES else None
    q_rows = max(CHUNKED_MIN_N if chunked else MIN_DOT, 1 << (qg - 1).bit_length())  # padded query heads
    rotate_chunk = min(ROTATE_CHUNK, d)
    consts = {
        "CHUNKED": chunked,  # one softmax state per warp and transposed MMAs (else one shared tile state)
        # QG query heads padded to a power of two: the MMAs' N when chunked, else >= tl.dot's 16 rows
        ("Q_COLS" if chunked else "Q_ROWS"): q_rows,
        **({"CHUNKS": warps} if chunked else {}),  # token chunks of a tile: one per warp
        # ... in launches whose partitions are single groups, where that differs (None: CHUNKS)
        "SHORT_CHUNKS": short_warps,
        **({"SHORT_PROGRAMS_PER_SM": _programs_per_sm(short_warps, max_registers)} if short_warps else {}),
        "PAIRS": pairs,  # bytes per packed K (or V) record: element pairs (2j, 2j+1) of head_dim
        "NIBBLE_BITS": ctx.spec.options.quant.key_bits,  # bits per packed element; the high nibble's shift
        "NIBBLE_MASK": (1 << ctx.spec.options.quant.key_bits) - 1,  # the low nibble
        "V_LEVEL_MID": 1 << (ctx.spec.options.quant.value_bits - 1),  # the middle V level, subtracted before PV
        "TILE_TOKENS": tile,  # tokens per inner-loop tile (QK's N, PV's K)
        "NUM_WARPS": warps,  # warps per program
        "NUM_STAGES": CHUNKED_STAGES if chunked else DECODE_STAGES,  # pipeline depth of the tile loop
        **({"LOAD_AHEAD": CHUNKED_LOAD_AHEAD[lanes["K_WORDS"]]} if chunked else {}),  # tiles whose loads are in flight
        # registers per thread, so that PROGRAMS_PER_SM programs share an SM (None: as many as the compiler wants)
        "MAX_REGISTERS": max_registers,
        # resident programs per SM at that budget: the wave the host's partition choice fills
        "PROGRAMS_PER_SM": _programs_per_sm(warps, max_registers),
        **_v_unpack_constants(ctx),
        **lanes,
        "ROTATE_ROWS": ROTATE_ROWS,  # query rows per program of the rotation kernel
        "ROTATE_MIN_COLS": min(ROTATE_MIN_COLS, d),  # fewest rotated columns per program of the rotation kernel
        "ROTATE_PROGRAMS_PER_SM": ROTATE_PROGRAMS_PER_SM,  # ... while its grid stays within this many per SM
        "ROTATE_CHUNK": rotate_chunk,  # rotation rows per tl.dot step
        "ROTATE_STAGES": min(ROTATE_MAX_STAGES, d // rotate_chunk),  # rotation chunks loaded at once
        "ROTATE_WARPS": ROTATE_WARPS,  # warps per program of the rotation kernel
    }

    if chunked:
        # The pair table (long partitions, CHUNKS warps) must not cost residency: the programs the
        # register budget lets an SM hold must also fit its shared memory (Triton's own scratch is
        # checked by the sm_90 compile test, tests/test_tq_sm90_compile.py).
        resident = consts["PROGRAMS_PER_SM"]
        if resident * (lanes["K_PAIR_TABLE_BYTES"] + SHARED_BYTES_RESERVED) > SHARED_BYTES_PER_SM:
            raise ctx.reject("dims.head_dim", f"{resident} resident programs an SM with a {lanes['K_PAIR_TABLE_BYTES']}-byte K pair table each exceed the SM's {SHARED_BYTES_PER_SM} bytes of shared memory", "head_dim 64 or 128")

    S = ctx.sym
    seq, kvh, part, slot, row, e, phys = (index_symbol(n) for n in ("seq", "kv_head", "part", "slot", "row", "e", "phys_block"))
    pair, token = index_symbol("pair"), index_symbol("token")
    max_tokens = ctx.ranges[S["max_blocks"]].hi * bs
    ranges = {
        **ctx.ranges,
        row: Range(0, q_rows - 1, "query head of the padded matrix (heads >= QG are padding)"),
        pair: Range(0, pairs - 1, "byte of a packed record = element pair of head_dim"),
        token: Range(0, max_tokens + tile - 1, "token of the sequence; masked lanes of the last tile included"),
    }
    names = {S["Hk"]: "NUM_KV_HEADS", S["P"]: "NUM_PARTITIONS", S["max_blocks"]: "max_blocks", phys: "block"}
    constexprs = (S["Hk"], S["P"])  # launch-time constants of the kernel
    out = _Printer(ranges, names, constexprs)
    off = ctx.offsets
    even, odd = {e: per_byte * pair}, {e: per_byte * pair + 1}  # low nibble: element 2j, high: 2j+1
    if chunked:  # q^T as [1, PAIRS, Q_COLS], pairs in the K lanes' order (k_byte); out^T as [PAIRS, Q_COLS]
        query_matrix = {row: "col[None, None, :]", pair: "k_byte[None, :, None]"}
        out_matrix, head = {row: "col[None, :]", pair: "pair[:, None]"}, {row: "col"}
    else:
        query_matrix = out_matrix = {row: "row[:, None]", pair: "pair[None, :]"}
        head = {}
    printed = {
        "query_base": out("query_base", off["query_base"]),
        "query_even": out("query_row", off["query_row"].subs(even), query_matrix),
        "query_odd": out("query_row", off["query_row"].subs(odd), query_matrix),
        "block_table_base": out("block_table_base", off["block_table_base"]),
        "table_index": out("table_index", FloorDiv(token, bs)),
        "slot": out("slot", Mod(token, bs)),
        **_cache_fields(out, off),
        "out_parts_base": out("out_parts_base", off["out_parts_base"]),
        "out_even": out("out_parts_row", off["out_parts_row"].subs(even), out_matrix),
        "out_odd": out("out_parts_row", off["out_parts_row"].subs(odd), out_matrix),
        "partials_base": out("partials_base", off["partials_base"]),
        "partials_row": out("partials_row", _layout(ctx, "exp_sums").offset(a3=row), head),
    }
    if chunked:  # q^T in the pair table's order: nibble `nibble` of byte k_byte (its element)
        nibble = index_symbol("nibble")
        nibble_ranges = {**ranges, nibble: Range(0, per_byte - 1, "nibble of a packed byte (0: low)")}
        printed["query_nibble"] = _Printer(nibble_ranges, names, constexprs)(
            "query_row", off["query_row"].subs({e: per_byte * pair + nibble}), {**query_matrix, nibble: "nibble[None, :, None]"}
        )
    if chunked:  # the K and V loads' own names for a 16-token run's table entry, block and slots
        for f in ("k", "v"):
            run = {token: f"{f}_run"}
            printed[f"{f}_table_index"] = out("table_index", FloorDiv(token, bs), run)
            printed[f"{f}_run_slot"] = out("slot", Mod(token, bs), run)
            printed[f"{f}_block_base"] = out("block_base_bytes", off["block_base_bytes"], {phys: f"{f}_block"})
            printed[f"{f}_record"] = out(f"{f}_bytes", off[f"{f}_bytes"], {slot: f"{f}_slot"})
        printed["out_rows"] = out("out_parts_row", off["out_parts_row"], {row: "col[None, :]", e: "v_elem[:, None]"})
    p = printed
    program = (
        f"program (seq, kv_head, part): the QG={qg} query heads of kv_head, padded to {q_rows} columns (the MMAs' N), over tiles of {tile} tokens ({pairs * tile} packed bytes),"
        f" each warp a chunk of {CHUNK_TOKENS} tokens with its own softmax state"
        if chunked
        else f"program (seq, kv_head, part): the QG={qg} query rows of kv_head, padded to {q_rows} rows for tl.dot, over tiles of {tile} tokens ({pairs * tile} packed bytes)"
    )
    mma = (
        f"QK: K . q_even^T + K . q_odd^T per chunk in {consts['QK_STEPS']} step(s) of two K words per lane (batched tl.dot, [{CHUNK_TOKENS} x {consts['STEP_PAIRS']}] . [{consts['STEP_PAIRS']} x {q_rows}]);"
        f" PV: V^T . P'^T per V word into {consts['V_WORDS']} [{d // consts['V_WORDS']} x {q_rows}] fp32 accumulator(s) per chunk, merged after the loop"
        if chunked
        else f"QK: q_even . C[low nibbles]^T + q_odd . C[high nibbles]^T, two tl.dot of K = {pairs}; PV: two tl.dot of K = {tile} into [{q_rows} x {pairs}] fp32 accumulators"
    )
    loads = (
        (
            f"K: each token's {pairs} B record over {K_LANES} lanes, {lanes['K_VEC']} contiguous bytes ({lanes['K_WORDS']} int32 words) each (lane quad q holds bytes [q*{lanes['K_VEC']}, (q+1)*{lanes['K_VEC']})), {WARP_LANES // K_LANES} tokens over the other lane bits, a chunk per warp,"
            f" loaded {_tiles_ahead(consts['LOAD_AHEAD'])} with the metadata; the unpacking pairs the same nibble of two words, and QK's reduction runs over the bytes in that order (k_byte);"
            f" in long partitions a byte-pair table in shared memory ({lanes['K_PAIR_ENTRIES']} rows of {lanes['K_PAIR_ROW_BYTES']} B, a copy per lane) gives a byte's two entries in one read, and QK runs over (k_byte, nibble)."
            f" V: each record over {V_LANES} lanes of {lanes['V_WORDS']} int32 word(s), {WARP_LANES // V_LANES} tokens over the other lane bits, loaded at the top of its tile ({_tiles_ahead(consts['LOAD_AHEAD'])} in long partitions); PV's rows are head_dim in that order (v_elem)",
        )
        if chunked
        else ()
    )
    mapping = (
        program,
        f"K, V: a [{tile} tokens x {pairs} B] tile, token-major: token t's byte `pair` at block base + ({p['k']}) + pair (V: + ({p['v']}) + pair),"
        f" holding elements {per_byte}*pair (low nibble) and {per_byte}*pair+1 (high nibble)",
        *loads,
        f"metadata: one fp16 per token and field at block base + ({p['k_norm']}), ({p['v_scale']}), ({p['v_zero']})",
        mma,
    )
    return KernelPart(consts=consts, proofs=(), printed=printed, mapping=mapping)


def lower_store(ctx):
    """Numbers and printed addresses of the store (quantize) kernel."""
    from kgen.ops.tq_decode import KernelPart

    c = ctx.consts
    bs, levels = c["BS"], c["N_CENTROIDS"]
    per_byte, pairs = _packing(ctx)
    rot_pairs = min(pairs, ROT_BLOCK_ELEMENTS // (per_byte * c["HEAD_DIM"]))  # output pairs per block of columns
    if per_byte * rot_pairs < MIN_DOT:
        raise ctx.reject("dims.head_dim", f"head_dim {c['HEAD_DIM']} leaves {per_byte * rot_pairs}-column rotation blocks within {ROT_BLOCK_ELEMENTS} elements, below tl.dot's minimum N of {MIN_DOT}", f"nearest that works: {ROT_BLOCK_ELEMENTS // MIN_DOT}")
    consts = {
        "PAIRS": pairs,  # bytes per packed K (or V) record: element pairs (2j, 2j+1) of head_dim
        "ROT_PAIRS": rot_pairs,  # output pairs per block of rotation columns ([HEAD_DIM x 2 * ROT_PAIRS] fp32)
        "COL_BLOCKS": pairs // rot_pairs,  # blocks of rotation columns per token
        # programs that may share one block of tokens' K (small stores): divisors of COL_BLOCKS
        "KEY_SPLITS": tuple(n for n in range(1, pairs // rot_pairs + 1) if (pairs // rot_pairs) % n == 0),
        "ROT_STAGES": min(ROT_MAX_STAGES, pairs // rot_pairs),  # column blocks loaded at once
        "NIBBLE_BITS": ctx.spec.options.quant.key_bits,  # bits per packed element; the high nibble's shift
        "STORE_TOKENS": MIN_DOT,  # tokens per program: the M of the rotation's tl.dot
        "N_MIDPOINTS": levels - 1,  # decision boundaries between the sorted centroids
        "V_LEVELS": (1 << ctx.spec.options.quant.value_bits) - 1,  # largest V index (affine min/max scheme)
        "KEY_NORM_EPS": 1e-8,  # x = k / (||k|| + eps), operators.md §2
        "V_SCALE_MIN": 1e-8,  # scale = max((max(v) - min(v)) / V_LEVELS, this), operators.md §2
        "NUM_WARPS": STORE_WARPS,  # warps per program
        "MAX_REGISTERS": STORE_MAX_REGISTERS,  # registers per thread (NVIDIA)
        "PROGRAMS_PER_SM": _programs_per_sm(STORE_WARPS, STORE_MAX_REGISTERS),  # the wave the store's split fills
    }
    S = ctx.sym
    phys, cache_slot = index_symbol("phys_block"), index_symbol("cache_slot")
    num_slots = ctx.ranges[S["num_blocks"]].hi * bs
    ranges = {**ctx.ranges, cache_slot: Range(0, num_slots - 1, "slot_mapping entry (negative ones are masked to 0)")}
    out = _Printer(ranges, {S["Hk"]: "NUM_KV_HEADS", phys: "block"}, (S["Hk"],))
    printed = {
        "block": out("block", FloorDiv(cache_slot, bs)),
        "slot": out("slot", Mod(cache_slot, bs)),
        **_cache_fields(out, ctx.offsets),
    }
    p = printed
    mapping = (
        f"program: {MIN_DOT} tokens of one kv head, K and V whole; or, for a store whose grid then fits one wave ({consts['PROGRAMS_PER_SM']} programs an SM), one part:"
        f" K over a divisor of {pairs // rot_pairs} column block(s) per program, V in one of its own; whole k and v rows loaded, then split into even and odd elements (low and high nibbles)",
        f"K: y = x . rotation in {pairs // rot_pairs} block(s) of {rot_pairs} output pairs ([{c['HEAD_DIM']} x {per_byte * rot_pairs}] fp32 rotation columns each), packed byte col"
        f" = elements {per_byte}*col (low nibble), {per_byte}*col+1 (high), stored at block base + ({p['k']}) + col",
        f"V: packed byte `pair` at block base + ({p['v']}) + pair; k_norm, v_scale, v_zero as fp16 at ({p['k_norm']}), ({p['v_scale']}), ({p['v_zero']})",
    )
    return KernelPart(consts=consts, proofs=(), printed=printed, mapping=mapping)


def _tiles_ahead(n: int) -> str:
    return "a tile ahead" if n == 1 else f"{n} tiles ahead"


def _programs_per_sm(warps: int, max_registers: int | None) -> int:
    """Programs of `warps` warps an SM holds at once when each thread may take max_registers
    registers (None: the most a thread can take): one wave is the SM count times this. The
    registers bound it, per warp scheduler (SM_SUBPARTITIONS)."""
    per_thread = max_registers or MAX_THREAD_REGISTERS
    per_warp = -(-WARP_LANES * per_thread // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    warps_per_scheduler = REGISTERS_PER_SM // SM_SUBPARTITIONS // per_warp
    return SM_SUBPARTITIONS * warps_per_scheduler // warps


class _Printer:
    """Prints one address expression with the width `decide_width` proves for it."""

    def __init__(self, ranges, names, constexprs):
        self.ranges, self.names, self.constexprs = ranges, dict(names), tuple(constexprs)

    def __call__(self, name: str, expr: sympy.Expr, names: Mapping[sympy.Symbol, str] | None = None) -> str:
        width = decide_width(name, expr, self.ranges)
        return TritonPrinter(self.ranges, {**self.names, **(names or {})}, self.constexprs, bits=width.bits)(expr)


def _cache_fields(out: _Printer, off) -> dict[str, str]:
    """Byte offsets in the cache: the block's base (from the block id) and each field of (slot,
    kv head) within the block."""
    return {
        "block_base": out("block_base_bytes", off["block_base_bytes"]),
        **{f: out(f"{f}_bytes", off[f"{f}_bytes"]) for f in ("k", "v", "k_norm", "v_scale", "v_zero")},
    }


def _words_per_lane(pairs: int) -> tuple[int, int]:
    """(int32 words of a K record per lane, of a V record per lane) in the chunked form."""
    return pairs // (K_LANES * WORD_BYTES), pairs // (V_LANES * WORD_BYTES)


def _chunk_lanes(ctx, pairs: int) -> dict:
    """The chunked form's lane plan: bytes of a K record per lane (K_LANES lanes a token) and int32
    words of a V record per lane (V_LANES lanes a token); and the bound behind its lane-dependent zero."""
    k_words, v_words = _words_per_lane(pairs)
    if not 1 <= v_words <= CHUNK_MAX_V_WORDS or v_words & (v_words - 1):
        raise ctx.reject("dims.head_dim", f"the chunked Triton decode spreads a V record over {V_LANES} lanes of 1 or 2 int32 words, not {pairs / (V_LANES * WORD_BYTES):g}", "head_dim 64 or 128")
    key_bits = ctx.spec.options.quant.key_bits
    pair_entries = 1 << (2 * key_bits)  # a byte holds two key_bits-bit indices
    max_blocks = ctx.ranges[ctx.sym["max_blocks"]].hi
    if 7 * max_blocks >= 2**31:  # (x & 7) * max_blocks >> 31 must be 0
        raise ctx.reject("dims.max_blocks", f"max {max_blocks} lets 7 * max_blocks reach 2^31, where the decode's lane-dependent zero stops being zero", f"max <= {(2**31 - 1) // 7}")
    return {
        "K_VEC": k_words * WORD_BYTES,  # contiguous bytes of a K record per lane
        "K_WORDS": k_words,  # ... as int32 words
        "QK_STEPS": k_words // K_WORDS_PER_STEP,  # QK's reduction in steps of two words per lane
        "STEP_PAIRS": K_WORDS_PER_STEP * WORD_BYTES * K_LANES,  # record bytes per QK step
        "V_WORDS": v_words,  # int32 words of a V record per lane
        "LANE_ZERO_BOUND": f"7 * {max_blocks} = {7 * max_blocks} < 2^31",
        "K_PAIR_ENTRIES": pair_entries,  # the byte-pair table's entries: one per packed K byte value
        "K_PAIR_ROW_BYTES": WARP_LANES * WORD_BYTES,  # an entry's 32 copies, one per lane
        "K_PAIR_TABLE_BYTES": pair_entries * WARP_LANES * WORD_BYTES,
    }


def _f16x2(value: float) -> str:
    """PTX immediate of an fp16 pair (value, value); the value must be exact in fp16."""
    (bits,) = struct.unpack("<H", struct.pack("<e", value))
    if struct.unpack("<e", struct.pack("<H", bits))[0] != value:
        raise ValueError(f"{value} is not exact in fp16")
    return f"0x{bits:04X}{bits:04X}"


def _v_unpack_constants(ctx) -> dict[str, str]:
    """Bit patterns and fp16 constants of the V unpacking (templates/triton/tq_decode.py.jinja).

    A byte b = 16 h + l becomes the fp16 1024 + b by placing it under 1024's exponent byte;
    clearing its low nibble leaves 1024 + 16 h. Then h - MID = (1024 + 16 h) / 16 - (64 + MID)
    and l - MID = (1024 + b) - (1024 + 17 MID) - 16 (h - MID), every step exact in fp16
    (tests/test_tq_ptx_unpack.py runs the PTX over all 65536 byte pairs)."""
    bits = ctx.spec.options.quant.value_bits
    mid = 1 << (bits - 1)
    step = 1 << bits  # weight of the high nibble
    (fp16_1024,) = struct.unpack("<H", struct.pack("<e", 1024.0))
    return {
        "FP16_1024_BITS": f"0x{fp16_1024:04X}",  # low byte zero: OR-ing a byte in gives 1024 + byte
        "V_EXPONENT_BYTES": f"0x{(fp16_1024 >> 8) * 0x01010101:08X}",  # 1024's high byte, in all 4 bytes
        "V_HIGH_NIBBLE_MASK": f"0x{(0xFFFF & ~(step - 1)) * 0x00010001:08X}",  # clears each lane's low nibble
        "V_HIGH_SCALE": _f16x2(1.0 / step),
        "V_HIGH_BIAS": _f16x2(-(1024.0 / step + mid)),
        "V_LOW_OFFSET": _f16x2(1024.0 + (step + 1) * mid),
        "V_LOW_HIGH_WEIGHT": _f16x2(-float(step)),
        # the chunked form's word unpacking: nibbles kept in place under 1024's exponent bits
        "V_LOW_NIBBLES": f"0x{(step - 1) * 0x00010001:08X}",  # each fp16 lane's low nibble
        "V_HIGH_NIBBLES": f"0x{((step - 1) << bits) * 0x00010001:08X}",  # the nibble above it
        "V_LOW_CENTRE": _f16x2(1024.0 + mid),
    }


def _packing(ctx) -> tuple[int, int]:
    """(elements per byte, bytes per packed record) of the data region's K and V fields."""
    q = ctx.spec.options.quant
    if q.key_bits != 4 or q.value_bits != 4:
        raise ctx.reject("quant", "the Triton kernels unpack 4-bit fields (two elements per byte)", "use bits: 4")
    per_byte = 8 // q.key_bits
    return per_byte, ctx.consts["HEAD_DIM"] // per_byte


def _layout(ctx, name: str) -> TensorLayout:
    """A contract tensor's row-major layout with the variant's constants folded in."""
    from kgen.ops.tq_decode import _dim_expr

    shape = [_dim_expr(s, ctx.sym) for s in ctx.spec.tensors[name].shape]
    fold = {ctx.sym[n]: v for n, v in ctx.spec.constants(ctx.variant.values).items() if n in ctx.sym}
    return TensorLayout(name, shape, range(len(shape)), [f"a{i}" for i in range(len(shape))]).substitute(fold)
