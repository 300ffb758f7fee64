"""Multi-scale deformable attention, forward and backward (operators.md §1), lowered for Triton.

Tiling (the query-block design): one program owns BLOCK_Q consecutive queries of one
(batch, head) pair and all L·K sampling points of each, accumulating a (BLOCK_Q, BLOCK_D) fp32
tile in registers. Sampling parameters load coalesced over the query block; each corner gather
reads a contiguous D-channel row of `value`.

Backward: the same grid and the same address expressions. A program recomputes the four corners
of each sampling point, writes that point's location and weight gradients with plain stores (one
program owns them) and scatters attn · corner weight · grad_out into grad_value with atomic adds.
How grad_value accumulates is derived here, not tabled by hand: from the spec's target
(`schedule.target`, facts in kgen/targets.py) and `schedule.deterministic`:
  - native: atomic adds in the input dtype, where the target has them for that dtype;
  - fp32: an fp32 buffer (fp32 atomics), cast to the input dtype at the end, where it has not;
  - fixed point (deterministic): each contribution is scaled by a power of two 2^e and truncated
    to int64, the int64 atomic adds are associative and commutative, so the sum is bitwise the
    same in any order; then one pass converts back. e is picked per call on the device from a
    bound on any pixel's sum (Q·K·max|attn|·max|grad_out| ≤ 2^61), no host synchronization.

Cost model of the deterministic backward against the atomic one (same kernel otherwise):
  - the same atomic count (B·Q·M·L·K·4 corner rows of D channels), as 8-byte int64 adds instead
    of 4-byte fp32 (or 2-byte native f16/bf16) adds: the scatter is bound by atomic throughput
    at the L2, which Hopper serves for 32- and 64-bit integer adds alike;
  - an int64 buffer of B·S·M·D·8 bytes (zeroed, then converted: read 8 B, write the dtype)
    instead of an fp32 buffer (4 B) or none (native atomics);
  - two max-reductions before the kernel (|attention_weights|, |grad_output|: one extra read of
    grad_output, B·Q·M·D elements) to pick e;
  - precision: each contribution is truncated at 2^-e = bound·2^-61, i.e. 2^-61 of the largest
    sum possible; fp32 accumulation rounds at 2^-24 of the running sum.

Everything the kernel computes an address from is derived here from the spec's dims and layouts
with sympy; the template only receives printed expressions and numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import sympy

from kgen.algebra import (
    FloorDiv,
    IndexWidth,
    Mod,
    PythonPrinter,
    Range,
    TensorLayout,
    TritonPrinter,
    decide_width,
    index_symbol,
)
from kgen.errors import SpecError
from kgen.ops.common import SHORT_DTYPE, TORCH_DTYPE, Fact, Tolerance, parse_tolerances
from kgen.spec import reader as r
from kgen.spec.model import Dim, Spec, Variant
from kgen.targets import NVIDIA_TARGETS

backends = ("triton",)


def template_for(variant) -> str:
    return "triton/msda_fwd.py.jinja"


# The operator's contract: logical shapes (any memory order may be declared for inputs).
RUNTIME_DIMS = ("B", "Q", "S")
CONST_DIMS = ("M", "D", "L", "K")
CONTRACT = {
    "value": ("B", "S", "M", "D"),
    "spatial_shapes": ("L", 2),
    "level_start_index": ("L",),
    "sampling_locations": ("B", "Q", "M", "L", "K", 2),
    "attention_weights": ("B", "Q", "M", "L", "K"),
    "output": ("B", "Q", "M", "D"),
}
FLOAT_TENSORS = ("value", "sampling_locations", "attention_weights", "output")
INDEX_TENSORS = ("spatial_shapes", "level_start_index")
GRID_Y_LIMIT = 65535  # CUDA's limit on grid dimension 1 (one program row per (batch, head))


# ---- spec sections ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    block_q: int
    num_warps: int
    num_stages: int
    target: str  # an NVIDIA arch of kgen.targets.NVIDIA_TARGETS: decides grad_value's atomics
    deterministic: bool  # bitwise-reproducible grad_value (fixed-point int64 accumulation)


@dataclass(frozen=True)
class Case:
    """One validation problem: sizes, level shapes, and the range locations are drawn from."""

    batch: int
    queries: int
    spatial_shapes: tuple[tuple[int, int], ...]
    locations: tuple[float, float]
    line: int | None


@dataclass(frozen=True)
class Options:
    schedule: Schedule
    padding: str
    tolerances: Mapping[str, Tolerance]
    grad_tolerances: Mapping[str, Tolerance]
    grad_cases: tuple[Case, ...]
    cpu_cases: tuple[Case, ...]
    gpu_cases: tuple[Case, ...]


def parse_options(root: r.Section, dims: Mapping[str, Dim], axes: Mapping[str, tuple]) -> Options:
    sched = root.section("schedule")
    schedule = Schedule(
        block_q=sched.get("block_q", r.power_of_two(8, 256)),
        num_warps=sched.get("num_warps", r.power_of_two(1, 16)),
        num_stages=sched.get("num_stages", r.integer(1, 8), default=1),
        target=sched.get("target", r.one_of(*NVIDIA_TARGETS), default="sm_90"),
        deterministic=sched.get("deterministic", r.boolean, default=False),
    )
    sched.finish()

    masking = root.section("masking")
    # grid_sample's padding_mode; ragged query tails and head-dim padding are derived from dims.
    padding = masking.get("out_of_image", r.one_of("zeros"))
    masking.finish()

    val = root.section("validation")
    dtypes = tuple(axes.get("dtype", ()))
    tolerances = parse_tolerances(val.section("tolerances"), dtypes)
    grad_tolerances = parse_tolerances(val.section("grad_tolerances"), dtypes)
    grad_cases = tuple(_parse_case(c) for c in val.items_of("grad_cases"))
    cpu_cases = tuple(_parse_case(c) for c in val.items_of("cpu_cases"))
    gpu_cases = tuple(_parse_case(c) for c in val.items_of("gpu_cases"))
    if not cpu_cases:
        raise val.error("cpu_cases", "required: at least one case for the CPU (interpreter) tier")
    val.finish()
    return Options(schedule, padding, tolerances, grad_tolerances, grad_cases, cpu_cases, gpu_cases)


def _parse_case(section: r.Section) -> Case:
    def level_shape(value: Any) -> tuple[int, int]:
        return r.list_of(r.integer(1, 2**20))(value) if isinstance(value, list) and len(value) == 2 else _bad(value)

    def _bad(value: Any):
        raise r.Invalid(f"expected [height, width], got {value!r}")

    lo, hi = section.get("locations", r.list_of(r.number(), min_len=2), default=(-0.2, 1.2))[:2]
    case = Case(
        batch=section.get("batch", r.integer(0)),
        queries=section.get("queries", r.integer(0)),
        spatial_shapes=section.get("spatial_shapes", r.list_of(level_shape, min_len=1)),
        locations=(lo, hi),
        line=section.line,
    )
    section.finish()
    return case


def check_spec(spec: Spec, root: r.Section) -> None:
    """The operator's semantics fix which dims and tensors exist and what they are."""
    for name in RUNTIME_DIMS + CONST_DIMS:
        if name not in spec.dims:
            raise SpecError(spec.path, root.line_of("dims"), f"dims.{name}", "required by msda_forward")
        runtime = spec.dims[name].is_runtime
        if runtime != (name in RUNTIME_DIMS):
            kind = "a run-time size (max)" if name in RUNTIME_DIMS else "a compile-time constant (value)"
            raise SpecError(spec.path, root.line_of("dims"), f"dims.{name}", f"expected {kind}")
    for name, shape in CONTRACT.items():
        t = spec.tensors.get(name)
        if t is None:
            raise SpecError(spec.path, root.line_of("tensors"), f"tensors.{name}", "required by msda_forward")
        if t.shape != shape:
            raise SpecError(spec.path, t.line, f"tensors.{name}.shape", f"expected {list(shape)}, got {list(t.shape)}")
        want_role = "output" if name == "output" else "input"
        if t.role != want_role:
            raise SpecError(spec.path, t.line, f"tensors.{name}.role", f"expected {want_role}, got {t.role}")
    for name in FLOAT_TENSORS:
        if spec.tensors[name].dtype != "dtype":
            raise SpecError(spec.path, spec.tensors[name].line, f"tensors.{name}.dtype", "expected the variant axis 'dtype'")
    for name in INDEX_TENSORS:
        if spec.tensors[name].dtype != "int64":
            raise SpecError(spec.path, spec.tensors[name].line, f"tensors.{name}.dtype", "expected int64")
    if "dtype" not in dict(spec.axes):
        raise SpecError(spec.path, root.line_of("variants"), "variants.axes.dtype", "required: the element types to emit")
    if spec.tensors["output"].order != tuple(range(4)):
        raise SpecError(spec.path, spec.tensors["output"].line, "tensors.output.layout", "the output is returned as (B, Q, M*D): expected row-major")
    for point in spec.variant_points():
        consts = spec.constants(point)
        for case in spec.options.grad_cases + spec.options.cpu_cases + spec.options.gpu_cases:
            if len(case.spatial_shapes) != consts["L"]:
                raise SpecError(spec.path, case.line, "validation.spatial_shapes", f"expected {consts['L']} levels (L), got {len(case.spatial_shapes)}")
        lower(spec, Variant(variant_name(spec, point), point))  # constraint proofs run at load time


# ---- variants ---------------------------------------------------------------------------------


def variant_name(spec: Spec, point: Mapping[str, Any], direction: str = "fwd") -> str:
    """A name that encodes every axis and constant, e.g. msda_fwd_bf16_m8_d32_l4_k4 (the module,
    its forward custom op) or msda_bwd_bf16_m8_d32_l4_k4 (its backward custom op)."""
    c = spec.constants(point)
    return f"{spec.name}_{direction}_{SHORT_DTYPE[point['dtype']]}_m{c['M']}_d{c['D']}_l{c['L']}_k{c['K']}"


def variants(spec: Spec) -> list[Variant]:
    return [Variant(variant_name(spec, p), p) for p in spec.variant_points()]


# ---- lowering ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorCheck:
    """What the wrapper checks about one tensor argument (shape, dtype, strides)."""

    name: str
    shape: str  # tuple literal of ints and dim names, e.g. ("B", "S", 8, 32)
    dtype: str
    strides: str  # tuple of Python expressions over the bound sizes


@dataclass(frozen=True)
class Plan:
    """Everything the MSDA template renders, derived from the spec."""

    spec_name: str
    variant: str
    kernel: str
    bwd_kernel: str
    fwd_op: str  # torch.library names, unique per variant
    bwd_op: str
    dtype: str
    torch_dtype: str
    acc: str  # Triton dtype of the arithmetic: fp32, fp64 for the float64 variant
    acc_torch: str
    target: str
    deterministic: bool
    grad_accum: str  # "native", "fp32" or "fixed_point": how grad_value's scatter accumulates
    accum_torch_dtype: str  # dtype of the tensor the atomic adds go to on the GPU
    interpreter_accum_torch_dtype: str  # the same under the Triton interpreter (no bf16 atomics)
    fixed_point_bits: int  # fixed point: any pixel's |sum| * 2^e stays below 2^this
    heads: int
    head_dim: int
    levels: int
    points: int
    block_q: int
    block_d: int
    num_warps: int
    num_stages: int
    query_mask: bool
    channel_mask: bool
    runtime_dims: tuple[tuple[str, int, str], ...]  # (name, declared max, doc)
    checks: tuple[TensorCheck, ...]
    expr: Mapping[str, str]  # printed index expressions, by name
    widths: tuple[IndexWidth, ...]
    facts: tuple[Fact, ...]


def lower(spec: Spec, variant: Variant) -> Plan:
    opts: Options = spec.options
    consts = spec.constants(variant.values)
    M, D, L, K = (consts[n] for n in CONST_DIMS)
    maxima = {n: spec.dims[n].max for n in RUNTIME_DIMS}
    block_q = opts.schedule.block_q
    block_d = 1 << (D - 1).bit_length()  # tl.arange needs a power of two

    sym = {n: index_symbol(n) for n in RUNTIME_DIMS + CONST_DIMS}
    fold = {sym[n]: consts[n] for n in CONST_DIMS}
    layouts = {
        name: TensorLayout(name, [sym[s] if isinstance(s, str) else s for s in t.shape], t.order, _axis_names(t.shape)).substitute(fold)
        for name, t in spec.tensors.items()
    }

    # Index symbols of the kernel and the ranges the proofs use.
    b, m, q, d, pix, pid_bm = (index_symbol(n) for n in ("b", "m", "q", "d", "pixel", "pid_bm"))
    q_hi = maxima["Q"] + block_q - 2  # masked lanes of the last block still form addresses
    ranges = {
        sym["B"]: Range(1, maxima["B"], "declared max of B"),
        sym["Q"]: Range(1, maxima["Q"], "declared max of Q"),
        sym["S"]: Range(1, maxima["S"], "declared max of S"),
        pid_bm: Range(0, maxima["B"] * M - 1, "grid axis 1 enumerates (batch, head) pairs"),
        b: Range(0, maxima["B"] - 1, "pid_bm // M"),
        m: Range(0, M - 1, "pid_bm % M"),
        q: Range(0, q_hi, "query block rows, masked lanes included"),
        d: Range(0, block_d - 1, "channel lanes, masked lanes included"),
        pix: Range(
            -2 * maxima["S"] - 2,
            2 * maxima["S"],
            "level_start + y0*W + x0 with x0 in [-2, W], y0 in [-2, H] (clamped) and level_start + H*W <= S",
        ),
    }
    triton = TritonPrinter(ranges)
    host = PythonPrinter()

    widths: list[IndexWidth] = []

    def address(name: str, expr: sympy.Expr, names: Mapping[sympy.Symbol, str] | None = None) -> str:
        width = decide_width(name, expr, ranges)
        widths.append(width)
        printer = TritonPrinter(ranges, names, bits=width.bits)
        return printer(expr)

    vals, locs, wts, out = (layouts[n] for n in ("value", "sampling_locations", "attention_weights", "output"))
    lvl, k_, c_ = sympy.Symbol("l", integer=True), sympy.Symbol("k", integer=True), sympy.Integer
    expr = {
        "b": triton(FloorDiv(pid_bm, M)),
        "m": triton(Mod(pid_bm, M)),
        "value_base": address("value_base", vals.offset(B=b, M=m)),
        "loc_base": address("loc_base", locs.offset(B=b, Q=q, M=m)),
        "weight_base": address("weight_base", wts.offset(B=b, Q=q, M=m)),
        "gather": address("gather", vals.offset(S=pix, D=d), {pix: "pixel[:, None]", d: "d[None, :]"}),
        "out": address("out", out.offset(B=b, Q=q, M=m, D=d), {q: "q[:, None]", d: "d[None, :]"}),
        # Offsets that only involve the unrolled level/point indices are compile-time ints.
        "loc_x": host(locs.offset(L=lvl, K=k_, axis5=c_(0))),
        "loc_y": host(locs.offset(L=lvl, K=k_, axis5=c_(1))),
        "weight_point": host(wts.offset(L=lvl, K=k_)),
        "level_h": host(layouts["spatial_shapes"].offset(L=lvl, axis1=c_(0))),
        "level_w": host(layouts["spatial_shapes"].offset(L=lvl, axis1=c_(1))),
        "level_start": host(layouts["level_start_index"].offset(L=lvl)),
    }

    # Proofs about the launch: the grid fits, and every level start fits the int32 coordinates.
    if maxima["B"] * M > GRID_Y_LIMIT:
        raise SpecError(spec.path, None, "dims.B.max", f"B*M = {maxima['B'] * M} programs on grid axis 1 exceeds CUDA's {GRID_Y_LIMIT}; lower B's max to at most {GRID_Y_LIMIT // M}")
    if 2 * maxima["S"] + 2 > 2**31 - 1:
        raise SpecError(spec.path, None, "dims.S.max", "pixel coordinates are computed in int32; S's max must stay below 2^30")

    # How the backward accumulates grad_value, from the target's atomics and the spec's option.
    dtype = variant.values["dtype"]
    target = NVIDIA_TARGETS[opts.schedule.target]
    acc = "float64" if dtype == "float64" else "float32"
    fixed_point_bits = 61
    if opts.schedule.deterministic:
        if not target.native_atomic_add("int64"):
            raise SpecError(spec.path, None, "schedule.deterministic", f"needs int64 atomic adds: {target.atomic_add_reason('int64')}")
        grad_accum, accum = "fixed_point", "int64"
        accum_why = (
            f"deterministic: contributions * 2^e truncated to int64, {target.atomic_add_reason('int64')}; "
            f"e per call so that Q*K*max|attn|*max|grad_out| * 2^e <= 2^{fixed_point_bits}"
        )
    elif target.native_atomic_add(dtype):
        grad_accum, accum, accum_why = "native", dtype, target.atomic_add_reason(dtype)
    else:
        grad_accum, accum = "fp32", "float32"
        accum_why = f"{target.atomic_add_reason(dtype)}: fp32 buffer, {target.atomic_add_reason('float32')}, cast at the end"
    # The Triton interpreter (CPU) has no bfloat16 atomics: it accumulates bf16 in fp32 instead.
    interpreter_accum = "float32" if accum == "bfloat16" else accum

    runtime_dims = tuple((n, maxima[n], spec.dims[n].doc) for n in RUNTIME_DIMS)
    checks = tuple(_tensor_check(name, spec, variant, layouts[name], host) for name in CONTRACT if name != "output")
    query_mask = spec.dims["Q"].multiple_of % block_q != 0
    channel_mask = block_d != D
    facts = (
        Fact("BLOCK_Q", str(block_q), "schedule.block_q"),
        Fact("BLOCK_D", str(block_d), f"next power of two >= D={D} (tl.arange needs a power of two)"),
        Fact("grid", f"(cdiv(Q, {block_q}), B*{M})", f"axis 1 at most {maxima['B'] * M} <= {GRID_Y_LIMIT}"),
        Fact("query mask", "emitted" if query_mask else "omitted", f"Q is guaranteed a multiple of {spec.dims['Q'].multiple_of}; BLOCK_Q={block_q}"),
        Fact("channel mask", "emitted" if channel_mask else "omitted", f"D={D}, BLOCK_D={block_d}"),
        Fact("out-of-image corners", opts.padding, "masked loads with other=0 (grid_sample padding_mode='zeros')"),
        Fact("arithmetic", acc, "fp64 for the float64 variant (gradcheck), else fp32"),
        Fact("backward grid", f"(cdiv(Q, {block_q}), B*{M})", "as the forward; grad_loc, grad_attn: plain stores by their owner"),
        Fact("grad_value accumulation", f"{grad_accum} ({accum})", accum_why),
        Fact("grad_value on interpreter", interpreter_accum, "the Triton interpreter has no bfloat16 atomics"),
        Fact("backward addresses", "as forward", "grad_value: value_base + gather; grad_out: out; grad_loc, grad_attn: loc_base, weight_base"),
    ) + tuple(Fact(f"range {s}", f"[{rg.lo}, {rg.hi}]", rg.why) for s, rg in ranges.items())

    return Plan(
        spec_name=spec.name,
        variant=variant.name,
        kernel=f"_{variant.name}_kernel",
        bwd_kernel=f"_{variant_name(spec, variant.values, 'bwd')}_kernel",
        fwd_op=f"kgen::{variant.name}",
        bwd_op=f"kgen::{variant_name(spec, variant.values, 'bwd')}",
        dtype=dtype,
        torch_dtype=TORCH_DTYPE[dtype],
        acc=f"tl.{acc}",
        acc_torch=TORCH_DTYPE[acc],
        target=target.arch,
        deterministic=opts.schedule.deterministic,
        grad_accum=grad_accum,
        accum_torch_dtype=TORCH_DTYPE[accum],
        interpreter_accum_torch_dtype=TORCH_DTYPE[interpreter_accum],
        fixed_point_bits=fixed_point_bits,
        heads=M,
        head_dim=D,
        levels=L,
        points=K,
        block_q=block_q,
        block_d=block_d,
        num_warps=opts.schedule.num_warps,
        num_stages=opts.schedule.num_stages,
        query_mask=query_mask,
        channel_mask=channel_mask,
        runtime_dims=runtime_dims,
        checks=checks,
        expr=expr,
        widths=tuple(widths),
        facts=facts,
    )


def _axis_names(shape: tuple) -> list[str]:
    """Dim names for symbolic axes; `axis<i>` for literal-size axes such as the (x, y) pair."""
    return [s if isinstance(s, str) else f"axis{i}" for i, s in enumerate(shape)]


def _tensor_check(name: str, spec: Spec, variant: Variant, layout: TensorLayout, host: PythonPrinter) -> TensorCheck:
    consts = spec.constants(variant.values)
    shape = tuple(consts.get(s, s) if isinstance(s, str) else s for s in spec.tensors[name].shape)
    shown = "(" + ", ".join(repr(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    strides = "(" + ", ".join(host(s) for s in layout.strides) + ("," if len(shape) == 1 else "") + ")"
    return TensorCheck(name, shown, TORCH_DTYPE[spec.dtype_of(name, variant.values)], strides)
