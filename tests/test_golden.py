"""Golden snapshot of one generated kernel, so template changes show up as a reviewed diff.

Refresh after an intended change with: KGEN_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py
"""

from __future__ import annotations

import os

from conftest import ROOT
from kgen.generate import generate
from kgen.ops import msda
from kgen.spec import load_spec

NAME = "msda_fwd_f16_m8_d48_l4_k4"
GOLDEN = ROOT / "tests" / "golden" / f"{NAME}.py"


def test_golden_snapshot(monkeypatch):
    spec = load_spec(ROOT / "specs" / "msda.yaml")  # loaded whole: its tuning file names other variants
    every = msda.variants
    monkeypatch.setattr(msda, "variants", lambda spec: [v for v in every(spec) if v.name == NAME])  # render just this one
    outputs = {o.variant: o for o in generate(spec, ROOT)}
    text = outputs[NAME].text
    if os.environ.get("KGEN_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), "no snapshot yet: run with KGEN_UPDATE_GOLDEN=1"
    assert text == GOLDEN.read_text(), "generated code changed: review the diff, then refresh the snapshot"
    assert text == (ROOT / "generated" / "msda" / f"{NAME}.py").read_text(), "the checked-in output is the snapshot too"
