"""benchmarks/tq_decode_fused_rotation.py's derived module on CPU under the interpreter: the edits
still apply to the generated d128 qg8 bs16 module, and its fused short launch (the decode
rotating its own query rows and rounding the codebook, no rotation kernel) passes kgen's decode
check; a rotated query stored with its columns reversed fails it."""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import tq_decode_fused_rotation as fused_lab
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

from kgen.spec import load_spec  # noqa: E402
from kgen.verify import tq as verify_tq  # noqa: E402

SOURCE = (ROOT / "generated" / "tq_decode" / f"{fused_lab.VARIANT}.py").read_text()
Q_ROT_STORE = "tl.store(scratch + rrow[:, None] * HEAD_DIM + rcol[None, :],"


def _checked(source):
    """kgen's decode checks of the module `source` on CPU, with single-group launches taking the
    short schedule (the interpreter has no wave to size it by), and which launches were fused."""
    module = fused_lab.load(source)
    module._short_wave = lambda device: 1 << 30
    fused = []
    launch = module.launch_decode_kernel
    module.launch_decode_kernel = lambda *args, **kwargs: fused.append(kwargs.get("fused") is not None) or launch(*args, **kwargs)
    return verify_tq.check_decode(module, load_spec(ROOT / "specs" / "tq_decode.yaml"), "cpu"), fused


def test_fused_short_launch_passes_the_decode_check():
    results, fused = _checked(fused_lab.derive(SOURCE))
    assert any(fused), "no launch took the fused path"
    assert all(r["ok"] for r in results), [r for r in results if not r["ok"]]


def test_reversed_rotated_columns_fail_the_check():
    source = fused_lab.derive(SOURCE)
    assert source.count(Q_ROT_STORE) == 1
    results, fused = _checked(source.replace(Q_ROT_STORE, "tl.store(scratch + rrow[:, None] * HEAD_DIM + (HEAD_DIM - 1 - rcol)[None, :],"))
    assert any(fused)
    assert not all(r["ok"] for r in results)


def test_derive_names_a_changed_generated_module():
    with pytest.raises(ValueError, match="the generated module changed"):
        fused_lab.derive(SOURCE.replace("    max_logits_ptr,\n    max_blocks,", "    max_logits_ptr,\n    max_rows,"))
