"""Golden snapshot of one generated kernel, so template changes show up as a reviewed diff.

Refresh after an intended change with: KGEN_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py
"""

from __future__ import annotations

import os

from conftest import ROOT
from kgen.generate import generate
from kgen.spec import load_spec

GOLDEN = ROOT / "tests" / "golden" / "msda_fwd_f16_m8_d48_l4_k4.py"


def test_golden_snapshot():
    outputs = {o.variant: o for o in generate(load_spec(ROOT / "specs" / "msda.yaml"), ROOT)}
    text = outputs["msda_fwd_f16_m8_d48_l4_k4"].text
    if os.environ.get("KGEN_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), "no snapshot yet: run with KGEN_UPDATE_GOLDEN=1"
    assert text == GOLDEN.read_text(), "generated code changed: review the diff, then refresh the snapshot"
