"""Where each TQ decode program ran: SM, start and end, for a choice of partitions.

Run from the project root on a CUDA machine:
`python benchmarks/tq_decode_trace.py [--variant d128_qg8_bs16] [--configs 16x32768,...]
[--splits 2x64,3x43,3x47]` (a split is PARTITIONS x TILE_GROUPS, tile groups per partition;
default: the shipped choice, the largest balanced split that fits one wave, and the same count with
the last partition shortened to about 70%).

Why: unbalanced partitions measured faster than balanced ones at the same total work (16 x 32K,
47/47/34 tile groups 250 us against 43/43/42 262 us and the shipped 64/64 274 us; RESULTS,
session 21), and no count of work per SM explained it. This tool copies the generated module,
records %smid, %globaltimer and %clock64 at the start and end of every decode program, times the
decode kernel alone (cold L2) and prints, per split: programs per SM, each partition's start and
end times and cycles per tile, per-SM work and finish times, and the latest SMs' programs.
"""

from __future__ import annotations

import argparse
import math
import platform
import re
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import cold_l2_us  # noqa: E402
from tq_decode import HK, load, random_decode_inputs  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

FIELDS = ("sm", "start_ns", "end_ns", "start_clock", "end_clock", "tiles")  # one int64 each per program

_READ = """    {name} = tl.inline_asm_elementwise("mov.u64 $0, %{register};", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
"""


def instrument(source: str, kernel: str) -> str:
    """The generated module's source with the decode kernel recording FIELDS per program into
    trace_ptr (a new parameter after max_logits_ptr; the launcher passes the module's TRACE[0])."""
    at = source.index(f"def {kernel}(")
    head, body = source[:at], source[at:]
    edits = [
        ("    max_logits_ptr,\n    max_blocks,\n", "    max_logits_ptr,\n    trace_ptr,\n    max_blocks,\n"),
        ("    part = tl.program_id(2)\n",
         "    part = tl.program_id(2)\n" + _READ.format(name="start_ns", register="globaltimer")
         + _READ.format(name="start_clock", register="clock64")),
        ("            max_logits,\n            block_table.shape[1],\n",
         "            max_logits,\n            TRACE[0],\n            block_table.shape[1],\n"),
    ]
    found = re.search(r"^    tl\.store\(max_logits_ptr \+ stats, .*\n", body, re.MULTILINE)  # the kernel's last store
    last_store = found.group(0) if found else "    tl.store(max_logits_ptr + stats, ...)\n"
    record = "".join([
        _READ.format(name="end_ns", register="globaltimer"),
        _READ.format(name="end_clock", register="clock64"),
        '    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)\n',
        "    program = (part * NUM_KV_HEADS + kv_head) * tl.num_programs(0) + seq\n",
        *(f"    tl.store(trace_ptr + program * {len(FIELDS)} + {i}, {f}.to(tl.int64))\n" for i, f in enumerate(FIELDS[:-1])),
        f"    tl.store(trace_ptr + program * {len(FIELDS)} + {len(FIELDS) - 1}, num_tiles.to(tl.int64))\n",
    ])
    edits.append((last_store, last_store + record))
    for old, new in edits:
        if body.count(old) < 1:
            raise SystemExit(f"tq_decode_trace: the generated module no longer has {old.strip()!r}; update instrument()")
        body = body.replace(old, new, 1)
    # The int64 [programs, len(FIELDS)] buffer the next launch records into (set before each launch).
    return head + body + "\nTRACE = [torch.empty(0, dtype=torch.int64)]\n"


def summarize(trace: torch.Tensor, num_seqs: int, num_partitions: int, num_sms: int) -> list[str]:
    sm, start, end, start_clock, end_clock, tiles = trace.view(-1, len(FIELDS)).cpu().unbind(1)
    start_us = (start - start.min()).double() / 1e3
    end_us = (end - start.min()).double() / 1e3
    part = torch.arange(len(sm)) // (HK * num_seqs)
    per_sm = torch.bincount(sm, minlength=num_sms)
    holding = {k: int((per_sm == k).sum()) for k in range(int(per_sm.max()) + 1)}
    lines = [f"  programs {len(sm)}, first start to last end {end_us.max():.1f} us; SMs holding k programs: "
             + ", ".join(f"{k}: {n}" for k, n in holding.items() if n)]
    cycles_per_tile = (end_clock - start_clock).double() / tiles.clamp(min=1).double()
    for p in range(num_partitions):
        m = part == p
        lines.append(f"  part {p}: {int(tiles[m].double().mean())} tiles; start {start_us[m].min():.1f}-{start_us[m].max():.1f} us,"
                     f" end {end_us[m].min():.1f}-{end_us[m].max():.1f} (median {end_us[m].median():.1f});"
                     f" {cycles_per_tile[m].median() / 1e3:.2f} kcycles a tile (median)")
    busy = per_sm > 0  # SMs that ran at least one program
    sm_tiles = torch.zeros(num_sms, dtype=torch.float64).index_add_(0, sm, tiles.double())[busy]
    sm_end = torch.full((num_sms,), float("-inf"), dtype=torch.float64).scatter_reduce_(0, sm, end_us, "amax")  # idle SMs sort last
    ends = sm_end[busy]
    lines.append(f"  per busy SM: tiles min/median/max {sm_tiles.min():.0f}/{sm_tiles.median():.0f}/{sm_tiles.max():.0f};"
                 f" last end min/median/max {ends.min():.1f}/{ends.median():.1f}/{ends.max():.1f} us")
    for s in torch.argsort(sm_end, descending=True)[:3].tolist():
        m = sm == s
        lines.append(f"  late SM {s}: parts {part[m].tolist()}, tiles {tiles[m].tolist()},"
                     f" starts {[round(x, 1) for x in start_us[m].tolist()]}, ends {[round(x, 1) for x in end_us[m].tolist()]}")
    return lines


def default_splits(decode, num_seqs: int, max_blocks: int, device) -> list[tuple[int, int]]:
    shipped = decode.decode_partitions(max_blocks, num_seqs, HK, device)
    groups = decode.table_groups(max_blocks)
    wave = decode._resident_programs(device)
    fill = max(1, min(groups, wave // (num_seqs * HK)))
    balanced = (fill, -(-groups // fill))
    shortened = (fill, -(-groups * 10 // (10 * fill - 3))) if fill > 1 else balanced  # last partition ~70%
    return list(dict.fromkeys([shipped, balanced, shortened]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="d128_qg8_bs16", help="d{head_dim}_qg{GQA factor}_bs{block size}")
    parser.add_argument("--configs", default="16x32768,8x32768,64x32768", help="comma-separated SEQSxCONTEXT")
    parser.add_argument("--splits", help="comma-separated PARTITIONSxTILE_GROUPS for every config (default: see the module doc)")
    args = parser.parse_args()
    name = f"tq_decode_triton_{args.variant}"
    plain = load(name)
    decode = load(name, instrument((ROOT / "generated" / "tq_decode" / f"{name}.py").read_text(), f"{name}_kernel"), "traced")
    store = load(f"tq_store_{args.variant.split('_')[0]}_{args.variant.split('_')[2]}")
    dev = torch.device("cuda")
    d, qg = decode.HEAD_DIM, decode.QG
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"device: {torch.cuda.get_device_name()}, {num_sms} SMs, torch {torch.__version__}, triton {triton.__version__},"
          f" python {platform.python_version()}; {name}, Hk = {HK}, {decode.PROGRAMS_PER_SM} programs an SM"
          f"{f' ({decode.SHORT_PROGRAMS_PER_SM} in single-group launches)' if hasattr(decode, 'SHORT_CHUNKS') else ''}")
    g = torch.Generator(device=dev).manual_seed(0)
    centroids, rotation = lloyd_max_centroids(d).to(dev), hadamard_rotation(d).to(dev)
    for config in args.configs.split(","):
        num_seqs, ctx = (int(x) for x in config.split("x"))
        query, cache, table, seq_lens = random_decode_inputs(decode, store, num_seqs, ctx, g, centroids, rotation)
        nb = table.shape[1]
        q_rot, codebook = decode.rotate_query(query, rotation, centroids)
        splits = [tuple(int(x) for x in s.split("x")) for s in args.splits.split(",")] if args.splits else default_splits(plain, num_seqs, nb, dev)
        for parts, tile_groups in splits:
            if (parts - 1) * tile_groups * decode.GROUP >= ctx or parts * tile_groups * decode.GROUP < ctx:
                print(f"{config} P{parts}x{tile_groups}: skipped (does not cover {ctx} tokens with every partition non-empty)")
                continue
            out_parts = torch.empty((num_seqs, HK, parts, qg, d), dtype=torch.bfloat16, device=dev)
            exp_sums = torch.empty((num_seqs, HK, parts, qg), dtype=torch.float32, device=dev)
            max_logits = torch.empty_like(exp_sums)
            decode.TRACE[0] = torch.zeros(num_seqs * HK * parts * len(FIELDS), dtype=torch.int64, device=dev)

            def call():
                decode.launch_decode_kernel(q_rot, cache, codebook, table, seq_lens, out_parts, exp_sums, max_logits,
                                            tile_groups, 1 / math.sqrt(d))

            timed = [cold_l2_us(call) for _ in range(3)]
            call()
            torch.cuda.synchronize()
            sizes = "/".join(str(min(tile_groups, -(-ctx // decode.GROUP) - p * tile_groups)) for p in range(parts))
            warps = decode._launch_chunks(num_seqs, HK, parts, tile_groups, query.device) if hasattr(decode, "SHORT_CHUNKS") else None
            shown = f", {warps}-warp programs" if warps else ""
            print(f"{config} P{parts}x{tile_groups} ({sizes} tile groups{shown}): decode kernel {'/'.join(f'{t:.1f}' for t in timed)} us, cold L2, 3 rounds")
            print("\n".join(summarize(decode.TRACE[0], num_seqs, parts, num_sms)))
        del query, cache, table
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
