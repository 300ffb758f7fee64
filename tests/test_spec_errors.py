"""Bad specs: a located message (file:line: field: what was expected), exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    assert spec.name == "msda" and len(spec.variant_points()) == 8


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
        ("  exclude: []", "  exclude: [{D: 64}]", "variants.exclude[0].D", "expected one of the axis values"),
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
    text = SPEC.replace("  exclude: []", "  exclude: [{D: 32}, {D: 48}]")
    with pytest.raises(SpecError, match="no variant"):
        load_spec(write(tmp_path, text))


def test_validation_case_with_wrong_level_count(tmp_path):
    text = SPEC.replace("[[7, 4], [4, 2], [1, 1], [2, 7]]", "[[7, 4], [4, 2]]")
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, text))
    assert err.value.line == line_of(text, "[[7, 4], [4, 2]]")
    assert "expected 4 levels (L), got 2" in err.value.message


def test_grid_limit_is_a_constraint_error(tmp_path):
    text = SPEC.replace("B: {max: 64,", "B: {max: 100000,")
    with pytest.raises(SpecError, match="exceeds CUDA's 65535; lower B's max to at most 8191"):
        load_spec(write(tmp_path, text))


def test_missing_file_is_exit_2(tmp_path):
    proc = run_kgen("verify", "specs/nope.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "cannot read spec" in proc.stderr and "Traceback" not in proc.stderr
