"""Schedule sweep of a generated Triton TQ decode on the GPU: warps per program, tile, register cap.

Run from the project root on a CUDA machine:
  python benchmarks/tq_decode_schedules.py [--variant d128_qg8_bs16] [--configs 16x32768,...]
      [--schedules 64:2:200,128:4:200,32:1:200]
A schedule is TILE_TOKENS:num_warps:maxnreg (maxnreg 0: no cap, and the module's own wave). In
the chunked form (QG <= 8) each warp owns one 32-token chunk of a tile, so TILE_TOKENS = 32 x
num_warps there; the default list is the shipped d128 schedule (2 warps since session 24) and
the same loop in programs of four and one warps.

Why one-warp programs: the shipped d128 loop (4 warps) has 6 CTA-wide barriers per tile, from
Triton's shared-memory layout conversions (the per-token metadata, and P^T for the PV MMA), and
ncu put 0.82 cycles of barrier stall on every issued instruction of session 16's kernel (RESULTS,
"Where the remaining TQ gaps come from", and session 22). In a one-warp program the same
conversions synchronize one warp, so warps no longer wait for each other; 12 programs then share
an SM (168 registers), and the host's partition rule, sized by that wave, picks 4x the
partitions. (Session 17's lab that cut the barriers from 6 to 2 ran 0.97-1.01x.)
Session 24 measured the three (RESULTS): 2-warp programs gained 1.02-1.06x from 1 x 32K up on
the H200 (1.39x at 64 x 32K on an H100, where 4-warp programs left a second wave) and lost 0.90x
at 1 x 1K; they ship for d128. One-warp programs beat two by more than 1% only at 4 x 32K on
the H100 (81.0 against 83.2 us) and lost at 1 x 32K and 1 x 1K.

For each config and schedule: the partitions the wrapper's rule picks for that schedule's wave,
the whole pipeline's device time with a cold L2 (rotate + decode + merge, as `tq_decode` runs
it), the decode kernel alone, registers and spills, and max |diff| against the shipped output.
The schedule's launch is the module's own (recorded from `launch_decode_kernel`) with only the
tile, the chunk count, the warps and the cap replaced, so it follows the template as it changes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import cold_l2_us  # noqa: E402
from tq_decode import HK, load, random_decode_inputs  # noqa: E402

from kgen.ops.tq_triton import CHUNKED_MAX_REGISTERS, _programs_per_sm  # noqa: E402
from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

D128_MAX_REGISTERS = CHUNKED_MAX_REGISTERS[4]  # the chunked d128 loop's cap (4 K words a lane)
DEFAULT_SCHEDULES = ",".join(f"{tile}:{warps}:{D128_MAX_REGISTERS}" for tile, warps in ((64, 2), (128, 4), (32, 1)))


def programs_per_sm(warps: int, max_registers: int) -> int:
    """Resident programs of a capped schedule on one SM, as the lowering counts them; 0 when
    uncapped (the compiler's register count is not known before compiling: the module's own wave
    is used)."""
    return _programs_per_sm(warps, max_registers) if max_registers else 0


class Schedule:
    """A decode pipeline for one schedule: the module's rotation and merge, its decode kernel
    launched with the schedule's tile, warps and cap, and its partition rule sized by the
    schedule's wave. `programs_per_sm=0` keeps the module's own rule (no GPU: no waves)."""

    def __init__(self, dec, tile: int, warps: int, max_registers: int, programs_per_sm: int):
        self.dec, self.tile, self.warps, self.max_registers, self.per_sm = dec, tile, warps, max_registers, programs_per_sm

    def partitions(self, max_blocks: int, num_seqs: int, num_kv_heads: int, device) -> tuple[int, int]:
        dec = self.dec
        shipped_wave = dec._resident_programs
        if self.per_sm and device.type == "cuda":
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            dec._resident_programs = lambda _device: sms * self.per_sm
        try:
            return dec.decode_partitions(max_blocks, num_seqs, num_kv_heads, device)
        finally:
            dec._resident_programs = shipped_wave

    def launch(self, q_rot, cache, codebook, table, seq_lens, out_parts, exp_sums, max_logits, tile_groups, scale):
        """launch_decode_kernel with this schedule's compile-time values in place of the module's."""
        dec, recorded = self.dec, []
        shipped_run = dec._run
        dec._run = lambda kernel, grid, args, variant, options: recorded.append((kernel, grid, args, options()))
        try:
            dec.launch_decode_kernel(q_rot, cache, codebook, table, seq_lens, out_parts, exp_sums, max_logits, tile_groups, scale)
        finally:
            dec._run = shipped_run
        if not recorded:  # an empty batch launches nothing
            return None
        ((kernel, grid, args, options),) = recorded
        options.update(TILE_TOKENS=self.tile, num_warps=self.warps)
        if "CHUNKS" in options:
            options["CHUNKS"] = self.warps  # one 32-token chunk per warp
        options.pop("maxnreg", None)
        if self.max_registers:
            options["maxnreg"] = self.max_registers
        return kernel[grid](*args, **options)

    def __call__(self, query, kv_cache, block_table, seq_lens, centroids, rotation, softmax_scale=None):
        """tq_decode's pipeline (rotate, decode, merge) under this schedule; returns (output, compiled kernel)."""
        dec = self.dec
        num_seqs, num_kv_heads, max_blocks = dec.validate_inputs(query, kv_cache, block_table, seq_lens, centroids, rotation)
        scale = dec.resolve_softmax_scale(softmax_scale)
        output = torch.empty_like(query)
        if num_seqs == 0:
            return output, None
        q_rot, codebook = dec.rotate_query(query, rotation, centroids)
        parts, tile_groups = self.partitions(max_blocks, num_seqs, num_kv_heads, query.device)
        shape = (num_seqs, num_kv_heads, parts, dec.QG, dec.HEAD_DIM)
        out_parts = output.view(shape) if parts == 1 else torch.empty(shape, dtype=torch.bfloat16, device=query.device)
        exp_sums = torch.empty(shape[:4], dtype=torch.float32, device=query.device)
        max_logits = torch.empty_like(exp_sums)
        compiled = self.launch(q_rot, kv_cache, codebook, block_table, seq_lens, out_parts, exp_sums, max_logits, tile_groups, scale)
        if parts > 1:
            dec.merge_partitions(out_parts, exp_sums, max_logits, output)
        return output, compiled


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="d128_qg8_bs16")
    parser.add_argument("--configs", default="1x1024,1x32768,4x32768,16x8192,16x32768,64x32768")
    parser.add_argument("--schedules", default=DEFAULT_SCHEDULES)
    args = parser.parse_args()
    dec = load(f"tq_decode_triton_{args.variant}")
    d, bs = dec.HEAD_DIM, dec.BS
    store = load(f"tq_store_d{d}_bs{bs}")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    centroids, rotation = lloyd_max_centroids(d).to(dev), hadamard_rotation(d).to(dev)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; variant {args.variant}, Hk = {HK}; shipped: tile"
          f" {dec.TILE_TOKENS}, {dec.PROGRAMS_PER_SM} programs an SM; cold L2")
    schedules = []
    for text in args.schedules.split(","):
        tile, warps, regs = (int(x) for x in text.split(":"))
        schedules.append(Schedule(dec, tile, warps, regs, programs_per_sm(warps, regs)))
    for num_seqs, ctx in (tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")):
        q, cache, table, seq_lens = random_decode_inputs(dec, store, num_seqs, ctx, g, centroids, rotation)
        shipped = dec.tq_decode(q, cache, table, seq_lens, centroids, rotation)
        print(f"== {num_seqs} x {ctx}", flush=True)
        for s in schedules:
            parts, tile_groups = s.partitions(table.shape[1], num_seqs, HK, dev)
            name = f"tile {s.tile:3d} warps {s.warps} maxnreg {s.max_registers or '-':>3} ({s.per_sm or dec.PROGRAMS_PER_SM} an SM): P{parts}x{tile_groups}"
            try:
                out, compiled = s(q, cache, table, seq_lens, centroids, rotation)
                diff = (out.float() - shipped.float()).abs().max().item()
                pipeline = cold_l2_us(lambda: s(q, cache, table, seq_lens, centroids, rotation))
                q_rot, codebook = dec.rotate_query(q, rotation, centroids)
                out_parts = torch.empty((num_seqs, HK, parts, dec.QG, d), dtype=torch.bfloat16, device=dev)
                exp_sums = torch.empty((num_seqs, HK, parts, dec.QG), dtype=torch.float32, device=dev)
                max_logits = torch.empty_like(exp_sums)
                kernel = cold_l2_us(lambda: s.launch(q_rot, cache, codebook, table, seq_lens, out_parts, exp_sums, max_logits, tile_groups, 1 / d**0.5))
                print(f"  {name}: pipeline {pipeline:8.1f} us, decode kernel {kernel:8.1f} us, regs {compiled.n_regs:3d}"
                      f" spills {compiled.n_spills:3d}, max |diff| vs shipped {diff:.1e}", flush=True)
            except Exception as e:  # a schedule Triton cannot build is reported, not fatal
                print(f"  {name}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
        del cache
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
