"""Multi-scale deformable attention, forward and backward (operators.md §1), lowered for Triton.

Tiling (the query-block design): one program owns BLOCK_Q consecutive queries of one
(batch, head) pair and all L·K sampling points of each, accumulating a (BLOCK_Q, BLOCK_D) fp32
tile in registers. Sampling parameters load coalesced over the query block; each corner gather
reads a contiguous D-channel row of `value`.

Backward: the same grid and the same address expressions. A program works on SAMPLE_STEP samples
(s = level * K + point) of its BLOCK_Q queries at once, a (BLOCK_Q, SAMPLE_STEP, BLOCK_D) tile:
locations and weights load as (BLOCK_Q, SAMPLE_STEP) tiles, contiguous per query, and the location
and weight gradients (one program owns them: plain stores) store the same way, instead of one
strided scalar per query and sample. Per corner it recomputes the rows, takes <grad_out, row> and
scatters attn · corner weight · grad_out into grad_value with atomic adds. Measured on the H200
(benchmarks/RESULTS.md, session 14): the scattered 2-byte stores and loads of the per-sample form
kept the L2's input crossbar 94% busy with 17M one-sector writes at encoder size; the tile form
is 1.26x faster there (bf16 and fp32 DETR), 1.14x at decoder size.
How grad_value accumulates is derived here, not tabled by hand: from the spec's target
(`schedule.target`, facts in kgen/targets.py), `schedule.deterministic` and
`schedule.grad_accumulation`:
  - native: atomic adds in the input dtype, where the target has them for that dtype;
  - fp32: an fp32 buffer (fp32 atomics), cast to the input dtype at the end, where it has not,
    and for f16/bf16 wherever grad_accumulation is fp32, for every call or per size class
    (16-bit adds round the running sum on every contribution: hot pixels of small levels lose
    precision; the buffer's zero fill and cast cost most at small B*Q);
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
from kgen.spec.model import DTYPES, Dim, Spec, Variant
from kgen.targets import NVIDIA_TARGETS
from kgen.tune import DEFAULT_SAMPLING, DIRECTIONS, FIELD_CHECKS, FIELD_DEFAULTS, Launch, Tuning, TuneConfig, enumerate_candidates, load_tuning, parse_tune

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
WARP = 32  # threads per warp on NVIDIA GPUs
# The kernels hold (BLOCK_Q, BLOCK_D) tiles in registers, spread over the program's threads: the
# forward an fp32 accumulator and one corner at a time; the backward the grad_out tile, a corner
# tile, its contribution and a tile of 64-bit corner addresses at once. Up to 32 fp32 values of
# one tile per thread keeps that within the 255 registers a thread can address; more spills.
TILE_VALUES_PER_THREAD = 32
# The level and point loops are unrolled (static_range) while levels * points * tile values per
# thread stays within this; above it the point loop runs at run time. Measured on sm_90 (Triton
# 3.6): at 1280 (L=5, K=8, D=128, BLOCK_Q 32, 4 warps) the fp64 backward was still in LLVM after
# 5 minutes and a 16-bit variant's GPU validation took ~195 s (18 s with the loop); at 256 (D=64)
# a whole validation takes a few seconds.
UNROLLED_TILE_VALUES = 512
# The backward's SAMPLE_STEP: the most samples (a power of two dividing L*K) whose
# (BLOCK_Q, SAMPLE_STEP, BLOCK_D) tile stays within this many values per thread. On the H200 the
# backward at 8 to 32 values per thread was within 3% of its best (bf16 and fp32 DETR, decoder
# and encoder sizes, benchmarks/RESULTS.md session 14); the rule leaves block_q and num_warps
# the only tuned choices.
SAMPLE_TILE_VALUES = 16
# Corner coordinates are clamped to [CLAMP, size] before they become int32 pixel indices: far
# samples stay representable and both of their corners stay outside the image (masked).
CLAMP = -2
# Normal binary exponents of the accumulation types: the fixed-point scale 2^e stays inside them.
NORMAL_EXPONENTS = {"float32": (-126, 127), "float64": (-1022, 1023)}


# ---- spec sections ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    block_q: int
    num_warps: int
    num_stages: int
    point_loop: str  # tune.POINT_LOOPS
    corners: str  # tune.CORNER_FORMS: how the forward adds a sample's four corners
    locations: str  # tune.LOCATION_FORMS: how the forward loads a sample's (x, y)
    target: str  # an NVIDIA arch of kgen.targets.NVIDIA_TARGETS: decides grad_value's atomics
    deterministic: bool  # bitwise-reproducible grad_value (fixed-point int64 accumulation)
    # "native": the input dtype's atomics where the target has them; "fp32": never narrower than
    # fp32; or a mapping from each size class (tune.size_classes) to one of the two.
    grad_accumulation: str | Mapping[str, str] = "native"

    @property
    def launch(self) -> Launch:
        return Launch(self.block_q, self.num_warps, self.num_stages, self.point_loop, self.corners, self.locations)

    def accumulation_for(self, size_class: str) -> str:
        choice = self.grad_accumulation
        return choice if isinstance(choice, str) else choice[size_class]


ACCUMULATIONS = ("native", "fp32")


@dataclass(frozen=True)
class Accumulation(r.Check):
    """schedule.grad_accumulation: one choice for every call, or one per size class."""

    def __call__(self, value: Any) -> str | dict[str, str]:
        if isinstance(value, str) and value in ACCUMULATIONS:
            return value
        if isinstance(value, dict) and value:
            out = {}
            for name, choice in value.items():
                if choice not in ACCUMULATIONS:
                    raise r.Invalid(f"expected native or fp32 for size class {name!r}, got {r._show(choice)}")
                out[str(name)] = choice
            return out
        raise r.Invalid(f"expected native, fp32 or a mapping {{size class: native or fp32}}, got {r._show(value)}")

    def schema(self) -> dict:
        choice = {"enum": list(ACCUMULATIONS)}
        return {"anyOf": [choice, {"type": "object", "additionalProperties": choice, "minProperties": 1}]}

    @property
    def words(self) -> str:
        return "`native` or `fp32`, or a mapping from each size class name to one of them"


@dataclass(frozen=True)
class Case:
    """One validation problem: sizes, level shapes, and the range locations are drawn from. A
    case lists at least as many levels as the largest L; a variant uses the first L of them."""

    batch: int
    queries: int
    spatial_shapes: tuple[tuple[int, int], ...]
    locations: tuple[float, float]
    line: int | None
    field: str = "validation"  # e.g. validation.cpu_cases[1], for messages

    def first_levels(self, levels: int) -> "Case":
        return Case(self.batch, self.queries, self.spatial_shapes[:levels], self.locations, self.line, self.field)


@dataclass(frozen=True)
class Options:
    schedule: Schedule
    padding: str
    tolerances: Mapping[str, Tolerance]
    grad_tolerances: Mapping[str, Tolerance]
    grad_cases: tuple[Case, ...]
    cpu_cases: tuple[Case, ...]
    gpu_cases: tuple[Case, ...]
    tune: TuneConfig | None  # schedule candidates and size classes (None: one schedule for all sizes)
    lines: Mapping[str, int | None]  # spec line of dims, axes and shapes ("variants.shapes[2].D")


def parse_options(root: r.Section, dims: Mapping[str, Dim], axes: Mapping[str, tuple]) -> Options:
    sched = root.section("schedule")
    schedule = Schedule(
        block_q=sched.get("block_q", r.power_of_two(8, 256)),
        num_warps=sched.get("num_warps", r.power_of_two(1, 16)),
        num_stages=sched.get("num_stages", r.integer(1, 8), default=1),
        point_loop=sched.get("point_loop", FIELD_CHECKS["point_loop"], default=FIELD_DEFAULTS["point_loop"]),
        corners=sched.get("corners", FIELD_CHECKS["corners"], default=FIELD_DEFAULTS["corners"]),
        locations=sched.get("locations", FIELD_CHECKS["locations"], default=FIELD_DEFAULTS["locations"]),
        target=sched.get("target", r.one_of(*NVIDIA_TARGETS), default="sm_90"),
        deterministic=sched.get("deterministic", r.boolean, default=False),
        grad_accumulation=sched.get("grad_accumulation", Accumulation(), default="native"),
    )
    accumulation_line = sched.line_of("grad_accumulation")
    locations_line = sched.line_of("locations")
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

    tune = parse_tune(root.section("tune"), [c.batch * c.queries for c in gpu_cases], axes) if root.has("tune") else None
    if not isinstance(schedule.grad_accumulation, str):
        classes = [c.name for c in tune.classes] if tune else []
        if sorted(schedule.grad_accumulation) != sorted(classes):
            raise SpecError(
                root.path, accumulation_line, "schedule.grad_accumulation",
                f"expected one entry per size class of tune.size_classes ({', '.join(classes) or 'none declared'}), "
                f"got {', '.join(schedule.grad_accumulation)}",
            )

    lines: dict[str, int | None] = {}
    dims_section, variants = root.section("dims"), root.section("variants")
    lines.update({f"dims.{n}": dims_section.line_of(n) for n in dims})
    lines.update({f"variants.axes.{n}": variants.section("axes").line_of(n) for n in axes})
    lines["variants"] = root.line_of("variants")
    lines["schedule.locations"] = locations_line
    for i, item in enumerate(variants.items_of("shapes") if variants.has("shapes") else ()):
        lines[f"variants.shapes[{i}]"] = item.line
        lines.update({f"variants.shapes[{i}].{k}": item.line_of(k) for k in item.data})
    return Options(schedule, padding, tolerances, grad_tolerances, grad_cases, cpu_cases, gpu_cases, tune, lines)


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
        field=section.field,
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
    opts: Options = spec.options
    if not variants(spec):
        return  # load_spec reports that the exclusions leave nothing
    deepest = max(variants(spec), key=lambda v: spec.constants(v.values)["L"])
    levels = spec.constants(deepest.values)["L"]
    for case in opts.grad_cases + opts.cpu_cases + opts.gpu_cases:
        if len(case.spatial_shapes) < levels:
            raise SpecError(
                spec.path, case.line, f"{case.field}.spatial_shapes",
                f"expected at least {levels} levels ({deepest.name} has L={levels}; each variant uses the first L), got {len(case.spatial_shapes)}",
            )
    names = {v.name for v in variants(spec)}
    tuning = tuning_of(spec)
    for name, line in tuning.variant_lines.items():
        if name not in names:
            raise SpecError(tuning.path, line, f"schedules.{name}", f"not a variant of {spec.path} (see `kgen list`); delete the entry or re-run kgen tune")
    for variant in variants(spec):
        lower(spec, variant)  # constraint proofs run at load time


# ---- variants ---------------------------------------------------------------------------------


def variant_name(spec: Spec, point: Mapping[str, Any], direction: str = "fwd") -> str:
    """A name that encodes every axis and constant, e.g. msda_fwd_bf16_m8_d32_l4_k4 (the module,
    its forward custom op) or msda_bwd_bf16_m8_d32_l4_k4 (its backward custom op)."""
    c = spec.constants(point)
    return f"{spec.name}_{direction}_{SHORT_DTYPE[point['dtype']]}_m{c['M']}_d{c['D']}_l{c['L']}_k{c['K']}"


def variants(spec: Spec) -> list[Variant]:
    return [Variant(variant_name(spec, p), p) for p in spec.variant_points()]


# ---- schedules --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassSchedule:
    """The launch schedules of one size class: calls with B*Q <= max_rows (None: all larger)."""

    name: str
    max_rows: int | None
    forward: Launch
    backward: Launch
    source: str  # where the two schedules come from, for the generated comment


def block_d_of(head_dim: int) -> int:
    return 1 << (head_dim - 1).bit_length()  # tl.arange needs a power of two


def launch_problem(block_d: int, launch: Launch) -> str | None:
    """Why a schedule cannot run this head dim's (BLOCK_Q, BLOCK_D) tile well, or None."""
    threads = WARP * launch.num_warps
    tile = launch.block_q * block_d
    if tile > TILE_VALUES_PER_THREAD * threads:
        return (
            f"a BLOCK_Q x BLOCK_D = {launch.block_q} x {block_d} tile over {launch.num_warps} warps is {tile // threads} values "
            f"per thread, above the {TILE_VALUES_PER_THREAD} the kernels keep in registers"
        )
    if tile < threads:
        return (
            f"a BLOCK_Q x BLOCK_D = {launch.block_q} x {block_d} tile has fewer values than the {threads} threads of "
            f"{launch.num_warps} warps (lanes would hold copies, and the backward's atomic adds would repeat)"
        )
    return None


def _nearest_that_work(head_dim: int, launch: Launch) -> str:
    """The closest head dims, block_q and num_warps with which `launch_problem` is satisfied (the
    head dims that work form one interval: BLOCK_D between the thread count and the register cap)."""
    ok_d = [d for d in range(1, 4097) if launch_problem(block_d_of(d), launch) is None]
    dims = ([f"D <= {ok_d[-1]}"] if head_dim > ok_d[-1] else [f"D >= {ok_d[0]}"]) if ok_d else []
    bd = block_d_of(head_dim)

    def nearest(values: list[int], now: int) -> list[str]:
        return [str(min(values, key=lambda v: (abs(v.bit_length() - now.bit_length()), v)))] if values else []

    qs = nearest([q for q in (8, 16, 32, 64, 128, 256) if launch_problem(bd, Launch(q, launch.num_warps, launch.num_stages)) is None], launch.block_q)
    ws = nearest([w for w in (1, 2, 4, 8, 16) if launch_problem(bd, Launch(launch.block_q, w, launch.num_stages)) is None], launch.num_warps)
    options = dims + [f"schedule.block_q: {q}" for q in qs] + [f"schedule.num_warps: {w}" for w in ws]
    return "nearest that work: " + ", or ".join(options)


def where_set(spec: Spec, variant: Variant, dim: str) -> tuple[str, int | None]:
    """(field, line) where the spec sets a compile-time dim's value for this variant: its variant
    axis, its entry in variants.shapes, or its dims entry."""
    lines = spec.options.lines
    if dim in dict(spec.axes):
        return f"variants.axes.{dim}", lines.get(f"variants.axes.{dim}")
    for i, shape in enumerate(spec.shapes):
        if dim in shape and all(variant.values.get(k) == v for k, v in shape.items()):
            return f"variants.shapes[{i}].{dim}", lines.get(f"variants.shapes[{i}].{dim}", lines.get(f"variants.shapes[{i}]"))
    return f"dims.{dim}", lines.get(f"dims.{dim}")


def tuning_of(spec: Spec) -> Tuning:
    """The tuning file's entries (read when needed, not at parse time: the spec's own sections
    are all that parsing reads); none without a tune section or a file."""
    if spec.options.tune is None:
        return Tuning("", None, {}, {}, {}, DEFAULT_SAMPLING)
    return load_tuning(spec.path, spec.name, spec.options.tune)


def default_launch(spec: Spec) -> Launch:
    return spec.options.schedule.launch


def tune_candidates(spec: Spec, variant: Variant) -> list[Launch]:
    """The schedules `kgen tune` times for this variant: tune.candidates and the default, minus
    those candidate_problem refuses."""
    return enumerate_candidates(spec.options.tune, default_launch(spec), lambda launch: candidate_problem(spec, variant, launch))


def candidate_problem(spec: Spec, variant: Variant, launch: Launch) -> str | None:
    """Why this variant cannot take `launch` as a tuning candidate: a register tile that does not
    fit its head dim, an unrolled point loop where unrolling is too large (the kernel would be the
    run_time candidate's), paired locations where x and y are not adjacent, or words where a level's
    parameters are not runs of whole aligned words; None if it can."""
    consts = spec.constants(variant.values)
    L, K, block_d = consts["L"], consts["K"], block_d_of(consts["D"])
    problem = launch_problem(block_d, launch)
    if problem:
        return problem
    values = unrolled_values(L, K, block_d, launch)
    if launch.point_loop == "unrolled" and values > UNROLLED_TILE_VALUES:
        return f"unrolled, L*K*tile values per thread = {values} > {UNROLLED_TILE_VALUES}: the point loop runs at run time anyway (the run_time candidate)"
    return locations_problem(spec, variant, launch)


def locations_problem(spec: Spec, variant: Variant, launch: Launch) -> str | None:
    """Paired locations load x and y as one (BLOCK_Q, 2) tile: the declared layout of
    sampling_locations must put y right after x. Words: see word_runs."""
    if launch.locations == "words":
        consts = spec.constants(variant.values)
        if launch.point_loop != "unrolled" or unrolled_values(consts["L"], consts["K"], block_d_of(consts["D"]), launch) > UNROLLED_TILE_VALUES:
            return "locations=words picks each point's values out of its level's words at compile time: it needs an unrolled point loop (point_loop=unrolled, small enough to unroll)"
        runs = word_runs(spec, variant)
        return runs if isinstance(runs, str) else None
    if launch.locations != "paired":
        return None
    stride = xy_stride(spec, variant)
    if stride == 1:
        return None
    return f"locations=paired loads x and y as one (BLOCK_Q, 2) tile, but sampling_locations' layout puts y {stride} elements after x (needs 1)"


WORD_BITS = 64  # the words form's load unit: a query's level parameters as int64 words


@dataclass(frozen=True)
class WordRun:
    """One tensor's run of a level's parameters of one query, as whole 64-bit words."""

    tensor: str
    per_point: int  # values per point: 2 (x, y) or 1 (weight)
    words: int  # int64 words in a level's run: 1, or an even count (loaded as 16-byte pairs)
    values_per_word: int
    base: sympy.Expr  # word offset of (b, q, m)'s run of level 0
    level: sympy.Expr  # word offset of level l's run from level 0's


def word_runs(spec: Spec, variant: Variant) -> tuple[WordRun, WordRun] | str:
    """The locations' and weights' runs a words-form forward loads, or why it cannot: each
    query's level must lay its K points (x, y, x, y, ...; and K weights) out as one run of whole
    64-bit words (1, or an even count: loaded as 16-byte pairs), starting on a word boundary for
    every (b, q, m, l) at 8-byte-aligned tensors. Proven from the declared layouts: the run's
    element strides, and every coefficient of its start divisible by the values per word."""
    consts = spec.constants(variant.values)
    K = consts["K"]
    bits = 8 * DTYPES[spec.dtype_of("sampling_locations", variant.values)]
    if bits not in (16, 32):
        return f"locations=words packs 16- or 32-bit values into 64-bit words, not {bits}-bit ones"
    per_word = WORD_BITS // bits
    b, q, m, lvl = index_symbol("b"), index_symbol("q"), index_symbol("m"), sympy.Symbol("l", integer=True)
    runs = []
    for name, per_point in (("sampling_locations", 2), ("attention_weights", 1)):
        layout = _layout(spec, name, consts)
        stride = dict(zip(layout.axis_names, layout.strides))
        if sympy.expand(stride["K"] - per_point) != 0 or (per_point == 2 and sympy.expand(stride["axis5"] - 1) != 0):
            return f"locations=words loads a level's {name} of a query as one run: its layout must lay out (K{', 2' if per_point == 2 else ''}) contiguously"
        values = per_point * K
        words, rest = divmod(values, per_word)
        if rest or (words > 1 and words % 2):
            return f"locations=words loads whole 64-bit words, 1 or an even count: a level's {values} {bits}-bit {name} values of a query are {values / per_word:g} words"
        start = sympy.expand(layout.offset(B=b, Q=q, M=m, L=lvl))
        coefficients = sympy.Poly(start, *start.free_symbols).coeffs() if start.free_symbols else [start]
        if any(sympy.Integer(c) % per_word for c in coefficients):
            return f"locations=words needs every level's run of {name} to start on a 64-bit word: its offset {start} is not a multiple of {per_word} for every index"
        level = sympy.expand(layout.offset(L=lvl))
        runs.append(WordRun(name, per_point, words, per_word, sympy.expand((start - level) / per_word), sympy.expand(level / per_word)))
    return runs[0], runs[1]


def xy_stride(spec: Spec, variant: Variant) -> sympy.Expr:
    """The stride of sampling_locations' (x, y) axis in its declared layout (1: adjacent)."""
    layout = _layout(spec, "sampling_locations", spec.constants(variant.values))
    return sympy.expand(dict(zip(layout.axis_names, layout.strides))["axis5"])


def tune_workload(module, spec: Spec, variant: Variant, case: Case, device: str, sampling: str = "uniform"):
    from kgen.verify.msda import TuneWorkload

    return TuneWorkload(module, spec, variant, case, device, sampling)


def schedules(spec: Spec, variant: Variant, launch: Launch | None = None) -> tuple[ClassSchedule, ...]:
    """Per size class, the forward and backward schedule: the tuning file's winners where it has
    them, else the spec's defaults; `launch` (kgen tune) forces one schedule everywhere. Each is
    checked against the head dim's register tile: a default that does not fit is refused where
    D is set, a tuned one where the tuning file names it."""
    opts: Options = spec.options
    D = spec.constants(variant.values)["D"]
    block_d = block_d_of(D)
    default = opts.schedule.launch
    tuning = tuning_of(spec)
    problem = launch_problem(block_d, default)
    if problem and launch is None:
        field, line = where_set(spec, variant, "D")
        raise SpecError(spec.path, line, field, f"{variant.name}: with schedule block_q={default.block_q}, num_warps={default.num_warps}: {problem}; {_nearest_that_work(D, default)}")
    problem = locations_problem(spec, variant, default)
    if problem and launch is None:
        raise SpecError(spec.path, opts.lines.get("schedule.locations"), "schedule.locations", f"{variant.name}: {problem}")
    classes = opts.tune.classes if opts.tune else ()
    if not classes:
        one = launch or default
        return (ClassSchedule("all", None, one, one, "the spec's schedule" if launch is None else "forced (kgen tune)"),)
    allowed = set(tune_candidates(spec, variant))
    out = []
    for c in classes:
        chosen, tuned = {}, {}  # tuned: direction -> the GPU it was timed on
        for direction in DIRECTIONS:
            entry = tuning.get(variant.name, c.name, direction)
            if launch is not None or entry is None:
                chosen[direction] = launch or default
                continue
            field = f"schedules.{variant.name}.{c.name}.{direction}"
            if entry.launch not in allowed:
                why = candidate_problem(spec, variant, entry.launch) or "not among tune.candidates (or the spec's schedule)"
                raise SpecError(tuning.path, entry.line, field, f"{entry.launch}: {why}; re-run kgen tune, or delete the entry to use the spec's schedule")
            if entry.sampling != opts.tune.sampling:
                raise SpecError(
                    tuning.path, entry.line, field,
                    f"timed under {' and '.join(entry.sampling)} sampling, but the spec's tune.sampling is {list(opts.tune.sampling)}: "
                    "re-run kgen tune for this variant (or set tune.sampling back)",
                )
            chosen[direction] = entry.launch
            tuned[direction] = (entry.tuned_on or tuning.tuned_on).get("device", "a GPU")
        if len(set(tuned.values())) > 1:
            where = " and ".join(f"{direction} tuned on {device}" for direction, device in tuned.items())
        elif tuned:
            where = f"{' and '.join(tuned)} tuned on {next(iter(tuned.values()))}"
        source = "forced (kgen tune)" if launch is not None else where if tuned else "spec defaults (not tuned)"
        out.append(ClassSchedule(c.name, c.max_rows, chosen["forward"], chosen["backward"], source))
    return tuple(out)


# ---- lowering ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorCheck:
    """What the wrapper checks about one tensor argument (shape, dtype, strides)."""

    name: str
    shape: str  # tuple literal of ints and dim names, e.g. ("B", "S", 8, 32)
    dtype: str
    strides: str  # tuple of Python expressions over the bound sizes
    sizes: str  # the shape as a Python tuple over the bound sizes, e.g. (B, S, 8, 32)


@dataclass(frozen=True)
class ClassAccumulation:
    """How one size class's backward accumulates grad_value."""

    size_class: str
    kind: str  # "native", "fp32" or "fixed_point"
    dtype: str  # of the buffer the atomic adds go to on the GPU
    why: str
    by_spec: bool  # the spec's schedule.grad_accumulation chose it, not the target's atomics

    @property
    def torch_dtype(self) -> str:
        return TORCH_DTYPE[self.dtype]


def _accumulation(dtype: str, target, schedule: Schedule, size_class: str, fixed_point_bits: int) -> tuple[str, str, str, bool]:
    """(kind, buffer dtype, why, chosen by the spec) of one size class's grad_value accumulation."""
    if schedule.deterministic:
        return "fixed_point", "int64", (
            f"deterministic: contributions * 2^e truncated to int64, {target.atomic_add_reason('int64')}; "
            f"e per call so that Q*K*max|attn|*max|grad_out| * 2^e <= 2^{fixed_point_bits}"
        ), True
    if dtype in ("float16", "bfloat16") and schedule.accumulation_for(size_class) == "fp32":
        # A 16-bit atomic add rounds the running sum to the input dtype on every contribution: a
        # pixel that thousands of samples hit (a small level) loses most of its gradient.
        return "fp32", "float32", (
            f"schedule.grad_accumulation: fp32 (16-bit sums round per add): fp32 buffer, {target.atomic_add_reason('float32')}, cast at the end"
        ), True
    if target.native_atomic_add(dtype):
        return "native", dtype, target.atomic_add_reason(dtype), False
    return "fp32", "float32", f"{target.atomic_add_reason(dtype)}: fp32 buffer, {target.atomic_add_reason('float32')}, cast at the end", False


@dataclass(frozen=True)
class PointLoop:
    """How one kernel (forward or backward) loops over the sampling points, across size classes."""

    form: str  # "unrolled" (static_range), "run_time" (tl.range), or "by_class": POINT_STEP per launch
    why: str  # the comment above the loop ("" for a plain unrolled loop)


@dataclass(frozen=True)
class ClassFlag:
    """A forward constexpr that differs between size classes: one more entry of SCHEDULES' forward
    tuple, passed to the kernel by name."""

    name: str  # the kernel's constexpr parameter
    words: str  # what the SCHEDULES entry holds, in the comments
    values: tuple[bool, ...]  # per size class
    why: str  # comment on the launch option


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
    grad_accum: str  # "native", "fp32", "fixed_point" or "by size class": how grad_value's scatter accumulates
    accumulations: tuple[ClassAccumulation, ...]  # per size class, in SCHEDULES order
    grad_accumulation: str | Mapping[str, str]  # schedule.grad_accumulation as the spec sets it
    fixed_point_bits: int  # fixed point: any pixel's |sum| * 2^e stays below 2^this
    exponent_range: tuple[int, int]  # fixed point: e is clamped to the accumulation type's normal exponents
    clamp: int  # corner coordinates are clamped to [clamp, size] (the pixel range proof assumes it)
    heads: int
    head_dim: int
    levels: int
    points: int
    block_d: int
    point_loops: Mapping[str, PointLoop]  # by direction (DIRECTIONS)
    point_steps: tuple[int, ...]  # per size class: the forward's points per loop step
    corners: str  # the forward's corner form (tune.CORNER_FORMS), or "by_class": FUSED_CORNERS per launch
    widen_ptx: bool  # bf16 corner rows widen to fp32 by inline PTX (NVIDIA) where corners are fused
    locations: str  # the forward's location form (tune.LOCATION_FORMS), or "by_class": a flag per launch
    location_chain: tuple[str, ...]  # the forms the classes use, in the order the kernel tests their flags
    word_runs: tuple[WordRun, WordRun] | None  # locations' and weights' runs, where a class loads words
    class_flags: tuple[ClassFlag, ...]  # the forward's constexprs that differ by size class, in SCHEDULES order
    sample_steps: tuple[tuple[int, int], ...]  # per size class: the backward's (SAMPLE_STEP, samples per loop trip)
    loc_pairs: bool  # locations lay (L, K, 2) out contiguously: the backward stores x and y as one tile
    schedules: tuple[ClassSchedule, ...]
    header_lines: tuple[str, ...]  # extra header lines (the tuning file's hash)
    query_mask: bool
    channel_mask: bool
    runtime_dims: tuple[tuple[str, int, str], ...]  # (name, declared max, doc)
    checks: tuple[TensorCheck, ...]
    expr: Mapping[str, str]  # printed index expressions, by name
    widths: tuple[IndexWidth, ...]
    facts: tuple[Fact, ...]


def unrolled_values(levels: int, points: int, block_d: int, launch: Launch) -> int:
    """Tile values per thread times the samples that unrolling the level and point loops lays out."""
    return levels * points * (launch.block_q * block_d // (WARP * launch.num_warps))


def sample_step(levels: int, points: int, block_d: int, launch: Launch) -> int:
    """The backward's samples per tile step (SAMPLE_TILE_VALUES)."""
    threads = WARP * launch.num_warps
    step = 1
    while (levels * points) % (2 * step) == 0 and launch.block_q * 2 * step * block_d <= SAMPLE_TILE_VALUES * threads:
        step *= 2
    return step


def _point_loop(levels: int, points: int, steps: list[int], too_large: bool, unrolled_step: int | None = None) -> PointLoop:
    """The loop form of one kernel, given its points (forward) or samples (backward) per loop
    trip in each size class; a trip of `unrolled_step` (default: all K points) is unrolled."""
    if len(set(steps)) > 1:
        if unrolled_step is None:
            return PointLoop("by_class", "POINT_STEP points per step: all of them (unrolled) or one (a run-time loop), by size class")
        return PointLoop("by_class", "SAMPLE_GROUP samples per loop trip: all of them (unrolled) or one step (a run-time loop), by size class")
    if steps[0] == (points if unrolled_step is None else unrolled_step):
        return PointLoop("unrolled", "")
    if too_large:
        return PointLoop("run_time", f"A run-time loop: unrolled, {levels} x {points} samples take LLVM minutes (plan: point loop).")
    return PointLoop("run_time", "A run-time loop: the schedule's point_loop (measured faster at these sizes).")


def lower(spec: Spec, variant: Variant, launch: Launch | None = None) -> Plan:
    """The variant's plan; `launch` forces one schedule for every size class (kgen tune)."""
    opts: Options = spec.options
    consts = spec.constants(variant.values)
    M, D, L, K = (consts[n] for n in CONST_DIMS)
    maxima = {n: spec.dims[n].max for n in RUNTIME_DIMS}
    plans = schedules(spec, variant, launch)
    launches = [s for c in plans for s in (c.forward, c.backward)]
    block_q = max(s.block_q for s in launches)  # the widest block bounds the masked lanes' addresses
    block_d = block_d_of(D)

    def too_large(s: Launch) -> bool:  # to unroll (compile time); the point loop runs at run time
        return unrolled_values(L, K, block_d, s) > UNROLLED_TILE_VALUES

    def run_time(s: Launch) -> bool:
        return s.point_loop == "run_time" or too_large(s)

    # The forward's points per step of its point loop, per class: all of them (unrolled) or one.
    point_steps = tuple(1 if run_time(c.forward) else K for c in plans)
    # The backward's samples per tile step, and per loop trip: all L*K (unrolled) or one step.
    sample_steps = tuple(
        (step, step if run_time(c.backward) else L * K) for c in plans for step in [sample_step(L, K, block_d, c.backward)]
    )
    corner_forms = tuple(c.forward.corners for c in plans)
    location_forms = tuple(c.forward.locations for c in plans)
    # Where classes differ, the kernel tests a flag per form in this order; the last needs none.
    location_chain = tuple(form for form in ("words", "paired", "separate") if form in location_forms)
    point_loops = {
        "forward": _point_loop(L, K, list(point_steps), any(too_large(c.forward) for c in plans)),
        "backward": _point_loop(L, K, [trip for _, trip in sample_steps], any(too_large(c.backward) for c in plans), unrolled_step=L * K),
    }

    sym = {n: index_symbol(n) for n in RUNTIME_DIMS + CONST_DIMS}
    layouts = {name: _layout(spec, name, consts) for name in spec.tensors}

    # Index symbols of the kernel and the ranges the proofs use.
    b, m, q, d, pix, pid_bm, s = (index_symbol(n) for n in ("b", "m", "q", "d", "pixel", "pid_bm", "s"))
    q_hi = maxima["Q"] + block_q - 2  # masked lanes of the last block still form addresses
    pix_lo = CLAMP * maxima["S"] + CLAMP  # y0 = x0 = CLAMP at level_start = 0, W <= S
    pix_hi = 3 * maxima["S"] + 1  # corner (y0+1, x0+1) at y0 = H, x0 = W: level_start + H*W + 2W + 1
    ranges = {
        sym["B"]: Range(1, maxima["B"], "declared max of B"),
        sym["Q"]: Range(1, maxima["Q"], "declared max of Q"),
        sym["S"]: Range(1, maxima["S"], "declared max of S"),
        pid_bm: Range(0, maxima["B"] * M - 1, "grid axis 1 enumerates (batch, head) pairs"),
        b: Range(0, maxima["B"] - 1, "pid_bm // M"),
        m: Range(0, M - 1, "pid_bm % M"),
        q: Range(0, q_hi, "query block rows, masked lanes included"),
        d: Range(0, block_d - 1, "channel lanes, masked lanes included"),
        pix: Range(pix_lo, pix_hi, f"level_start + y0*W + x0 (+W, +1 for the other corners) with x0 in [{CLAMP}, W], y0 in [{CLAMP}, H] (clamped), W <= S and level_start + H*W <= S"),
    }
    triton = TritonPrinter(ranges)
    host = PythonPrinter()
    sample_host = PythonPrinter({index_symbol("s"): "s[None, :]"})
    level_host = PythonPrinter({sympy.Symbol("l", integer=True): "level"})

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
        # Offsets in the level/point indices (compile-time ints where those loops are unrolled).
        "loc_x": host(locs.offset(L=lvl, K=k_, axis5=c_(0))),
        "loc_y": host(locs.offset(L=lvl, K=k_, axis5=c_(1))),
        "weight_point": host(wts.offset(L=lvl, K=k_)),
        "level_h": host(layouts["spatial_shapes"].offset(L=lvl, axis1=c_(0))),
        "level_w": host(layouts["spatial_shapes"].offset(L=lvl, axis1=c_(1))),
        "level_start": host(layouts["level_start_index"].offset(L=lvl)),
        # The backward's tiles: sample s = l*K + k of each query (s a (SAMPLE_STEP,) vector).
        "sample_loc_x": sample_host(_sample_offset(locs, s, K, axis5=c_(0))),
        "sample_loc_y": sample_host(_sample_offset(locs, s, K, axis5=c_(1))),
        "sample_weight": sample_host(_sample_offset(wts, s, K)),
        "sample_level_h": level_host(layouts["spatial_shapes"].offset(L=lvl, axis1=c_(0))),
        "sample_level_w": level_host(layouts["spatial_shapes"].offset(L=lvl, axis1=c_(1))),
        "sample_level_start": level_host(layouts["level_start_index"].offset(L=lvl)),
    }
    runs = word_runs(spec, variant) if "words" in location_forms else None
    if runs is not None:
        # Words: each query's level run of locations (and of weights) as 64-bit words; point k's
        # values sit at a compile-time word and lane (value slot) of its level's words. Where the
        # point loop differs by class, the words class runs one unrolled step: k_step is k there.
        point = PythonPrinter({k_: "k_step"}) if point_loops["forward"].form == "by_class" else host
        for run, key in zip(runs, ("loc_words", "weight_words")):
            expr[f"{key}_base"] = address(f"{key}_base", run.base)
            expr[f"{key}_level"] = host(run.level)
            points_per_word = run.values_per_word // run.per_point
            expr[f"{key}_index"] = point(sympy.Integer(0) if K <= points_per_word else FloorDiv(k_, points_per_word))
            for component in range(run.per_point):
                expr[f"{key}_lane{component}"] = point(run.per_point * Mod(k_, points_per_word) + component)
    # The backward's corner rows: (BLOCK_Q, SAMPLE_STEP, BLOCK_D), at the forward's proven width.
    gather_bits = next(w.bits for w in widths if w.name == "gather")
    expr["sample_gather"] = TritonPrinter(ranges, {pix: "pixel[:, :, None]", d: "d[None, None, :]"}, bits=gather_bits)(vals.offset(S=pix, D=d))
    # x and y of consecutive samples adjacent in memory: gradients store as one (BLOCK_Q, 2*SAMPLE_STEP) tile.
    loc_pairs = _sample_offset(locs, s, K, axis5=c_(1)) - _sample_offset(locs, s, K) == 1 and sympy.expand(_sample_offset(locs, s, K) - 2 * s) == 0

    # Proofs about the launch: the grid fits, and every level start fits the int32 coordinates.
    if maxima["B"] * M > GRID_Y_LIMIT:
        field, line = where_set(spec, variant, "M")
        raise SpecError(
            spec.path, line, field,
            f"{variant.name}: B*M = {maxima['B']}*{M} = {maxima['B'] * M} programs on grid axis 1 exceeds CUDA's {GRID_Y_LIMIT}; "
            f"lower B's max to at most {GRID_Y_LIMIT // M}, or use M <= {GRID_Y_LIMIT // maxima['B']}",
        )
    if max(-pix_lo, pix_hi) > 2**31 - 1:
        most = (2**31 - 2) // 3
        raise SpecError(spec.path, opts.lines.get("dims.S"), "dims.S.max", f"pixel coordinates (from {CLAMP}*S{CLAMP} to 3*S+1) are computed in int32: expected at most {most}, got {maxima['S']}")

    # How the backward accumulates grad_value, per size class: from the target's atomics and the
    # spec's options.
    dtype = variant.values["dtype"]
    target = NVIDIA_TARGETS[opts.schedule.target]
    acc = "float64" if dtype == "float64" else "float32"
    fixed_point_bits = 61
    if opts.schedule.deterministic and not target.native_atomic_add("int64"):
        raise SpecError(spec.path, None, "schedule.deterministic", f"needs int64 atomic adds: {target.atomic_add_reason('int64')}")
    accumulations = tuple(ClassAccumulation(c.name, *_accumulation(dtype, target, opts.schedule, c.name, fixed_point_bits)) for c in plans)
    kinds = {a.kind for a in accumulations}
    grad_accum = kinds.pop() if len(kinds) == 1 else "by size class"
    runtime_dims = tuple((n, maxima[n], spec.dims[n].doc) for n in RUNTIME_DIMS)
    checks = tuple(_tensor_check(name, spec, variant, layouts[name], host) for name in CONTRACT if name != "output")
    query_mask = any(spec.dims["Q"].multiple_of % s.block_q for s in launches)
    channel_mask = block_d != D
    bounds = [f"B*Q <= {c.max_rows}" if c.max_rows is not None else "larger calls" for c in plans]
    facts = tuple(
        Fact(f"schedule {c.name} fwd", f"BLOCK_Q={c.forward.block_q} warps={c.forward.num_warps} stages={c.forward.num_stages}",
             f"{bound}; {c.source}; {c.forward.block_q * block_d // (WARP * c.forward.num_warps)} tile values per thread (at most {TILE_VALUES_PER_THREAD})")
        for c, bound in zip(plans, bounds)
    ) + tuple(
        Fact(f"schedule {c.name} bwd", f"BLOCK_Q={c.backward.block_q} SAMPLE_STEP={step} warps={c.backward.num_warps} stages={c.backward.num_stages}",
             f"{bound}; {c.source}; SAMPLE_STEP: the most samples dividing L*K={L * K} within {SAMPLE_TILE_VALUES} values per thread: "
             f"{c.backward.block_q * step * block_d // (WARP * c.backward.num_warps)}")
        for c, bound, (step, _) in zip(plans, bounds, sample_steps)
    ) + (
        Fact("BLOCK_D", str(block_d), f"next power of two >= D={D} (tl.arange needs a power of two)"),
        Fact("grid", f"(cdiv(Q, BLOCK_Q), B*{M})", f"axis 1 at most {maxima['B'] * M} <= {GRID_Y_LIMIT}"),
        Fact("query mask", "emitted" if query_mask else "omitted", f"Q is guaranteed a multiple of {spec.dims['Q'].multiple_of}; BLOCK_Q in {sorted({s.block_q for s in launches})}"),
        Fact("channel mask", "emitted" if channel_mask else "omitted", f"D={D}, BLOCK_D={block_d}"),
        Fact("out-of-image corners", opts.padding, "masked loads with other=0 (grid_sample padding_mode='zeros')"),
    ) + (
        Fact("corners forward", ", ".join(f"{c.name} {form}" for c, form in zip(plans, corner_forms)),
             "summed: one weighted sum of the four corner rows per sample; fused: one multiply-add per corner into the "
             "accumulator" + (", bf16 rows widened by inline PTX on NVIDIA" if dtype == "bfloat16" else "")),
        Fact("locations forward", ", ".join(f"{c.name} {form}" for c, form in zip(plans, location_forms)),
             "separate: x and y as two (BLOCK_Q,) loads per sample; paired: one (BLOCK_Q, 2) load split in registers "
             "(sampling_locations puts y right after x), half the L1 sectors; words: a level's locations and weights "
             "of each query as 64-bit words, values shifted out at compile time"),
        Fact("point loop forward", point_loops["forward"].form.replace("_", " "),
             f"points per step by class: {', '.join(f'{c.name} {steps}' for c, steps in zip(plans, point_steps))}; "
             f"unrolled where schedule/tuning says so and L*K*tile values per thread <= {UNROLLED_TILE_VALUES} (compile time)"),
        Fact("sample loop backward", point_loops["backward"].form.replace("_", " "),
             f"samples per loop trip by class: {', '.join(f'{c.name} {trip}' for c, (_, trip) in zip(plans, sample_steps))}; "
             f"unrolled where schedule/tuning says so and L*K*tile values per thread <= {UNROLLED_TILE_VALUES} (compile time)"),
        Fact("backward location gradients", "one (BLOCK_Q, 2*SAMPLE_STEP) store" if loc_pairs else "x and y stored apart",
             "sampling_locations lays (L, K, 2) out contiguously" if loc_pairs else "sampling_locations' (L, K, 2) axes are not one contiguous run"),
    ) + (
        Fact("arithmetic", acc, "fp64 for the float64 variant (gradcheck), else fp32"),
        Fact("backward grid", f"(cdiv(Q, BLOCK_Q), B*{M})", "as the forward; grad_loc, grad_attn: plain stores by their owner"),
    ) + tuple(
        Fact("grad_value accumulation" + (f" {a.size_class}" if grad_accum == "by size class" else ""), f"{a.kind} ({a.dtype})", a.why)
        for a in (accumulations if grad_accum == "by size class" else accumulations[:1])
    ) + (
        (Fact("grad_value on interpreter", "float32", "the Triton interpreter has no bfloat16 atomics"),)
        if any(a.dtype == "bfloat16" for a in accumulations) else ()
    ) + (
        Fact("backward addresses", "as forward", "grad_value: value_base + gather; grad_out: out; grad_loc, grad_attn: loc_base, weight_base"),
    ) + tuple(
        Fact(f"words {run.tensor}", f"{run.words} x int64 per query and level",
             f"{run.per_point * K} values of {WORD_BITS // run.values_per_word} bits a level; run start "
             f"{run.base} + {run.level} words, whole for every index")
        for run in runs or ()
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
        accumulations=accumulations,
        grad_accumulation=opts.schedule.grad_accumulation,
        fixed_point_bits=fixed_point_bits,
        exponent_range=NORMAL_EXPONENTS[acc],
        clamp=CLAMP,
        heads=M,
        head_dim=D,
        levels=L,
        points=K,
        block_d=block_d,
        point_loops=point_loops,
        point_steps=point_steps,
        corners=corner_forms[0] if len(set(corner_forms)) == 1 else "by_class",
        widen_ptx=dtype == "bfloat16" and "fused" in corner_forms,
        locations=location_forms[0] if len(set(location_forms)) == 1 else "by_class",
        location_chain=location_chain,
        word_runs=runs,
        class_flags=tuple(
            ClassFlag(name, words, tuple(form == on for form in forms), why)
            for name, words, forms, on, why, needed in (
                ("FUSED_CORNERS", "corners fused", corner_forms, "fused", "the way it adds a sample's corners differs by size class", len(set(corner_forms)) > 1),
                ("WORD_LOCATIONS", "locations words", location_forms, "words", "the way it loads a sample's parameters differs by size class", "words" in location_chain[:-1]),
                ("PAIRED_LOCATIONS", "locations paired", location_forms, "paired", "the way it loads a sample's location differs by size class", "paired" in location_chain[:-1]),
            )
            if needed
        ),
        sample_steps=sample_steps,
        loc_pairs=loc_pairs,
        schedules=plans,
        header_lines=_tuning_header(spec),
        query_mask=query_mask,
        channel_mask=channel_mask,
        runtime_dims=runtime_dims,
        checks=checks,
        expr=expr,
        widths=tuple(widths),
        facts=facts,
    )


def _tuning_header(spec: Spec) -> tuple[str, ...]:
    opts: Options = spec.options
    if opts.tune is None:
        return ()
    sha = tuning_of(spec).sha256  # the file named as the spec names it: headers must not depend on the cwd
    if sha is None:
        return (f"tuning sha256:    none ({opts.tune.file} absent: the spec's schedule for every size class)",)
    return (f"tuning sha256:    {sha} ({opts.tune.file}, beside the spec)",)


def _sample_offset(layout: TensorLayout, s: sympy.Symbol, points: int, **rest: sympy.Expr) -> sympy.Expr:
    """Offset of sample s = l*points + k (plus the `rest` axes' indices): stride_K * s where the
    layout lays L and K out as one run (stride_L = points * stride_K), else through s // points
    and s % points."""
    stride = dict(zip(layout.axis_names, layout.strides))
    if sympy.expand(stride["L"] - points * stride["K"]) == 0:
        return sympy.expand(stride["K"] * s + layout.offset(**rest))
    return layout.offset(L=FloorDiv(s, points), K=Mod(s, points), **rest)


def _layout(spec: Spec, name: str, consts: Mapping[str, int]) -> TensorLayout:
    """A tensor's declared layout, the variant's compile-time dims folded in."""
    sym = {n: index_symbol(n) for n in RUNTIME_DIMS + CONST_DIMS}
    t = spec.tensors[name]
    layout = TensorLayout(name, [sym[s] if isinstance(s, str) else s for s in t.shape], t.order, _axis_names(t.shape))
    return layout.substitute({sym[n]: consts[n] for n in CONST_DIMS})


def _axis_names(shape: tuple) -> list[str]:
    """Dim names for symbolic axes; `axis<i>` for literal-size axes such as the (x, y) pair."""
    return [s if isinstance(s, str) else f"axis{i}" for i, s in enumerate(shape)]


def _tensor_check(name: str, spec: Spec, variant: Variant, layout: TensorLayout, host: PythonPrinter) -> TensorCheck:
    consts = spec.constants(variant.values)
    shape = tuple(consts.get(s, s) if isinstance(s, str) else s for s in spec.tensors[name].shape)
    shown = "(" + ", ".join(repr(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    strides = "(" + ", ".join(host(s) for s in layout.strides) + ("," if len(shape) == 1 else "") + ")"
    sizes = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    return TensorCheck(name, shown, TORCH_DTYPE[spec.dtype_of(name, variant.values)], strides, sizes)
