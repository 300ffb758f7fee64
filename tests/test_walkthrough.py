"""The README's "Add a head dim" walk-through, performed on a copy of the repository.

The YAML line, the commands, the Python lines and the refusal are read from README.md, so the
README cannot drift from what works. To keep CI time bounded, the copy's spec starts from one
variant (float32, the reference shape), written by `kgen build --no-validate`: the README's build
then checks two variants, the new one and that starting point (the lock records no validation
for it), instead of the four dtypes of the new shape. The steps are the README's, verbatim.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, keep_tuning_entries, run_kgen

SECTION = (lambda text: text[text.index("**Add a head dim.**"): text.index("**Tune the schedule")])((ROOT / "README.md").read_text())
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", SECTION, re.S)
SHAPE = next(body for lang, body in BLOCKS if lang == "yaml").strip()
COMMANDS = [line for line in next(body for lang, body in BLOCKS if lang == "bash").splitlines() if line.strip()]
PYTHON = next(body for lang, body in BLOCKS if lang == "python")
REFUSAL = next(body for lang, body in BLOCKS if lang == "").strip()
REFUSED_SHAPE = re.search(r"\(`(- \{M: [^`]*\})` instead\)", SECTION).group(1)


def _copy(root: Path) -> Path:
    for folder in ("specs", "templates", "generated"):
        shutil.copytree(ROOT / folder, root / folder)
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def _add_shape(spec: Path, line: str) -> None:
    """Append `line` to variants.shapes, after its last entry (as a user would)."""
    lines = spec.read_text().splitlines(keepends=True)
    last = i = next(i for i, text in enumerate(lines) if text.strip() == "shapes:")
    while i + 1 < len(lines) and lines[i + 1].startswith("    - {"):
        last = i = i + 1
    lines.insert(last + 1, "    " + line.strip() + "\n")
    spec.write_text("".join(lines))


def test_readme_steps_are_what_the_test_performs():
    assert SHAPE == "- {M: 8, D: 96, L: 4, K: 4}"
    assert [shlex.split(c)[:2] for c in COMMANDS] == [["kgen", "build"], ["kgen", "verify"]]
    assert "import msda_forward" in PYTHON and REFUSAL.startswith("kgen: error: specs/msda.yaml:")


def test_a_refused_head_dim_names_its_line_the_rule_and_what_works(tmp_path):
    root = _copy(tmp_path)
    before = {p: p.read_bytes() for p in (root / "generated").rglob("*") if p.is_file()}
    _add_shape(root / "specs" / "msda.yaml", REFUSED_SHAPE)
    proc = run_kgen(*shlex.split(COMMANDS[0])[1:], cwd=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == REFUSAL  # the README shows exactly what kgen prints
    assert {p: p.read_bytes() for p in (root / "generated").rglob("*") if p.is_file()} == before


def test_add_a_head_dim_build_verify_and_use_it(tmp_path):
    root = _copy(tmp_path)
    spec = root / "specs" / "msda.yaml"
    text = spec.read_text()
    start, end = text.index("variants:\n"), text.index("\ntensors:")
    text = text[:start] + "variants:\n  axes:\n    dtype: [float32]\n  shapes:\n    - {M: 8, D: 32, L: 4, K: 4}\n" + text[end:]
    spec.write_text(re.sub(r"\n  exclude:\n    - \{dtype: float64\}.*", "", text))  # tune.exclude names float64
    keep_tuning_entries(root, "msda_fwd_f32_m8_d32_l4_k4")
    setup = run_kgen("build", "--no-validate", "specs/msda.yaml", cwd=root)  # the float32-only starting point
    assert setup.returncode == 0, setup.stdout + setup.stderr

    _add_shape(spec, SHAPE)  # step 1: the README's line
    build, verify = (run_kgen(*shlex.split(c)[1:], cwd=root) for c in COMMANDS)  # steps 2 and 3
    assert build.returncode == 0, build.stdout + build.stderr
    assert "validating 2 variant(s) of specs/msda.yaml on" in build.stdout
    assert "ok   msda_fwd_f32_m8_d96_l4_k4" in build.stdout and "2 variant(s) from 1 spec(s), 2 written" in build.stdout
    assert (root / "generated" / "msda" / "msda_fwd_f32_m8_d96_l4_k4.py").is_file()
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "drift: ok" in verify.stdout and "ok   msda_fwd_f32_m8_d96_l4_k4 [" in verify.stdout
    assert verify.stdout.count(" [cpu]") + verify.stdout.count(" [cuda]") == 1, verify.stdout  # numerics: the new one only

    # Step 4: the README's Python lines, on random inputs, against the float64 reference.
    script = "\n".join([
        "import torch",
        "from kgen.reference.msda import msda_forward_grid_sample",
        "g = torch.Generator().manual_seed(0)",
        "spatial_shapes = torch.tensor([[9, 7], [5, 4], [3, 2], [2, 1]])",
        "S = int((spatial_shapes[:, 0] * spatial_shapes[:, 1]).sum())",
        "B, Q = 2, 37",
        "value = torch.randn(B, S, 8, 96, generator=g)",
        "sampling_locations = torch.rand(B, Q, 8, 4, 4, 2, generator=g) * 1.4 - 0.2",
        "attention_weights = torch.rand(B, Q, 8, 4, 4, generator=g) + 0.05",
        PYTHON.strip(),
        "ref = msda_forward_grid_sample(value.double(), spatial_shapes, None, sampling_locations.double(), attention_weights.double())",
        "assert out.shape == (B, Q, 768), out.shape",
        "torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)",
        "assert ref.abs().max() > 0.1",
        "print('used', out.shape)",
    ])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(root), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "used torch.Size([2, 37, 768])" in proc.stdout
