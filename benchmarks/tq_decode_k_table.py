"""A/B of the TQ decode's K lookup: byte permutes (shipped) against a shared-memory byte table.

Run from the project root on a CUDA machine:
`python benchmarks/tq_decode_k_table.py [--variant d128_qg8_bs16] [--configs 1x1024,16x32768,...]
[--copies 2,4,8,16] [--once]`

Why: offline (sm_90 SASS, Triton 3.6), the d128 loop's bound is the integer ALU, which sm_90
runs at half the FP32 rate: ~540 of its 1032 instructions a warp-chunk, ~330 of them K's codebook
lookup (10 PRMT/LOP3 per 4 nibbles). A table of 256 bf16 pairs (entry b = codebook[b & 15],
codebook[b >> 4]) looked up once per packed byte through `tl.gather` moves the lookup to shared
memory loads: with 8 copies the same loop is 944 instructions with ~305 on the ALU, plus 64 LDS
a warp-chunk and the table's store and 2 barriers per gather (Triton stores a gather's source at
every call). COPIES interleaved copies of the table (entry b, copy r at word b * COPIES + r; a
token row's lanes read copy row % COPIES) spread a warp's lookups over more banks. Whether that
is faster on the GPU, and at which COPIES, is what this measures (RESULTS, session 23).

This tool derives the table variant from the generated module's source (`k_table_variant`, as
tq_decode_trace.py does for its trace) and prints, per config, the whole pipeline's time (cold
L2, 3 interleaved rounds) for the shipped module and each table variant, with the ratio and the
largest difference from the shipped output. `--once` runs each module once and compares outputs
without timing (for a profiler; with `--device cpu` and TRITON_INTERPRET=1, the CPU test's run).
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import cold_l2_us  # noqa: E402
from tq_decode import random_decode_inputs  # noqa: E402
from tq_decode_trace import HK, load  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

_LOOKUP = r'''

@triton.jit
def _k_table_entries(words, table, table_copy, CHUNKS: tl.constexpr, CHUNK: tl.constexpr, STEP_PAIRS: tl.constexpr, PTX_UNPACK: tl.constexpr):
    """bf16 K entries [CH, CHUNK, 2 * STEP_PAIRS] of int32 words [CH, CHUNK, (word, QUAD)], k in
    (word, byte_hi, QUAD, byte_lo, nibble) order: each MMA k-block of 16 holds 4 consecutive k per
    lane of a quad, as the operand layout wants. One table lookup per packed byte."""
    if PTX_UNPACK:
        # One byte permute a byte (a shift and a mask otherwise): byte i of the word, zero-extended.
        b0, b1, b2, b3 = tl.inline_asm_elementwise(
            """
            prmt.b32 $0, $4, 0, 0x4440;
            prmt.b32 $1, $4, 0, 0x4441;
            prmt.b32 $2, $4, 0, 0x4442;
            prmt.b32 $3, $4, 0, 0x4443;
            """,
            "=r,=r,=r,=r,r", [words], dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1,
        )
    else:
        b0, b1, b2, b3 = words & 255, (words >> 8) & 255, (words >> 16) & 255, (words >> 24) & 255
    byte = tl.join(tl.join(b0, b2), tl.join(b1, b3))  # flattens to bytes 0-3 in order
    index = tl.reshape(byte, (CHUNKS, CHUNK, STEP_PAIRS)) * K_TABLE_COPIES + table_copy
    pairs = tl.gather(table, tl.reshape(index, (CHUNKS * CHUNK * STEP_PAIRS,)), 0)
    pairs = tl.reshape(tl.permute(tl.reshape(pairs, (CHUNKS, CHUNK, 2, 4, 2, 2)), (0, 1, 2, 4, 3, 5)), (CHUNKS, CHUNK, STEP_PAIRS))
    if PTX_UNPACK:
        low, high = tl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [pairs], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)
    else:
        low = (pairs & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        high = ((pairs >> 16) & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return tl.reshape(tl.join(low, high), (CHUNKS, CHUNK, 2 * STEP_PAIRS))

'''

_QUERY = '''    kk = tl.arange(0, 2 * STEP_PAIRS)  # step {step}'s k: word, byte_hi, QUAD, byte_lo, nibble
    d_of_k = 2 * (((kk >> 2) & 3) * K_VEC + ({step2} + (kk >> 5)) * 4 + ((kk >> 4) & 1) * 2 + ((kk >> 1) & 1)) + (kk & 1)
    qT{step} = tl.broadcast_to(
        tl.load(q_base + (d_of_k[None, :, None] + col[None, None, :] * HEAD_DIM), mask=q_cols, other=0.0),
        (CHUNKS, 2 * STEP_PAIRS, Q_COLS),
    )
'''

_TABLE = '''    # K's byte table: entry b is the bf16 pair (codebook[b & 15], codebook[b >> 4]), in
    # K_TABLE_COPIES interleaved copies; token row t reads copy t % K_TABLE_COPIES.
    byte = tl.arange(0, 256 * K_TABLE_COPIES) // K_TABLE_COPIES
    low_entry = tl.load(codebook_ptr + (byte & 15)).to(tl.int32) | (tl.load(codebook_ptr + N_CENTROIDS + (byte & 15)).to(tl.int32) << 8)
    high_entry = tl.load(codebook_ptr + (byte >> 4)).to(tl.int32) | (tl.load(codebook_ptr + N_CENTROIDS + (byte >> 4)).to(tl.int32) << 8)
    table = low_entry | (high_entry << 16)
    table_copy = (tl.arange(0, CHUNK) % K_TABLE_COPIES)[None, :, None]
'''

_QK = '''        # QK, two K words per lane at a time, each packed byte looked up in K's byte table.
        k_step0, k_step1 = tl.split(tl.permute(tl.reshape(k_words, (CHUNKS, CHUNK, 2, 8)), (0, 1, 3, 2)))
        scores = tl.zeros((CHUNKS, CHUNK, Q_COLS), dtype=tl.float32)
        scores = _mma(_k_table_entries(k_step0, table, table_copy, CHUNKS, CHUNK, STEP_PAIRS, PTX_UNPACK), qT0, scores, INTERPRETER_FIXUPS)
        scores = _mma(_k_table_entries(k_step1, table, table_copy, CHUNKS, CHUNK, STEP_PAIRS, PTX_UNPACK), qT1, scores, INTERPRETER_FIXUPS)
'''


def k_table_variant(source: str, kernel: str, copies: int) -> str:
    """The generated module's source with the decode kernel's K lookup through a byte table of
    `copies` interleaved copies (chunked d128 modules: two QK steps of two K words per lane)."""

    def cut(text: str, first: str, until: str, new: str) -> str:
        if first not in text or until not in text[text.index(first):]:
            raise SystemExit(f"tq_decode_k_table: the generated module no longer has {first.strip()!r} ... {until.strip()!r}; update k_table_variant()")
        start = text.index(first)
        return text[:start] + new + text[text.index(until, start):]

    at = source.index(f"@triton.jit(do_not_specialize=[\"max_blocks\", \"tile_groups\"])\ndef {kernel}(")
    head, body = source[:at], source[at:]
    body = cut(body, "    pair = 0 * STEP_PAIRS + tl.arange(0, STEP_PAIRS)\n", "    block_table_row = block_table_ptr +",
               "".join(_QUERY.format(step=s, step2=2 * s) for s in (0, 1)))
    body = cut(body, "    # The codebook's byte planes as 8 words", "    fp16_1024 = FP16_1024_BITS",
               _TABLE + "    v_lane_zero = (tl.arange(0, 8) * max_blocks >> 31)[None, :, None, None, None]  # over V's JG lanes\n")
    body = cut(body, "        # QK, two K words per lane at a time", "        scores = scores * (k_norm.to(tl.float32)", _QK)
    return head + f"K_TABLE_COPIES = tl.constexpr({copies})\n" + _LOOKUP + body


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="d128_qg8_bs16", help="d{head_dim}_qg{GQA factor}_bs{block size} (a chunked d128 module)")
    parser.add_argument("--configs", default="1x1024,1x32768,16x8192,16x32768,64x32768", help="comma-separated SEQSxCONTEXT")
    parser.add_argument("--copies", default="2,4,8,16", help="comma-separated table copies to time")
    parser.add_argument("--once", action="store_true",
                        help="run each module once per config, no timing: for a profiler, e.g. ncu --kernel-name regex:_bs16_kernel")
    parser.add_argument("--device", default="cuda", help="cuda; cpu with TRITON_INTERPRET=1 and --once (the CPU test's smoke run)")
    args = parser.parse_args()
    name = f"tq_decode_triton_{args.variant}"
    source = (ROOT / "generated" / "tq_decode" / f"{name}.py").read_text()
    shipped = load(name)
    tables = {int(c): load(name, k_table_variant(source, f"{name}_kernel", int(c))) for c in args.copies.split(",")}
    store = load(f"tq_store_{args.variant.split('_')[0]}_{args.variant.split('_')[2]}")
    dev = torch.device(args.device)
    d = shipped.HEAD_DIM
    where = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (Triton interpreter)"
    timing = "outputs only (--once)" if args.once else "whole pipeline, cold L2, 3 interleaved rounds (us)"
    print(f"device: {where}, torch {torch.__version__}, triton {triton.__version__},"
          f" python {platform.python_version()}; {name}, Hk = {HK}; {timing}")
    g = torch.Generator(device=dev).manual_seed(0)
    centroids, rotation = lloyd_max_centroids(d).to(dev), hadamard_rotation(d).to(dev)
    for config in args.configs.split(","):
        num_seqs, ctx = (int(x) for x in config.split("x"))
        query, cache, table, seq_lens = random_decode_inputs(shipped, store, num_seqs, ctx, g, centroids, rotation)
        calls = {"shipped": lambda: shipped.tq_decode(query, cache, table, seq_lens, centroids, rotation)}
        calls.update({f"table x{c}": (lambda m=m: m.tq_decode(query, cache, table, seq_lens, centroids, rotation)) for c, m in tables.items()})
        reference = calls["shipped"]().float()
        times = {label: [] for label in calls}
        for _ in range(0 if args.once else 3):
            for label, call in calls.items():
                times[label].append(cold_l2_us(call))
        for label, call in calls.items():
            out = call().float()
            diff = (out - reference).abs().max().item()
            rel = ((out - reference).norm() / reference.norm()).item()
            timed = "" if args.once else (f"{'/'.join(f'{t:.1f}' for t in times[label])} us,"
                                          f" x{min(times['shipped']) / min(times[label]):.2f} of shipped; ")
            print(f"{config} {label:10s} {timed}max |diff| {diff:.2e}, relative rms {rel:.2e} against shipped")
        del query, cache, table
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
