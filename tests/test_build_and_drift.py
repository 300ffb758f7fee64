"""kgen build / verify on a copy of the project: drift detection, lock, stale removal, atomicity."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import tomllib

from conftest import ROOT, keep_tuning_entries, run_kgen
from kgen.toolchain import GENERATOR_PINS

VARIANT = "generated/msda/msda_fwd_f16_m8_d48_l4_k4.py"


def test_checked_in_output_is_in_sync():
    proc = run_kgen("verify", "--no-numerics", "--no-compile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "drift: ok" in proc.stdout


def test_rebuild_writes_nothing(project):
    before = {p: p.stat().st_mtime_ns for p in (project / "generated").rglob("*") if p.is_file()}
    proc = run_kgen("build", "--no-validate", "--no-compile", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "0 written, 63 unchanged" in proc.stdout  # msda 21, tq_decode 42
    after = {p: p.stat().st_mtime_ns for p in (project / "generated").rglob("*") if p.is_file()}
    assert before.keys() == after.keys()
    assert all(before[p] == after[p] for p in before if p.name != "kgen.lock")


def test_concurrent_builds_serialize_on_the_lock(project):
    """A build waits for the output directory's lock before it reads kgen.lock, so two builds
    of different specs at once cannot drop each other's lock entries."""
    import fcntl
    import time

    edited = project / "specs" / "msda.yaml"
    edited.write_text(edited.read_text().replace("block_q: 32        # queries", "block_q: 16        # queries", 1))
    fd = os.open(project / "generated", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        build = subprocess.Popen(
            [sys.executable, "-m", "kgen", "build", "--no-validate", "--no-compile", "specs/msda.yaml"],
            cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        said = ""
        while "waiting for another build's lock" not in said:
            line = build.stderr.readline()
            assert line, f"build ended without waiting for the lock: rc {build.wait()}, {said}"
            said += line
        time.sleep(1)  # it stays blocked: nothing written while the lock is held
        assert build.poll() is None
        assert (project / "generated" / "kgen.lock").read_text() == (ROOT / "generated" / "kgen.lock").read_text()
    finally:
        os.close(fd)
    out, err = build.communicate(timeout=300)
    assert build.returncode == 0, err
    assert "kgen build: 21 variant(s)" in out and "0 written" not in out


def test_tampered_generated_file_fails_verify(project):
    path = project / VARIANT
    path.write_text(path.read_text().replace("x = loc_x * width.to(tl.float32) - 0.5", "x = loc_x * width.to(tl.float32)"))
    proc = run_kgen("verify", "--no-numerics", "--no-compile", cwd=project)
    assert proc.returncode == 1
    assert f"{VARIANT}: differs from what specs/msda.yaml generates now" in proc.stdout
    assert "fix: kgen build" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_edited_template_fails_verify(project):
    template = project / "templates" / "triton" / "msda_fwd.py.jinja"
    template.write_text(template.read_text().replace("# Zero padding:", "# Zero padding (edited):"))
    proc = run_kgen("verify", "--no-numerics", "--no-compile", cwd=project)
    assert proc.returncode == 1
    assert proc.stdout.count("differs from what specs/msda.yaml generates now") == 21  # every msda variant


def test_lock_tampering_and_stray_files_fail_verify(project):
    lock = project / "generated" / "kgen.lock"
    data = json.loads(lock.read_text())
    first = next(iter(data["outputs"]))
    data["outputs"][first]["sha256"] = "0" * 64
    lock.write_text(json.dumps(data))
    (project / "generated" / "msda" / "hand_written.py").write_text("x = 1\n")
    proc = run_kgen("verify", "--no-numerics", "--no-compile", cwd=project)
    assert proc.returncode == 1
    assert "generated/kgen.lock: out of date" in proc.stdout
    assert "generated/msda/hand_written.py: not produced by any spec" in proc.stdout


def test_outputs_no_spec_produces_are_removed(project):
    spec = project / "specs" / "msda.yaml"
    spec.write_text(_only_the_reference_shape(spec.read_text()))
    proc = run_kgen("build", "--no-validate", "specs/msda.yaml", cwd=project)
    assert proc.returncode == 0, proc.stderr
    # The variants kept differ in their header's spec hash only: no unchecked code is written.
    assert "WARNING: --no-validate" not in proc.stderr
    remaining = sorted(p.name for p in (project / "generated" / "msda").glob("*.py"))
    assert remaining == [f"msda_fwd_{t}_m8_d32_l4_k4.py" for t in ("bf16", "f16", "f32", "f64")]
    lock = json.loads((project / "generated" / "kgen.lock").read_text())
    assert sorted(k for k in lock["outputs"] if k.startswith("msda/")) == [f"msda/{n}" for n in remaining]
    assert any(k.startswith("tq_decode/") for k in lock["outputs"]), "other specs' entries are kept"
    assert run_kgen("verify", "--no-numerics", "--no-compile", cwd=project).returncode == 0


def test_a_no_validate_write_is_validated_by_the_next_build(project):
    """--no-validate warns and records no validation in the lock; the next build validates what
    it wrote, and the one after has nothing left to validate."""
    spec = project / "specs" / "msda.yaml"
    spec.write_text(_only_the_reference_shape(spec.read_text(), "[float32]"))
    keep_tuning_entries(project, "msda_fwd_f32_m8_d32_l4_k4")
    template = project / "templates" / "triton" / "msda_fwd.py.jinja"
    template.write_text(template.read_text().replace("# One coalesced tile store", "# One coalesced store of the tile", 1))
    first = run_kgen("build", "--no-validate", "--no-compile", "specs/msda.yaml", cwd=project)
    assert first.returncode == 0, first.stderr
    assert "WARNING: --no-validate: writing kernels that were NOT checked against their reference" in first.stderr
    assert "1 written" in first.stdout
    second = run_kgen("build", "--device", "cpu", "--no-compile", "specs/msda.yaml", cwd=project)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "validating 1 variant(s) of specs/msda.yaml on cpu" in second.stdout
    assert "ok   msda_fwd_f32_m8_d32_l4_k4" in second.stdout and "0 written" in second.stdout
    third = run_kgen("build", "--device", "cpu", "--no-compile", "specs/msda.yaml", cwd=project)
    assert third.returncode == 0 and "validating" not in third.stdout, third.stdout
    assert run_kgen("verify", "--no-numerics", "--no-compile", cwd=project).returncode == 0


def _only_the_reference_shape(text: str, dtypes: str = "[float32, float16, bfloat16, float64]") -> str:
    """specs/msda.yaml with variants narrowed to the M=8, D=32, L=4, K=4 shape (and `dtypes`)."""
    start, end = text.index("variants:\n"), text.index("\ntensors:")
    text = text[:start] + f"variants:\n  axes:\n    dtype: {dtypes}\n  shapes:\n    - {{M: 8, D: 32, L: 4, K: 4}}\n" + text[end:]
    tune_exclude = "\n  exclude:\n    - {dtype: float64}   # the gradcheck variants: their speed does not matter"
    assert tune_exclude in text
    return text if "float64" in dtypes else text.replace(tune_exclude, "")


def test_build_refuses_a_kernel_that_fails_its_reference(project):
    """A planted template bug: validation catches it and nothing is written."""
    spec = project / "specs" / "msda.yaml"
    text = _only_the_reference_shape(spec.read_text(), "[float32]")
    keep_tuning_entries(project, "msda_fwd_f32_m8_d32_l4_k4")
    spec.write_text(text.replace("    - {batch: 1, queries: 5,", "    # - {batch: 1, queries: 5,"))
    template = project / "templates" / "triton" / "msda_fwd.py.jinja"
    template.write_text(template.read_text().replace("y = loc_y * height.to({{ p.acc }}) - 0.5", "y = loc_y * height.to({{ p.acc }}) - 0.25"))
    before = {p: p.read_bytes() for p in (project / "generated").rglob("*") if p.is_file()}
    proc = run_kgen("build", "--device", "cpu", cwd=project)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL msda_fwd_f32_m8_d32_l4_k4" in proc.stdout
    assert "not written" in proc.stderr
    after = {p: p.read_bytes() for p in (project / "generated").rglob("*") if p.is_file()}
    assert before == after


def test_header_has_hashes_and_no_timestamp():
    head = (ROOT / VARIANT).read_text().split('"""')[0]
    assert "DO NOT EDIT" in head and "kgen build specs/msda.yaml" in head
    for key in ("spec sha256:", "templates sha256:", "toolchain sha256:"):
        assert key in head
    assert not re.search(r"\d{4}-\d{2}-\d{2}|\d{2}:\d{2}", head), "no dates or times in headers"


def test_generation_is_deterministic_across_hash_seeds():
    script = "from pathlib import Path; from kgen.spec import load_spec; from kgen.generate import generate;" \
        "print(''.join(o.text for o in generate(load_spec('specs/msda.yaml'), Path('.'))))"
    texts = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
        texts.add(subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout)
    assert len(texts) == 1


def test_pyproject_pins_match_the_toolchain_hash_pins():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {d.split("==")[0].lower(): "==" + d.split("==")[1] for d in deps}
    assert declared == {k.lower(): v for k, v in GENERATOR_PINS.items()}


def test_usage_errors_exit_2():
    proc = run_kgen("frobnicate")
    assert proc.returncode == 2
    proc = run_kgen("show", "no_such_variant")
    assert proc.returncode == 2 and "no variant named 'no_such_variant'" in proc.stderr


def test_list_and_show():
    proc = run_kgen("list")
    assert proc.returncode == 0
    assert "msda_fwd_bf16_m8_d48_l4_k4" in proc.stdout and "dtype=bfloat16 M=8 D=48 L=4 K=4" in proc.stdout
    proc = run_kgen("show", "msda_fwd_bf16_m8_d48_l4_k4")
    assert proc.returncode == 0
    assert "BLOCK_D" in proc.stdout and "64" in proc.stdout
    assert "value_base   = 384*S*b + 48*m" in proc.stdout
    assert "int64: an intermediate reaches" in proc.stdout
    proc = run_kgen("show", "msda_fwd_bf16_m8_d32_l4_k4")  # M*D = 256: the corner gather fits int32
    assert "gather       = d + 256*pixel" in proc.stdout and "int32: every intermediate" in proc.stdout


def test_adding_a_variant_validates_only_the_new_one(project):
    """A variant added to a spec changes every other file of that spec in the header's spec hash
    only; the build validates the new variant alone (the others' code was checked as it is),
    rewrites the rest, and leaves generated/ in sync."""
    spec = project / "specs" / "msda.yaml"
    spec.write_text(spec.read_text().replace("    - {dtype: float64, D: 24}\n", "", 1))
    kept = project / VARIANT
    before = kept.read_text()
    proc = run_kgen("build", "--device", "cpu", "specs/msda.yaml", cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "21 variant(s) of specs/msda.yaml differ from generated/ only in their header's spec hash" in proc.stdout
    assert "validating 1 variant(s) of specs/msda.yaml" in proc.stdout
    assert "ok   msda_fwd_f64_m1_d24_l3_k4" in proc.stdout
    assert "22 written" in proc.stdout
    assert (project / "generated" / "msda" / "msda_fwd_f64_m1_d24_l3_k4.py").exists()
    after = kept.read_text()
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0][1].startswith("# spec sha256:"), changed
    assert run_kgen("verify", "--no-numerics", "--no-compile", cwd=project).returncode == 0


def test_only_a_variants_edit_skips_validation(tmp_path):
    """validation_sha256 ignores the spec's variants section and the header's spec hash, nothing
    else: an edited tolerance or template, or a file on disk the lock does not describe, is
    validated again."""
    import shutil

    from kgen.emit import validated_before
    from kgen.generate import generate
    from kgen.spec import load_spec

    text = (ROOT / "specs" / "msda.yaml").read_text()
    edits = {
        "base": text,
        "variants": text.replace("    - {dtype: float64, D: 24}\n", "", 1),
        "validation": text.replace("float32:  {atol: 5.0e-5, rtol: 1.0e-5}", "float32:  {atol: 4.0e-5, rtol: 1.0e-5}", 1),
    }
    templates = tmp_path / "edited" / "templates"  # a root whose forward template has a reworded comment
    shutil.copytree(ROOT / "templates", templates)
    fwd = templates / "triton" / "msda_fwd.py.jinja"
    fwd.write_text(fwd.read_text().replace("# One coalesced tile store", "# One coalesced store of the tile", 1))
    variant = "msda_fwd_f32_m8_d32_l4_k4"
    out = {}
    for name, body in edits.items():
        assert name == "base" or body != text
        (tmp_path / name).mkdir()
        (tmp_path / name / "msda.yaml").write_text(body)
        shutil.copy(ROOT / "specs" / "msda.tuning.json", tmp_path / name)
        out[name] = next(o for o in generate(load_spec(str(tmp_path / name / "msda.yaml")), ROOT) if o.variant == variant)
    out["template"] = next(o for o in generate(load_spec(str(tmp_path / "variants" / "msda.yaml")), tmp_path / "edited") if o.variant == variant)
    base = out["base"]
    entry = dict(base.lock_entry(), validation_sha256=base.validation_sha256)  # as a validating build records it

    assert out["variants"].text != base.text and out["variants"].validation_sha256 == base.validation_sha256
    assert validated_before(out["variants"], base.text, entry)
    assert not validated_before(out["variants"], base.text + "# edited by hand\n", entry)  # not the file the lock describes
    assert not validated_before(out["variants"], None, entry)
    assert not validated_before(out["variants"], base.text, base.lock_entry())  # written by --no-validate, or an older lock
    for name in ("validation", "template"):
        assert out[name].validation_sha256 != base.validation_sha256, name
        assert not validated_before(out[name], base.text, entry), name
