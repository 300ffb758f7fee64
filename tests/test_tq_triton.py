"""Generated Triton TQ modules (decode and store) under the interpreter, against kgen.reference.tq.

The variants are rendered here straight from the spec (lower + render), so these tests do not
depend on every template of the spec (the FlyDSL one) being present; the numerical checks are
the ones `kgen build` / `kgen verify` run (kgen.verify.tq).
"""

from __future__ import annotations

import ast
import math
import sys

import pytest
import torch

from conftest import ROOT, JitStandIn, load_module
from kgen.ops import tq_decode
from kgen.reference import tq as ref
from kgen.render import render
from kgen.spec import load_spec
from kgen.verify import tq as verify_tq

SPEC = load_spec(ROOT / "specs" / "tq_decode.yaml")
VARIANTS = {v.name: v for v in tq_decode.variants(SPEC) if v.values["backend"] == "triton"}
DECODE = sorted(n for n, v in VARIANTS.items() if v.values["kind"] == "decode")
STORE = sorted(n for n, v in VARIANTS.items() if v.values["kind"] == "store")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """name -> (path, source) of every rendered Triton variant."""
    out = tmp_path_factory.mktemp("tq_triton")
    rendered = {}
    for name, variant in VARIANTS.items():
        text = render(tq_decode.template_for(variant), {"p": tq_decode.lower(SPEC, variant)}, name)
        path = out / f"{name}.py"
        path.write_text(text)
        rendered[name] = (path, text)
    return rendered


@pytest.fixture(scope="module")
def modules(sources):
    return {name: load_module(path) for name, (path, _) in sources.items()}


def _failures(results):
    return [r for r in results if not r["ok"]]


def test_variants_are_the_expected_ones():
    shipped = ((64, (4, 7)), (128, (4, 6, 7, 8, 16)), (256, (4, 7)))  # specs/tq_decode.yaml says why
    assert DECODE == sorted(f"tq_decode_triton_d{d}_qg{qg}_bs{bs}" for d, qgs in shipped for qg in qgs for bs in (16, 32))
    assert STORE == sorted(f"tq_store_d{d}_bs{bs}" for d in (64, 128, 256) for bs in (16, 32))


def test_resident_programs_follow_each_scheduler_s_registers():
    """A warp's registers come from its scheduler's quarter of the SM's 65536, in units of 256, so
    2-warp programs at 200 registers fit 4 an SM (ncu: "Block Limit Registers 4", H100, session
    38), not the 5 that the SM's total alone gives; 168 is the most that fits 3 warps a scheduler."""
    from kgen.ops.tq_triton import _programs_per_sm

    assert [_programs_per_sm(2, r) for r in (128, 168, 169, 200, None)] == [8, 6, 4, 4, 4]
    assert [_programs_per_sm(4, r) for r in (128, 168, 200, None)] == [4, 3, 2, 2]


def test_head_dim_shapes_the_derived_numbers(sources):
    """What head_dim re-derives in the Triton modules: packed bytes per record, the tile of the
    decode loop and its register cap (both measured per head dim), the store's blocks of
    rotation columns, and the cache block size of the host code."""
    for name, variant in VARIANTS.items():
        plan = tq_decode.lower(SPEC, variant)
        d, c = plan.consts["HEAD_DIM"], plan.consts
        assert c["PAIRS"] == d // 2
        if variant.values["kind"] == "decode":
            # the register cap up to d128's tile of packed bytes (d256 spills under it); the
            # chunked d128 loop holds the next two tiles' loads in registers (200) and runs 2-warp
            # programs of 64-token tiles, 4 an SM (H200 and H100, sessions 24, 37 and 38); the rest 4 warps
            chunked_d128 = d == 128 and c["QG"] <= 8
            assert (c["TILE_TOKENS"], c["NUM_WARPS"]) == ((64, 2) if chunked_d128 else (128, 4))
            assert c["TILE_TOKENS"] * c["PAIRS"] <= 128 * 128
            assert c["MAX_REGISTERS"] == (200 if chunked_d128 else {64: 128, 128: 128, 256: None}[d])
            assert c["PROGRAMS_PER_SM"] == (4 if chunked_d128 else {128: 4, None: 2}[c["MAX_REGISTERS"]])
            # ... and where that is 2, 4-warp programs for launches of single-group partitions
            assert c["SHORT_CHUNKS"] == (4 if chunked_d128 else None)
            assert (f"num_warps={c['NUM_WARPS']}," if c["SHORT_CHUNKS"] is None else "num_warps=chunks,") in sources[name][1]
            # one softmax state per warp up to 8 query heads, with the lane plan of d64 and d128
            # (one or two V words per lane); d256 measured slower with it (session 16)
            assert c["CHUNKED"] == (c["QG"] <= 8 and d <= 128)
            if c["CHUNKED"]:
                assert c["Q_COLS"] == 8 and c["CHUNKS"] == c["NUM_WARPS"] and c["TILE_TOKENS"] // c["CHUNKS"] == 32
                assert (c["K_VEC"], c["V_WORDS"]) == (d // 8, d // 64)
                assert (c["K_WORDS"], c["QK_STEPS"], c["STEP_PAIRS"]) == (d // 32, d // 64, 32)
                assert c["NUM_STAGES"] == 1 and "Q_ROWS" not in c
            else:
                assert c["Q_ROWS"] == 16 and c["NUM_STAGES"] == 2 and "Q_COLS" not in c
            # the q rotation's 32-row chunks all in flight up to 4 of them (d256: 4 x 33 KB of
            # shared memory), and the kernel's loop pipelined that deep
            assert (c["ROTATE_CHUNK"], c["ROTATE_STAGES"]) == (32, {64: 2, 128: 4, 256: 4}[d])
            assert "tl.range(0, HEAD_DIM, ROTATE_CHUNK, num_stages=ROTATE_STAGES)" in sources[name][1]
        else:
            # rotation columns in blocks of 8192 fp32 elements, two blocks' loads in flight at once;
            # small stores split a block of tokens' K over a divisor of COL_BLOCKS programs
            assert (c["ROT_PAIRS"], c["COL_BLOCKS"], c["ROT_STAGES"]) == {64: (32, 1, 1), 128: (32, 2, 2), 256: (16, 8, 2)}[d]
            assert c["KEY_SPLITS"] == {64: (1,), 128: (1, 2), 256: (1, 2, 4, 8)}[d]
            assert "tl.range(first_block, first_block + num_blocks, num_stages=ROT_STAGES)" in sources[name][1]
            # one wave: 2 programs of 4 warps at 255 registers a thread fill an SM's 64K registers
            assert c["PROGRAMS_PER_SM"] == 2
        text = sources[name][1]
        if variant.values["kind"] == "store":
            # ptxas's own register choice gave d256 32 registers and 3x the time (H200, session 7)
            assert c["MAX_REGISTERS"] == 255 and "maxnreg=255," in text
        assert f"HEAD_DIM = {d}\n" in text and f"PAIRS = {d // 2} " in text


def test_generated_code_is_self_contained_and_derived(sources):
    for name, (_, text) in sources.items():
        tree = ast.parse(text)
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        # the standard library, torch and triton only: a generated module runs without kgen
        assert imported <= {"functools", "math", "os", "torch", "triton"}, (name, imported)
        kernel = text[text.index(f"def {name}_kernel(") :]
        if "def _load_k_tile(" in text:  # the chunked form loads K and the metadata in a helper
            kernel = text[text.index("def _load_k_tile(") :]
        # 64-bit arithmetic exactly where the plan proves it is needed: the cache block's base,
        # and the out_parts base when QG * HEAD_DIM makes it pass 2^31 at the declared maxima.
        plan = tq_decode.lower(SPEC, VARIANTS[name])
        bits = {w.name: w.bits for w in plan.widths}
        wide = [line.strip() for line in kernel.splitlines() if "tl.int64" in line and "token.to(tl.int64)" not in line]
        expected = ["block.to(tl.int64) * NUM_KV_HEADS * "]
        if VARIANTS[name].values["kind"] == "decode" and plan.consts["CHUNKED"]:
            # the chunked form's K and V loads form their own blocks' bases (one per 16-token run);
            # the helper that loads K and the metadata comes first
            expected += ["+ (k_block.to(tl.int64) * NUM_KV_HEADS * ", "+ (v_block.to(tl.int64) * NUM_KV_HEADS * "]
        if VARIANTS[name].values["kind"] == "decode" and bits["out_parts_base"] == 64:
            expected.append("seq.to(tl.int64) * NUM_KV_HEADS * NUM_PARTITIONS * ")
        assert [next((e for e in expected if line.startswith(e)), line) for line in wide] == expected, (name, wide)
        block = plan.offsets["block_bytes"].subs({tq_decode.index_symbol("Hk"): 1})
        assert f"NUM_KV_HEADS * {block}" in kernel, name


@pytest.mark.parametrize("name", DECODE)
def test_decode_matches_reference(modules, name):
    results = verify_tq.check_decode(modules[name], SPEC, "cpu")
    # the chunked form's cases run twice: as launched, then in the long-partition schedule
    runs = 2 if hasattr(modules[name], "LONG_PARTITION_GROUPS") else 1
    assert len(results) == runs * (len(SPEC.options.cases) + 1)
    assert sum(r["case"].startswith("long-partition schedule (forced)") for r in results) == (runs - 1) * (len(SPEC.options.cases) + 1)
    assert not _failures(results), _failures(results)
    assert max(r["max_abs"] for r in results) < SPEC.options.tolerance.atol


@pytest.mark.parametrize("name", STORE)
def test_store_bytes_match_reference(modules, name):
    """fp32/bf16/fp16 inputs, norm correction on and off, padding slots, exact ties, unsorted
    centroids with an identity rotation, strided k/v, under every schedule (whole programs, K
    split over each divisor of COL_BLOCKS with V apart): the bytes are identical here."""
    mod = modules[name]
    results = verify_tq.check_store(mod, SPEC, "cpu")
    schedules = {r["case"].split("; ")[1] for r in results}
    assert schedules == {"whole programs", "K over 1 program, V apart"} | {f"K over {n} programs, V apart" for n in mod.KEY_SPLITS[1:]}
    assert not _failures(results), _failures(results)
    assert all(r["detail"] == "bytes identical" for r in results), results


def test_store_schedule_splits_small_stores_within_one_wave(modules):
    """store_parts: the most K programs (a divisor of COL_BLOCKS, V apart) whose grid fits one wave
    of resident programs; whole programs past that, off the GPU, and K whole under norm correction.
    d256 (8 column blocks) at Hk 8 on a 132-SM H200 (264 resident programs)."""
    parts = modules["tq_store_d256_bs16"].store_parts
    # 16-token programs x 8 heads x (parts + 1) <= 264 at the edges of each size class
    tokens = (1, 48, 49, 96, 97, 176, 177, 256, 257, 65536)
    assert [parts(n, 8, False, 264) for n in tokens] == [8, 8, 4, 4, 2, 2, 1, 1, 0, 0]
    assert [parts(n, 8, True, 264) for n in (1, 256, 257)] == [1, 1, 0]
    assert parts(1, 8, False, 0) == 0  # no GPU (the interpreter): whole programs
    assert [parts(1, hk, False, 264) for hk in (64, 88, 89, 132, 133)] == [2, 2, 1, 1, 0]
    assert modules["tq_store_d64_bs16"].store_parts(1, 8, False, 264) == 1  # one column block: V apart only


def test_store_skips_padding_slots_and_leaves_other_bytes(modules):
    mod = modules["tq_store_d128_bs16"]
    cache = torch.full((3, mod.cache_block_bytes(2)), 0xAB, dtype=torch.uint8)
    k = torch.randn(4, 2, 128)
    mod.tq_store(cache, k, k.clone(), torch.tensor([-1, 5, -7, 40]), ref.lloyd_max_centroids(128), ref.hadamard_rotation(128))
    want = torch.full_like(cache, 0xAB)
    ref.store(want, k[[1, 3]], k[[1, 3]], torch.tensor([5, 40]), block_size=16, centroids=ref.lloyd_max_centroids(128),
              rotation=ref.hadamard_rotation(128))
    assert torch.equal(cache, want)


def test_store_with_repeated_centroids_matches_reference_bytes(modules):
    """The kernel sorts the centroids itself: repeated entries keep their index order (a stable
    sort, as the reference's), so values just above and just below a repeated centroid get the
    last and the first of its indices, bit for bit as the reference stores them."""
    mod = modules["tq_store_d64_bs16"]
    gen = torch.Generator().manual_seed(3)
    centroids = ref.lloyd_max_centroids(64)[torch.randperm(16, generator=gen)]
    centroids[[2, 9, 13]] = centroids[5].item()  # four equal entries at scattered indices
    centroids[0] = -0.0
    rotation = ref.hadamard_rotation(64)
    k, v = torch.randn(48, 2, 64, generator=gen), torch.randn(48, 2, 64, generator=gen)
    slots = torch.randperm(4 * 16, generator=gen)[:48]
    ours = torch.full((4, mod.cache_block_bytes(2)), 0xAB, dtype=torch.uint8)
    theirs = ours.clone()
    mod.tq_store(ours, k, v, slots, centroids, rotation)
    ref.store(theirs, k, v, slots, block_size=16, centroids=centroids, rotation=rotation)
    assert torch.equal(ours, theirs)
    stored = set(ref.quantize_keys(k, centroids, rotation)[0].unique().tolist())
    # both ends of the repeated run were stored (the first below it, the last above it), the
    # middle ones never: so a kernel that ordered the run otherwise would have written other bytes
    assert {2, 13} <= stored and not {5, 9} & stored, stored


def test_single_group_partitions_run_programs_of_four_warps(modules, monkeypatch):
    """The chunked d128 decode runs 2-warp programs, but a launch whose partitions are single
    256-token groups, in a grid one wave of 4-warp programs holds, runs those (1 x 1K to 1 x 4K
    and 4 x 1K measured faster so, kgen/ops/tq_triton.py); each schedule passes the variant's
    whole check under the interpreter, both in one run."""
    mod = modules["tq_decode_triton_d128_qg8_bs16"]
    assert (mod.CHUNKS, mod.SHORT_CHUNKS, mod.SHORT_PROGRAMS_PER_SM) == (2, 4, 2)  # 2 warps of 200 registers a scheduler
    assert not hasattr(modules["tq_decode_triton_d64_qg4_bs16"], "SHORT_CHUNKS")  # 4 warps already
    assert not hasattr(modules["tq_decode_triton_d128_qg16_bs16"], "SHORT_CHUNKS")  # the shared-tile form
    cpu = torch.device("cpu")
    assert mod._launch_chunks(1, 8, 4, 1, cpu) == 2  # off the GPU: no wave to fit
    monkeypatch.setattr(mod, "_short_wave", lambda device: 396)  # an H200: 132 SMs x 3
    assert mod._launch_chunks(1, 8, 4, 1, cpu) == 4  # 1 x 1K: 32 programs of one group
    assert mod._launch_chunks(4, 8, 16, 1, cpu) == 2  # 512 programs: past one wave of 4-warp programs
    assert mod._launch_chunks(64, 8, 1, 4, cpu) == 2  # partitions of 4 groups
    # Numerics: with a wave that holds any grid, single-group launches run 4 warps, and the
    # check's launches of longer partitions 2.
    monkeypatch.setattr(mod, "_short_wave", lambda device: 10**6)
    kernel = JitStandIn(mod.tq_decode_triton_d128_qg8_bs16_kernel)
    monkeypatch.setattr(mod, "tq_decode_triton_d128_qg8_bs16_kernel", kernel)
    results = verify_tq.check_decode(mod, SPEC, "cpu")
    assert not _failures(results), _failures(results)
    shapes = {(o["CHUNKS"], o["TILE_TOKENS"], o["num_warps"]) for o in (c.options for c in kernel.compiled)}
    assert shapes == {(4, 128, 4), (2, 64, 2)}, shapes


def test_small_rotations_split_over_columns(modules, sources, tmp_path, monkeypatch):
    """rotate_query's programs take HEAD_DIM columns, halved down to ROTATE_MIN_COLS while the grid
    stays within ROTATE_PROGRAMS_PER_SM programs an SM (measured in kgen/ops/tq_triton.py); the
    interpreter runs the finest split. Every split gives the same bits as whole rows, for a
    ragged row count, and a planted column offset fails."""
    cpu = torch.device("cpu")
    d128, d256 = modules["tq_decode_triton_d128_qg8_bs16"], modules["tq_decode_triton_d256_qg4_bs16"]
    assert d128._rotate_columns(4096, cpu) == d256._rotate_columns(64, cpu) == 32  # off the GPU: finest
    for mod in (d128, d256):
        monkeypatch.setattr(mod, "_multiprocessors", lambda device: 132)
    assert [d128._rotate_columns(rows, cpu) for rows in (64, 1024, 2048, 4096)] == [32, 32, 64, 128]
    assert [d256._rotate_columns(rows, cpu) for rows in (32, 512, 2048, 8192)] == [32, 32, 128, 256]
    monkeypatch.undo()
    g = torch.Generator().manual_seed(7)
    for mod in (d128, d256):
        d = mod.HEAD_DIM
        query = torch.randn(3, 8, d, generator=g).bfloat16()  # 24 rows: not a multiple of ROTATE_ROWS
        rotation = torch.linalg.qr(torch.randn(d, d, generator=g))[0].contiguous()
        centroids = torch.randn(mod.N_CENTROIDS, generator=g).sort().values
        split = mod.rotate_query(query, rotation, centroids)
        expected = query.double() @ rotation.double()
        assert (split[0].double() - expected).abs().max() <= 2**-7 * expected.abs().max()  # bf16 rounding
        for cols in (64, d):
            monkeypatch.setattr(mod, "_rotate_columns", lambda rows, device, c=cols: c)
            wider = mod.rotate_query(query, rotation, centroids)
            assert torch.equal(wider[0], split[0]) and torch.equal(wider[1], split[1]), (d, cols)
        monkeypatch.undo()
    planted = _planted(sources, tmp_path, "tq_decode_triton_d128_qg8_bs16",
                       "col = tl.program_id(1) * ROTATE_COLS + tl.arange(0, ROTATE_COLS)", "col = tl.arange(0, ROTATE_COLS)")
    query = torch.randn(1, 8, 128, generator=g).bfloat16()
    rotation = torch.linalg.qr(torch.randn(128, 128, generator=g))[0].contiguous()
    q_rot, _ = planted.rotate_query(query, rotation, torch.randn(planted.N_CENTROIDS, generator=g))
    assert not torch.allclose(q_rot.double(), query.double() @ rotation.double(), atol=0.05)


def test_host_checks_of_the_shared_code(modules):
    """What the FlyDSL variants are checked with: partition plan, validation, merge."""
    results = verify_tq.check_host(modules["tq_decode_triton_d128_qg8_bs32"], SPEC, "cpu")
    assert len(results) == 4 and not _failures(results), _failures(results)


def _groups_spanned(width, mod):
    """GROUP-token groups a table of `width` blocks spans, at least 1: counted here, not by the
    module's table_groups, so the oracle below does not share what it checks."""
    tokens = width * mod.BS
    return max(1, (tokens + mod.GROUP - 1) // mod.GROUP)


def _fewest_waves_then_most_partitions(width, heads, resident, mod):
    """decode_partitions' rule by brute force over every partition count: the fewest waves that
    some count fills to ONE_WAVE_FILL (one wave) or WAVE_FILL, else the finest split; then the most
    partitions within those waves."""
    groups = _groups_spanned(width, mod)
    most, _ = mod.partition_plan(width)
    splits = {-(-groups // -(-groups // p)) for p in range(1, most + 1)}  # no partition left empty
    waves = {p: -(-heads * p // resident) for p in splits}
    passing = [p for p in splits
               if heads * p >= (mod.ONE_WAVE_FILL if waves[p] == 1 else mod.WAVE_FILL) * waves[p] * resident]
    fewest = min(waves[p] for p in passing) if passing else waves[max(splits)]
    return max(p for p in splits if waves[p] <= fewest)


def test_decode_partitions_fill_waves_and_cover_the_table(modules, monkeypatch):
    """decode_partitions takes the fewest waves of resident programs its grid fills well, and the
    most partitions those waves hold; every split covers the table with no empty partition."""
    mod = modules["tq_decode_triton_d128_qg8_bs16"]
    assert mod.PROGRAMS_PER_SM == 4  # 2 warps of 200 registers in each scheduler's 16384
    assert modules["tq_decode_triton_d64_qg4_bs16"].PROGRAMS_PER_SM == 4  # 128 registers
    assert modules["tq_decode_triton_d256_qg4_bs16"].PROGRAMS_PER_SM == 2  # uncapped: up to 255 registers
    cpu = torch.device("cpu")
    assert mod.decode_partitions(2048, 1, 8, cpu) == mod.partition_plan(2048)  # no waves off the GPU
    # The choices measured on an H100 (132 SMs x 4 programs), session 39: (num_seqs, context) -> P
    monkeypatch.setattr(mod, "_resident_programs", lambda device: 528)
    measured = {(1, 32768): 64, (3, 32768): 22, (5, 32768): 13, (9, 32768): 7, (12, 32768): 5,
                (16, 32768): 4, (64, 32768): 1, (16, 8192): 4, (20, 8192): 3, (24, 8192): 2,
                (36, 8192): 5, (40, 8192): 3, (72, 8192): 4, (128, 8192): 1, (1, 1024): 4}
    for (seqs, ctx), expected in measured.items():
        assert mod.decode_partitions(ctx // mod.BS, seqs, 8, cpu)[0] == expected, (seqs, ctx)
    for resident in (4, 24, 396, 528):
        monkeypatch.setattr(mod, "_resident_programs", lambda device, r=resident: r)
        for width in (0, 1, 15, 16, 17, 64, 511, 512, 2048, 2049, 16384):
            shared_p, _ = mod.partition_plan(width)
            groups = _groups_spanned(width, mod)
            assert mod.table_groups(width) == groups
            for seqs, heads in ((1, 1), (1, 8), (3, 2), (5, 8), (16, 8), (40, 8), (64, 8), (1024, 64)):
                p, tgpp = mod.decode_partitions(width, seqs, heads, cpu)
                assert 1 <= p <= shared_p and p * tgpp * mod.GROUP >= width * mod.BS
                assert (p - 1) * tgpp < groups  # the last partition holds tokens
                assert p == _fewest_waves_then_most_partitions(width, seqs * heads, resident, mod)


def test_decode_with_coarsened_partitions_matches_reference(modules, monkeypatch):
    """The GPU's choice of fewer, longer partitions (several tile groups per program, any count),
    forced here under the interpreter by a small wave."""
    mod = modules["tq_decode_triton_d128_qg7_bs32"]
    monkeypatch.setattr(mod, "_resident_programs", lambda device: 6)
    # the spec's first case (6 sequences, 2 kv heads, a 24-block table) now runs in 1 partition, not 4
    assert mod.decode_partitions(24, 6, 2, torch.device("cpu")) == (1, 3) and mod.partition_plan(24)[0] == 4
    # A single partition is written straight into the output; only P > 1 runs the merge.
    decoded, merged = [], []
    launch, merge = mod.launch_decode_kernel, mod.merge_partitions
    monkeypatch.setattr(mod, "launch_decode_kernel", lambda *a: decoded.append(a[5].shape[2]) or launch(*a))
    monkeypatch.setattr(mod, "merge_partitions", lambda *a: merged.append(a[0].shape[2]) or merge(*a))
    results = verify_tq.check_decode(mod, SPEC, "cpu")
    assert not _failures(results), _failures(results)
    assert 1 in decoded and merged == [p for p in decoded if p > 1], (decoded, merged)
    assert any(p & (p - 1) for p in merged), decoded  # a count that is not a power of two, merged


@pytest.mark.parametrize("name", ["tq_decode_triton_d128_qg8_bs16", "tq_decode_triton_d64_qg4_bs32"])
def test_decode_with_long_partition_schedule_matches_reference(modules, monkeypatch, name):
    """Long partitions load V a tile ahead (V_AHEAD), as K is, and look K up in the byte-pair
    table (K_PAIR_TABLE; the interpreter runs the plain arm, its word/nibble trade included):
    forced here for every launch, coarsened partitions included, against the reference; the
    launches record the flags. (check_decode also runs its cases once more with it forced.)"""
    mod = modules[name]
    assert mod.LONG_PARTITION_GROUPS > 1
    flags = []
    run = mod._run
    monkeypatch.setattr(mod, "LONG_PARTITION_GROUPS", 1)
    monkeypatch.setattr(mod, "_run", lambda kernel, grid, args, variant, options: flags.append((options().get("V_AHEAD"), options().get("K_PAIR_TABLE"))) or run(kernel, grid, args, variant, options))
    results = verify_tq.check_decode(mod, SPEC, "cpu")
    monkeypatch.setattr(mod, "_resident_programs", lambda device: 6)  # fewer, longer partitions
    results += verify_tq.check_decode(mod, SPEC, "cpu")
    assert not _failures(results), _failures(results)
    assert set(flags) - {(None, None)} == {(True, True)}, flags  # (None, None): the rotation and the merge
    assert mod.LONG_PARTITION_GROUPS == 1  # check_decode puts back what it forces


def _reusing_compiled(module, monkeypatch, *kernels):
    """`module` as on an NVIDIA GPU, launches of `kernels` (names) counted by JitStandIn."""
    assert not module._REUSE_COMPILED  # the interpreter (and AMD) always take Triton's dispatch
    monkeypatch.setattr(module, "_REUSE_COMPILED", True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    stand_ins = {name: JitStandIn(getattr(module, name)) for name in kernels}
    for name, stand_in in stand_ins.items():
        monkeypatch.setattr(module, name, stand_in)
    return stand_ins.values()


def test_repeat_decodes_launch_compiled_kernels_and_stay_correct(sources, monkeypatch):
    """On the GPU the three launches of a decode step reuse the kernels compiled by an earlier
    step of the same specialization (kv heads, partitions, dtype and alignment of each tensor,
    class of each size): other sequence lengths, sequence counts and data run the compiled
    kernels, correctly; other kv heads compile the decode and merge kernels anew. Run here through
    the interpreter behind the same contract."""
    name = "tq_decode_triton_d128_qg8_bs16"
    mod = load_module(sources[name][0])
    rotate, decode, merge = _reusing_compiled(
        mod, monkeypatch, "_rotate_query_kernel", f"{name}_kernel", "_merge_partitions_kernel"
    )
    cases = (
        verify_tq.DecodeCase("3 sequences, Hk 2", 3, 2, (17, 1, 300), 20),
        verify_tq.DecodeCase("2 sequences, Hk 2, same table width", 2, 2, (5, 260), 20),
        verify_tq.DecodeCase("2 sequences, Hk 1", 2, 1, (0, 200), 20),
    )
    for seed, case in enumerate(cases):
        inputs = verify_tq.make_decode_inputs(case, mod.QG, mod.BS, mod.HEAD_DIM, "cpu", seed)
        out = mod.tq_decode(**inputs)
        result = verify_tq._compare_decode(case.label, out, inputs, case, mod.BS, SPEC.options.tolerance)
        assert result["ok"], result
    assert mod.decode_partitions(20, 3, 2, torch.device("cpu"))[0] > 1  # a real merge
    assert [[c.launches for c in k.compiled] for k in (rotate, decode, merge)] == [[2], [1, 0], [1, 0]]


def test_repeat_stores_launch_compiled_kernels_and_stay_correct(sources, monkeypatch):
    """The store's compiled kernel serves later calls of its specialization (other token counts
    and data); one token (Triton turns a 1 into a constant), norm correction, or k with a head
    stride not a multiple of 16 compiles anew. Every call stores the reference's bytes."""
    mod = load_module(sources["tq_store_d128_bs16"][0])
    (store,) = _reusing_compiled(mod, monkeypatch, "tq_store_d128_bs16_kernel")
    centroids, rotation = ref.lloyd_max_centroids(128), ref.hadamard_rotation(128)
    gen = torch.Generator().manual_seed(3)
    calls = ((5, False, 0), (7, False, 0), (1, False, 0), (6, True, 0), (4, False, 8))
    for num_tokens, norm_correction, pad in calls:
        k = torch.randn(num_tokens, 2, 128 + pad, generator=gen)[:, :, :128]  # pad 8: k's heads 136 floats apart
        v = torch.randn(num_tokens, 2, 128, generator=gen)
        slots = torch.randperm(4 * 16, generator=gen)[:num_tokens]
        cache = torch.zeros(4, mod.cache_block_bytes(2), dtype=torch.uint8)
        want = cache.clone()
        mod.tq_store(cache, k, v, slots, centroids, rotation, norm_correction)
        ref.store(want, k, v, slots, block_size=16, centroids=centroids, rotation=rotation, norm_correction=norm_correction)
        assert torch.equal(cache, want), (num_tokens, norm_correction, pad)
    assert [c.launches for c in store.compiled] == [1, 0, 0, 0]


def test_merge_with_empty_partitions_and_odd_partition_counts(modules):
    mod = modules["tq_decode_triton_d128_qg6_bs16"]
    gen = torch.Generator().manual_seed(1)
    for num_partitions in (1, 3, 4):
        shape = (3, 2, num_partitions, mod.QG)
        parts = (torch.rand(*shape, 128, generator=gen) * 2 - 1).to(torch.bfloat16)
        sums = torch.rand(*shape, generator=gen) * 50 + 0.5
        maxes = torch.randn(*shape, generator=gen) * 4
        empty = torch.rand(*shape, generator=gen) < 0.3
        empty[0, 0] = True  # every partition of these heads empty -> zeros
        maxes[empty] = -math.inf
        # An empty partition weighs nothing whatever its other entries hold (the kernel loads them
        # with the max, then tl.where drops them): garbage there must not reach the output.
        sums[empty] = float("nan")
        parts[empty] = float("nan")
        out = mod.merge_partitions(parts, sums, maxes, torch.empty(3, 2 * mod.QG, 128, dtype=torch.bfloat16))
        want = ref.merge_partitions(parts.float().nan_to_num(0.0), sums.nan_to_num(0.0), maxes)
        assert torch.equal(out[0, : mod.QG], torch.zeros_like(out[0, : mod.QG]))
        # bf16 output rounded to nearest: within half a bf16 ulp (+ fp32 noise) of the reference
        assert ((out.float() - want).abs() <= 2**-8 * want.abs() + 1e-6).all()


def test_decode_empty_batch_and_all_empty_sequences(modules):
    mod = modules["tq_decode_triton_d128_qg16_bs32"]
    c, rot = ref.lloyd_max_centroids(128), ref.hadamard_rotation(128)
    cache = ref.allocate_cache(2, 32, 2, 128)
    none = mod.tq_decode(torch.zeros(0, 32, 128, dtype=torch.bfloat16), cache, torch.zeros(0, 4, dtype=torch.int32),
                         torch.zeros(0, dtype=torch.int32), c, rot)
    assert none.shape == (0, 32, 128) and none.dtype == torch.bfloat16
    table = torch.full((2, 1), 2**31 - 1, dtype=torch.int32)  # read any entry and the process dies
    out = mod.tq_decode(torch.randn(2, 32, 128).to(torch.bfloat16), cache, table, torch.zeros(2, dtype=torch.int32), c, rot)
    assert torch.equal(out, torch.zeros_like(out))


def _decode_args(mod, hk=2):
    return dict(
        query=torch.randn(2, hk * mod.QG, 128).to(torch.bfloat16),
        kv_cache=ref.allocate_cache(4, mod.BS, hk, 128),
        block_table=torch.zeros(2, 2, dtype=torch.int32),
        seq_lens=torch.tensor([3, 20], dtype=torch.int32),
        centroids=ref.lloyd_max_centroids(128),
        rotation=ref.hadamard_rotation(128),
    )


DECODE_BAD = [
    ("query", lambda a: a["query"].float(), "torch.bfloat16"),
    ("query", lambda a: a["query"][:, :12].contiguous(), "multiple of QG=8"),
    ("kv_cache", lambda a: ref.allocate_cache(4, 32, 2, 128), "that is the block size of BS=32"),
    ("block_table", lambda a: a["block_table"].long(), "torch.int32"),
    ("seq_lens", lambda a: a["seq_lens"][:1], "shape"),
    ("centroids", lambda a: a["centroids"][:8], "shape"),
    ("rotation", lambda a: torch.eye(64), "shape"),
    ("softmax_scale", lambda a: -1.0, "finite float > 0"),
    ("softmax_scale", lambda a: "0.1", "finite float > 0"),
    ("softmax_scale", lambda a: math.inf, "finite float > 0"),
]


@pytest.mark.parametrize("name,make,words", DECODE_BAD, ids=[f"{n}-{w}" for n, _, w in DECODE_BAD])
def test_decode_errors_name_the_argument(modules, name, make, words):
    mod = modules["tq_decode_triton_d128_qg8_bs16"]
    args = _decode_args(mod)
    args[name] = make(args)
    with pytest.raises(ValueError) as info:
        mod.tq_decode(**args)
    msg = str(info.value)
    assert msg.startswith(f"{name}: expected") and words in msg and "got" in msg, msg


STORE_BAD = [
    ("kv_cache", lambda a: a["kv_cache"].view(torch.int8), "torch.uint8"),
    ("kv_cache", lambda a: a["kv_cache"][:, :-2].contiguous(), "blocks of 4288 bytes"),
    ("k", lambda a: a["k"].to(torch.int8), "dtype"),
    ("k", lambda a: a["k"][:, :, :64], "shape (num_tokens, Hk, 128)"),
    ("k", lambda a: a["k"].transpose(1, 2).contiguous().transpose(1, 2), "unit stride"),
    ("v", lambda a: a["v"][:-1], "(that of k)"),
    ("slot_mapping", lambda a: a["slot_mapping"].float(), "torch.int32 or torch.int64"),
    ("slot_mapping", lambda a: a["slot_mapping"][:-1], "num_tokens of k"),
    ("centroids", lambda a: a["centroids"].double(), "torch.float32"),
    ("rotation", lambda a: a["rotation"].half(), "torch.float32"),
    ("rotation", lambda a: torch.eye(64), "shape (128, 128)"),
    ("norm_correction", lambda a: 1, "a bool"),
]


@pytest.mark.parametrize("name,make,words", STORE_BAD, ids=[f"{n}-{w}" for n, _, w in STORE_BAD])
def test_store_errors_name_the_argument(modules, name, make, words):
    mod = modules["tq_store_d128_bs16"]
    args = dict(kv_cache=ref.allocate_cache(2, 16, 2, 128), k=torch.randn(5, 2, 128), v=torch.randn(5, 2, 128),
                slot_mapping=torch.arange(5), centroids=ref.lloyd_max_centroids(128), rotation=ref.hadamard_rotation(128))
    args[name] = make(args)
    with pytest.raises(ValueError) as info:
        mod.tq_store(**args)
    msg = str(info.value)
    assert msg.startswith(f"{name}: expected") and words in msg and ", got " in msg, msg


def _planted(sources, tmp_path, name, old, new, count=1):
    path, text = sources[name]
    assert text.count(old) == count, (old, text.count(old))
    bad = tmp_path / f"planted_{name}.py"
    bad.write_text(text.replace(old, new))
    return load_module(bad)


def test_planted_decode_bugs_fail_the_check(sources, tmp_path):
    """Swapped nibble order (in the interpreter's arm of _unpack_k_pairs; tests/test_tq_ptx_unpack.py
    plants bugs in the PTX arm), q's reduction order off the K lanes' (two bytes of a word
    swapped; the pair table's word or nibble order), the farthest tile in flight's K (and, with
    V_AHEAD, V) loaded at an earlier tile's tokens, the tiles in flight not moved up, then the V
    scale read from the K norm's field."""
    name = "tq_decode_triton_d128_qg8_bs16"
    swapped = _planted(sources, tmp_path, name, "return (\n            _codebook_entry(codebook_ptr, (words >> 0 * NIBBLE_BITS)", "return (\n            _codebook_entry(codebook_ptr, (words >> 1 * NIBBLE_BITS)")
    assert _failures(verify_tq.check_decode(swapped, SPEC, "cpu", extra_cases=False))
    old_order, new_order = "+ ((pair >> 4) & 1) * 2\n            + ((pair >> 1) & 1)", "+ ((pair >> 1) & 1) * 2\n            + ((pair >> 4) & 1)"
    misordered = _planted(sources, tmp_path, name, old_order, new_order, count=2)
    assert _failures(verify_tq.check_decode(misordered, SPEC, "cpu", extra_cases=False))
    # The byte-pair table's order (check_decode forces the long-partition schedule): q's second
    # product at the first word's bytes, and the plain arm without the word/nibble trade.
    same_word = _planted(sources, tmp_path, name, "k_byte += 4", "k_byte += 0", count=2)
    assert _failures(verify_tq.check_decode(same_word, SPEC, "cpu", extra_cases=False))
    untraded = _planted(sources, tmp_path, name, "(0, 1, 4, 3, 2)", "(0, 1, 2, 3, 4)", count=4)
    assert _failures(verify_tq.check_decode(untraded, SPEC, "cpu", extra_cases=False))
    # K (and V) are loaded LOAD_AHEAD = 2 tiles ahead at d128: tile + 2's loads at tile + 1's or
    # this tile's tokens, and tile + 1 not taking over what was loaded for it.
    assert tq_decode.lower(SPEC, VARIANTS[name]).consts["LOAD_AHEAD"] == 2
    for wrong in ("chunk_start + TILE_TOKENS,", "chunk_start + 0 * TILE_TOKENS,"):
        stale = _planted(sources, tmp_path, name, "_load_k_tile(\n            chunk_start + 2 * TILE_TOKENS,", "_load_k_tile(\n            " + wrong)
        assert _failures(verify_tq.check_decode(stale, SPEC, "cpu", extra_cases=False)), wrong
    unmoved = _planted(sources, tmp_path, name, "= (\n            next2_k_words,", "= (\n            next_k_words,")
    assert _failures(verify_tq.check_decode(unmoved, SPEC, "cpu", extra_cases=False))
    # V ahead too (forced for every launch): tile + 2's V at tile + 1's tokens, and V not moved up.
    for old, new in (("_load_v_tile(\n                chunk_start + 2 * TILE_TOKENS,", "_load_v_tile(\n                chunk_start + TILE_TOKENS,"),
                     ("next_v_words0, next_v_words1 = next2_v_words0, next2_v_words1", "next_v_words0, next_v_words1 = next_v_words0, next_v_words1")):
        stale_v = _planted(sources, tmp_path, name, old, new)
        stale_v.LONG_PARTITION_GROUPS = 1
        assert _failures(verify_tq.check_decode(stale_v, SPEC, "cpu", extra_cases=False)), new
    plan = tq_decode.lower(SPEC, VARIANTS[name])
    wrong_field = _planted(sources, tmp_path, name, plan.printed["kernel"]["v_scale"] + ")", plan.printed["kernel"]["k_norm"] + ")")
    assert _failures(verify_tq.check_decode(wrong_field, SPEC, "cpu", extra_cases=False))


def test_relative_rms_tolerance_catches_small_outputs_that_pass_atol():
    """Long-context outputs are small (v ~ U(-1, 1) averaged over 32K tokens is ~0.004): a kernel
    5% off everywhere stays inside atol 5e-3 there, and only the per-sequence relative rms
    catches it. The H200 showed such a kernel (uncentred V levels in the PV MMA, 22% at 32K)."""
    tol = SPEC.options.tolerance
    assert tol.rel_rms == 1e-2 and tol.atol == 5e-3
    g = torch.Generator().manual_seed(0)
    want = torch.randn(3, 8, 128, generator=g, dtype=torch.float64) * 0.004
    want[1] = 0.0  # a sequence of length 0: its reference is all zero and is skipped
    off = want * (1 + 0.05 * torch.randn(want.shape, generator=g, dtype=torch.float64))
    result = verify_tq.compare("small outputs", off.to(torch.bfloat16), want, tol, torch.bfloat16)
    assert result["max_abs"] < tol.atol and not result["ok"], result
    assert "relative rms error" in result["detail"] and "sequence" in result["detail"], result
    close = want * (1 + 1e-3 * torch.randn(want.shape, generator=g, dtype=torch.float64))
    assert verify_tq.compare("close", close.to(torch.bfloat16), want, tol, torch.bfloat16)["ok"]


def test_planted_store_bugs_fail_the_check(sources, tmp_path):
    name = "tq_store_d128_bs32"
    ties_up = _planted(sources, tmp_path, name, "tl.where(y > midpoint, step, 0)", "tl.where(y >= midpoint, step, 0)")
    results = verify_tq.check_store(ties_up, SPEC, "cpu")
    assert _failures(results) and "exact ties went to the wrong centroid" in results[0]["detail"], results
    swapped = _planted(sources, tmp_path, name, "(k_index_even | (k_index_odd << NIBBLE_BITS))", "(k_index_odd | (k_index_even << NIBBLE_BITS))")
    assert all(not r["ok"] for r in verify_tq.check_store(swapped, SPEC, "cpu"))



def test_planted_head_dim_256_store_bug_fails_the_check(sources, tmp_path):
    """head_dim 256 quantizes keys in 8 blocks of rotation columns: every block rotated and
    stored at the first block's columns is caught."""
    first_block_only = _planted(sources, tmp_path, "tq_store_d256_bs16", "col = col_block * ROT_PAIRS + block_pair", "col = 0 * ROT_PAIRS + block_pair")
    assert all(not r["ok"] for r in verify_tq.check_store(first_block_only, SPEC, "cpu"))


@pytest.mark.parametrize("tile, warps", [(32, 1), (128, 4)])
def test_schedule_sweep_runs_programs_of_other_warp_counts_correctly(modules, monkeypatch, tile, warps):
    """benchmarks/tq_decode_schedules.py launches the module's decode kernel with another tile and
    warp count (one 32-token chunk per warp), for the GPU A/B of programs of one and four warps
    against the shipped two: the same kernel with CHUNKS = warps must pass the variant's whole check."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from tq_decode_schedules import Schedule
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    mod = modules["tq_decode_triton_d128_qg8_bs16"]
    max_registers = tq_decode.lower(SPEC, VARIANTS["tq_decode_triton_d128_qg8_bs16"]).consts["MAX_REGISTERS"]
    schedule = Schedule(mod, tile, warps, max_registers, programs_per_sm=0)
    kernel = JitStandIn(mod.tq_decode_triton_d128_qg8_bs16_kernel)
    monkeypatch.setattr(mod, "tq_decode_triton_d128_qg8_bs16_kernel", kernel)
    monkeypatch.setattr(mod, "tq_decode", lambda *args, **kwargs: schedule(*args, **kwargs)[0])
    results = verify_tq.check_decode(mod, SPEC, "cpu")
    assert not _failures(results), _failures(results)
    launches = [c.options for c in kernel.compiled]
    assert launches and all(o["CHUNKS"] == warps and o["TILE_TOKENS"] == tile and o["num_warps"] == warps for o in launches), launches
