"""A/B for the next GPU session: short TQ decode launches with the query rotation fused into the
decode kernel, against the shipped three-kernel pipeline (issue 4's 1 x 1K target: not slower
than bf16 SDPA; ours 0.84-0.85x, RESULTS sessions 29 and 34).

Run from the project root on a CUDA machine:
`python benchmarks/tq_decode_fused_rotation.py [--configs 1x1024,2x1024,1x2048,1x4096,4x1024,16x8192]`.

A short decode (single-group partitions in a grid one wave holds: `_launch_chunks` picks
SHORT_CHUNKS) runs rotation -> decode -> merge, and the decode's programs, launched early,
wait for the whole rotation grid before their first tile. The derived module (d128 qg8 bs16
only: the edits below name that module's text) skips the rotation kernel there: each decode
program computes bf16(query . rotation) for its own QG rows with the rotation kernel's
arithmetic (tf32x3 `tl.dot` over ROTATE_CHUNK-row chunks of the matrix, software-pipelined
ROTATE_STAGES deep) into its slice of out_parts, and the bf16 codebook's byte planes into its
exp_sums slice (32 bytes), both of which it writes again at its end; a CTA barrier, then the loop
reads them where the shipped kernel reads q_rot and the codebook. The decode is then the call's
first kernel (no dependent launch); other launches are unchanged. Offline (sm_90, Triton 3.6)
the fused kernel keeps 168 registers without spills and takes 51 KB of shared memory (the
rotation's stages), so 3 programs still fit an SM.

For each config: the derived module's output against the shipped one's (bitwise or max |diff|,
full and ragged lengths), both pipelines' cold-L2 device time (3 interleaved rounds, medians);
then kgen's decode check on the derived module (its short launches are fused).
`tests/test_tq_fused_rotation.py` runs the derivation and the fused launch on CPU.
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

from tq_decode import load as load_generated  # noqa: E402

VARIANT = "tq_decode_triton_d128_qg8_bs16"

# (text of the generated module, its replacement): each must occur exactly once.
EDITS = [
    # kernel arguments
    ("""    max_logits_ptr,
    max_blocks,
    tile_groups,
    qk_scale_log2,
    NUM_KV_HEADS: tl.constexpr,""", """    max_logits_ptr,
    max_blocks,
    tile_groups,
    qk_scale_log2,
    query_ptr,
    rotation_ptr,
    centroids_ptr,
    NUM_KV_HEADS: tl.constexpr,"""),
    ("""    MERGE_EARLY: tl.constexpr,
    INTERPRETER_FIXUPS: tl.constexpr,
):
    # One program: all QG query heads""", """    MERGE_EARLY: tl.constexpr,
    INTERPRETER_FIXUPS: tl.constexpr,
    FUSED_ROTATION: tl.constexpr,
    ROTATE_CHUNK: tl.constexpr,
    ROTATE_STAGES: tl.constexpr,
):
    # One program: all QG query heads"""),
    # prologue
    ("""    if DEPENDENT_LAUNCH:
        tl.extra.cuda.gdc_wait()  # launched early: q_rot and the codebook are the rotation's results

    # Rotated query heads as columns (q^T), even and odd elements apart (they meet the low and
    # high nibbles); the same for every chunk. QK's reduction runs in QK_STEPS steps of two K words
    # per lane, in the order the K loads and the unpacking leave the bytes: pair j of a step is byte
    # k_byte[j] of a K record (lane quad (j >> 2) & 3, word 2 * step + (j & 1), byte
    # 2 * ((j >> 4) & 1) + ((j >> 1) & 1) of that word).
    q_base = q_rot_ptr + (NUM_KV_HEADS * seq * 1024 + kv_head * 1024)
""", """    if FUSED_ROTATION:
        # This program rotates its own QG query rows into its out_parts slice and rounds the
        # codebook into its exp_sums slice (both written again at the end), as the rotation kernel does.
        scratch = out_parts_ptr + (
            seq.to(tl.int64) * NUM_KV_HEADS * NUM_PARTITIONS * 1024
            + NUM_PARTITIONS * kv_head * 1024
            + part * 1024
        )
        rrow = tl.arange(0, 16)
        rcol = tl.arange(0, HEAD_DIM)
        rstep = tl.arange(0, ROTATE_CHUNK)
        rlive = rrow[:, None] < QG
        q_rows = query_ptr + (NUM_KV_HEADS * seq * 1024 + kv_head * 1024)
        q_rot = tl.zeros((16, HEAD_DIM), dtype=tl.float32)
        for c0 in tl.range(0, HEAD_DIM, ROTATE_CHUNK, num_stages=ROTATE_STAGES):
            qc = tl.load(q_rows + rrow[:, None] * HEAD_DIM + (c0 + rstep)[None, :], mask=rlive, other=0.0)
            rc = tl.load(rotation_ptr + (c0 + rstep)[:, None] * HEAD_DIM + rcol[None, :])
            q_rot = tl.dot(qc.to(tl.float32), rc, q_rot, input_precision="tf32x3")
        tl.store(scratch + rrow[:, None] * HEAD_DIM + rcol[None, :], _to_bf16(q_rot, INTERPRETER_FIXUPS), mask=rlive)
        codebook_ptr = (
            exp_sums_ptr + (NUM_KV_HEADS * NUM_PARTITIONS * seq * 8 + NUM_PARTITIONS * kv_head * 8 + part * 8)
        ).to(tl.pointer_type(tl.uint8))
        n = tl.arange(0, N_CENTROIDS)
        entry = _to_bf16(tl.load(centroids_ptr + n), INTERPRETER_FIXUPS).to(tl.uint16, bitcast=True)
        tl.store(codebook_ptr + n, (entry & 0xFF).to(tl.uint8))
        tl.store(codebook_ptr + N_CENTROIDS + n, (entry >> 8).to(tl.uint8))
        tl.debug_barrier()  # the program's own stores, visible to all its threads
        q_base = scratch
    else:
        if DEPENDENT_LAUNCH:
            tl.extra.cuda.gdc_wait()  # launched early: q_rot and the codebook are the rotation's results
        q_base = q_rot_ptr + (NUM_KV_HEADS * seq * 1024 + kv_head * 1024)
"""),
    # host: launch_decode_kernel
    ("""    tiles_per_partition,
    softmax_scale,
):
    \"\"\"First pass only""", """    tiles_per_partition,
    softmax_scale,
    fused=None,
):
    \"\"\"First pass only"""),
    ("""    merge_early = dependent and chunks != SHORT_CHUNKS
    v_ahead = tiles_per_partition >= V_AHEAD_MIN_GROUPS
""", """    merge_early = dependent and chunks != SHORT_CHUNKS
    v_ahead = tiles_per_partition >= V_AHEAD_MIN_GROUPS
    if fused is not None:  # the decode is the first kernel: no dependent launch
        query, rotation, centroids = fused
        decode_dependent = False
    else:
        query, rotation, centroids = q_rot, exp_sums, exp_sums  # unread (FUSED_ROTATION off)
        decode_dependent = dependent
"""),
    ("""            block_table.shape[1],
            tiles_per_partition,
            softmax_scale * LOG2E,
        ),
        (num_kv_heads, num_partitions, chunks, v_ahead),""", """            block_table.shape[1],
            tiles_per_partition,
            softmax_scale * LOG2E,
            query,
            rotation,
            centroids,
        ),
        (num_kv_heads, num_partitions, chunks, v_ahead, fused is not None),"""),
    ("""            DEPENDENT_LAUNCH=dependent,
            MERGE_EARLY=merge_early,
            INTERPRETER_FIXUPS=INTERPRETER_FIXUPS,
            num_warps=chunks,
            num_stages=1,
            launch_pdl=dependent,""", """            DEPENDENT_LAUNCH=decode_dependent,
            MERGE_EARLY=merge_early,
            INTERPRETER_FIXUPS=INTERPRETER_FIXUPS,
            FUSED_ROTATION=fused is not None,
            ROTATE_CHUNK=ROTATE_CHUNK,
            ROTATE_STAGES=ROTATE_STAGES,
            num_warps=chunks,
            num_stages=1,
            launch_pdl=decode_dependent,"""),
    # host: tq_decode
    ("""    q_rot, codebook = rotate_query(
        query, rotation, centroids, decode_early=short
    )  # rotate q once, never the cache
""", """    if short and FUSED_SHORT:
        q_rot, codebook = query, centroids.view(torch.uint8)  # unread: the decode rotates its own rows
    else:
        q_rot, codebook = rotate_query(
            query, rotation, centroids, decode_early=short
        )  # rotate q once, never the cache
"""),
    ("""        tile_groups,
        scale,
    )
    if num_partitions == 1:
        return output""", """        tile_groups,
        scale,
        fused=(query, rotation, centroids) if short and FUSED_SHORT else None,
    )
    if num_partitions == 1:
        return output"""),
    ("""PTX_UNPACK = not INTERPRETER_FIXUPS and torch.version.hip is None
""", """PTX_UNPACK = not INTERPRETER_FIXUPS and torch.version.hip is None
FUSED_SHORT = True  # lab: short launches rotate in the decode kernel
"""),
]


def derive(source: str) -> str:
    """The fused-rotation module's text from the generated module's."""
    for old, new in EDITS:
        if source.count(old) != 1:
            raise ValueError(f"{VARIANT}: expected one occurrence of {old.strip().splitlines()[0]!r}, found {source.count(old)} (the generated module changed)")
        source = source.replace(old, new)
    return source


def load(source: str | None = None):
    """The generated module, or one derived from it."""
    return load_generated(VARIANT, source, "fused")


def main() -> None:
    from timing import cold_l2_us
    from tq_decode import HK, random_decode_inputs

    from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids
    from kgen.spec import load_spec
    from kgen.verify import tq as verify_tq

    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default="1x1024,2x1024,1x2048,1x4096,4x1024,16x8192", help="SEQSxCONTEXT,...")
    args = parser.parse_args()
    shipped = load()
    fused = load(derive((ROOT / "generated" / "tq_decode" / f"{VARIANT}.py").read_text()))
    store = load_generated(f"tq_store_d{shipped.HEAD_DIM}_bs{shipped.BS}")
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    centroids, rotation = lloyd_max_centroids(shipped.HEAD_DIM).to(dev), hadamard_rotation(shipped.HEAD_DIM).to(dev)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {VARIANT}; whole pipeline, us, cold L2, medians of 3 rounds", flush=True)
    forms = {"shipped": shipped, "fused": fused}
    for num_seqs, ctx in (tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")):
        q, cache, table, seq_lens = random_decode_inputs(shipped, store, num_seqs, ctx, g, centroids, rotation)
        ragged = torch.randint(0, ctx + 1, seq_lens.shape, device=dev, generator=g).int()
        diff, equal = 0.0, True
        for lens in (seq_lens, ragged):
            want = shipped.tq_decode(q, cache, table, lens, centroids, rotation)
            got = fused.tq_decode(q, cache, table, lens, centroids, rotation)
            diff = max(diff, (got.float() - want.float()).abs().max().item())
            equal &= torch.equal(got, want)
        times = {f: [] for f in forms}
        for _ in range(3):
            for f, m in forms.items():
                times[f].append(cold_l2_us(lambda: m.tq_decode(q, cache, table, seq_lens, centroids, rotation)))
        med = {f: statistics.median(v) for f, v in times.items()}
        plan = shipped.decode_partitions(table.shape[1], num_seqs, HK, q.device)
        short = shipped._launch_chunks(num_seqs, HK, *plan, q.device) == shipped.SHORT_CHUNKS
        print(f"{num_seqs:3d} x {ctx:6d} ({'fused' if short else 'not short: unchanged'}): shipped {med['shipped']:.1f}, fused {med['fused']:.1f} "
              f"({med['shipped'] / med['fused']:.3f}x); {'bitwise equal' if equal else f'max |diff| {diff:.1e}'}", flush=True)
        del cache
    results = verify_tq.check_decode(fused, load_spec(ROOT / "specs" / "tq_decode.yaml"), dev)
    fails = [r for r in results if not r["ok"]]
    print(f"kgen decode check of the fused module: {len(results) - len(fails)} of {len(results)} ok, max abs {max(r['max_abs'] for r in results):.2e}", flush=True)
    for r in fails:
        print("   ", r, flush=True)


if __name__ == "__main__":
    main()
