"""Bad specs: a located message (file:line: field: what was expected), exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import ROOT, run_kgen
from kgen.errors import SpecError
from kgen.spec import load_spec

SPEC = (ROOT / "specs" / "msda.yaml").read_text()


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "specs").mkdir(exist_ok=True)
    path = tmp_path / "specs" / "msda.yaml"
    path.write_text(text)
    return path


def test_shipped_spec_loads():
    spec = load_spec(ROOT / "specs" / "msda.yaml")
    assert spec.name == "msda" and len(spec.variant_points()) == 21


def test_bad_value_names_file_line_field_and_expectation(tmp_path):
    text = SPEC.replace("block_q: 32", "block_q: 24")
    path = write(tmp_path, text)
    proc = run_kgen("list", str(path.relative_to(tmp_path)), cwd=tmp_path)
    assert proc.returncode == 2
    line = line_of(text, "block_q: 24")
    assert f"specs/msda.yaml:{line}: schedule.block_q: expected a power of two between 8 and 256, got 24" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_duplicate_key(tmp_path):
    text = SPEC.replace("  num_warps: 4\n", "  num_warps: 4\n  num_warps: 8\n")
    proc = run_kgen("list", str(write(tmp_path, text)), cwd=tmp_path)
    assert proc.returncode == 2
    first, second = line_of(text, "num_warps: 4"), line_of(text, "num_warps: 8")
    assert f"msda.yaml:{second}: schedule.num_warps: duplicate key (first given on line {first})" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_key(tmp_path):
    text = SPEC.replace("  num_stages: 1", "  num_stages: 1\n  num_wraps: 2")
    proc = run_kgen("build", "--no-validate", str(write(tmp_path, text)), cwd=tmp_path)
    assert proc.returncode == 2
    assert f"msda.yaml:{line_of(text, 'num_wraps')}: schedule.num_wraps: unknown key" in proc.stderr
    assert not (tmp_path / "generated").exists(), "a bad spec must not write anything"


@pytest.mark.parametrize(
    "old, new, field, expected",
    [
        ("B: {max: 64, doc: batch}", "B: {max: -3, doc: batch}", "dims.B.max", "expected an integer between 1 and"),
        ("dtype: [float32, float16, bfloat16, float64]", "dtype: [float32, float8]", "variants.axes.dtype", "item 1: expected one of"),
        ("value:              {shape: [B, S, M, D]", "value:              {shape: [B, S, M, X]", "tensors.value.shape", "expected a dim name"),
        ("attention_weights:  {shape: [B, Q, M, L, K]", "attention_weights:  {shape: [B, Q, M, K]", "tensors.attention_weights.shape", "expected ['B', 'Q', 'M', 'L', 'K']"),
        ("float16:  {atol: 2.0e-3, rtol: 2.0e-3}", "float16:  {atol: lots, rtol: 2.0e-3}", "validation.tolerances.float16.atol", "expected a number >= 0.0, got 'lots'"),
        ("op: msda_forward", "op: msda_backward", "op", "expected one of msda_forward"),
        ("    - {dtype: float64, D: 64}", "    - {dtype: float64, D: 96}", "variants.exclude[0].D", "expected one of the axis values"),
        ("    - {M: 8, D: 64, L: 4, K: 4}", "    - {M: 8, D: 64, L: 4}", "variants.shapes[2]", "expected the dims of the first shape (M, D, L, K)"),
        ("    - {M: 8, D: 64, L: 4, K: 4}", "    - {M: 8, D: 64, L: 4, K: 0}", "variants.shapes[2].K", "expected an integer between 1 and"),
        ("    - {M: 8, D: 64, L: 4, K: 4}", "    - {M: 8, D: 48, L: 4, K: 4}  # again", "variants.shapes[2]", "repeats an earlier shape"),
        ("  target: sm_90", "  target: gfx950", "schedule.target", "expected one of sm_70"),
        ("  deterministic: false", "  deterministic: maybe", "schedule.deterministic", "expected true or false"),
    ],
)
def test_bad_values_are_located(tmp_path, old, new, field, expected):
    assert old in SPEC
    text = SPEC.replace(old, new)
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, text))
    assert err.value.field == field
    assert err.value.line == line_of(text, new)
    assert expected in err.value.message


def test_missing_required_section(tmp_path):
    text = SPEC.replace("schedule:\n", "scheduled:\n")
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, text))
    assert err.value.field in ("schedule", "scheduled")


def test_invalid_yaml_and_non_mapping(tmp_path):
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, "name: msda\n  bad: [indent\n"))
    assert err.value.path.endswith("msda.yaml") and err.value.line
    with pytest.raises(SpecError, match="expected a mapping"):
        load_spec(write(tmp_path, "- just\n- a list\n"))


def test_yaml_tags_are_not_executed(tmp_path):
    with pytest.raises(SpecError, match="invalid"):
        load_spec(write(tmp_path, "name: !!python/object/apply:os.system ['echo hi']\n"))


def test_exclusions_that_leave_nothing(tmp_path):
    text = SPEC.replace("    - {dtype: float64, D: 64}", "    - {dtype: float32}\n    - {dtype: float16}\n    - {dtype: bfloat16}\n    - {dtype: float64}")
    with pytest.raises(SpecError, match="no variant"):
        load_spec(write(tmp_path, text))


def test_validation_case_with_too_few_levels(tmp_path):
    """Cases list levels for the deepest variant; each variant uses the first L of them."""
    text = SPEC.replace("[[7, 4], [4, 2], [1, 1], [2, 7], [1, 4]]", "[[7, 4], [4, 2], [1, 1], [2, 7]]")
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, text))
    assert err.value.line == line_of(text, "[[7, 4], [4, 2], [1, 1], [2, 7]]")
    assert err.value.field == "validation.cpu_cases[1].spatial_shapes"
    assert "expected at least 5 levels (msda_fwd_f32_m2_d128_l5_k8 has L=5; each variant uses the first L), got 4" in err.value.message


# ---- refusals: a shape or schedule that cannot work on the target, located where it is set ------

NEW_SHAPE = "    - {M: 1, D: 24, L: 3, K: 4}"


def _with_shape(tmp_path, shape: str, old: str = NEW_SHAPE, new: str | None = None) -> tuple[str, SpecError]:
    text = SPEC.replace(old, (new or old) + "\n" + shape, 1) if shape else SPEC.replace(old, new)
    assert text != SPEC
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, text))
    return text, err.value


@pytest.mark.parametrize(
    "shape, name, expected",
    [
        # BLOCK_D 256: 32 x 256 fp32 values over 128 threads is 64 per thread, twice the cap.
        ("{M: 8, D: 256, L: 4, K: 4}", "msda_fwd_f32_m8_d256_l4_k4",
         "a BLOCK_Q x BLOCK_D = 32 x 256 tile over 4 warps is 64 values per thread, above the 32 the kernels keep "
         "in registers; nearest that work: D <= 128, or schedule.block_q: 16, or schedule.num_warps: 8"),
        # BLOCK_D 2: 64 values for 128 threads: lanes would duplicate work (and atomic adds).
        ("{M: 8, D: 2, L: 4, K: 4}", "msda_fwd_f32_m8_d2_l4_k4",
         "a BLOCK_Q x BLOCK_D = 32 x 2 tile has fewer values than the 128 threads of 4 warps (lanes would hold copies, "
         "and the backward's atomic adds would repeat); nearest that work: D >= 3, or schedule.block_q: 64, or schedule.num_warps: 2"),
    ],
)
def test_head_dim_whose_tile_does_not_fit_is_refused_at_its_shape(tmp_path, shape, name, expected):
    text, err = _with_shape(tmp_path, f"    - {shape}")
    assert err.line == line_of(text, shape) and err.field == "variants.shapes[6].D"
    assert err.message == f"{name}: with schedule block_q=32, num_warps=4: {expected}"


def test_the_schedule_the_refusal_names_makes_the_head_dim_work(tmp_path):
    text = SPEC.replace(NEW_SHAPE, NEW_SHAPE + "\n    - {M: 1, D: 256, L: 1, K: 1}").replace("  num_warps: 4\n", "  num_warps: 8\n")
    spec = load_spec(write(tmp_path, text))
    assert {"dtype": "float32", "M": 1, "D": 256, "L": 1, "K": 1} in spec.variant_points()


def test_heads_beyond_the_grid_are_refused_at_their_shape(tmp_path):
    text, err = _with_shape(tmp_path, "    - {M: 2048, D: 32, L: 4, K: 4}")
    assert err.line == line_of(text, "{M: 2048,") and err.field == "variants.shapes[6].M"
    assert "B*M = 64*2048 = 131072 programs on grid axis 1 exceeds CUDA's 65535; lower B's max to at most 31, or use M <= 1023" in err.message


def test_value_tokens_beyond_int32_pixel_coordinates_are_refused(tmp_path):
    text = SPEC.replace("S: {max: 2097152,", "S: {max: 1000000000,")
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, text))
    assert err.value.field == "dims.S.max" and err.value.line == line_of(text, "S: {max: 1000000000,")
    assert "computed in int32: expected at most 715827882, got 1000000000" in err.value.message


def test_shape_naming_a_run_time_or_axis_dim_is_refused(tmp_path):
    _, err = _with_shape(tmp_path, "", "    - {M: 1, D: 24, L: 3, K: 4}", "    - {M: 1, D: 24, L: 3, B: 4}")
    assert err.field == "variants.shapes[5].B" and "expected a constant dim that is not a variant axis" in err.message


def test_grid_limit_is_a_constraint_error(tmp_path):
    text = SPEC.replace("B: {max: 64,", "B: {max: 100000,")
    with pytest.raises(SpecError, match="exceeds CUDA's 65535; lower B's max to at most 8191"):
        load_spec(write(tmp_path, text))


def test_missing_file_is_exit_2(tmp_path):
    proc = run_kgen("verify", "specs/nope.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "cannot read spec" in proc.stderr and "Traceback" not in proc.stderr


# ---- tq_decode: values a target cannot take are refused at spec time, located -------------------

TQ_SPEC = (ROOT / "specs" / "tq_decode.yaml").read_text()
TQ_AXES = TQ_SPEC[TQ_SPEC.index("  axes:\n") : TQ_SPEC.index("\nquant:")]


@pytest.mark.parametrize(
    "axes, needle, expected",
    [
        ("head_dim: [96]", "head_dim: [96]", "variants.axes.head_dim: tq_decode_gfx950_d96_qg8_bs16: head_dim 96 is not a power of two (the Hadamard rotation needs one); nearest that work: 64, 128"),
        ("head_dim: [32]", "head_dim: [32]", "variants.axes.head_dim: tq_decode_gfx950_d32_qg8_bs16: head_dim 32 leaves each of the 4 lanes of a token 4 packed bytes per stream"),
        ("QG: [17]", "QG: [17]", "variants.axes.QG: tq_decode_gfx950_d128_qg17_bs16: QG 17 exceeds the 16 rows of one MFMA tile"),
    ],
)
def test_tq_value_a_target_cannot_take_is_exit_2_with_file_line_field_rule(tmp_path, axes, needle, expected):
    """`kgen verify` (which loads the spec with its constraint checks, as build and show do; list
    does not) on a tq_decode spec with one bad axis value: exit 2, no traceback, and the message
    names the spec line, the field, the variant, the rule and the nearest values."""
    point = {"head_dim": "head_dim: [128]", "QG": "QG: [8]", "BS": "BS: [16]"}
    point[axes.split(":")[0]] = axes
    text = TQ_SPEC.replace(TQ_AXES, "  axes:\n" + "".join(f"    {a}\n" for a in point.values()) + "  exclude: []\n")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "tq_decode.yaml").write_text(text)
    proc = run_kgen("verify", "--no-numerics", "--no-compile", "specs/tq_decode.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"specs/tq_decode.yaml:{line_of(text, needle)}: {expected}" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "edit, field, message",
    [
        (lambda s: s[1].pop("K"), "variants.shapes[1]", "expected the dims of the first shape"),
        (lambda s: s.__setitem__(1, dict(s[0])), "variants.shapes[1]", "repeats an earlier shape"),
        (lambda s: s[0].__setitem__("B", 4), "variants.shapes[0].B", "expected a constant dim that is not a variant axis"),
        (lambda s: s[0].__setitem__("M", 0), "variants.shapes[0].M", "expected an integer between 1 and"),
    ],
)
def test_variant_shapes_errors_name_the_item(tmp_path, edit, field, message):
    """variants.shapes: every item lists the same compile-time dims (not axes), once each."""
    data = yaml.safe_load(SPEC)
    assert len(data["variants"]["shapes"]) >= 2
    edit(data["variants"]["shapes"])
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, yaml.safe_dump(data, sort_keys=False)), check=False)
    assert err.value.field == field and message in err.value.message, str(err.value)


def test_tq_region_axis_extent_that_is_not_a_name_is_located(tmp_path):
    """A list (or number) where a region axis names its extent: a located error, no traceback."""
    needle = "axes: {slot: BS, kv_head: Hk}"
    assert TQ_SPEC.count(needle) == 1
    text = TQ_SPEC.replace(needle, "axes: {slot: [BS], kv_head: Hk}")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "tq_decode.yaml").write_text(text)
    proc = run_kgen("verify", "--no-numerics", "--no-compile", "specs/tq_decode.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line = line_of(text, "axes: {slot: [BS]")
    assert f"specs/tq_decode.yaml:{line}: cache.regions.data.axes.slot: expected a dim name" in proc.stderr, proc.stderr
