"""Schedule tuning on CPU: candidate enumeration, the spec's tune section and the tuning file
(checks with located errors), generation reading the file (its hash in every header, drift when
it changes), the wrapper's size-class dispatch under the Triton interpreter, the whole `kgen tune`
path with an injected timer, and the refusal without a CUDA GPU."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch

from conftest import ROOT, load_module, run_kgen
from kgen.errors import KgenError, SpecError
from kgen.generate import generate
from kgen.ops import msda
from kgen.ops.msda import Case
from kgen.spec import load_spec
from kgen.tune import Launch, Timed, _time_one, _time_sampled, load_tuning, main as tune_main, tuning_text, winners
from kgen.verify.msda import TuneWorkload, check, local_locations, make_inputs

SPEC_TEXT = (ROOT / "specs" / "msda.yaml").read_text()
SPEC = load_spec(ROOT / "specs" / "msda.yaml")
SMALL = "msda_fwd_f32_m1_d24_l3_k4"  # one head, three levels: the cheapest variant to run


def narrow(text: str = SPEC_TEXT) -> str:
    """The spec with two float32 variants (the reference shape and SMALL's): generation and
    builds of it take seconds, not minutes."""
    start, end = text.index("variants:\n"), text.index("\ntensors:")
    variants = "variants:\n  axes:\n    dtype: [float32]\n  shapes:\n    - {M: 8, D: 32, L: 4, K: 4}\n    - {M: 1, D: 24, L: 3, K: 4}\n"
    text = text[:start] + variants + text[end:]
    return text[: text.index("  exclude:\n    - {dtype: float64}")]


def variant(spec, name):
    return next(v for v in msda.variants(spec) if v.name == name)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def spec_copy(tmp_path: Path, text: str = SPEC_TEXT, tuning: dict | str | None = None) -> Path:
    (tmp_path / "specs").mkdir(exist_ok=True)
    path = tmp_path / "specs" / "msda.yaml"
    path.write_text(text)
    if tuning is not None:
        (tmp_path / "specs" / "msda.tuning.json").write_text(tuning if isinstance(tuning, str) else json.dumps(tuning, indent=2))
    return path


def tuning(schedules: dict, spec: str = "msda") -> dict:
    return {"spec": spec, "tuned_on": {"device": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0"}, "schedules": schedules}


# ---- candidates -------------------------------------------------------------------------------


def test_candidates_skip_schedules_whose_register_tile_does_not_fit():
    wide = msda.tune_candidates(SPEC, variant(SPEC, "msda_fwd_bf16_m2_d128_l5_k8"))
    # BLOCK_D 128: block_q * 128 values over 32 * num_warps threads must stay within 1 to 32 each.
    # L*K = 40 samples: unrolled, only 16 x 128 over 8 warps (8 values each) stays within
    # UNROLLED_TILE_VALUES (40 * 8 = 320 <= 512); every other fitting tile has run-time loops only.
    # Each in both corner forms and both location forms (the shipped layout puts y after x); the
    # unrolled one also as words (a level's 16 location and 8 weight values: 4 and 2 words).
    fits = [(16, 2, 1), (16, 4, 1), (16, 8, 1), (32, 4, 1), (32, 8, 1), (64, 8, 1)]
    loops = [(*f, "run_time") for f in fits] + [(16, 8, 1, "unrolled")]
    forms = {"run_time": ("separate", "paired"), "unrolled": ("separate", "paired", "words")}
    assert wide == sorted(Launch(*f, corners, locations) for f in loops for corners in ("summed", "fused") for locations in forms[f[3]])
    narrow = msda.tune_candidates(SPEC, variant(SPEC, "msda_fwd_bf16_m16_d16_l2_k4"))
    assert len(narrow) == 90 and Launch(64, 2, 1) in narrow and Launch(64, 2, 1, "run_time", "fused", "paired") in narrow  # 64 x 16 over 64 threads: 16 each
    assert len([c for c in narrow if c.locations == "words"]) == 18 and Launch(64, 2, 1, "unrolled", "fused", "words") in narrow  # 72 + the 18 unrolled as words


# sampling_locations with the (x, y) axis outermost: y lies B*Q*M*L*K elements after x.
PLANAR = SPEC_TEXT.replace(
    "  sampling_locations: {shape: [B, Q, M, L, K, 2], dtype: dtype}",
    "  sampling_locations: {shape: [B, Q, M, L, K, 2], dtype: dtype, layout: [2, B, Q, M, L, K]}",
)


def test_paired_locations_need_y_right_after_x(tmp_path):
    """Paired locations load (x, y) as one (BLOCK_Q, 2) tile: a layout that puts the pair's axis
    elsewhere drops them from the candidates, and a spec schedule or tuning entry that names them
    is refused at its line; the spec's separate loads still generate."""
    assert PLANAR != SPEC_TEXT
    spec = load_spec(spec_copy(tmp_path, PLANAR))
    assert msda.xy_stride(spec, variant(spec, SMALL)) != 1 and msda.xy_stride(SPEC, variant(SPEC, SMALL)) == 1
    planar = next(o.text for o in generate(spec, ROOT) if o.variant == SMALL)
    assert "loc_x = tl.load(" in planar and "loc_xy" not in planar
    got = msda.tune_candidates(spec, variant(spec, SMALL))
    assert got and {c.locations for c in got} == {"separate"}
    text = PLANAR.replace("  block_q: 32        # queries per program", "  locations: paired\n  block_q: 32        # queries per program")
    path = spec_copy(tmp_path, text)
    with pytest.raises(SpecError) as err:
        list(generate(load_spec(path), ROOT))
    assert err.value.line == line_of(text, "  locations: paired") and err.value.field == "schedule.locations"
    assert "elements after x (needs 1)" in err.value.message, err.value.message
    # A tuning file entry that names them is refused in the tuning file, with the same reason.
    paired = dict(GOOD, locations="paired")
    entries = {SMALL: {"decoder": {"forward": paired, "backward": GOOD}}}
    path = spec_copy(tmp_path, PLANAR, tuning=tuning(entries))
    with pytest.raises(SpecError) as err:
        list(generate(load_spec(path), ROOT))
    assert err.value.path.endswith("specs/msda.tuning.json") and err.value.field == f"schedules.{SMALL}.decoder.forward"
    assert "elements after x (needs 1)" in err.value.message, err.value.message


def test_candidates_always_include_the_spec_default(tmp_path):
    spec = load_spec(spec_copy(tmp_path, SPEC_TEXT.replace("block_q: [16, 32, 64]", "block_q: [16]")))
    got = msda.tune_candidates(spec, variant(spec, SMALL))
    assert Launch(32, 4, 1) in got and {c.block_q for c in got} == {16, 32}


# ---- the spec's tune section ------------------------------------------------------------------


@pytest.mark.parametrize(
    "old, new, field, expected",
    [
        ("{name: decoder, max_rows: 8192, case: 0}", "{name: decoder, max_rows: 1000, case: 0}", "tune.size_classes[0].case",
         "validation.gpu_cases[0] has B*Q = 1200, outside this class (0 < B*Q <= 1000): it would time another class's calls"),
        ("{name: encoder, case: 1}", "{name: encoder, max_rows: 90000, case: 1}", "tune.size_classes[1].max_rows",
         "the last size class takes every larger call: leave max_rows out"),
        ("{name: decoder, max_rows: 8192, case: 0}", "{name: decoder, case: 0}", "tune.size_classes[0].max_rows",
         "required on every size class but the last"),
        ("{name: encoder, case: 1}", "{name: encoder, case: 5}", "tune.size_classes[1].case",
         "expected the index of a validation.gpu_cases entry (0 to 1), got 5"),
        ("{name: encoder, case: 1}", "{name: decoder, case: 1}", "tune.size_classes[1].name", "repeats the size class name 'decoder'"),
        ("file: msda.tuning.json", "file: ../msda.tuning.json", "tune.file", "expected a file name ending in .json, beside the spec"),
        ("block_q: [16, 32, 64]", "block_q: [16, 24]", "tune.candidates.block_q", "item 1: expected a power of two between 8 and 256, got 24"),
        ("point_loop: [unrolled, run_time]", "point_loop: [unrolled, sideways]", "tune.candidates.point_loop", "item 1: expected one of unrolled, run_time, got 'sideways'"),
        ("- {dtype: float64}   #", "- {dtype: float8}   #", "tune.exclude[0].dtype", "expected one of the axis values"),
        ("- {dtype: float64}   #", "- {D: 32}   #", "tune.exclude[0].D", "expected a variant axis (dtype), got 'D'"),
    ],
)
def test_bad_tune_section_is_located(tmp_path, old, new, field, expected):
    assert old in SPEC_TEXT
    text = SPEC_TEXT.replace(old, new)
    with pytest.raises(SpecError) as err:
        load_spec(spec_copy(tmp_path, text))
    assert err.value.field == field and err.value.line == line_of(text, new)
    assert expected in err.value.message


# ---- the tuning file --------------------------------------------------------------------------

GOOD = {"block_q": 16, "num_warps": 2, "num_stages": 1, "us": 5.25, "default_us": 7.5}


@pytest.mark.parametrize(
    "schedules, needle, field, expected",
    [
        ({"msda_fwd_f32_m8_d40_l4_k4": {"decoder": {"forward": GOOD}}}, "msda_fwd_f32_m8_d40_l4_k4",
         "schedules.msda_fwd_f32_m8_d40_l4_k4", "not a variant of"),
        ({SMALL: {"tiny": {"forward": GOOD}}}, '"tiny"', f"schedules.{SMALL}.tiny", "expected a size class of the spec's tune.size_classes (decoder, encoder)"),
        ({SMALL: {"decoder": {"forward": dict(GOOD, block_q=128, num_warps=8)}}}, '"forward"', f"schedules.{SMALL}.decoder.forward",
         "block_q=128 num_warps=8 num_stages=1 point_loop=unrolled corners=summed locations=separate: not among tune.candidates"),
        ({"msda_fwd_f32_m2_d128_l5_k8": {"encoder": {"backward": dict(GOOD, block_q=64)}}}, '"backward"',
         "schedules.msda_fwd_f32_m2_d128_l5_k8.encoder.backward", "a BLOCK_Q x BLOCK_D = 64 x 128 tile over 2 warps is 128 values per thread"),
        ({SMALL: {"decoder": {"forward": dict(GOOD, num_warps=3)}}}, '"num_warps"', f"schedules.{SMALL}.decoder.forward.num_warps",
         "expected a power of two between 1 and 16, got 3"),
        ({SMALL: {"decoder": {"sideways": GOOD}}}, '"sideways"', f"schedules.{SMALL}.decoder.sideways", "unknown key"),
        ({SMALL: {"decoder": {"forward": dict(GOOD, point_loop="rolled")}}}, '"point_loop"', f"schedules.{SMALL}.decoder.forward.point_loop",
         "expected one of unrolled, run_time, got 'rolled'"),
    ],
)
def test_bad_tuning_file_is_located_in_the_tuning_file(tmp_path, schedules, needle, field, expected):
    spec_copy(tmp_path, tuning=tuning(schedules))
    text = (tmp_path / "specs" / "msda.tuning.json").read_text()
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path / "specs" / "msda.yaml")
    assert err.value.path.endswith("specs/msda.tuning.json")
    assert err.value.field == field and err.value.line == line_of(text, needle)
    assert expected in err.value.message


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"spec": "msda", "tuned_on": {}, "schedules": {}, "spec": "msda"}', "duplicate key"),
        ('{"spec": "tq_decode", "tuned_on": {}, "schedules": {}}', "expected 'msda' (this file tunes another spec)"),
        ('{"spec": "msda", "schedules": {', "invalid YAML"),
    ],
)
def test_malformed_tuning_file_is_a_located_error(tmp_path, text, expected):
    spec_copy(tmp_path, tuning=text)
    with pytest.raises(SpecError, match="msda.tuning.json") as err:
        load_spec(tmp_path / "specs" / "msda.yaml")
    assert expected in err.value.message and err.value.line


# ---- generation reads the tuning file ----------------------------------------------------------


def _tuned_spec(tmp_path):
    entries = {SMALL: {"decoder": {"forward": GOOD}, "encoder": {"forward": dict(GOOD, block_q=64, num_warps=8), "backward": dict(GOOD, block_q=16, num_warps=4)}}}
    return load_spec(spec_copy(tmp_path, narrow(), tuning=tuning(entries)))


def test_generation_takes_tuned_schedules_per_class_and_hashes_the_file(tmp_path):
    spec = _tuned_spec(tmp_path)
    outputs = {o.variant: o.text for o in generate(spec, ROOT)}
    text = outputs[SMALL]
    # Backward: (BLOCK_Q, warps, stages, SAMPLE_STEP within 16 values per thread, L*K samples per trip).
    assert '# decoder: forward tuned on NVIDIA H200; grad_value: native\n    ("decoder", 8192, (16, 2, 1, 4), (32, 4, 1, 2, 12), torch.float32),' in text
    assert '# encoder: forward and backward tuned on NVIDIA H200; grad_value: native\n    ("encoder", None, (64, 8, 1, 4), (16, 4, 1, 4, 12), torch.float32),' in text
    sha = [line for line in text.splitlines() if line.startswith("# tuning sha256:")]
    assert len(sha) == 1 and "(msda.tuning.json, beside the spec)" in sha[0] and "none" not in sha[0]
    other = outputs["msda_fwd_f32_m8_d32_l4_k4"]
    assert sha[0] in other  # every variant's header carries the file's hash
    assert '# decoder: spec defaults (not tuned); grad_value: native\n    ("decoder", 8192, (32, 4, 1, 4), (32, 4, 1, 2, 16), torch.float32),' in other
    (tmp_path / "specs" / "msda.tuning.json").unlink()
    untuned = next(o.text for o in generate(load_spec(tmp_path / "specs" / "msda.yaml"), ROOT) if o.variant == SMALL)
    assert "# tuning sha256:    none (msda.tuning.json absent" in untuned


def test_a_new_tuning_file_is_drift_until_rebuilt(project):
    (project / "specs" / "msda.yaml").write_text(narrow())
    (project / "specs" / "msda.tuning.json").unlink()  # the shipped one names variants narrow() drops
    assert run_kgen("build", "--no-validate", "specs/msda.yaml", cwd=project).returncode == 0
    (project / "specs" / "msda.tuning.json").write_text(json.dumps(tuning({SMALL: {"decoder": {"forward": GOOD}}}), indent=2))
    proc = run_kgen("verify", "--no-numerics", "--no-compile", "specs/msda.yaml", cwd=project)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.count("differs from what specs/msda.yaml generates now") == 2  # every variant: its header has the hash
    assert "fix: kgen build specs/msda.yaml" in proc.stdout
    assert run_kgen("build", "--no-validate", "specs/msda.yaml", cwd=project).returncode == 0
    proc = run_kgen("verify", "--no-numerics", "--no-compile", "specs/msda.yaml", cwd=project)
    assert proc.returncode == 0 and "drift: ok" in proc.stdout, proc.stdout + proc.stderr


def test_the_wrapper_launches_each_size_class_schedule_and_verify_runs_them_all(tmp_path):
    spec = _tuned_spec(tmp_path)
    path = tmp_path / f"{SMALL}.py"
    path.write_text(next(o.text for o in generate(spec, ROOT) if o.variant == SMALL))
    module = load_module(path)
    assert module._launch(8192, backward=False)[0] == 16 and module._launch(8193, backward=False)[0] == 64
    assert module._launch(8192, backward=True)[0] == 32 and module._launch(10**6, backward=True)[0] == 16
    results = check(module, spec, variant(spec, SMALL), "cpu")
    forced = [r for r in results if r["case"].startswith("[encoder schedule]")]
    assert len(forced) == 4 and all(r["ok"] for r in results), results  # forward + three gradients


def test_point_loop_per_size_class_takes_a_step_per_launch_and_every_class_runs(tmp_path):
    """Tuned entries that unroll the decoder's point loops and run the encoder's forward one at
    run time (as measured for bf16 encoder sizes, benchmarks/RESULTS.md session 7): the forward
    kernel takes POINT_STEP per launch (all points or one), the backward keeps its unrolled loop,
    and every class's schedule matches the reference under the interpreter."""
    run_time = dict(GOOD, point_loop="run_time")
    entries = {SMALL: {"decoder": {"forward": GOOD, "backward": GOOD}, "encoder": {"forward": run_time, "backward": GOOD}}}
    spec = load_spec(spec_copy(tmp_path, narrow(), tuning=tuning(entries)))
    text = next(o.text for o in generate(spec, ROOT) if o.variant == SMALL)
    # Backward: D=24 pads to 32 lanes; a 16 x SAMPLE_STEP x 32 tile over 64 threads stays within
    # 16 values per thread at 2 samples (of L*K = 12), and its 12 samples unroll in one trip.
    assert '("decoder", 8192, (16, 2, 1, 4), (16, 2, 1, 2, 12), torch.float32),' in text
    assert '("encoder", None, (16, 2, 1, 1), (16, 2, 1, 2, 12), torch.float32),' in text
    forward = text[text.index("def _msda_fwd_f32_m1_d24_l3_k4_kernel(") : text.index("def _corner_backward")]
    backward = text[text.index("def _msda_bwd_f32_m1_d24_l3_k4_kernel(") : text.index("def _check_tensor")]
    assert "POINT_STEP: tl.constexpr," in forward and "for k_first in tl.range(0, POINTS, POINT_STEP):" in forward
    assert "POINT_STEP" not in backward and "for s_first in tl.static_range(0, LEVELS * POINTS, SAMPLE_STEP):" in backward
    path = tmp_path / f"{SMALL}.py"
    path.write_text(text)
    module = load_module(path)
    assert module._launch(8192, backward=False)[1]["POINT_STEP"] == 4 and module._launch(8193, backward=False)[1]["POINT_STEP"] == 1
    assert "POINT_STEP" not in module._launch(8193, backward=True)[1] and module._launch(8193, backward=True)[1]["SAMPLE_STEP"] == 2
    results = check(module, spec, variant(spec, SMALL), "cpu")
    forced = [r for r in results if r["case"].startswith("[encoder schedule]")]
    assert len(forced) == 4 and all(r["ok"] for r in results), results  # forward + three gradients


def test_corner_form_per_size_class_is_a_constexpr_per_launch_and_every_class_runs(tmp_path):
    """Tuned entries that fuse the decoder forward's corners and sum the encoder's (as measured
    for the 16-bit decoder, benchmarks/RESULTS.md session 24): the forward kernel takes
    FUSED_CORNERS per launch and holds both forms; a bf16 module also widens by PTX where fused
    (never under the interpreter); every class matches the reference under the interpreter."""
    fused = dict(GOOD, corners="fused")
    entries = {SMALL: {"decoder": {"forward": fused, "backward": GOOD}, "encoder": {"forward": GOOD, "backward": GOOD}}}
    spec = load_spec(spec_copy(tmp_path, narrow(), tuning=tuning(entries)))
    text = next(o.text for o in generate(spec, ROOT) if o.variant == SMALL)
    assert '("decoder", 8192, (16, 2, 1, 4, True), (16, 2, 1, 2, 12), torch.float32),' in text
    assert '("encoder", None, (16, 2, 1, 4, False), (16, 2, 1, 2, 12), torch.float32),' in text
    forward = text[text.index("def _msda_fwd_f32_m1_d24_l3_k4_kernel(") : text.index("def _corner_backward")]
    assert "FUSED_CORNERS: tl.constexpr," in forward and "            if FUSED_CORNERS:\n" in forward
    assert forward.count("acc += v") == 4 and "acc += (" in forward
    assert "WIDEN_PTX" not in text  # float32: nothing to widen
    path = tmp_path / f"{SMALL}.py"
    path.write_text(text)
    module = load_module(path)
    assert module._launch(8192, backward=False)[1]["FUSED_CORNERS"] is True and module._launch(8193, backward=False)[1]["FUSED_CORNERS"] is False
    assert "FUSED_CORNERS" not in module._launch(8192, backward=True)[1]
    results = check(module, spec, variant(spec, SMALL), "cpu")
    forced = [r for r in results if r["case"].startswith("[encoder schedule]")]
    assert len(forced) == 4 and all(r["ok"] for r in results), results  # forward + three gradients


def test_fused_corners_everywhere_leave_one_form_and_bf16_widens_by_ptx_on_nvidia_only(tmp_path):
    text = SPEC_TEXT.replace("  block_q: 32        # queries per program", "  corners: fused\n  block_q: 32        # queries per program")
    spec = load_spec(spec_copy(tmp_path, text))
    outputs = {o.variant: o.text for o in generate(spec, ROOT) if o.variant in ("msda_fwd_bf16_m1_d24_l3_k4", "msda_fwd_f16_m1_d24_l3_k4")}
    assert len(outputs) == 2
    for name, out in outputs.items():
        forward = out[out.index(f"def _{name}_kernel(") : out.index("def _corner_backward")]
        assert "FUSED_CORNERS" not in out and forward.count("acc += v") == 4 and "acc += (" not in forward, name
        assert ("WIDEN_PTX: tl.constexpr," in forward) == ("bf16" in name), name
    bf16 = outputs["msda_fwd_bf16_m1_d24_l3_k4"]
    assert 'WIDEN_PTX = not _INTERPRETED and torch.version.hip is None' in bf16
    assert 'launch["WIDEN_PTX"] = WIDEN_PTX\n' in bf16


def test_location_form_per_size_class_is_a_constexpr_and_both_forms_match_the_reference(tmp_path):
    """Tuned entries that pair the decoder forward's location loads and keep the encoder's apart:
    PAIRED_LOCATIONS per launch, beside FUSED_CORNERS where the corner forms differ too (each its
    own SCHEDULES entry); every class matches the reference under the interpreter."""
    paired = dict(GOOD, locations="paired", corners="fused")
    entries = {SMALL: {"decoder": {"forward": paired, "backward": GOOD}, "encoder": {"forward": GOOD, "backward": GOOD}}}
    spec = load_spec(spec_copy(tmp_path, narrow(), tuning=tuning(entries)))
    text = next(o.text for o in generate(spec, ROOT) if o.variant == SMALL)
    assert "forward (BLOCK_Q, num_warps, num_stages, points per step of the point loop,\n# corners fused, locations paired), backward" in text
    assert '("decoder", 8192, (16, 2, 1, 4, True, True), (16, 2, 1, 2, 12), torch.float32),' in text
    assert '("encoder", None, (16, 2, 1, 4, False, False), (16, 2, 1, 2, 12), torch.float32),' in text
    forward = text[text.index(f"def _{SMALL}_kernel(") : text.index("def _corner_backward")]
    assert "FUSED_CORNERS: tl.constexpr,\n    PAIRED_LOCATIONS: tl.constexpr," in forward and "            if PAIRED_LOCATIONS:\n" in forward
    assert forward.count("loc_xy = tl.load(") == 1 and forward.count("loc_x = tl.load(") == 1
    path = tmp_path / f"{SMALL}.py"
    path.write_text(text)
    module = load_module(path)
    decoder, encoder = module._launch(8192, backward=False)[1], module._launch(8193, backward=False)[1]
    assert (decoder["FUSED_CORNERS"], decoder["PAIRED_LOCATIONS"], encoder["FUSED_CORNERS"], encoder["PAIRED_LOCATIONS"]) == (True, True, False, False)
    assert "PAIRED_LOCATIONS" not in module._launch(8192, backward=True)[1]
    results = check(module, spec, variant(spec, SMALL), "cpu")
    forced = [r for r in results if r["case"].startswith("[encoder schedule]")]
    assert len(forced) == 4 and all(r["ok"] for r in results), results  # forward + three gradients


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_paired_locations_everywhere_leave_one_form_and_match_the_separate_loads_bitwise(tmp_path, dtype):
    """A spec schedule of paired locations: one form, no constexpr, and (under the interpreter)
    the same output bit for bit as separate loads, on locations that reach outside the levels."""
    import torch

    text = narrow().replace("dtype: [float32]", f"dtype: [{dtype}]")
    separate = next(o.text for o in generate(load_spec(spec_copy(tmp_path, text)), ROOT) if "m1_d24" in o.variant)
    text = text.replace("  block_q: 32        # queries per program", "  locations: paired\n  block_q: 32        # queries per program")
    spec = load_spec(spec_copy(tmp_path, text))
    paired = next(o.text for o in generate(spec, ROOT) if "m1_d24" in o.variant)
    forward = paired[paired.index("def _msda_fwd_") : paired.index("def _corner_backward")]
    assert "PAIRED_LOCATIONS" not in paired and "loc_xy = tl.load(" in forward and "loc_x = tl.load(" not in forward
    facts = {f.name: f.value for f in msda.lower(spec, next(v for v in msda.variants(spec) if "m1_d24" in v.name)).facts}
    assert facts["locations forward"] == "decoder paired, encoder paired"
    modules = []
    for name, source in (("separate", separate), ("paired", paired)):
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        modules.append(load_module(path))
    g = torch.Generator().manual_seed(7)
    torch_dtype = getattr(torch, dtype)
    shapes = torch.tensor([[5, 7], [3, 4], [2, 2]])
    areas = shapes[:, 0] * shapes[:, 1]
    value = torch.randn(2, int(areas.sum()), 1, 24, generator=g).to(torch_dtype)
    loc = (torch.rand(2, 37, 1, 3, 4, 2, generator=g) * 1.4 - 0.2).to(torch_dtype)  # 37: ragged against every block_q
    weights = torch.rand(2, 37, 1, 3, 4, generator=g).to(torch_dtype)
    outs = [m.msda_forward(value, shapes, torch.cumsum(areas, 0) - areas, loc, weights) for m in modules]
    assert outs[0].abs().sum() > 0 and torch.equal(outs[0], outs[1])


# ---- the tuner, end to end on CPU with an injected timer -----------------------------------------

# Two candidates x two classes x (forward, backward), in the order the tuner times them.
FAKE_US = {
    (16, "decoder", "forward"): 5.0, (16, "decoder", "backward"): 9.0, (16, "encoder", "forward"): 7.0, (16, "encoder", "backward"): 3.0,
    (32, "decoder", "forward"): 6.0, (32, "decoder", "backward"): 8.0, (32, "encoder", "forward"): 4.0, (32, "encoder", "backward"): 10.0,
}


def test_kgen_tune_times_every_candidate_and_writes_the_winners(tmp_path, capsys):
    text = narrow().replace("block_q: [16, 32, 64]", "block_q: [16, 32]").replace("num_warps: [2, 4, 8]", "num_warps: [4]").replace("point_loop: [unrolled, run_time]", "point_loop: [unrolled]").replace("corners: [summed, fused]", "corners: [summed]").replace("locations: [separate, paired, words]", "locations: [separate]")
    path = spec_copy(tmp_path, text)
    order = iter(sorted(FAKE_US, key=lambda k: (k[0], k[1] == "encoder", k[2] == "backward")))
    calls = []

    def timer(fn):
        fn()  # the call being timed runs (under the interpreter here)
        key = next(order)
        calls.append(key)
        return FAKE_US[key]

    sizes = (Case(1, 5, ((3, 4), (2, 2), (1, 3)), (-0.2, 1.2), None), Case(2, 7, ((2, 3), (3, 1), (2, 2)), (-0.2, 1.2), None))
    args = argparse.Namespace(specs=[str(path)], root=tmp_path, only=[SMALL])
    assert tune_main(args, timer=timer, device="cpu", sizes=sizes) == 0
    assert len(calls) == 8
    written = json.loads((tmp_path / "specs" / "msda.tuning.json").read_text())
    got = {(c, d): (e["block_q"], e["us"], e["default_us"]) for c, per in written["schedules"][SMALL].items() for d, e in per.items()}
    assert got == {("decoder", "forward"): (16, 5.0, 6.0), ("decoder", "backward"): (32, 8.0, 8.0),
                   ("encoder", "forward"): (32, 4.0, 4.0), ("encoder", "backward"): (16, 3.0, 10.0)}
    assert written["tuned_on"]["device"] == "cpu (Triton interpreter)"
    out = capsys.readouterr().out
    assert f"{SMALL} decoder forward: block_q=16 num_warps=4 num_stages=1 point_loop=unrolled corners=summed locations=separate, 5.0 us (spec default: 6.0 us)" in out
    spec = load_spec(path)  # generation reads what the tuner wrote
    row = next(c for c in msda.schedules(spec, variant(spec, SMALL)) if c.name == "encoder")
    assert (row.forward, row.backward) == (Launch(32, 4, 1), Launch(16, 4, 1))
    # --missing resumes: the variant has entries now, so nothing is timed again.
    resumed = argparse.Namespace(specs=[str(path)], root=tmp_path, only=[SMALL], missing=True)
    assert tune_main(resumed, timer=lambda fn: pytest.fail("timed again"), device="cpu", sizes=sizes) == 0
    assert "no variant of" in capsys.readouterr().out


def test_kgen_tune_one_direction_times_only_that_kernel_and_keeps_the_other(tmp_path):
    """--direction backward (after a change to the backward kernel): only backward launches are
    timed, the tuning file's forward entries stay as they were."""
    text = narrow().replace("block_q: [16, 32, 64]", "block_q: [16, 32]").replace("num_warps: [2, 4, 8]", "num_warps: [4]").replace("point_loop: [unrolled, run_time]", "point_loop: [unrolled]").replace("corners: [summed, fused]", "corners: [summed]").replace("locations: [separate, paired, words]", "locations: [separate]")
    forward = dict(GOOD, block_q=32, num_warps=4)
    entries = {SMALL: {c: {"forward": forward, "backward": forward} for c in ("decoder", "encoder")}}
    path = spec_copy(tmp_path, text, tuning=tuning(entries))
    calls = []

    def timer(fn):
        fn()
        calls.append(1)
        return {1: 9.0, 2: 3.0, 3: 8.0, 4: 10.0}[len(calls)]  # (16, decoder), (16, encoder), (32, decoder), (32, encoder)

    sizes = (Case(1, 5, ((3, 4), (2, 2), (1, 3)), (-0.2, 1.2), None), Case(2, 7, ((2, 3), (3, 1), (2, 2)), (-0.2, 1.2), None))
    args = argparse.Namespace(specs=[str(path)], root=tmp_path, only=[SMALL], direction="backward")
    assert tune_main(args, timer=timer, device="cpu", sizes=sizes) == 0
    assert len(calls) == 4  # 2 candidates x 2 classes, backward only
    written = json.loads((tmp_path / "specs" / "msda.tuning.json").read_text())["schedules"][SMALL]
    assert {c: (e["forward"]["block_q"], e["forward"]["us"]) for c, e in written.items()} == {"decoder": (32, 5.25), "encoder": (32, 5.25)}
    assert {c: (e["backward"]["block_q"], e["backward"]["us"]) for c, e in written.items()} == {"decoder": (32, 8.0), "encoder": (16, 3.0)}
    # The file still names the GPU its other entries were timed on; the new ones name their own.
    whole = json.loads((tmp_path / "specs" / "msda.tuning.json").read_text())
    assert whole["tuned_on"]["device"] == "NVIDIA H200"
    assert all("tuned_on" not in e["forward"] and e["backward"]["tuned_on"]["device"] == "cpu (Triton interpreter)" for e in written.values())
    text = next(o.text for o in generate(load_spec(path), ROOT) if o.variant == SMALL)
    assert "# decoder: forward tuned on NVIDIA H200 and backward tuned on cpu (Triton interpreter); grad_value" in text


def test_kgen_tune_one_size_class_times_only_that_class_and_keeps_the_others(tmp_path):
    """--size-class encoder --direction forward (retiming the encoder forward on another GPU):
    only encoder launches are timed, the decoder's entries stay byte for byte as they were."""
    text = narrow().replace("block_q: [16, 32, 64]", "block_q: [16, 32]").replace("num_warps: [2, 4, 8]", "num_warps: [4]").replace("point_loop: [unrolled, run_time]", "point_loop: [unrolled]").replace("corners: [summed, fused]", "corners: [summed]").replace("locations: [separate, paired, words]", "locations: [separate]")
    decoder = dict(GOOD, block_q=16, num_warps=4, us=1.5, default_us=2.5)
    encoder = dict(GOOD, block_q=32, num_warps=4)
    path = spec_copy(tmp_path, text, tuning=tuning({SMALL: {"decoder": {"forward": decoder, "backward": decoder}, "encoder": {"forward": encoder, "backward": encoder}}}))
    # The file as kgen writes it (sorted keys, its defaults filled in), so its bytes can be compared.
    spec = load_spec(path)
    before = load_tuning(spec.path, spec.name, spec.options.tune)
    file = tmp_path / "specs" / "msda.tuning.json"
    file.write_text(tuning_text(spec.name, before.tuned_on, before.entries, before.sampling))
    decoder_text = lambda text: text[text.index('"decoder"') : text.index('"encoder"')]  # noqa: E731 - one variant in the file
    old = file.read_text()
    calls = []

    def timer(fn):
        fn()
        calls.append(1)
        return {1: 3.0, 2: 8.0}[len(calls)]  # (16, encoder), (32, encoder)

    sizes = (Case(1, 5, ((3, 4), (2, 2), (1, 3)), (-0.2, 1.2), None), Case(2, 7, ((2, 3), (3, 1), (2, 2)), (-0.2, 1.2), None))
    args = argparse.Namespace(specs=[str(path)], root=tmp_path, only=[SMALL], direction="forward", size_class=["encoder"])
    assert tune_main(args, timer=timer, device="cpu", sizes=sizes) == 0
    assert len(calls) == 2  # 2 candidates x the encoder, forward only
    new = file.read_text()
    assert decoder_text(new) == decoder_text(old)
    written = json.loads(new)["schedules"][SMALL]
    assert (written["encoder"]["forward"]["block_q"], written["encoder"]["forward"]["us"], written["encoder"]["forward"]["default_us"]) == (16, 3.0, 8.0)
    assert written["encoder"]["forward"]["tuned_on"]["device"] == "cpu (Triton interpreter)"
    assert written["encoder"]["backward"] == json.loads(old)["schedules"][SMALL]["encoder"]["backward"]


def test_kgen_tune_unknown_size_class_is_a_clear_error(tmp_path):
    path = spec_copy(tmp_path, narrow())
    args = argparse.Namespace(specs=[str(path)], root=tmp_path, only=[SMALL], size_class=["encoder", "tiny"])
    with pytest.raises(KgenError, match=re.escape("kgen tune: --size-class 'tiny': not among tune.size_classes ['decoder', 'encoder']")):
        tune_main(args, timer=lambda fn: pytest.fail("timed"), device="cpu")


def test_kgen_tune_times_a_forward_only_field_in_the_forward_alone(tmp_path):
    """corners and locations change the forward kernel only: their non-default candidates are
    timed forward, and the backward is timed once per other schedule (it would be the same kernel
    again)."""
    text = narrow().replace("block_q: [16, 32, 64]", "block_q: [16]").replace("num_warps: [2, 4, 8]", "num_warps: [4]").replace("point_loop: [unrolled, run_time]", "point_loop: [unrolled]")
    path = spec_copy(tmp_path, text)
    calls = []

    def timer(fn):
        fn()
        calls.append(1)
        return 1.0 if len(calls) in (1, 2) else 9.0  # (16, fused, paired) forward, decoder and encoder: the winner

    sizes = (Case(1, 5, ((3, 4), (2, 2), (1, 3)), (-0.2, 1.2), None), Case(2, 7, ((2, 3), (3, 1), (2, 2)), (-0.2, 1.2), None))
    args = argparse.Namespace(specs=[str(path)], root=tmp_path, only=[SMALL])
    assert tune_main(args, timer=timer, device="cpu", sizes=sizes) == 0
    # In order, per class: (16, fused, paired), (16, fused, separate), (16, fused, words) and
    # (16, summed, paired) forward only (calls 1-8), (16, summed, separate) forward and backward
    # (9-12), (16, summed, words) forward only (13-14), the default (32, summed, separate) forward
    # and backward (15-18).
    assert len(calls) == 18
    written = json.loads((tmp_path / "specs" / "msda.tuning.json").read_text())["schedules"][SMALL]
    assert {c: (e["forward"]["corners"], e["forward"]["locations"]) for c, e in written.items()} == {"decoder": ("fused", "paired"), "encoder": ("fused", "paired")}
    assert {c: (e["backward"]["corners"], e["backward"]["locations"]) for c, e in written.items()} == {"decoder": ("summed", "separate"), "encoder": ("summed", "separate")}


def test_kgen_tune_narrow_times_a_subset_of_the_candidates(tmp_path):
    """--narrow FIELD=V1,V2 times only those values (and the spec default), without editing the
    spec, whose tuning file may name schedules outside the subset; a value the spec does not
    declare is a clear error."""
    path = spec_copy(tmp_path, narrow(), tuning=tuning({SMALL: {"decoder": {"forward": dict(GOOD, num_warps=8)}}}))
    calls = []

    def timer(fn):
        fn()
        calls.append(1)
        return 1.0 if len(calls) == 1 else 9.0  # (16, 4, fused, paired) forward, decoder: the winner

    sizes = (Case(1, 5, ((3, 4), (2, 2), (1, 3)), (-0.2, 1.2), None), Case(2, 7, ((2, 3), (3, 1), (2, 2)), (-0.2, 1.2), None))
    args = argparse.Namespace(specs=[str(path)], root=tmp_path, only=[SMALL], direction="forward",
                              narrow=["block_q=16", "num_warps=4", "point_loop=unrolled"])
    assert tune_main(args, timer=timer, device="cpu", sizes=sizes) == 0
    # (16, 4, unrolled) in both corner and all three location forms, and the default (32, 4,
    # unrolled, summed, separate): 7 x 2 classes.
    assert len(calls) == 14
    written = json.loads((tmp_path / "specs" / "msda.tuning.json").read_text())["schedules"][SMALL]
    assert tuple(written["decoder"]["forward"][f] for f in ("block_q", "corners", "locations")) == (16, "fused", "paired")
    for bad, needle in (("num_warps=3", "'3' is not among tune.candidates.num_warps [2, 4, 8]"), ("warps=4", "expected FIELD=V1,V2 with FIELD one of")):
        args.narrow = [bad]
        with pytest.raises(KgenError, match=re.escape(needle)):
            tune_main(args, timer=timer, device="cpu", sizes=sizes)


class _Work:
    def __init__(self, problem=None, error=None):
        self.problem, self.error = problem, error

    def check(self, direction):
        if self.error:
            raise self.error
        return self.problem

    def call(self, direction):
        return lambda: None


def test_a_candidate_that_is_wrong_or_fails_is_refused_not_timed():
    timer = lambda fn: 1.0  # noqa: E731
    assert _time_one(_Work(problem="B=1 Q=5: max abs 0.3"), "forward", Launch(16, 4, 1), timer) == Timed(Launch(16, 4, 1), None, "B=1 Q=5: max abs 0.3")
    refused = _time_one(_Work(error=RuntimeError("out of resources: shared memory\nmore")), "backward", Launch(64, 8, 1), timer)
    assert refused.us is None and refused.why == "RuntimeError: out of resources: shared memory"
    results = {("decoder", "forward"): [Timed(Launch(64, 8, 1), None, "out of resources"), Timed(Launch(16, 4, 1), None, "wrong")]}
    with pytest.raises(KgenError, match="every candidate was refused"):
        winners(SPEC, variant(SPEC, SMALL), results)


def test_tune_refuses_a_spec_without_a_tune_section(tmp_path):
    untuned = SPEC_TEXT[: SPEC_TEXT.index("\ntune:")] + "\n"
    # Without size classes, grad_accumulation takes one choice for every call.
    path = spec_copy(tmp_path, untuned.replace("grad_accumulation: {decoder: native, encoder: fp32}", "grad_accumulation: fp32"))
    args = argparse.Namespace(specs=[str(path)], root=tmp_path, only=None)
    with pytest.raises(SpecError, match="declares no tune section"):
        tune_main(args, timer=lambda fn: 1.0, device="cpu")


def test_tune_without_a_gpu_exits_2_with_a_clear_message():
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    proc = run_kgen("tune", "specs/msda.yaml")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "kgen tune: needs a CUDA GPU, and none is available here" in proc.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cold_l2_timer_measures_a_kernel_on_the_gpu():
    from kgen.tune import cold_l2_us

    x = torch.randn(1 << 24, device="cuda")
    us = cold_l2_us(lambda: x.mul_(1.0))
    assert 1.0 < us < 10_000.0


# ---- tuning under a declared sampling distribution ---------------------------------------------


def test_tune_sampling_is_read_in_a_fixed_order_and_bad_values_are_located(tmp_path):
    assert "  sampling: [uniform]\n" in SPEC_TEXT and SPEC.options.tune.sampling == ("uniform",)
    text = SPEC_TEXT.replace("  sampling: [uniform]\n", "  sampling: [local, uniform]\n")
    assert load_spec(spec_copy(tmp_path, text)).options.tune.sampling == ("uniform", "local")
    text = SPEC_TEXT.replace("  sampling: [uniform]\n", "")
    assert load_spec(spec_copy(tmp_path, text)).options.tune.sampling == ("uniform",)  # the default
    for bad, expected in (("[uniform, sideways]", "item 1: expected one of uniform, local, got 'sideways'"), ("[local, local]", "repeated value")):
        text = SPEC_TEXT.replace("  sampling: [uniform]\n", f"  sampling: {bad}\n")
        with pytest.raises(SpecError) as err:
            load_spec(spec_copy(tmp_path, text))
        assert err.value.field == "tune.sampling" and err.value.line == line_of(text, "sampling: " + bad)
        assert expected in err.value.message


def test_local_locations_stay_within_two_pixels_of_each_query_reference():
    levels = ((6, 10), (3, 5))
    g = torch.Generator().manual_seed(0)
    wh = torch.tensor([[10.0, 6.0], [5.0, 3.0]])[None, None, None, :, None, :]
    # An encoder (Q = S = 75): query i's reference point is the centre of pixel i.
    loc = local_locations(levels, 2, 75, 3, 4, g)
    assert loc.shape == (2, 75, 3, 2, 4, 2) and loc.dtype == torch.float32
    centres = torch.cat([torch.stack([(torch.arange(w).repeat(h) + 0.5) / w, (torch.arange(h).repeat_interleave(w) + 0.5) / h], -1) for h, w in levels])
    offset_px = (loc - centres[None, :, None, None, None, :]) * wh
    assert offset_px.abs().max() <= 2.0 and offset_px.abs().max() > 1.9 and offset_px.std() > 0.9  # spread over +-2 px
    # Object queries (Q != S): one reference per query, shared by its heads, levels and points.
    loc = local_locations(levels, 2, 7, 3, 4, g)
    spread = (loc.amax(dim=(2, 3, 4)) - loc.amin(dim=(2, 3, 4)))  # [B, Q, 2] in [0, 1] units
    assert (spread <= 4.0 / torch.tensor([5.0, 3.0])).all()  # within the coarsest level's 2 px each way
    refs = loc.mean(dim=(2, 3, 4))
    assert refs.std() > 0.2  # reference points spread over the image


def test_local_sampling_inputs_have_no_far_or_snapped_samples():
    case = Case(1, 75, ((6, 10), (3, 5)), (-0.2, 1.2), None)
    local = make_inputs(case, 2, 8, 4, torch.float32, "cpu", seed=1, sampling="local")["sampling_locations"]
    uniform = make_inputs(case, 2, 8, 4, torch.float32, "cpu", seed=1)["sampling_locations"]
    assert (uniform == 3.5).any() and not (local == 3.5).any()
    assert local.min() >= -2 / 3 and local.max() <= 1 + 2 / 3  # pixel centres +- 2 px of the 3 x 5 level


def test_candidates_timed_under_several_distributions_rank_by_the_geometric_mean():
    times = iter([9.0, 1.0])
    timed = _time_sampled({"uniform": _Work(), "local": _Work()}, "forward", Launch(16, 4, 1), lambda fn: next(times))
    assert timed == Timed(Launch(16, 4, 1), pytest.approx(3.0), by_sampling=(("uniform", 9.0), ("local", 1.0)))
    refused = _time_sampled({"uniform": _Work(), "local": _Work(problem="max abs 0.2")}, "forward", Launch(16, 4, 1), lambda fn: 1.0)
    assert refused.us is None and refused.why == "max abs 0.2"
    one = _time_sampled({"local": _Work()}, "forward", Launch(16, 4, 1), lambda fn: 7.0)
    assert one == Timed(Launch(16, 4, 1), 7.0)


def test_kgen_tune_under_both_distributions_and_generation_refuses_other_sampling(tmp_path, monkeypatch, capsys):
    """tune.sampling [uniform, local]: every candidate is checked and timed on each distribution's
    inputs and ranks by the geometric mean (here the candidate uniform sampling alone would not
    pick); the file records the distributions; a spec asking for other ones refuses the entries
    at their line until they are re-tuned."""
    text = narrow().replace("block_q: [16, 32, 64]", "block_q: [16]").replace("num_warps: [2, 4, 8]", "num_warps: [4]").replace("point_loop: [unrolled, run_time]", "point_loop: [unrolled]").replace("corners: [summed, fused]", "corners: [summed]").replace("locations: [separate, paired, words]", "locations: [separate]")
    assert "  sampling: [uniform]\n" in text
    both = text.replace("  sampling: [uniform]\n", "  sampling: [uniform, local]\n")
    path = spec_copy(tmp_path, both)
    original = TuneWorkload.call

    def tagged(self, direction):  # the timer learns which candidate and distribution it times
        fn = original(self, direction)
        fn.sampling, fn.block_q = self.sampling, self.module.SCHEDULES[0][2][0]  # the forced schedule's
        return fn

    monkeypatch.setattr(TuneWorkload, "call", tagged)
    fake = {(16, "uniform"): 9.0, (16, "local"): 1.0, (32, "uniform"): 4.0, (32, "local"): 4.0}

    def timer(fn):
        return fake[(fn.block_q, fn.sampling)]

    sizes = (Case(1, 5, ((3, 4), (2, 2), (1, 3)), (-0.2, 1.2), None), Case(1, 18, ((3, 4), (2, 2), (1, 2)), (-0.2, 1.2), None))
    args = argparse.Namespace(specs=[str(path)], root=tmp_path, only=[SMALL])
    assert tune_main(args, timer=timer, device="cpu", sizes=sizes) == 0
    written = json.loads((tmp_path / "specs" / "msda.tuning.json").read_text())
    assert written["sampling"] == ["uniform", "local"]
    assert {(c, d): (e["block_q"], e["us"], "sampling" in e) for c, per in written["schedules"][SMALL].items() for d, e in per.items()} == {
        (c, d): (16, 3.0, False) for c in ("decoder", "encoder") for d in ("forward", "backward")}
    out = capsys.readouterr().out
    assert "uniform and local sampling" in out and "3.0 us (geometric mean of uniform 9.0, local 1.0)" in out
    spec = load_spec(path)
    assert all(c.forward == Launch(16, 4, 1) for c in msda.schedules(spec, variant(spec, SMALL)))
    # The spec back to uniform alone: the entries answer another workload (refused as it loads).
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert err.value.path.endswith("msda.tuning.json") and err.value.field == f"schedules.{SMALL}.decoder.forward"
    assert "timed under uniform and local sampling, but the spec's tune.sampling is ['uniform']: re-run kgen tune" in err.value.message
    # kgen tune still runs (it replaces those entries). Re-tuning one direction under uniform
    # sampling: those entries carry their own distributions.
    capsys.readouterr()
    args = argparse.Namespace(specs=[str(path)], root=tmp_path, only=[SMALL], direction="forward")
    assert tune_main(args, timer=timer, device="cpu", sizes=sizes) == 0
    assert "timed under uniform and local sampling" in capsys.readouterr().out  # named, not fatal
    written = json.loads((tmp_path / "specs" / "msda.tuning.json").read_text())
    per_class = written["schedules"][SMALL]["decoder"]
    assert written["sampling"] == ["uniform", "local"] and per_class["forward"]["sampling"] == ["uniform"] and "sampling" not in per_class["backward"]
    assert per_class["forward"]["block_q"] == 32  # uniform alone: 4.0 against 9.0
    with pytest.raises(SpecError, match="re-run kgen tune") as err:
        load_spec(path)
    assert err.value.field == f"schedules.{SMALL}.decoder.backward"
    # --missing resumes such a change: a variant with any entry timed under other sampling is
    # tuned again, then nothing is left.
    args = argparse.Namespace(specs=[str(path)], root=tmp_path, only=[SMALL], missing=True)
    assert tune_main(args, timer=timer, device="cpu", sizes=sizes) == 0
    assert json.loads((tmp_path / "specs" / "msda.tuning.json").read_text())["schedules"][SMALL]["decoder"]["backward"]["sampling"] == ["uniform"]
    load_spec(path)  # every entry answers the spec's workload again
    assert tune_main(args, timer=lambda fn: pytest.fail("timed again"), device="cpu", sizes=sizes) == 0


def test_kgen_tune_stops_on_an_error_in_the_spec_itself(tmp_path):
    """Only errors located in the tuning file let kgen tune load without the operators' checks;
    one in the spec (here a shape whose default tile does not fit) stops it as it stops
    generation, before anything is timed."""
    text = narrow().replace("    - {M: 1, D: 24, L: 3, K: 4}\n", "    - {M: 1, D: 24, L: 3, K: 4}\n    - {M: 8, D: 256, L: 4, K: 4}\n")
    path = spec_copy(tmp_path, text)
    args = argparse.Namespace(specs=[str(path)], root=tmp_path, only=[SMALL])
    with pytest.raises(SpecError) as err:
        tune_main(args, timer=lambda fn: pytest.fail("timed"), device="cpu")
    assert err.value.path.endswith("msda.yaml") and "values per thread" in err.value.message
