"""Numerical checks of generated TQ modules against kgen.reference.tq.

One entry point, `check(module, spec, variant, device)`, dispatching on the variant's kind and
backend:
- Triton decode: `tq_decode` on caches written by the reference store, ragged sequences
  (lengths 0, 1, 15, 16, 17, 300, ...), shuffled blocks and huge block ids in every unused table
  entry, against `decode_attention` with the spec's tolerance; plus the shared host checks below.
- Triton store: `tq_store` bytes against the reference store's bytes, with the honest tie rule.
- FlyDSL decode (no AMD GPU here): the module's own source run under kgen.emu, the lane-accurate
  gfx950 wave emulator, end to end (`tq_decode`: host code, the FlyDSL kernel on emulated waves,
  the Triton merge) against `decode_attention` with the spec's tolerance, on the spec's cases and
  one with two tile groups per partition (loop-carried state); every empty partition must store
  the documented (0, 0, -inf). Plus the host code it shares with the Triton variant:
  partition_plan covers the table width, validate_inputs names the argument it rejects,
  merge_partitions matches the reference merge.
Each result is a dict with keys case, ok, max_abs, max_rel, worst, detail (as kgen.verify.msda).

Test data: q, k ~ N(0, 1); v ~ U(-1, 1). With |v| <= 1 every output is below 1 in magnitude,
where the bf16 rounding of the output costs at most 2^-9 of the 5e-3 budget; with N(0, 1)
values a single-token sequence returns v_hat itself (|v_hat| up to ~4) and bf16 rounding alone
would exceed the tolerance, for any kernel.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kgen.reference import tq as ref

HUGE_BLOCK = 2**31 - 1  # unused block-table entries: dereferencing one faults (GPU) or crashes (interpreter)


@dataclass(frozen=True)
class DecodeCase:
    label: str
    num_seqs: int
    kv_heads: int
    seq_lens: tuple[int, ...]
    max_blocks: int | None  # None: just enough blocks for the longest sequence, plus 3
    unsorted_identity: bool = False  # permuted centroids and an identity rotation (the upstream tests)
    softmax_scale: float | None = None


def check(module, spec, variant, device: str) -> list[dict[str, Any]]:
    values = variant.values
    kind = values.get("kind") or ("store" if hasattr(module, "tq_store") else "decode")
    backend = values.get("backend") or ("triton" if hasattr(module, "tq_decode") or kind == "store" else "flydsl")
    if kind == "store":
        return check_store(module, spec, device)
    if backend == "triton":
        results = check_decode(module, spec, device)
    else:
        results = check_emulated(module.__file__, spec, device)
    return results + check_host(module, spec, device)


# ---- decode -----------------------------------------------------------------------------------


def decode_cases(spec, module, device: str, extra_cases: bool = True) -> list[DecodeCase]:
    """The spec's cases; with extra_cases, the generated `module`'s long case and (on the GPU) the
    H200 matrix."""
    cases = [
        DecodeCase(f"num_seqs={c.num_seqs} Hk={c.kv_heads} seq_lens={list(c.seq_lens)} max_blocks={c.max_blocks}",
                   c.num_seqs, c.kv_heads, tuple(c.seq_lens), c.max_blocks)
        for c in spec.options.cases
    ]
    if not extra_cases:
        return cases
    # More tile groups than MAX_PARTITIONS (so two per partition), several tiles per partition,
    # and the upstream tables: unsorted centroids, identity rotation, explicit scale.
    long = ((module.MAX_PARTITIONS + 1) * module.GROUP + 52, 700)
    cases.append(DecodeCase(f"seq_lens={list(long)} Hk=1, unsorted centroids, identity rotation, scale 0.05",
                            len(long), 1, long, None, unsorted_identity=True, softmax_scale=0.05))
    if device == "cuda":  # the H200 matrix: num_seqs x seq_len at Hk=8
        for n in (1, 4, 16):
            for s in (256, 1024, 4096):
                cases.append(DecodeCase(f"num_seqs={n} seq_len={s} Hk=8", n, 8, (s,) * n, None))
        # Long contexts: many tiles per partition, and outputs averaged over 32K tokens are small,
        # so accumulated rounding shows in the relative error long before it reaches atol.
        cases.append(DecodeCase("num_seqs=2 seq_len=32768 Hk=2", 2, 2, (32768, 32768), None))
    return cases


def make_decode_inputs(case: DecodeCase, qg: int, bs: int, head_dim: int, device: str, seed: int) -> dict[str, Any]:
    """A cache written by the reference store: each sequence's blocks drawn from a shuffled pool,
    tokens stored in random order, every unused table entry HUGE_BLOCK."""
    g = torch.Generator().manual_seed(seed)
    used = [-(-n // bs) for n in case.seq_lens]
    max_blocks = case.max_blocks if case.max_blocks is not None else max(used, default=0) + 3
    if max(used, default=0) > max_blocks:
        raise ValueError(f"{case.label}: max_blocks={max_blocks} cannot hold {max(used)} blocks of BS={bs}")
    num_blocks = sum(used) + 2
    pool = torch.randperm(num_blocks, generator=g).to(torch.int32)
    table = torch.full((case.num_seqs, max_blocks), HUGE_BLOCK, dtype=torch.int32)
    at = 0
    for s, u in enumerate(used):
        table[s, :u] = pool[at : at + u]
        at += u
    slots = torch.tensor([int(table[s, t // bs]) * bs + t % bs for s, n in enumerate(case.seq_lens) for t in range(n)],
                         dtype=torch.int64)
    centroids = ref.lloyd_max_centroids(head_dim)
    rotation = ref.hadamard_rotation(head_dim)
    if case.unsorted_identity:
        centroids = centroids[torch.randperm(len(centroids), generator=g)]
        rotation = torch.eye(head_dim)
    hk = case.kv_heads
    k = torch.randn(len(slots), hk, head_dim, generator=g)
    v = torch.rand(len(slots), hk, head_dim, generator=g) * 2 - 1
    cache = ref.allocate_cache(num_blocks, bs, hk, head_dim)
    order = torch.randperm(len(slots), generator=g)
    ref.store(cache, k[order], v[order], slots[order], block_size=bs, centroids=centroids, rotation=rotation)
    query = torch.randn(case.num_seqs, hk * qg, head_dim, generator=g).to(torch.bfloat16)
    seq_lens = torch.tensor(case.seq_lens, dtype=torch.int32)
    return {
        name: t.to(device)
        for name, t in dict(query=query, kv_cache=cache, block_table=table, seq_lens=seq_lens,
                            centroids=centroids, rotation=rotation).items()
    }


def check_decode(module, spec, device: str, extra_cases: bool = True) -> list[dict[str, Any]]:
    tol = spec.options.tolerance
    qg, bs, d = module.QG, module.BS, module.HEAD_DIM
    cases = decode_cases(spec, module, device, extra_cases)

    def run(prefix: str, seed: int) -> list[dict[str, Any]]:
        results = []
        for i, case in enumerate(cases):
            inputs = make_decode_inputs(case, qg, bs, d, device, seed=seed + i)
            out = module.tq_decode(**inputs, softmax_scale=case.softmax_scale)
            results.append(_compare_decode(prefix + case.label, out, inputs, case, bs, tol))
        return results

    results = run("", 2000)
    if hasattr(module, "LONG_PARTITION_GROUPS"):
        # The chunked Triton form's schedule of long partitions (V a tile ahead, K's byte-pair
        # table), which the cases' short tables never pick: forced on every launch, cases again.
        natural, module.LONG_PARTITION_GROUPS = module.LONG_PARTITION_GROUPS, 1
        try:
            results += run("long-partition schedule (forced): ", 3000)
        finally:
            module.LONG_PARTITION_GROUPS = natural
    return results


def _compare_decode(label: str, out, inputs: dict, case: DecodeCase, bs: int, tol) -> dict[str, Any]:
    """A decode output against decode_attention; sequences of length 0 must read exactly 0."""
    if out.device.type == "cuda":
        torch.cuda.synchronize()
    want = ref.decode_attention(
        inputs["query"].cpu(), inputs["kv_cache"].cpu(), inputs["block_table"].cpu(), inputs["seq_lens"].cpu(),
        block_size=bs, num_kv_heads=case.kv_heads, centroids=inputs["centroids"].cpu(),
        rotation=inputs["rotation"].cpu(), softmax_scale=case.softmax_scale,
    )
    result = compare(label, out.cpu(), want, tol, torch.bfloat16)
    empty = [s for s, n in enumerate(case.seq_lens) if n == 0]
    if result["ok"] and empty and out[empty].abs().max().item() != 0:
        result.update(ok=False, detail=f"sequences {empty} have seq_len 0 but a non-zero output")
    return result


# ---- FlyDSL decode under the emulator ------------------------------------------------------------


def emulated_cases(spec, module) -> list[DecodeCase]:
    """The spec's cases, and one whose table is wide enough for more than MAX_PARTITIONS tile
    groups, so each partition loops over two of them (the kernel's loop-carried state; the
    spec's small tables give one group per partition). Its long sequence ends inside partition 1
    and most partitions are empty, which keeps the emulator's work small."""
    cases = decode_cases(spec, module, "cpu", extra_cases=False)
    width = -(-(module.MAX_PARTITIONS + 1) * module.GROUP // module.BS)
    partitions, groups = module.partition_plan(width)
    lens = (2 * module.GROUP + 19, 2)
    cases.append(DecodeCase(
        f"seq_lens={list(lens)} Hk=1 max_blocks={width} (P={partitions}, {groups} tile groups per partition),"
        " unsorted centroids, identity rotation, scale 0.05", len(lens), 1, lens, width, unsorted_identity=True,
        softmax_scale=0.05))
    return cases


def check_emulated(path, spec, device: str, cases: list[DecodeCase] | None = None) -> list[dict[str, Any]]:
    """`tq_decode` of the FlyDSL module at `path`, its kernel run by kgen.emu, against the reference
    (on `cases`, by default emulated_cases). torch.empty fills with NaN meanwhile, so a partial
    the kernel fails to write cannot pass."""
    from kgen.emu import EmuError, load_module

    tol = spec.options.tolerance
    try:
        module = load_module(path)
    except EmuError as err:
        return [_result("emulated gfx950: load the module", False, detail=str(err))]
    results = []
    for i, case in enumerate(emulated_cases(spec, module) if cases is None else cases):
        label = f"emulated gfx950: {case.label}"
        inputs = make_decode_inputs(case, module.QG, module.BS, module.HEAD_DIM, device, seed=5000 + i)
        module.__kgen_emu__.last_launch = None
        try:
            with _nan_for_uninitialized():
                out = module.tq_decode(**inputs, softmax_scale=case.softmax_scale)
        except EmuError as err:
            results.append(_result(label, False, detail=str(err)))
            continue
        result = _compare_decode(label, out, inputs, case, module.BS, tol)
        problem = _empty_partition_problem(module)
        if problem:
            result.update(ok=False, detail="; ".join(filter(None, [result["detail"], problem])))
        results.append(result)
    return results


@contextlib.contextmanager
def _nan_for_uninitialized():
    """torch.empty returns NaN-filled memory (torch's deterministic mode) within the block."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.utils.deterministic.fill_uninitialized_memory = saved[2]


def _empty_partition_problem(module) -> str:
    """The kernel's contract for a partition with no token: out 0, exp_sum 0, max_logit -inf."""
    launch = module.__kgen_emu__.last_launch
    if launch is None:  # nothing was launched (no sequence, or a table of width 0)
        return ""
    out, sums, maxes = (launch[name].tensor.cpu() for name in ("out_parts", "exp_sums", "max_logits"))
    tokens = launch["seq_lens"].tensor.cpu().long().clamp(max=launch["max_blocks"] * module.BS)
    first = torch.arange(out.shape[2]) * (launch["groups_per_partition"] * module.GROUP)
    empty = (first[None, :] >= tokens[:, None])[:, None, :].expand(sums.shape[:3])
    if (maxes[empty] == -math.inf).all() and (sums[empty] == 0).all() and (out[empty] == 0).all():
        return ""
    return f"some of the {int(empty.sum())} empty partition rows do not store (out 0, exp_sum 0, max_logit -inf)"


def compare(label: str, out: torch.Tensor, ref_out: torch.Tensor, tol, dtype) -> dict[str, Any]:
    """Element-wise |out - ref| <= atol + rtol * |ref|, and, when tol.rel_rms is set, each
    sequence's (first index's) rms(out - ref) / rms(ref) <= rel_rms."""
    if out.shape != ref_out.shape or out.dtype != dtype:
        return _result(label, False, detail=f"got {tuple(out.shape)} {out.dtype}, expected {tuple(ref_out.shape)} {dtype}")
    if out.numel() == 0:
        return _result(label, True)
    diff = (out.double() - ref_out.double()).abs()
    finite = bool(torch.isfinite(out).all())
    diff = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, math.inf))
    excess = diff - (tol.atol + tol.rtol * ref_out.double().abs())
    worst = int(torch.argmax(excess).item())
    ok, detail = finite and bool((excess <= 0).all()), "" if finite else "non-finite output"
    if tol.rel_rms is not None and finite:
        rms = lambda t: t.pow(2).flatten(1).mean(1).sqrt()  # noqa: E731 - per sequence
        ref_rms = rms(ref_out.double())
        live = ref_rms > 0
        rel = rms(diff)[live] / ref_rms[live]
        if rel.numel():
            seq = int(live.nonzero()[int(rel.argmax())])
            detail = f"relative rms error {float(rel.max()):.2e} (sequence {seq}; limit {tol.rel_rms:g})"
            if float(rel.max()) > tol.rel_rms:
                ok = False
    return _result(
        label,
        ok,
        max_abs=float(diff.max()),
        max_rel=float((diff / ref_out.double().abs().clamp_min(1e-6)).max()),
        worst=[int(x) for x in torch.unravel_index(torch.tensor(worst), out.shape)],
        detail=detail,
    )


def _result(case: str, ok: bool, max_abs: float = 0.0, max_rel: float = 0.0, worst=None, detail: str = "") -> dict[str, Any]:
    return {"case": case, "ok": ok, "max_abs": max_abs, "max_rel": max_rel, "worst": worst, "detail": detail}


# ---- host code shared by the decode backends -------------------------------------------------


def check_host(module, spec, device: str) -> list[dict[str, Any]]:
    return [check_partition_plan(module), check_validation(module, device), *check_merge(module, spec, device)]


def check_partition_plan(module) -> dict[str, Any]:
    """P a power of two <= MAX_PARTITIONS, and the P partitions of TGPP*GROUP tokens cover the
    block table's full width, for every width up to the declared maximum."""
    bad = []
    limit = module.MAX_SIZES["max_blocks"]
    widths = sorted(set(range(0, 600)) | set(range(600, limit + 1, 97)) | {limit})
    for w in widths:
        p, tgpp = module.partition_plan(w)
        if not (1 <= p <= module.MAX_PARTITIONS and p & (p - 1) == 0 and tgpp >= 1 and p * tgpp * module.GROUP >= w * module.BS):
            bad.append(f"max_blocks={w}: (P, TGPP) = ({p}, {tgpp})")
    detail = f"{len(widths)} table widths in [0, {limit}]" + (f"; fails: {', '.join(bad[:3])}" if bad else "")
    return _result("partition_plan covers the table width", not bad, detail=detail)


def _host_inputs(module, device: str) -> dict[str, Any]:
    hk, qg, bs, d = 2, module.QG, module.BS, module.HEAD_DIM
    return dict(
        query=torch.zeros(3, hk * qg, d, dtype=torch.bfloat16, device=device),
        kv_cache=torch.zeros(4, ref.cache_block_bytes(bs, hk, d), dtype=torch.uint8, device=device),
        block_table=torch.zeros(3, 5, dtype=torch.int32, device=device),
        seq_lens=torch.zeros(3, dtype=torch.int32, device=device),
        centroids=ref.lloyd_max_centroids(d).to(device),
        rotation=ref.hadamard_rotation(d).to(device),
    )


# (argument, how to break it, words the message must contain)
BAD_INPUTS: list[tuple[str, Callable[[dict], Any], str]] = [
    ("query", lambda a: a["query"].float(), "bfloat16"),
    ("query", lambda a: a["query"][0], "shape"),
    ("query", lambda a: a["query"][:, :, :-2], "shape"),
    ("query", lambda a: a["query"][:, 1:].contiguous(), "QG"),
    ("query", lambda a: a["query"].transpose(0, 1).contiguous().transpose(0, 1), "contiguous"),
    ("kv_cache", lambda a: a["kv_cache"].to(torch.int8), "uint8"),
    ("kv_cache", lambda a: a["kv_cache"][:, :-2].contiguous(), "bytes"),
    ("block_table", lambda a: a["block_table"].long(), "int32"),
    ("block_table", lambda a: a["block_table"][:2], "shape"),
    ("seq_lens", lambda a: a["seq_lens"].long(), "int32"),
    ("seq_lens", lambda a: a["seq_lens"][:1], "shape"),
    ("centroids", lambda a: a["centroids"][:8], "shape"),
    ("centroids", lambda a: a["centroids"].double(), "float32"),
    ("rotation", lambda a: a["rotation"][:-1, :-1].contiguous(), "shape"),
]


def check_validation(module, device: str) -> dict[str, Any]:
    """validate_inputs accepts a good call and rejects each broken argument, naming it."""
    problems = []
    good = _host_inputs(module, device)
    try:
        got = module.validate_inputs(**good)
        if tuple(got) != (3, 2, 5):
            problems.append(f"good inputs: returned {got}, expected (3, 2, 5)")
    except Exception as err:  # noqa: BLE001 - reported
        problems.append(f"good inputs rejected: {err}")
    for name, breaker, words in BAD_INPUTS:
        args = dict(good, **{name: breaker(good)})
        try:
            module.validate_inputs(**args)
            problems.append(f"{name} ({words}): accepted")
        except (ValueError, TypeError) as err:
            msg = str(err)
            if not (msg.startswith(f"{name}:") and "expected" in msg and words in msg):
                problems.append(f"{name} ({words}): message {msg!r}")
    detail = f"{len(BAD_INPUTS)} broken inputs" + (f"; {'; '.join(problems[:3])}" if problems else ", each rejected naming its argument")
    return _result("validate_inputs names the bad argument", not problems, detail=detail)


def check_merge(module, spec, device: str) -> list[dict[str, Any]]:
    """merge_partitions on the reference's own partials (partitioned as partition_plan says),
    against the reference merge; empty partitions are then poisoned (NaN output, garbage sums)
    to show they are never read."""
    tol = spec.options.tolerance
    qg, bs, d = module.QG, module.BS, module.HEAD_DIM
    case = spec.options.cases[0]
    c = DecodeCase("merge", case.num_seqs, case.kv_heads, tuple(case.seq_lens), case.max_blocks)
    inputs = make_decode_inputs(c, qg, bs, d, "cpu", seed=3000)
    num_partitions, tgpp = module.partition_plan(inputs["block_table"].shape[1])
    parts, sums, maxes = ref.decode_attention_partitioned(
        inputs["query"], inputs["kv_cache"], inputs["block_table"], inputs["seq_lens"], block_size=bs,
        num_kv_heads=c.kv_heads, centroids=inputs["centroids"], rotation=inputs["rotation"],
        tokens_per_partition=tgpp * module.GROUP, num_partitions=num_partitions,
    )
    parts = parts.to(torch.bfloat16)  # the partials' contract dtype
    want = ref.merge_partitions(parts.float(), sums, maxes)
    empty = torch.isinf(maxes)
    results = []
    for label, (p_in, s_in) in {
        f"merge_partitions, P={num_partitions}, {int(empty.sum())} of {empty.numel()} partition rows empty": (parts, sums),
        "merge_partitions, empty partitions poisoned (NaN out, garbage exp_sums)": (
            parts.masked_fill(empty.unsqueeze(-1), float("nan")),
            sums.masked_fill(empty, 123.0),
        ),
    }.items():
        output = torch.empty(c.num_seqs, c.kv_heads * qg, d, dtype=torch.bfloat16, device=device)
        module.merge_partitions(p_in.to(device).contiguous(), s_in.to(device).contiguous(), maxes.to(device).contiguous(), output)
        if device == "cuda":
            torch.cuda.synchronize()
        results.append(compare(label, output.cpu(), want, tol, torch.bfloat16))
    return results


# ---- store ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreCase:
    label: str
    dtype: torch.dtype
    norm_correction: bool
    unsorted_identity: bool = False
    slot_dtype: torch.dtype = torch.int64
    strided: bool = False  # k and v as views into a wider [num_tokens, 2*Hk, d] tensor


STORE_CASES = (
    StoreCase("fp32, Hadamard, Lloyd-Max", torch.float32, False),
    StoreCase("bf16, norm correction, int32 slots", torch.bfloat16, True, slot_dtype=torch.int32),
    StoreCase("fp16, norm correction, unsorted centroids, identity rotation, strided k/v", torch.float16, True,
              unsorted_identity=True, strided=True),
)


def check_store(module, spec, device: str) -> list[dict[str, Any]]:
    """Every case under every schedule the wrapper may pick (store_parts picks by size and GPU:
    whole programs, or K split over KEY_SPLITS programs with V apart; norm correction keeps K
    whole), each compared with the reference store's bytes."""
    results = []
    for i, case in enumerate(STORE_CASES):
        for key_parts in (0, *module.KEY_SPLITS):
            if case.norm_correction and key_parts > 1:
                continue
            with _forced_store_parts(module, key_parts):
                results.append(_check_store_case(module, device, i, case, key_parts))
    return results


@contextlib.contextmanager
def _forced_store_parts(module, key_parts: int):
    """The store module's schedule (store_parts) fixed to key_parts for the duration."""
    chosen = module.store_parts
    module.store_parts = lambda *args: key_parts
    try:
        yield
    finally:
        module.store_parts = chosen


def _check_store_case(module, device: str, i: int, case: StoreCase, key_parts: int) -> dict[str, Any]:
    bs, d, hk = module.BS, module.HEAD_DIM, 2
    schedule = "whole programs" if key_parts == 0 else f"K over {key_parts} program{'s' * (key_parts > 1)}, V apart"
    g = torch.Generator().manual_seed(4000 + i)
    num_tokens, num_blocks = 70, 8
    k = torch.randn(num_tokens, 2 * hk, d, generator=g).to(case.dtype)
    v = (torch.randn(num_tokens, 2 * hk, d, generator=g) * 3).to(case.dtype)
    # Exact ties: k = e0 + e1 + e2 + e3 has norm 2, so x = k / (2 + eps) is exactly 0.5 and every
    # product with a Hadamard entry is exact; three quarters of y then cancel to exactly 0.0, the
    # middle midpoint, in any summation order and with or without FMA (e0 + e1 gave x = 1/sqrt(2),
    # whose products round, and an FMA matmul then left y at +-1.6e-9 instead of on the tie). A
    # tie goes to the smaller centroid. v on a 0.5 grid hits floor(x + 0.5) at exact halves.
    k[0] = 0
    k[0, :, :4] = 1.0
    v[1] = (torch.arange(d) % 31 * 0.5).to(case.dtype)
    k, v = (k[:, ::2], v[:, 1::2]) if case.strided else (k[:, :hk].contiguous(), v[:, :hk].contiguous())
    slots = torch.randperm(num_blocks * bs, generator=g)[:num_tokens]
    slots[5::9] = -1  # padding tokens (tokens 0 and 1 are kept)
    slots = slots.to(case.slot_dtype)
    centroids, rotation = ref.lloyd_max_centroids(d), ref.hadamard_rotation(d)
    if case.unsorted_identity:
        centroids, rotation = centroids[torch.randperm(len(centroids), generator=g)], torch.eye(d)
    theirs = ref.allocate_cache(num_blocks, bs, hk, d)
    ref.store(theirs, k, v, slots, block_size=bs, centroids=centroids, rotation=rotation,
              norm_correction=case.norm_correction)
    ours = ref.allocate_cache(num_blocks, bs, hk, d).to(device)
    module.tq_store(ours, k.to(device), v.to(device), slots.to(device), centroids.to(device), rotation.to(device),
                    norm_correction=case.norm_correction)
    if device == "cuda":
        torch.cuda.synchronize()
    keep = slots >= 0
    return compare_store(f"{case.label}; {schedule}", ours.cpu(), theirs, k[keep], slots[keep].long(), centroids,
                         rotation, bs, hk, d, case.norm_correction)


def compare_store(label, ours, theirs, k, slots, centroids, rotation, bs, hk, d, norm_correction) -> dict[str, Any]:
    """Bytes of two caches written from the same inputs. Rule (every exception counted):
    - bytes outside the written slots, V nibbles, V scale and V zero: identical;
    - a K nibble may differ only to the neighbouring cell of the sorted table, and only where the
      exact y (fp64) lies within the fp32 error bound of the rotation, HEAD_DIM * eps * sum|x_i r_ic|,
      of that midpoint (a summation-order tie); never at an exact tie (y exactly on a midpoint);
    - a K norm may differ by one fp16 ulp (fp32 reduction order), or more only in a row whose K
      indices differ under norm correction."""
    if torch.equal(ours, theirs):
        return _result(label, True, detail="bytes identical")
    problems = []
    data_o, meta_o = ref._views(ours, bs, hk, d)
    data_t, meta_t = ref._views(theirs, bs, hk, d)
    unwritten = torch.ones(ours.shape[0], bs, dtype=torch.bool)
    unwritten.view(-1)[slots] = False
    if not (torch.equal(data_o[unwritten], data_t[unwritten])
            and torch.equal(meta_o.permute(0, 3, 1, 2)[unwritten], meta_t.permute(0, 3, 1, 2)[unwritten])):
        problems.append("bytes outside the written slots changed")
    f_o = ref.read_slots(ours, slots, block_size=bs, num_kv_heads=hk, head_dim=d)
    f_t = ref.read_slots(theirs, slots, block_size=bs, num_kv_heads=hk, head_dim=d)
    for name in ("vidx", "vscale", "vzero"):
        n = int((f_o[name] != f_t[name]).sum())
        if n:
            problems.append(f"{n} {name} differ")
    meta_diff = max(float((f_o[n] - f_t[n]).abs().max()) for n in ("knorm", "vscale", "vzero"))
    meta_rel = max(float(((f_o[n] - f_t[n]).abs() / f_t[n].abs().clamp_min(1e-30)).max()) for n in ("knorm", "vscale", "vzero"))

    diff = f_o["kidx"] != f_t["kidx"]  # [T, Hk, d]
    worst = None
    stats = f"{int(diff.sum())} of {diff.numel()} K nibbles differ"
    if diff.any():
        worst = [int(x) for x in diff.nonzero()[0]]
        kf = k.float()
        x = kf / (kf.norm(dim=-1, keepdim=True) + 1e-8)
        y_true = x.double() @ rotation.double()
        bound_unit = torch.finfo(torch.float32).eps * (x.double().abs() @ rotation.double().abs())
        c_sorted, order = torch.sort(centroids.float())
        mids = ((c_sorted[1:] + c_sorted[:-1]) / 2).double()
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order))
        r_o, r_t = rank[f_o["kidx"][diff]], rank[f_t["kidx"][diff]]
        if not ((r_o - r_t).abs() == 1).all():
            problems.append("a K nibble moved further than the neighbouring cell")
        units = (y_true[diff] - mids[torch.minimum(r_o, r_t)]).abs() / bound_unit[diff]
        if (units == 0).any():
            problems.append(f"{int((units == 0).sum())} exact ties went to the wrong centroid")
        if (units > d).any():
            problems.append(f"{int((units > d).sum())} K nibbles differ beyond the fp32 rounding bound")
        stats += f" (all at rounding ties: <= {float(units.max()):.2g} of {d} eps-units from a midpoint)" if not problems else ""
    knorm_diff = f_o["knorm"] != f_t["knorm"]
    if knorm_diff.any():
        ulp = torch.finfo(torch.float16).eps * f_t["knorm"].abs()
        close = (f_o["knorm"] - f_t["knorm"]).abs() <= ulp * 1.01
        moved = diff.any(dim=-1) & norm_correction
        if not (close | moved).all():
            problems.append(f"{int((~(close | moved)).sum())} K norms differ by more than one fp16 ulp")
    stats += f"; {int(knorm_diff.sum())} K norms differ"
    return _result(label, not problems, max_abs=meta_diff, max_rel=meta_rel, worst=worst,
                   detail="; ".join(problems + [stats]))
