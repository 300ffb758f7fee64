"""TurboQuant decode over a 4-bit paged SoA KV cache (operators.md §2), lowered for FlyDSL/gfx950.

Design (one 64-lane wave per (sequence, kv head, partition)): centroids and the QG rotated query
rows live in LDS; each 16-token tile is dequantized into LDS, QK runs on the 16x16x32 bf16 MFMA,
softmax is FA-2 online in the exp2 domain, V is dequantized row-major into LDS and read back
through the hardware transpose into the 16x16x16 MFMA. Partitions of TGPP x GROUP tokens are
merged by a second kernel.

Everything the kernel addresses is derived here: the cache block layout from the spec's region
declarations, tensor strides from their shapes, per-lane byte mappings from the target's operand
layouts; each mapping is proven to cover its tile exactly once for every variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import sympy

from kgen.algebra import FloorDiv, Mod, PythonPrinter, Range, TensorLayout, TritonPrinter, decide_width, index_symbol
from kgen.algebra.coverage import Coverage
from kgen.algebra.soa import PackedField, Region, SoABlock
from kgen.errors import SpecError
from kgen.ops.common import Fact, Tolerance
from kgen.spec import reader as r
from kgen.spec.model import Dim, Spec, Variant
from kgen.targets import AMD_TARGETS, AmdTarget

backends = ("flydsl", "triton")
TEMPLATES = {
    ("decode", "flydsl"): "flydsl/tq_decode.py.jinja",
    ("decode", "triton"): "triton/tq_decode.py.jinja",
    ("store", "triton"): "triton/tq_store.py.jinja",
}


def template_for(variant) -> str:
    return TEMPLATES[variant.values["kind"], variant.values["backend"]]


CONST_DIMS = ("head_dim", "QG", "BS", "TILE", "GROUP")
RUNTIME_DIMS = ("num_seqs", "Hk", "num_blocks", "max_blocks", "P")
CONTRACT = {
    "query": ("num_seqs", "Hk*QG", "head_dim"),
    "block_table": ("num_seqs", "max_blocks"),
    "seq_lens": ("num_seqs",),
    "centroids": ("N_CENTROIDS",),  # quant.key.centroids entries (checked against that, not by name)
    "output": ("num_seqs", "Hk*QG", "head_dim"),
    "out_parts": ("num_seqs", "Hk", "P", "QG", "head_dim"),
    "exp_sums": ("num_seqs", "Hk", "P", "QG"),
    "max_logits": ("num_seqs", "Hk", "P", "QG"),
}
DTYPES = {
    "query": "bfloat16",
    "block_table": "int32",
    "seq_lens": "int32",
    "centroids": "float32",
    "output": "bfloat16",
    "out_parts": "bfloat16",
    "exp_sums": "float32",
    "max_logits": "float32",
}
ROW_PAD = 16  # query rows per kv head are padded to one 16-row matrix tile in both backends
META_DTYPE_BYTES = {"float16": 2}


# ---- spec sections ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Quant:
    key_bits: int
    centroids: int
    value_bits: int


@dataclass(frozen=True)
class Case:
    num_seqs: int
    kv_heads: int
    seq_lens: tuple[int, ...]
    max_blocks: int
    line: int | None


@dataclass(frozen=True)
class Options:
    quant: Quant
    cache_blocks: str
    regions: tuple[Region, ...]
    target: AmdTarget
    max_partitions: int
    tolerance: Tolerance
    cases: tuple[Case, ...]
    lines: Mapping[str, int | None]  # spec line of each dim and variant axis ("dims.QG", "variants.axes.QG")


def parse_options(root: r.Section, dims: Mapping[str, Dim], axes: Mapping[str, tuple]) -> Options:
    quant = root.section("quant")
    key = quant.section("key")
    key_bits = key.get("bits", r.one_of(4))
    centroids = key.get("centroids", r.integer(1, 1 << 16))
    if centroids != 1 << key_bits:
        raise key.error("centroids", f"{key_bits}-bit key indices address exactly {1 << key_bits} centroids, got {centroids}")
    key.get("codebook", r.one_of("lloyd_max_gaussian"))
    key.get("rotation", r.one_of("hadamard"))
    key.finish()
    value = quant.section("value")
    value_bits = value.get("bits", r.one_of(4))
    value.get("scheme", r.one_of("affine_min_max"))
    value.finish()
    quant.finish()

    cache = root.section("cache")
    blocks = cache.get("blocks", r.one_of(*dims))
    regions_section = cache.section("regions")
    regions = tuple(_parse_region(name, raw, line, regions_section, dims) for name, raw, line in regions_section.entries())
    cache.finish()

    sched = root.section("schedule")
    target = AMD_TARGETS[sched.get("target", r.one_of(*AMD_TARGETS))]
    sched.get("waves_per_program", r.one_of(1))
    max_partitions = sched.get("max_partitions", r.power_of_two(1, 64))
    sched.finish()

    masking = root.section("masking")
    masking.get("tokens_past_seq_len", r.one_of("minus_inf"))
    masking.get("unused_mfma_rows", r.one_of("not_stored"))
    masking.get("block_table_past_seq", r.one_of("first_entry"))
    masking.finish()

    val = root.section("validation")
    tol = val.section("tolerance")
    tolerance = Tolerance(tol.get("atol", r.number(0.0)), tol.get("rtol", r.number(0.0)), tol.get("rel_rms", r.number(0.0), default=None))
    tol.finish()
    cases = []
    for c in val.items_of("cases"):
        case = Case(
            num_seqs=c.get("num_seqs", r.integer(1, 64)),
            kv_heads=c.get("kv_heads", r.integer(1, 16)),
            seq_lens=c.get("seq_lens", r.list_of(r.integer(0, 1 << 20), min_len=1)),
            max_blocks=c.get("max_blocks", r.integer(1, 4096)),
            line=c.line,
        )
        if len(case.seq_lens) != case.num_seqs:
            raise c.error("seq_lens", f"expected {case.num_seqs} lengths (num_seqs), got {len(case.seq_lens)}")
        c.finish()
        cases.append(case)
    val.finish()
    dims_section, axes_section = root.section("dims"), root.section("variants").section("axes")
    lines = {f"dims.{n}": dims_section.line_of(n) for n in dims} | {f"variants.axes.{n}": axes_section.line_of(n) for n in axes}
    quant = Quant(key_bits, centroids, value_bits)
    return Options(quant, blocks, regions, target, max_partitions, tolerance, tuple(cases), lines)


def _parse_region(name: str, raw: Any, line: int | None, parent: r.Section, dims: Mapping[str, Dim]) -> Region:
    section = r.Section(raw, parent.path, parent.child_field(name), getattr(raw, "line", line))
    axes_section = section.section("axes")
    axes = []
    for axis, extent, axis_line in axes_section.entries():
        if not isinstance(extent, str) or (extent != "fields" and extent not in dims):
            raise axes_section.error(axis, f"expected a dim name ({', '.join(dims)}) or 'fields', got {extent!r}")
        axes.append((axis, extent))
    if section.has("fields") and isinstance(section.data.get("fields"), dict):
        fields_section = section.section("fields")
        packed = []
        for fname, fraw, fline in fields_section.entries():
            f = r.Section(fraw, section.path, fields_section.child_field(fname), getattr(fraw, "line", fline))
            bits = f.get("bits", r.one_of(4, 8))
            count = f.get("count", r.one_of(*dims))
            packing = f.get("packing", r.one_of("low_first", "high_first"), default="low_first")
            f.finish()
            packed.append(PackedField(fname, bits, index_symbol(count), packing == "low_first"))
        section.finish()
        return Region(name, tuple((a, index_symbol(e)) for a, e in axes), packed=tuple(packed))
    dtype = section.get("dtype", r.one_of(*META_DTYPE_BYTES))
    fields = section.get("fields", r.list_of(r.name, min_len=1))
    section.finish()
    extents = tuple((a, sympy.Integer(len(fields)) if e == "fields" else index_symbol(e)) for a, e in axes)
    return Region(name, extents, meta_fields=fields, meta_bytes=META_DTYPE_BYTES[dtype])


def check_spec(spec: Spec, root: r.Section) -> None:
    for name in CONST_DIMS + RUNTIME_DIMS:
        if name not in spec.dims:
            raise SpecError(spec.path, root.line_of("dims"), f"dims.{name}", "required by tq_decode")
        if spec.dims[name].is_runtime != (name in RUNTIME_DIMS):
            kind = "a run-time size (max)" if name in RUNTIME_DIMS else "a compile-time constant (value or variant axis)"
            raise SpecError(spec.path, root.line_of("dims"), f"dims.{name}", f"expected {kind}")
    for name, shape in CONTRACT.items():
        t = spec.tensors.get(name)
        if t is None:
            raise SpecError(spec.path, root.line_of("tensors"), f"tensors.{name}", "required by tq_decode")
        codebook = name == "centroids"  # one entry per centroid: cross-checked with quant.key.centroids
        expected = (spec.options.quant.centroids,) if codebook else shape
        if t.shape != expected:
            why = ", the codebook size quant.key.centroids gives" if codebook else ""
            raise SpecError(spec.path, t.line, f"tensors.{name}.shape", f"expected {list(expected)}{why}, got {list(t.shape)}")
        if t.dtype != DTYPES[name]:
            raise SpecError(spec.path, t.line, f"tensors.{name}.dtype", f"expected {DTYPES[name]}, got {t.dtype}")
        if t.order != tuple(range(len(shape))):
            raise SpecError(spec.path, t.line, f"tensors.{name}.layout", "expected row-major (the launcher allocates and checks these)")
    regions = {reg.name: reg for reg in spec.options.regions}
    data = next((reg for reg in regions.values() if reg.packed), None)
    meta = next((reg for reg in regions.values() if reg.meta_fields), None)
    if data is None or meta is None or [f.name for f in data.packed] != ["k", "v"] or meta.meta_fields != ("k_norm", "v_scale", "v_zero"):
        raise SpecError(spec.path, root.line_of("cache"), "cache.regions", "expected a packed region with fields k, v and a meta region with fields k_norm, v_scale, v_zero")
    if {a for a, _ in data.axes} != {"slot", "kv_head"} or {a for a, _ in meta.axes} != {"slot", "kv_head", "field"}:
        raise SpecError(spec.path, root.line_of("cache"), "cache.regions", "expected data axes {slot, kv_head} and meta axes {kv_head, field, slot}")
    for variant in variants(spec):
        lower(spec, variant)  # constraint and coverage proofs run at load time


# ---- variants ---------------------------------------------------------------------------------


def variant_name(spec: Spec, point: Mapping[str, Any]) -> str:
    """tq_decode_gfx950_d128_qg8_bs16 (FlyDSL for gfx950), tq_decode_triton_d128_qg8_bs16, or
    tq_store_d128_bs16 (the store kernel does not depend on QG)."""
    c = spec.constants(point)
    if point["kind"] == "store":
        return f"tq_store_d{c['head_dim']}_bs{c['BS']}"
    where = spec.options.target.arch if point["backend"] == "flydsl" else point["backend"]
    return f"{spec.name}_{where}_d{c['head_dim']}_qg{c['QG']}_bs{c['BS']}"


def variants(spec: Spec) -> list[Variant]:
    """One decode module per backend and point of the variant axes; with the Triton backend, one
    store module per distinct (head_dim, BS), which serves every QG (and the FlyDSL decode too)."""
    out = []
    for backend in spec.backends:
        for point in spec.variant_points():
            values = {**point, "backend": backend, "kind": "decode"}
            out.append(Variant(variant_name(spec, values), values))
    if "triton" in spec.backends:
        seen = set()
        for point in spec.variant_points():
            values = {**point, "backend": "triton", "kind": "store"}
            name = variant_name(spec, values)
            if name not in seen:  # QG stays in the values (the first one) but plays no part
                seen.add(name)
                out.append(Variant(name, values))
    return out


# ---- lowering ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    spec_name: str
    variant: str
    backend: str
    kernel: str
    consts: Mapping[str, int]  # every derived number the template uses, by name
    offsets: Mapping[str, sympy.Expr]  # symbolic offsets (elements or bytes, as named)
    printed: Mapping[str, Mapping[str, str]]  # offsets printed per context: host, merge, kernel
    siblings: tuple[tuple[int, int], ...]  # (QG, BS) of every variant of the spec with this head_dim
    runtime_dims: tuple[tuple[str, int, str], ...]
    widths: tuple  # IndexWidth per address expression
    proofs: tuple[Coverage, ...]
    facts: tuple[Fact, ...]
    softmax_scale: float
    mapping: tuple[str, ...]  # the derived data-to-lane mapping in words (`kgen show`)


@dataclass(frozen=True)
class KernelContext:
    """What a backend's kernel lowering gets from the shared lowering."""

    spec: Spec
    variant: Variant
    consts: Mapping[str, int]
    offsets: Mapping[str, sympy.Expr]
    ranges: Mapping[sympy.Symbol, Range]
    sym: Mapping[str, sympy.Symbol]
    reject: Callable[[str, str, str], SpecError]


@dataclass(frozen=True)
class KernelPart:
    """A backend's additions to the plan: its own numbers, proofs and printed expressions."""

    consts: Mapping[str, int]
    proofs: tuple[Coverage, ...]
    printed: Mapping[str, str]
    mapping: tuple[str, ...] = ()  # which lane loads which bytes, in a few lines (`kgen show`)


def lower(spec: Spec, variant: Variant) -> Plan:
    opts: Options = spec.options
    c = spec.constants(variant.values)
    d, qg, bs, tile, group = (c[n] for n in CONST_DIMS)
    maxima = {n: spec.dims[n].max for n in RUNTIME_DIMS}

    axis_names = {n for n, _ in spec.axes}

    def reject(field: str, rule: str, nearest: str) -> SpecError:
        """A refusal located where the user sets the value: a compile-time dim's variant axis
        when it has one, else its `dims` entry."""
        head, _, dim = field.rpartition(".")
        if head in ("dims", "variants.axes"):
            field = f"variants.axes.{dim}" if dim in axis_names else f"dims.{dim}"
        return SpecError(spec.path, opts.lines.get(field), field, f"{variant.name}: {rule}; {nearest}")

    # ---- constraints every backend shares --------------------------------------------------
    if d & (d - 1):
        raise reject("dims.head_dim", f"head_dim {d} is not a power of two (the Hadamard rotation needs one)", f"nearest that work: {1 << (d.bit_length() - 1)}, {1 << d.bit_length()}")
    if bs % tile or group % bs:
        raise reject("variants.axes.BS", f"BS {bs} must be a multiple of TILE {tile} and divide GROUP {group}", f"use one of {[b for b in (16, 32, 64, 128, 256) if b % tile == 0 and group % b == 0]}")
    consts = {
        "HEAD_DIM": d,
        "QG": qg,
        "BS": bs,
        "TILE": tile,
        "GROUP": group,
        "N_CENTROIDS": opts.quant.centroids,
        "KEY_BYTES": d * opts.quant.key_bits // 8,
        "VALUE_BYTES": d * opts.quant.value_bits // 8,
        "MAX_PARTITIONS": min(opts.max_partitions, maxima["P"]),
    }

    # ---- cache block layout from the region declarations ------------------------------------
    sym = {n: index_symbol(n) for n in CONST_DIMS + RUNTIME_DIMS}
    fold = {sym[n]: c[n] for n in CONST_DIMS}
    block = SoABlock([_fold_region(reg, fold) for reg in opts.regions])
    data = next(reg for reg in block.regions.values() if reg.packed)
    meta = next(reg for reg in block.regions.values() if reg.meta_fields)
    for f in data.packed:
        if not f.low_first:
            raise reject(f"cache.regions.{data.name}.fields.{f.name}.packing", "only low_first packing is implemented", "use low_first")

    seq, kvh, part, slot, row, e, phys, bt_i, head = (
        index_symbol(n) for n in ("seq", "kv_head", "part", "slot", "row", "e", "phys_block", "bt_index", "head")
    )
    ranges = {
        **{sym[n]: Range(1, maxima[n], f"declared max of {n}") for n in RUNTIME_DIMS},
        seq: Range(0, maxima["num_seqs"] - 1, "grid axis 0"),
        kvh: Range(0, maxima["Hk"] - 1, "grid axis 1"),
        part: Range(0, maxima["P"] - 1, "grid axis 2"),
        slot: Range(0, bs - 1, "slot within a cache block"),
        row: Range(0, ROW_PAD - 1, "query row within the group (rows >= QG are padding)"),
        e: Range(0, d - 1, "element of head_dim"),
        phys: Range(0, maxima["num_blocks"] - 1, "block-table entry"),
        bt_i: Range(0, maxima["max_blocks"] - 1, "block index within the sequence"),
        head: Range(0, maxima["Hk"] * qg - 1, "query head"),
    }
    shape = lambda name: [_dim_expr(s, sym) for s in spec.tensors[name].shape]  # noqa: E731
    layouts = {name: TensorLayout(name, shape(name), range(len(shape(name))), [f"a{i}" for i in range(len(shape(name)))]).substitute(fold) for name in CONTRACT}

    def at(name: str, *index: sympy.Expr) -> sympy.Expr:
        return layouts[name].offset(**{f"a{i}": x for i, x in enumerate(index)})

    block_bytes = block.block_bytes
    offsets = {
        # bytes, from the start of a cache block
        "block_bytes": block_bytes,
        "k_bytes": block.field_offset(data.name, "k", {"slot": slot, "kv_head": kvh}),
        "v_bytes": block.field_offset(data.name, "v", {"slot": slot, "kv_head": kvh}),
        "k_norm_bytes": block.field_offset(meta.name, "k_norm", {"slot": slot, "kv_head": kvh}),
        "v_scale_bytes": block.field_offset(meta.name, "v_scale", {"slot": slot, "kv_head": kvh}),
        "v_zero_bytes": block.field_offset(meta.name, "v_zero", {"slot": slot, "kv_head": kvh}),
        "block_base_bytes": phys * block_bytes,
        # elements of the named tensors: a per-program base plus an in-program offset
        "query_base": at("query", seq, kvh * qg, 0),
        "query_row": at("query", 0, row, e),
        "block_table_base": at("block_table", seq, 0),
        "out_parts_base": at("out_parts", seq, kvh, part, 0, 0),
        "out_parts_row": at("out_parts", 0, 0, 0, row, e),
        "partials_base": at("exp_sums", seq, kvh, part, 0),
        "output_base": at("output", seq, head, 0),
    }
    widths = tuple(decide_width(name, expr, ranges) for name, expr in offsets.items())
    for w in widths:
        # Per-program bases (names ending in _base) are added to the 64-bit pointer; everything
        # else is an in-program offset, which both backends keep in 32 bits (buffer offsets are
        # 32-bit on AMD).
        if w.bits == 64 and not (w.name.endswith("_base") or w.name == "block_base_bytes"):
            raise reject("dims", f"{w.name} = {w.expr} needs 64 bits at the declared maxima but is a 32-bit in-program offset", "lower the maxima of Hk or num_seqs")

    # Printed forms. Host code and the merge kernel see Hk and P as Python ints.
    host = PythonPrinter({sym["Hk"]: "Hk"})
    merge_names = {sym["Hk"]: "NUM_KV_HEADS", sym["P"]: "NUM_PARTITIONS", kvh: "kv_head"}
    merge_exprs = {
        "partials": (at("exp_sums", seq, kvh, part, row), {}),
        "out_parts": (at("out_parts", seq, kvh, part, row, e), {part: "part[:, None]", e: "e[None, :]"}),
        "output": (at("output", seq, head, e), {}),
    }
    merge = {}
    for name, (expr, names) in merge_exprs.items():
        width = decide_width(f"merge_{name}", expr, ranges)
        widths += (width,)
        constexprs = (sym["Hk"], sym["P"])  # launch-time constants of the merge kernel
        merge[name] = TritonPrinter(ranges, {**merge_names, **names}, constexprs, bits=width.bits)(expr)
    printed = {"host": {"block_bytes": host(block_bytes)}, "merge": merge}

    ctx = KernelContext(spec, variant, consts, offsets, ranges, sym, reject)
    backend = BACKENDS[variant.values["backend"]]
    part_ = backend.lower_store(ctx) if variant.values["kind"] == "store" else backend.lower_kernel(ctx)
    failed = [p for p in part_.proofs if not p.ok]
    if failed:
        p = failed[0]
        raise reject("dims", f"lane mapping {p.name} does not cover its tile exactly once ({p.detail})", "see `kgen show` for the mappings")
    consts = {**consts, **part_.consts}
    printed["kernel"] = dict(part_.printed)

    scale = 1.0 / d**0.5
    facts = tuple(Fact(k, str(v), "") for k, v in consts.items()) + (
        Fact("block stride (bytes)", str(block_bytes), "data region + meta region, from cache.regions"),
        Fact("meta region offset", str(block.region_offset(meta.name)), "after the data region"),
        Fact("softmax scale", f"{scale!r}", "1/sqrt(head_dim)"),
    )
    return Plan(
        spec_name=spec.name,
        variant=variant.name,
        backend=variant.values["backend"],
        kernel=f"{variant.name}_kernel",
        consts=consts,
        offsets=offsets,
        printed=printed,
        siblings=tuple(
            (pc["QG"], pc["BS"]) for pc in map(spec.constants, spec.variant_points()) if pc["head_dim"] == d
        ),
        runtime_dims=tuple((n, maxima[n], spec.dims[n].doc) for n in RUNTIME_DIMS),
        widths=widths,
        proofs=part_.proofs,
        mapping=part_.mapping,
        facts=facts,
        softmax_scale=scale,
    )


def _dim_expr(item: str | int, sym: Mapping[str, sympy.Symbol]) -> sympy.Expr:
    if isinstance(item, int):
        return sympy.Integer(item)
    return sympy.Mul(*(sym[part] for part in item.split("*")))


def _fold_region(reg: Region, fold: Mapping[sympy.Symbol, int]) -> Region:
    axes = tuple((a, sympy.sympify(x).subs(fold)) for a, x in reg.axes)
    packed = tuple(PackedField(f.name, f.bits, sympy.sympify(f.count).subs(fold), f.low_first) for f in reg.packed)
    return Region(reg.name, axes, packed, reg.meta_fields, reg.meta_bytes)


from kgen.ops import tq_flydsl, tq_triton  # noqa: E402  (backend lowerings use the types above)

BACKENDS = {"flydsl": tq_flydsl, "triton": tq_triton}
