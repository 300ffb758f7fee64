"""The TQ decode pipeline with and without programmatic dependent launches, in one run.

Run from the project root on an sm_90 (or later) GPU:
  python benchmarks/tq_decode_dependent.py [--variant d128_qg8_bs16] [--configs 1x1024,16x32768,...]
The same generated module is loaded twice; in one copy `_dependent_launch` is turned off, so
its decode and merge are launched plainly and never trigger or wait. For each config, ragged
sequence lengths: whole-pipeline device time with a cold L2 in three interleaved rounds (median),
the ratio plain / dependent, and a race check: the dependent pipeline captured ten times in one
CUDA graph, replayed 30 times, every output compared bitwise with the plain pipeline's (a decode
or merge that read its predecessor's output too early would differ).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import cold_l2_us  # noqa: E402
from tq_decode import HK, load, random_decode_inputs  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

DEFAULT_CONFIGS = "1x1024,1x2048,1x4096,1x8192,4x1024,8x1024,16x1024,1x32768,4x32768,16x8192,16x32768,64x32768"


def graph_mismatches(decode, inputs, expected, calls=10, replays=30) -> int:
    outputs = []
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        decode.tq_decode(*inputs)  # compiled before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            outputs.append(decode.tq_decode(*inputs))
    mismatches = 0
    for _ in range(replays):
        graph.replay()
        torch.cuda.synchronize()
        mismatches += sum(not torch.equal(out, expected) for out in outputs)
    return mismatches


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="d128_qg8_bs16", help="d{head_dim}_qg{GQA factor}_bs{block size}")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="SEQSxCONTEXT,...")
    args = parser.parse_args()
    dependent = load(f"tq_decode_triton_{args.variant}")
    plain = load(f"tq_decode_triton_{args.variant}")
    plain._dependent_launch = lambda device: False
    d, bs = dependent.HEAD_DIM, dependent.BS
    store = load(f"tq_store_d{d}_bs{bs}")
    g = torch.Generator(device="cuda").manual_seed(0)
    cent, rot = lloyd_max_centroids(d).cuda(), hadamard_rotation(d).cuda()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.variant}, Hk = {HK}; "
          "us: whole pipeline, cold L2, median of 3 interleaved rounds")
    for num_seqs, ctx in (tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")):
        q, cache, table, _ = random_decode_inputs(dependent, store, num_seqs, ctx, g, cent, rot)
        seq_lens = torch.randint(max(1, ctx - 300), ctx + 1, (num_seqs,), device="cuda", generator=g, dtype=torch.int32)
        inputs = (q, cache, table, seq_lens, cent, rot)
        expected = plain.tq_decode(*inputs)
        equal = torch.equal(dependent.tq_decode(*inputs), expected)
        mismatches = graph_mismatches(dependent, inputs, expected)
        times = {"dependent": [], "plain": []}
        for _ in range(3):
            times["plain"].append(cold_l2_us(lambda: plain.tq_decode(*inputs)))
            times["dependent"].append(cold_l2_us(lambda: dependent.tq_decode(*inputs)))
        on, off = statistics.median(times["dependent"]), statistics.median(times["plain"])
        P, _ = dependent.decode_partitions(table.shape[1], num_seqs, HK, q.device)
        print(f"{num_seqs:3d} x {ctx:6d} P={P:2d}: dependent {on:7.1f} us, plain {off:7.1f} us, {off / on:5.3f}x; "
              f"bitwise equal {equal}, graph mismatches {mismatches}/300", flush=True)
        del cache


if __name__ == "__main__":
    main()
