"""Every generated Triton TQ decode module compiles for sm_90 on this machine, no GPU needed.

CI's numerics run the kernels under the interpreter, which never compiles them and runs the
plain-Triton arm of the nibble unpacking instead of its inline PTX. Here Triton's NVIDIA backend
compiles each module's three kernels (query rotation, decode, merge) with the constants and
launch options the module itself passes, and its bundled ptxas assembles the PTX: a layout
Triton cannot lower, a PTX typo or a register cap the compiler does not honour fails here
rather than on a GPU. (The H200 runs them: benchmarks/RESULTS.md. Register and spill counts
differ between this Triton and the device's, so only the cap is checked.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kgen.ops.tq_triton import SHARED_BYTES_PER_SM  # cuobjdump's static figure includes the driver's 1 KB a program

from conftest import ROOT

SCRIPT = ROOT / "tests" / "sm90_compile.py"
DECODE = sorted((ROOT / "generated" / "tq_decode").glob("tq_decode_triton_*.py"))


# The GPU machine's Triton (benchmarks/RESULTS.md records its version with every number), installed
# apart from this environment's (`pip install --target DIR triton==3.6.0`; .ci/run does): shared
# memory use is Triton's choice and differs between versions, so residency is checked under it.
GPU_TRITON = os.environ.get("KGEN_GPU_TRITON")


def compile_sm90(*paths, triton_dir: str | None = None) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the kernels must be JIT functions
    env["PYTHONPATH"] = os.pathsep.join([*([triton_dir] if triton_dir else []), str(ROOT)])
    done = subprocess.run([sys.executable, str(SCRIPT), *map(str, paths)], env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    mark = "kgen-sm90: "
    return [json.loads(line[len(mark):]) for line in done.stdout.splitlines() if line.startswith(mark)]


@pytest.fixture(scope="module")
def records():
    return compile_sm90(*DECODE)


def test_every_decode_module_compiles_for_sm90(records):
    assert len(DECODE) == 18
    kernels = {(r["module"], r["kernel"]) for r in records}
    expected = {(p.stem, k) for p in DECODE for k in ("_rotate_query_kernel", f"{p.stem}_kernel", "_merge_partitions_kernel")}
    assert kernels == expected
    # The chunked variants (d64 and d128, QG <= 8) also compile their long-partition schedule, and
    # the d128 ones their single-group schedule.
    decodes = {p.stem: sum(r["module"] == p.stem and r["kernel"] == f"{p.stem}_kernel" for r in records) for p in DECODE}
    chunked = {f"tq_decode_triton_d{d}_qg{qg}_bs{bs}" for d, qgs in ((64, (4, 7)), (128, (4, 6, 7, 8))) for qg in qgs for bs in (16, 32)}
    assert decodes == {name: (1 + (name in chunked) + (name in chunked and "_d128_" in name)) for name in decodes}, decodes
    failed = [f"{r['module']}.{r['kernel']}: {r['error']}" for r in records if not r["ok"]]
    assert not failed, "\n".join(failed)


def test_register_caps_hold(records):
    for r in records:
        if r["maxnreg"]:
            assert r["registers"] <= r["maxnreg"], r


def test_kernels_after_the_first_wait_for_the_one_before(records):
    """On sm_90 the decode and the merge are launched as programmatic dependents, and each waits
    (griddepcontrol.wait) before reading what the kernel before it wrote. Where the variant has
    a single-group schedule, the rotation lets that schedule's decode launch at once, and only the
    other schedule's decode lets the merge launch after its loop (the numbers are in the
    template's comments). Reading too early is caught by the GPU validation; this checks the
    instructions are where the launches expect them."""
    for path in DECODE:
        mine = [r for r in records if r["module"] == path.stem]
        short = len([r for r in mine if r["kernel"] == f"{path.stem}_kernel"]) == 3
        long = len([r for r in mine if r["kernel"] == f"{path.stem}_kernel"]) >= 2
        found = [(r["kernel"], r["grid_dependency"]) for r in mine]
        decode = f"{path.stem}_kernel"
        expected = [
            ("_rotate_query_kernel", ["launch_dependents"] if short else []),
            ("_rotate_query_kernel", []),  # whole rows, launched plainly
            (decode, ["launch_dependents", "wait"]),
            *([(decode, ["launch_dependents", "wait"])] if long else []),  # long partitions
            *([(decode, ["wait"])] if short else []),
            ("_merge_partitions_kernel", ["wait"]),
        ]
        assert found == expected, path.stem
        if short:  # the chunked loop: its first tile's K loads (16 bytes a lane) go out before the wait
            assert all(r["vector_loads_before_wait"] >= 4 for r in mine if r["kernel"] == decode), path.stem


def test_only_long_partition_launches_carry_the_pair_table(records):
    for path in DECODE:
        table = re.search(r"\.b8 k_pair_table\[(\d+)\]", path.read_text())
        for r in records:
            if r["module"] == path.stem and r["kernel"] == f"{path.stem}_kernel":
                assert (r["static_shared"] >= int(table.group(1))) if r["long_partitions"] else (r["static_shared"] < 4096), r


@pytest.mark.skipif(not GPU_TRITON, reason="KGEN_GPU_TRITON (a directory holding the GPU machine's Triton, 3.6.0) is not set")
def test_the_pair_table_costs_no_residency_under_the_gpu_triton():
    """Long-partition launches carry the K byte-pair table (static shared memory); with Triton's own
    shared memory, as many of their programs fit an SM's shared memory as its registers allow
    (PROGRAMS_PER_SM, which sizes the host's waves): one fewer cost 0.76x at 96 x 8K (H100,
    benchmarks/RESULTS.md session 35). Checked under the GPU machine's Triton: Triton 3.9 routes
    the K operands through shared memory too (12 KB at d128), and there fewer programs fit."""
    assert [d.name for d in Path(GPU_TRITON).glob("triton-*.dist-info")] == ["triton-3.6.0.dist-info"], GPU_TRITON
    chunked = [p for p in DECODE if "def _k_pair_table(" in p.read_text()]
    records = compile_sm90(*chunked, triton_dir=GPU_TRITON)
    assert records and all(r["ok"] for r in records), [r for r in records if not r["ok"]]
    long = [r for r in records if r["long_partitions"]]
    assert sorted(r["module"] for r in long) == sorted(p.stem for p in chunked)
    for r in long:
        per_sm = int(re.search(r"^PROGRAMS_PER_SM = (\d+)", (DECODE[0].parent / f"{r['module']}.py").read_text(), re.M).group(1))
        shared = r["static_shared"] + r["dynamic_shared"]
        assert per_sm * shared <= SHARED_BYTES_PER_SM, (r["module"], per_sm, r["static_shared"], r["dynamic_shared"])


def test_a_ptx_typo_fails(tmp_path):
    source = (ROOT / "generated" / "tq_decode" / "tq_decode_triton_d64_qg4_bs16.py").read_text()
    assert source.count("lop3.b32 high, a, b, upper, 0xD8;") == 4  # once per byte in _unpack_k_pairs
    bad = tmp_path / "tq_decode_triton_d64_qg4_bs16.py"
    bad.write_text(source.replace("lop3.b32 high, a, b, upper, 0xD8;", "lop3.b32 high, a, b, upper;", 1))
    # the launch that unpacks with byte permutes (the long-partition one reads the pair table)
    decode = next(r for r in compile_sm90(bad) if r["kernel"].endswith("_bs16_kernel"))
    assert not decode["ok"] and "ptxas" in decode["error"].lower(), decode


def test_the_trace_benchmark_instruments_every_decode_module(tmp_path):
    """benchmarks/tq_decode_trace.py edits a copy of a generated module (a trace buffer, %smid,
    %globaltimer and %clock64 read per program): the edit applies to every decode module, and the
    default variant's copy compiles for sm_90 with its inline PTX assembled."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from tq_decode_trace import FIELDS, instrument, summarize
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    for path in DECODE:
        traced = instrument(path.read_text(), f"{path.stem}_kernel")
        assert traced.count("%smid") == 1 and traced.count("trace_ptr + program") == 6, path.stem
        compile(traced, path.name, "exec")
    default = ROOT / "generated" / "tq_decode" / "tq_decode_triton_d128_qg8_bs16.py"
    copy = tmp_path / default.name
    copy.write_text(instrument(default.read_text(), f"{default.stem}_kernel"))
    decodes = [r for r in compile_sm90(copy) if r["kernel"].endswith("_bs16_kernel")]
    assert len(decodes) == 3 and all(r["ok"] for r in decodes), decodes  # 2-warp, long-partition and single-group 4-warp schedules
    # The report, on a made-up trace (2 sequences x 8 kv heads x 3 partitions over 5 of 6 SMs).
    programs = torch.arange(48)
    trace = torch.stack([programs % 5, 1000 + 10 * programs, 51000 + 10 * programs, 0 * programs,
                         100000 + 0 * programs, 8 + programs // 16], dim=1)
    assert trace.shape[1] == len(FIELDS)
    report = "\n".join(summarize(trace.flatten(), 2, 3, 6))
    assert "SMs holding k programs: 0: 1, 9: 2, 10: 3" in report and "part 2: 10 tiles" in report, report
