"""GPU timing as design.md prescribes: device time with a cold L2, plus do_bench's median.

Cold L2: a CUDA graph holds 20 copies of (zero a 256 MB buffer, which evicts the 60 MB L2; then
the call). Replaying it ~15 times and taking the median per copy, minus the same graph with the
flushes alone, gives the call's device time without host overhead and without a warm cache.
"""

from __future__ import annotations

import statistics

import torch
import triton

COPY_CEILING_TBPS = 4.29  # measured device-to-device copy, read + write, H200 (design.md)


def _graph_time_us(fn, copies: int, replays: int) -> float:
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    # The warm-up runs on a side stream, which does not wait for the caller's: without this, fn
    # could read inputs the caller's stream has not finished writing (a block table still being
    # filled gave an illegal address in a session 39 sweep).
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up outside capture (allocations, autotuning, compilation)
            flush.zero_()
            if fn is not None:
                fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(copies):
            flush.zero_()
            if fn is not None:
                fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000 / copies)
    del graph
    return statistics.median(samples)


def cold_l2_us(fn, copies: int = 20, replays: int = 15) -> float:
    """Median device time of one call with a cold L2, in microseconds."""
    return max(_graph_time_us(fn, copies, replays) - _graph_time_us(None, copies, replays), 0.0)


def cold_l2_median_us(fn, rounds: int = 3) -> float:
    """Median of `rounds` cold_l2_us readings: what the benchmarks report. A reading taken just
    after heavy GPU work (the benchmarks' references) can run slow: of three readings of 9 x 32K
    right after benchmarks/tq_decode.py's fp32 reference, one was 178.2 us and the median 149.7,
    as everywhere else (H100, session 40); the benchmark, which timed once, had reported 174-176."""
    return statistics.median(cold_l2_us(fn) for _ in range(rounds))


def do_bench_us(fn) -> float:
    """triton.testing.do_bench's median (includes host launch overhead), in microseconds."""
    return triton.testing.do_bench(fn, return_mode="median") * 1000


def bandwidth_fraction(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / (COPY_CEILING_TBPS * 1e12) if us > 0 else float("nan")
