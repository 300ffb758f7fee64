"""Schedule tuning: the spec declares candidates and size classes, `kgen tune` (CUDA only) times
them and writes the winners to a checked-in tuning file, which generation reads.

    spec  tune: {file, candidates: {block_q, num_warps, num_stages, point_loop, corners, locations},
          size_classes: [...], [sampling: [uniform, local]]}
    file  specs/<name>.tuning.json: {"spec", "tuned_on", ["sampling"], "schedules": {variant:
          {class: {forward, backward}: {block_q, num_warps, num_stages, point_loop, corners,
          locations, us, default_us, [tuned_on], [sampling]}}}}

An entry timed on another machine than the file's `tuned_on` (a later `kgen tune --only` run)
carries its own `tuned_on`, so every schedule names the GPU and versions it was chosen on; one
timed under other sampling distributions than the file's carries its own `sampling` (absent:
uniform). Generation refuses an entry tuned under other distributions than the spec's
`tune.sampling` names: its winner answers another workload.

A generated wrapper picks its size class from the call's B*Q with a host-side rule (no per-call
tuning) and launches that class's schedule. The tuning file's sha256 goes into every generated
header, so a changed file is drift, like a changed spec. `kgen verify` never tunes.

Timing (design.md, Benchmarks): device time with a cold L2, from a CUDA graph holding 20 copies
of (zero a 256 MB buffer, the call), replayed and the median taken, minus the flushes alone; the
median of three such readings. The benchmarks (benchmarks/timing.py) use the same timer.
Every candidate's result is checked against the reference before it is timed. The timer is a
parameter, so everything but the measurement runs (and is tested) on CPU.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import json
import os
import re
import statistics
import tempfile
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from kgen.errors import KgenError, SpecError
from kgen.spec import reader as r

LAUNCH_FIELDS = ("block_q", "num_warps", "num_stages", "point_loop", "corners", "locations")
DIRECTIONS = ("forward", "backward")
POINT_LOOPS = ("unrolled", "run_time")  # the kernel's loop over sampling points: static_range or tl.range
# How the forward adds a sample's four bilinear corners into its accumulator: as one weighted sum
# (summed), or each corner by its own fused multiply-add, with bf16 rows widened by inline PTX on
# NVIDIA (fused): fewer instructions, but a longer dependency chain through the accumulator.
CORNER_FORMS = ("summed", "fused")
# How the forward loads a sample's location: x and y as two [BLOCK_Q] loads (separate), or as one
# [BLOCK_Q, 2] load split in registers (paired; only where x and y are adjacent in memory). A
# query's parameters lie hundreds of bytes from the next query's, so each [BLOCK_Q] load touches
# one L1 sector per query: pairing halves the location loads' sectors. Or a level's 2K location
# values and K weights of a query as 64-bit words, each value shifted out of its word at compile
# time (words; 16- and 32-bit dtypes, an unrolled point loop, runs of whole aligned words).
LOCATION_FORMS = ("separate", "paired", "words")
# The sampling-location distributions kgen tune can time candidates under: the validation case's
# (uniform over its `locations` range: the worst case for caches), or local (each query's points
# within 2 pixels of its reference point, as a trained Deformable DETR samples; neighbouring
# encoder queries then sample neighbouring pixels). With several, candidates rank by the geometric
# mean of their times.
SAMPLINGS = ("uniform", "local")
DEFAULT_SAMPLING = ("uniform",)
# Fields only one direction's kernel reads: the tuner times the other direction at the field's
# default alone (its other values would time the same kernel again).
ONE_DIRECTION_FIELDS = {"corners": "forward", "locations": "forward"}
FIELD_CHECKS = {
    "block_q": r.power_of_two(8, 256),
    "num_warps": r.power_of_two(1, 16),
    "num_stages": r.integer(1, 8),
    "point_loop": r.one_of(*POINT_LOOPS),
    "corners": r.one_of(*CORNER_FORMS),
    "locations": r.one_of(*LOCATION_FORMS),
}


@dataclass(frozen=True, order=True)
class Launch:
    """One kernel launch schedule."""

    block_q: int
    num_warps: int
    num_stages: int
    point_loop: str = "unrolled"  # POINT_LOOPS; "unrolled" yields to a run-time loop where unrolling is too large
    corners: str = "summed"  # CORNER_FORMS (the forward only)
    locations: str = "separate"  # LOCATION_FORMS (the forward only)

    def __str__(self) -> str:
        return " ".join(f"{f}={getattr(self, f)}" for f in LAUNCH_FIELDS)


# Fields a spec's candidates or a tuning file may leave out (Launch's defaults: what kernels
# before the field had).
FIELD_DEFAULTS = {f.name: f.default for f in fields(Launch) if f.default is not MISSING}


@dataclass(frozen=True)
class SizeClass:
    name: str
    max_rows: int | None  # calls with B*Q <= max_rows; None: every larger call
    case: int  # index into validation.gpu_cases: the size this class is timed at
    line: int | None


@dataclass(frozen=True)
class TuneConfig:
    file: str  # the tuning file: a plain name, beside the spec
    candidates: Mapping[str, tuple[int, ...]]  # LAUNCH_FIELDS -> values
    classes: tuple[SizeClass, ...]
    exclude: tuple[Mapping[str, Any], ...]  # variants left untuned (keep the schedule defaults)
    sampling: tuple[str, ...] = DEFAULT_SAMPLING  # SAMPLINGS the candidates are timed under


class FileName(r.Check):
    """A plain .json file name (no folders): the tuning file lies beside its spec."""

    PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.json")

    def __call__(self, value: Any) -> str:
        if isinstance(value, str) and self.PATTERN.fullmatch(value):
            return value
        raise r.Invalid(f"expected a file name ending in .json, beside the spec (letters, digits, '.', '_', '-'; no folders), got {value!r}")

    def schema(self) -> dict:
        return {"type": "string", "pattern": "^" + self.PATTERN.pattern + "$"}

    @property
    def words(self) -> str:
        return "file name ending in `.json`"


def parse_tune(section: r.Section, case_rows: list[int], axes: Mapping[str, tuple]) -> TuneConfig:
    """The spec's `tune` section. case_rows: B*Q of each validation.gpu_cases entry; axes: the
    variant axes tune.exclude may name."""
    file = section.get("file", FileName())
    cand = section.section("candidates")
    candidates = {}
    for name in LAUNCH_FIELDS:
        default = (FIELD_DEFAULTS[name],) if name in FIELD_DEFAULTS else r.REQUIRED
        values = cand.get(name, r.list_of(FIELD_CHECKS[name], min_len=1), default=default)
        if len(set(values)) != len(values):
            raise cand.error(name, f"repeated value in {list(values)}")
        candidates[name] = tuple(sorted(values))
    cand.finish()
    classes: list[SizeClass] = []
    items = section.items_of("size_classes")
    if not items:
        raise section.error("size_classes", "expected at least one size class, e.g. {name: all, case: 0}")
    for i, item in enumerate(items):
        last = i == len(items) - 1
        name = item.get("name", r.name)
        max_rows = item.get("max_rows", r.integer(1), default=None)
        case = item.get("case", r.integer(0))
        item.finish()
        if any(c.name == name for c in classes):
            raise item.error("name", f"repeats the size class name {name!r}")
        if last and max_rows is not None:
            raise item.error("max_rows", "the last size class takes every larger call: leave max_rows out")
        if not last and max_rows is None:
            raise item.error("max_rows", "required on every size class but the last (the wrapper picks the first class with B*Q <= max_rows)")
        low = classes[-1].max_rows if classes else 0
        if max_rows is not None and max_rows <= low:
            raise item.error("max_rows", f"expected more than the previous class's {low} (classes go from small to large), got {max_rows}")
        if case >= len(case_rows):
            known = f"0 to {len(case_rows) - 1}" if case_rows else "there are none: add the size to validation.gpu_cases"
            raise item.error("case", f"expected the index of a validation.gpu_cases entry ({known}), got {case}")
        rows = case_rows[case]
        if rows <= low or (max_rows is not None and rows > max_rows):
            span = f"{low} < B*Q" + (f" <= {max_rows}" if max_rows is not None else "")
            raise item.error("case", f"validation.gpu_cases[{case}] has B*Q = {rows}, outside this class ({span}): it would time another class's calls")
        classes.append(SizeClass(name, max_rows, case, item.line))
    sampling = _sampling_of(section, DEFAULT_SAMPLING)
    exclude = []
    for item in section.items_of("exclude"):
        rule = {}
        for key, _, _ in list(item.entries()):
            if key not in axes:
                raise item.error(key, f"expected a variant axis ({', '.join(axes)}), got {key!r}")
            rule[key] = item.get(key, r.AxisValue(tuple(axes[key])))
        exclude.append(rule)
    section.finish()
    return TuneConfig(file, candidates, tuple(classes), tuple(exclude), sampling)


# The section's declaration, for `kgen schema` and docs/spec-reference.md (kgen/ops/formats.py
# places it in each operator that reads a tune section); parse_tune reads exactly these keys.
TUNE_FIELD = r.Field(
    r.Struct(
        {
            "file": r.Field(FileName(), "The tuning file `kgen tune` writes and generation reads, beside the spec; its sha256 is in every generated header."),
            "candidates": r.Field(
                r.Struct(
                    {
                        name: r.Field(
                            r.list_of(FIELD_CHECKS[name], min_len=1),
                            f"The `{name}` values to time.",
                            **({"default": [FIELD_DEFAULTS[name]]} if name in FIELD_DEFAULTS else {}),
                        )
                        for name in LAUNCH_FIELDS
                    }
                ),
                "The schedules `kgen tune` times: every combination, and the spec's `schedule`, minus those a variant cannot run.",
            ),
            "size_classes": r.Field(
                r.Items(
                    r.Struct(
                        {
                            "name": r.Field(r.name, "The class's name in the tuning file and the generated wrapper."),
                            "max_rows": r.Field(r.integer(1), "Calls with B*Q up to this take this class (leave out on the last class: every larger call).", default=None),
                            "case": r.Field(r.integer(0), "The validation.gpu_cases entry the class is timed at; its B*Q must fall in the class."),
                        }
                    ),
                    min_len=1,
                ),
                "Size classes, small to large: the generated wrapper picks one per call from B*Q (host-side sizes, no per-call tuning).",
            ),
            "sampling": r.Field(
                r.list_of(r.one_of(*SAMPLINGS), min_len=1),
                "The sampling-location distributions each candidate is timed under: `uniform` (the validation case's"
                " locations, uniform over its range: the worst case for caches) and/or `local` (each query's points within"
                " 2 pixels of its reference point, as a trained Deformable DETR samples; where Q is the pyramid's pixel"
                " count, query i's reference point is pixel i). With both, candidates rank by the geometric mean of their"
                " times. A tuning file entry timed under other distributions is refused at generation.",
                default=list(DEFAULT_SAMPLING),
            ),
            "exclude": r.Field(
                r.Items(r.Struct(rest=r.Field(r.AxisValue(), "An axis and one of its values."), rest_name="axis")),
                "Variants `kgen tune` leaves out (they keep `schedule`): those matching every axis value of one entry.",
                default=r.OPTIONAL,
            ),
        }
    ),
    "Schedule tuning (`kgen tune`, CUDA only): the candidates, the size classes and the tuning file.",
    default=r.OPTIONAL,
)


def enumerate_candidates(config: TuneConfig, default: Launch, problem: Callable[[Launch], str | None]) -> list[Launch]:
    """Every declared combination, plus the spec's default schedule, minus those `problem`
    refuses for this variant (e.g. a register tile too large); sorted, default included."""
    combos = {Launch(*values) for values in itertools.product(*(config.candidates[f] for f in LAUNCH_FIELDS))}
    combos.add(default)
    return sorted(c for c in combos if problem(c) is None)


# ---- the tuning file ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    launch: Launch
    line: int | None
    us: float | None = None  # the winner's time, for review
    default_us: float | None = None  # the spec default's time at the same size
    tuned_on: Mapping[str, str] | None = None  # where it was timed (None: as the file's tuned_on)
    sampling: tuple[str, ...] | None = None  # the distributions it was timed under (None: the file's)


@dataclass(frozen=True)
class Tuning:
    path: str  # as shown in messages
    sha256: str | None  # of the normalized file; None when there is no file (schedule defaults)
    tuned_on: Mapping[str, str]
    entries: Mapping[tuple[str, str, str], Entry]  # (variant, size class, direction) -> Entry
    variant_lines: Mapping[str, int | None]
    sampling: tuple[str, ...]  # the file's: what entries without their own were timed under

    def get(self, variant: str, size_class: str, direction: str) -> Entry | None:
        return self.entries.get((variant, size_class, direction))


def tuning_path(spec_path: str | os.PathLike, config: TuneConfig) -> Path:
    return Path(spec_path).parent / config.file


def load_tuning(spec_path: str, spec_name: str, config: TuneConfig) -> Tuning:
    """Read and check the tuning file beside the spec (an absent file: no entries). Every error
    is a SpecError located in the tuning file."""
    from kgen.spec.yaml_loc import load_located

    path = tuning_path(spec_path, config)
    shown = path.as_posix()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Tuning(shown, None, {}, {}, {}, DEFAULT_SAMPLING)
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(shown, None, "", f"cannot read the tuning file: {err}") from None
    data = load_located(text, shown)  # JSON is YAML: duplicate keys rejected, lines kept
    root = r.Section(data, shown, "", 1)
    name = root.get("spec", r.name)
    if name != spec_name:
        raise root.error("spec", f"expected {spec_name!r} (this file tunes another spec), got {name!r}")
    tuned_on = _tuned_on_of(root)
    sampling = _sampling_of(root, DEFAULT_SAMPLING)
    schedules = root.section("schedules")
    classes = {c.name for c in config.classes}
    entries, variant_lines = {}, {}
    for variant, raw, line in schedules.entries():
        variant_lines[variant] = line
        per_variant = r.Section(raw, shown, schedules.child_field(variant), getattr(raw, "line", line))
        for class_name, raw_class, class_line in per_variant.entries():
            if class_name not in classes:
                raise per_variant.error(class_name, f"expected a size class of the spec's tune.size_classes ({', '.join(sorted(classes))}), got {class_name!r}")
            per_class = r.Section(raw_class, shown, per_variant.child_field(class_name), getattr(raw_class, "line", class_line))
            for direction in DIRECTIONS:
                if not per_class.has(direction):
                    continue
                entries[(variant, class_name, direction)] = _entry(per_class.section(direction), tuned_on, sampling)
            per_class.finish()
    root.finish()
    digest = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return Tuning(shown, digest, tuned_on, entries, variant_lines, sampling)


def _tuned_on_of(section: r.Section) -> dict[str, str]:
    """A `tuned_on` mapping (device and versions, as text) of the file or of one entry."""
    on = section.section("tuned_on")
    return {key: on.get(key, r.text) for key, _, _ in list(on.entries())}


def _sampling_of(section: r.Section, default: tuple[str, ...]) -> tuple[str, ...]:
    """A `sampling` list of the spec's tune section, the tuning file or one of its entries (absent:
    `default`), in SAMPLINGS' order."""
    values = section.get("sampling", r.list_of(r.one_of(*SAMPLINGS), min_len=1), default=default)
    if len(set(values)) != len(values):
        raise section.error("sampling", f"repeated value in {list(values)}")
    return tuple(name for name in SAMPLINGS if name in values)  # a set, compared and written as one


def _entry(section: r.Section, file_tuned_on: Mapping[str, str], file_sampling: tuple[str, ...]) -> Entry:
    values = {name: section.get(name, FIELD_CHECKS[name], default=FIELD_DEFAULTS.get(name, r.REQUIRED)) for name in LAUNCH_FIELDS}
    us = section.get("us", r.number(0.0), default=None)
    default_us = section.get("default_us", r.number(0.0), default=None)
    tuned_on = _tuned_on_of(section) if section.has("tuned_on") else dict(file_tuned_on)
    sampling = _sampling_of(section, file_sampling)
    section.finish()
    return Entry(Launch(**values), section.line, us, default_us, tuned_on, sampling)


def tuning_text(spec_name: str, tuned_on: Mapping[str, str], entries: Mapping[tuple[str, str, str], Entry],
                sampling: tuple[str, ...] = DEFAULT_SAMPLING) -> str:
    """The tuning file's bytes: sorted keys, two-space indent, one trailing newline (stable diffs).
    An entry timed elsewhere than `tuned_on`, or under other distributions than `sampling`, keeps
    its own; `sampling` is written only where it is not the default (uniform)."""
    schedules: dict = {}
    for (variant, size_class, direction), entry in sorted(entries.items()):
        row: dict[str, Any] = {f: getattr(entry.launch, f) for f in LAUNCH_FIELDS}
        if entry.us is not None:
            row["us"] = round(entry.us, 2)
        if entry.default_us is not None:
            row["default_us"] = round(entry.default_us, 2)
        if entry.tuned_on is not None and dict(entry.tuned_on) != dict(tuned_on):
            row["tuned_on"] = dict(entry.tuned_on)
        if entry.sampling is not None and entry.sampling != sampling:
            row["sampling"] = list(entry.sampling)
        schedules.setdefault(variant, {}).setdefault(size_class, {})[direction] = row
    body = {"spec": spec_name, "tuned_on": dict(tuned_on), "schedules": schedules}
    if sampling != DEFAULT_SAMPLING:
        body["sampling"] = list(sampling)
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


# ---- timing (GPU) ---------------------------------------------------------------------------------

Timer = Callable[[Callable[[], Any]], float]  # fn -> microseconds per call


def cold_l2_us(fn: Callable[[], Any], copies: int = 20, replays: int = 15) -> float:
    """Median device time of one call with a cold L2, in microseconds (CUDA graphs)."""
    return max(_graph_us(fn, copies, replays) - _graph_us(None, copies, replays), 0.0)


def cold_l2_median_us(fn: Callable[[], Any], rounds: int = 3) -> float:
    """Median of `rounds` cold_l2_us readings: what `kgen tune` and the benchmarks report. The
    first reading after a reference check can run slow: the first ~80 ms of replays of the first
    graph captured after benchmarks/tq_decode.py's fp32 reference took a TQ decode 177-178 us a
    call, the readings after it 149-151 (H100, session 40, benchmarks/RESULTS.md)."""
    return statistics.median(cold_l2_us(fn) for _ in range(rounds))


def _graph_us(fn, copies: int, replays: int) -> float:
    import torch

    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 4x the H200's 60 MB L2
    stream = torch.cuda.Stream()
    # The warm-up runs on a side stream: it must wait for the caller's, or fn could read inputs
    # still being written (a block table still being filled gave an illegal address, session 39).
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compile, allocate, warm up outside capture
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


# ---- the tuner ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timed:
    launch: Launch
    us: float | None  # None: refused (a wrong result, or it failed to compile or run): see `why`
    why: str = ""
    by_sampling: tuple[tuple[str, float], ...] = ()  # each distribution's time, where several were timed


def parse_narrow(items: list[str] | None, config: TuneConfig) -> dict[str, tuple]:
    """`--narrow FIELD=V1,V2` options -> {field: values}: a subset of each field's tune.candidates
    to time in this run (the spec and its tuning file stay as they are)."""
    narrow: dict[str, tuple] = {}
    for item in items or ():
        name, sep, values = item.partition("=")
        if not sep or name not in LAUNCH_FIELDS:
            raise KgenError(f"kgen tune: --narrow {item!r}: expected FIELD=V1,V2 with FIELD one of {', '.join(LAUNCH_FIELDS)}")
        declared = config.candidates[name]
        chosen = []
        for text in values.split(","):
            value = next((v for v in declared if str(v) == text.strip()), None)
            if value is None:
                raise KgenError(f"kgen tune: --narrow {item!r}: {text.strip()!r} is not among tune.candidates.{name} {list(declared)}")
            chosen.append(value)
        narrow[name] = tuple(chosen)
    return narrow


def parse_size_classes(names: list[str] | None, config: TuneConfig) -> tuple[str, ...]:
    """`--size-class NAME` options -> the names of the tune.size_classes to time in this run, in
    the spec's order (none given: every class)."""
    declared = [c.name for c in config.classes]
    for name in names or ():
        if name not in declared:
            raise KgenError(f"kgen tune: --size-class {name!r}: not among tune.size_classes {declared}")
    return tuple(n for n in declared if not names or n in names)


def tune_variant(spec, variant, *, root: Path, device: str, timer: Timer, directory: Path, sizes=None, log=None,
                 directions: tuple[str, ...] = DIRECTIONS, narrow: Mapping[str, tuple] | None = None,
                 size_classes: tuple[str, ...] | None = None) -> dict[tuple[str, str], list[Timed]]:
    """Time every candidate schedule of one variant at each size class (or those `size_classes`
    names), in each of `directions` (forward, backward), or those whose fields take the values
    `narrow` lists, and the spec's default. Returns (size class, direction) -> timings, fastest
    first, refused candidates last.

    Each candidate is rendered in memory into a module of its own (the variant with that one
    schedule), loaded, checked against the reference at the class's size, then timed. `sizes`
    stands in for validation.gpu_cases (tests on CPU pass small ones)."""
    from kgen.ops import OPS

    op = OPS[spec.op]
    log = log or (lambda line: print(line, flush=True))
    cases = sizes if sizes is not None else spec.options.gpu_cases
    default = op.default_launch(spec)
    results: dict[tuple[str, str], list[Timed]] = {}
    for launch in op.tune_candidates(spec, variant):
        if launch != default and any(getattr(launch, f) not in values for f, values in (narrow or {}).items()):
            continue
        # A field only the other direction reads, off its default: this direction's kernel is
        # the same as at the default, which is timed already.
        timed_directions = [
            direction for direction in directions
            if all(ONE_DIRECTION_FIELDS.get(f, direction) == direction or getattr(launch, f) == getattr(default, f) for f in LAUNCH_FIELDS)
        ]
        if not timed_directions:
            continue
        module = render_module(spec, variant, launch, root, directory)
        config: TuneConfig = spec.options.tune
        for size_class in config.classes:
            if size_classes is not None and size_class.name not in size_classes:
                continue  # not timed in this run: its workload (inputs, reference) is not built
            works = {s: op.tune_workload(module, spec, variant, cases[size_class.case], device, sampling=s) for s in config.sampling}
            for direction in timed_directions:
                timed = _time_sampled(works, direction, launch, timer)
                results.setdefault((size_class.name, direction), []).append(timed)
                shown = f"{timed.us:.1f} us" if timed.us is not None else f"refused: {timed.why}"
                if timed.by_sampling:
                    shown += " (geometric mean of " + ", ".join(f"{s} {us:.1f}" for s, us in timed.by_sampling) + ")"
                log(f"  {variant.name} {size_class.name} {direction} {launch}: {shown}")
    return {key: sorted(v, key=lambda t: (t.us is None, t.us or 0.0, t.launch)) for key, v in results.items()}


def _time_sampled(works: Mapping[str, Any], direction: str, launch: Launch, timer: Timer) -> Timed:
    """One candidate under each sampling distribution's workload: refused if any run refuses it,
    else timed as the geometric mean (each distribution weighs the same, whatever its scale)."""
    timed = {name: _time_one(work, direction, launch, timer) for name, work in works.items()}
    refused = next((t for t in timed.values() if t.us is None), None)
    if refused is not None:
        return refused
    if len(timed) == 1:
        return next(iter(timed.values()))
    mean = statistics.geometric_mean([t.us for t in timed.values()])
    return Timed(launch, mean, by_sampling=tuple((name, t.us) for name, t in timed.items()))


def _time_one(work, direction: str, launch: Launch, timer: Timer) -> Timed:
    try:
        problem = work.check(direction)  # the first call also compiles
        if problem:
            return Timed(launch, None, problem)
        return Timed(launch, timer(work.call(direction)))
    except Exception as err:  # noqa: BLE001 - a candidate that cannot run is refused, not fatal
        lines = str(err).strip().splitlines()
        return Timed(launch, None, f"{type(err).__name__}: {lines[0][:200] if lines else ''}")


def render_module(spec, variant, launch: Launch, root: Path, directory: Path):
    """The variant's module with `launch` as its only schedule, rendered in memory, loaded."""
    import importlib.util

    from kgen.ops import OPS
    from kgen.render import render, templates_dir

    op = OPS[spec.op]
    plan = op.lower(spec, variant, launch=launch)
    text = render(op.template_for(variant), {"p": plan}, f"{spec.path}, variant {variant.name}, {launch}", templates_dir(root))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = directory / f"{variant.name}_{digest}.py"
    path.write_text(text)
    module_spec = importlib.util.spec_from_file_location(f"kgen_tune_{variant.name}_{digest}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def winners(spec, variant, results: Mapping[tuple[str, str], list[Timed]]) -> dict[tuple[str, str, str], Entry]:
    """The fastest schedule per (size class, direction), with the spec default's time beside it."""
    from kgen.ops import OPS

    default = OPS[spec.op].default_launch(spec)
    out = {}
    for (size_class, direction), timed in sorted(results.items()):
        ok = [t for t in timed if t.us is not None]
        if not ok:
            why = "; ".join(f"{t.launch}: {t.why}" for t in timed[:3])
            raise KgenError(f"{variant.name}, size class {size_class}, {direction}: every candidate was refused ({why})")
        base = next((t.us for t in ok if t.launch == default), None)
        out[(variant.name, size_class, direction)] = Entry(ok[0].launch, None, ok[0].us, base, sampling=spec.options.tune.sampling)
    return out


def tuned_variants(spec, only: list[str] | None) -> list:
    """The variants `kgen tune` times: those tune.exclude leaves, narrowed by --only globs."""
    from kgen.ops import OPS

    config: TuneConfig = spec.options.tune
    chosen = [v for v in OPS[spec.op].variants(spec) if not any(all(v.values.get(k) == x for k, x in ex.items()) for ex in config.exclude)]
    if only:
        chosen = [v for v in chosen if any(fnmatch.fnmatch(v.name, g) for g in only)]
    return chosen


def main(args, timer: Timer | None = None, device: str = "cuda", sizes=None) -> int:
    """`kgen tune SPEC... [--only GLOB]... [--missing] [--direction forward|backward]
    [--size-class NAME]... [--narrow FIELD=V1,V2]...`. Exit 2 without a CUDA GPU, or for a spec
    without a tune section. The tuning file is rewritten after each variant, so an interrupted
    run keeps what it measured (resume with --missing: variants without entries, or with entries
    timed under other sampling than the spec's) and a long run can be split with --only;
    --direction retimes one kernel and keeps the other's entries; --size-class retimes the named
    size classes and keeps the other classes' entries; --narrow times a subset of the candidates
    (a new field's values at the known winners' others).
    (timer, device and sizes: for tests, which run the whole path on CPU under the interpreter.)"""
    from kgen.emit import write_atomic
    from kgen.generate import load_all
    from kgen.ops import OPS

    if timer is None:
        from kgen.verify.numerics import cuda_available

        if not cuda_available():
            raise KgenError(
                "kgen tune: needs a CUDA GPU, and none is available here; run it on the GPU machine "
                "(until a tuning file exists, generation uses the spec's schedule defaults; `kgen verify` never tunes)"
            )
        timer = cold_l2_median_us
        os.environ.pop("TRITON_INTERPRET", None)
    try:
        specs = load_all(args.specs, args.root)
    except SpecError as err:
        # A tuning file the spec no longer matches (a candidate dropped, other sampling) is what
        # this run replaces, so it must not stop it: load without the operators' checks (each
        # candidate is still lowered, with its proofs, as it is rendered). Errors located in the
        # spec itself stop the run as they stop generation.
        if not err.path.endswith(".json"):
            raise
        print(f"kgen tune: {err.path}:{err.line}: {err.field}: {err.message} (this run replaces such entries)", flush=True)
        specs = load_all(args.specs, args.root, check=False)
    for spec in specs:
        if getattr(spec.options, "tune", None) is None or not hasattr(OPS[spec.op], "tune_workload"):
            raise SpecError(spec.path, None, "tune", "this spec declares no tune section (candidates, size classes): nothing to tune")
    for spec in specs:
        config: TuneConfig = spec.options.tune
        path = tuning_path(spec.path, config)
        narrow = parse_narrow(getattr(args, "narrow", None), config)
        classes = parse_size_classes(getattr(args, "size_class", None), config)
        existing = load_tuning(spec.path, spec.name, config)
        entries = dict(existing.entries)
        chosen = tuned_variants(spec, args.only)
        if getattr(args, "missing", False):
            # Resume: variants with no entry, or with one timed under other distributions than
            # the spec's (an interrupted run after tune.sampling changed).
            stale = {key[0] for key, entry in entries.items() if entry.sampling != config.sampling}
            done = {key[0] for key in entries} - stale
            chosen = [v for v in chosen if v.name not in done]
        if not chosen:
            print(f"kgen tune: no variant of {spec.path} left to tune (tune.exclude, --only, --missing)")
            continue
        run_on = _tuned_on(device)
        # The file keeps the machine and distributions it names (its other entries were timed
        # there); winners timed elsewhere, or under other distributions, carry their own.
        tuned_on = existing.tuned_on if existing.sha256 is not None else run_on
        sampling = existing.sampling if existing.sha256 is not None else config.sampling
        print(f"kgen tune: {spec.path}: {len(chosen)} variant(s), size classes {', '.join(classes)}, "
              f"{' and '.join(config.sampling)} sampling, on {run_on['device']}", flush=True)
        with tempfile.TemporaryDirectory(prefix="kgen-tune-") as tmp:
            for variant in chosen:
                directions = (args.direction,) if getattr(args, "direction", None) else DIRECTIONS
                results = tune_variant(spec, variant, root=args.root, device=device, timer=timer, directory=Path(tmp), sizes=sizes,
                                       directions=directions, narrow=narrow, size_classes=classes)
                best = {key: replace(entry, tuned_on=run_on) for key, entry in winners(spec, variant, results).items()}
                entries.update(best)
                for (_, size_class, direction), entry in best.items():
                    base = f" (spec default: {entry.default_us:.1f} us)" if entry.default_us is not None else ""
                    print(f"{variant.name} {size_class} {direction}: {entry.launch}, {entry.us:.1f} us{base}", flush=True)
                write_atomic(path, tuning_text(spec.name, tuned_on, entries, sampling))
        print(f"wrote {path.as_posix()}; regenerate and validate with: kgen build {spec.path}")
    return 0


def _tuned_on(device: str) -> dict[str, str]:
    import platform

    import torch
    import triton

    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    return {"device": name, "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}
