"""Compile generated Triton kernels for sm_90 without a GPU: `python tests/sm90_compile.py PATH...`
(TQ decode modules: rotation, decode and merge; MSDA modules: the forward of each size class).

Run in a process without TRITON_INTERPRET (the kernels must be JIT functions). Each module's
launch functions are called with small CPU tensors while `_run` is replaced by a recorder, so
the kernels get exactly the compile-time constants and launch options the module would use;
each recorded kernel is then compiled by Triton's own NVIDIA backend (its bundled ptxas
assembles the inline PTX) and its resource use read from the cubin. Prints one JSON line per
kernel after MARK (Triton prints a failing kernel's PTX to stdout): module, kernel, ok, registers,
stack bytes (spills), the register cap asked for, the griddepcontrol instructions in its PTX and
the 16-byte global loads issued before its first griddepcontrol.wait, error.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget

ROOT = Path(__file__).resolve().parents[1]
TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
POINTER_TYPES = {torch.uint8: "*u8", torch.int32: "*i32", torch.int64: "*i64", torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}
LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg", "launch_pdl")
MARK = "kgen-sm90: "


def load(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record_launches(module) -> list[tuple]:
    """(kernel, run-time args, options) of every launch one small decode makes, as on an sm_90 GPU
    (the kernels after the first launched as programmatic dependents)."""
    launches = []
    module._run = lambda kernel, grid, args, variant, options: launches.append((kernel, args, options()))
    module._dependent_launch = lambda device: True
    d, qg, hk, num_seqs, max_blocks = module.HEAD_DIM, module.QG, 2, 2, 4
    query = torch.zeros(num_seqs, hk * qg, d, dtype=torch.bfloat16)
    rotation, centroids = torch.eye(d), torch.zeros(module.N_CENTROIDS)
    short = hasattr(module, "SHORT_CHUNKS")  # then the rotation lets a single-group decode launch early
    q_rot, codebook = module.rotate_query(query, rotation, centroids, decode_early=short)  # columns split, as in small batches
    module._rotate_columns = lambda rows, device: module.HEAD_DIM  # whole rows, as in large batches
    module.rotate_query(query, rotation, centroids)
    parts = 2
    out_parts = torch.zeros(num_seqs, hk, parts, qg, d, dtype=torch.bfloat16)
    exp_sums = torch.zeros(num_seqs, hk, parts, qg)
    cache = torch.zeros(8, module.cache_block_bytes(hk), dtype=torch.uint8)
    table = torch.zeros(num_seqs, max_blocks, dtype=torch.int32)
    seq_lens = torch.zeros(num_seqs, dtype=torch.int32)
    module.launch_decode_kernel(q_rot, cache, codebook, table, seq_lens, out_parts, exp_sums, exp_sums.clone(), 1, 0.1)
    if hasattr(module, "LONG_PARTITION_GROUPS"):  # the chunked form's schedule of long partitions
        module.launch_decode_kernel(q_rot, cache, codebook, table, seq_lens, out_parts, exp_sums, exp_sums.clone(), module.LONG_PARTITION_GROUPS, 0.1)
    if short:  # the schedule of single-group launches, which a GPU picks
        module._short_wave = lambda device: 1 << 30
        module.launch_decode_kernel(q_rot, cache, codebook, table, seq_lens, out_parts, exp_sums, exp_sums.clone(), 1, 0.1)
    module.merge_partitions(out_parts, exp_sums, exp_sums.clone(), torch.zeros_like(query))
    return launches


def record_msda_launches(module) -> list[tuple]:
    """(kernel, run-time args, options) of the forward launch of each size class of an MSDA module."""
    launches = []
    module._run = lambda kernel, grid, args, variant, options: launches.append((kernel, args, options()))
    heads, head_dim, levels, points = module.HEADS, module.HEAD_DIM, module.LEVELS, module.POINTS
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f64": torch.float64}[module.__name__.split("_")[2]]
    smaller = 0  # B*Q of the class below: the last class (max None) takes everything past it
    for _, max_rows, *_ in module.SCHEDULES:
        queries, smaller = (smaller + 1, smaller) if max_rows is None else (max_rows, max_rows)  # B = 1
        shapes = torch.ones(levels, 2, dtype=torch.int64)
        value = torch.zeros(1, levels, heads, head_dim, dtype=dtype)
        locations = torch.zeros(1, queries, heads, levels, points, 2, dtype=dtype)
        weights = torch.zeros(1, queries, heads, levels, points, dtype=dtype)
        module._forward_impl(value, shapes, torch.arange(levels), locations, weights)
    return launches


def compile_kernel(kernel, args, options):
    """The kernel compiled for sm_90 as the recorded launch would compile it (Triton's result)."""
    names = kernel.arg_names
    constexprs = {k: v for k, v in options.items() if k not in LAUNCH_OPTIONS}
    signature, attrs = {}, {}
    runtime = iter(args)
    for i, name in enumerate(names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        value = next(runtime)
        if isinstance(value, torch.Tensor):
            signature[name] = POINTER_TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if isinstance(value, float) else "i32"
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    launch = {k: options[k] for k in LAUNCH_OPTIONS if k in options}
    return triton.compile(source, target=TARGET, options=launch)


def cuobjdump(compiled, flag: str) -> str:
    """cuobjdump's report (flag: --dump-resource-usage, -sass, ...) on a compiled kernel's cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([str(CUOBJDUMP), flag, f.name], capture_output=True, text=True, check=True).stdout


def resource_usage(compiled, options) -> dict:
    """What MARK reports of a compiled kernel: its resource use and the facts of its PTX."""
    usage = cuobjdump(compiled, "--dump-resource-usage")
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)), "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
            # shared memory: the kernel's static variables with the 1 KB the driver keeps per program
            # (sm_90; cuobjdump counts it), and what Triton asks for at launch
            "static_shared": int(re.search(r"SHARED:(\d+)", usage).group(1)), "dynamic_shared": compiled.metadata.shared,
            "long_partitions": options.get("K_PAIR_TABLE"),
            "maxnreg": options.get("maxnreg"), "grid_dependency": sorted(set(re.findall(r"griddepcontrol\.(\w+)", compiled.asm["ptx"]))),
            "vector_loads_before_wait": compiled.asm["ptx"].split("griddepcontrol.wait")[0].count("ld.global.v4")}


def main() -> None:
    for path in map(Path, sys.argv[1:]):
        name = path.stem
        module = load(path)
        for kernel, args, options in (record_msda_launches if name.startswith("msda_") else record_launches)(module):
            record = {"module": name, "kernel": kernel.__name__}
            try:
                record.update(ok=True, **resource_usage(compile_kernel(kernel, args, options), options))
            except Exception as e:  # reported with the kernel's name; the test fails on it
                record.update(ok=False, error=f"{type(e).__name__}: {str(e)[:2000]}")
            print(MARK + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
