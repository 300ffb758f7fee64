"""Subprocess: compile one generated FlyDSL module for the target named by FLYDSL_GPU_ARCH.

The parent (kgen.verify.flydsl) sets COMPILE_ONLY and the dump directory; this process calls the
module's kernel launcher with CPU tensors of the contract's shapes, which traces and compiles
the kernel without a GPU, then prints the kernel's symbol name as JSON.
Usage: python -m kgen.verify.flydsl_worker MODULE.py
"""

from __future__ import annotations

import importlib.util
import json
import sys


def main(path: str) -> int:
    import torch

    spec = importlib.util.spec_from_file_location("kgen_flydsl_variant", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    # Representative launch-time sizes (they are compile-time constants of the kernel).
    num_seqs, num_kv_heads, max_blocks = 1, 8, 512
    num_partitions, tiles_per_partition = mod.partition_plan(max_blocks)
    qg, d = mod.QG, mod.HEAD_DIM
    mod.launch_decode_kernel(
        q_rot=torch.zeros(num_seqs, num_kv_heads * qg, d, dtype=torch.bfloat16),
        kv_cache=torch.zeros(4, mod.cache_block_bytes(num_kv_heads), dtype=torch.uint8),
        centroids=torch.zeros(mod.N_CENTROIDS, dtype=torch.float32),
        block_table=torch.zeros(num_seqs, max_blocks, dtype=torch.int32),
        seq_lens=torch.zeros(num_seqs, dtype=torch.int32),
        out_parts=torch.zeros(num_seqs, num_kv_heads, num_partitions, qg, d, dtype=torch.bfloat16),
        exp_sums=torch.zeros(num_seqs, num_kv_heads, num_partitions, qg, dtype=torch.float32),
        max_logits=torch.zeros(num_seqs, num_kv_heads, num_partitions, qg, dtype=torch.float32),
        tiles_per_partition=tiles_per_partition,
        softmax_scale=1.0 / d**0.5,
    )
    print(json.dumps({"kernel": mod.KERNEL_NAME}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
