"""benchmarks/tq_decode_ablate.py on CPU: its altered modules differ from the generated one only
in the named inline PTX, which becomes one byte permute per output register of the two packed
input words, and they load and run (the interpreter takes the plain-Triton path, so they agree)."""

from __future__ import annotations

import difflib
import re
import sys

import torch

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import tq_decode_ablate as ablate
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

NAME = "tq_decode_triton_d128_qg8_bs16"
SOURCE = (ROOT / "generated" / "tq_decode" / f"{NAME}.py").read_text()


def _changed_lines(before: str, after: str) -> tuple[list[str], list[str]]:
    diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0))
    removed = [line[1:] for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    return removed, added


def _asm_of(source: str, function: str) -> str:
    at = source.index(f"def {function}(")
    start = source.index('asm="""', at)
    return source[start:source.index('"""', start + 7)]


def test_each_form_replaces_only_its_function_s_ptx():
    forms = ablate.ablated_sources(SOURCE)
    assert forms["shipped"] == SOURCE
    for before, after, function in ((SOURCE, forms["k_cheap"], "_unpack_k_pairs"),
                                    (forms["k_cheap"], forms["kv_cheap"], "_unpack_v_words")):
        removed, added = _changed_lines(before, after)
        old_asm = _asm_of(before, function)
        assert removed and all(line in old_asm for line in removed), function
        # Eight outputs ($0-$7), each a permute of the two packed words ($8, $9).
        assert [re.sub(r"0x[0-9A-F]{4}", "SEL", line.strip()) for line in added if "prmt" in line] == [
            f"prmt.b32 ${i}, $8, $9, SEL;" for i in range(8)]
        assert _asm_of(after, function).count("prmt") == 8
        # The other function's PTX is untouched.
        other = "_unpack_v_words" if function == "_unpack_k_pairs" else "_unpack_k_pairs"
        assert _asm_of(after, other) == _asm_of(before, other)


def test_forms_load_and_run_under_the_interpreter(tmp_path):
    forms = ablate.load_forms(NAME, tmp_path)
    shipped = forms["shipped"]
    store = ablate.load(f"tq_store_d{shipped.HEAD_DIM}_bs{shipped.BS}")
    g = torch.Generator().manual_seed(0)
    centroids, rotation = ablate.lloyd_max_centroids(shipped.HEAD_DIM), ablate.hadamard_rotation(shipped.HEAD_DIM)
    q, cache, table, seq_lens = ablate.random_decode_inputs(shipped, store, 1, 256, g, centroids, rotation)
    ref = shipped.tq_decode(q, cache, table, seq_lens, centroids, rotation)
    assert ref.abs().max() > 0
    for form in ("k_cheap", "kv_cheap"):
        assert torch.equal(forms[form].tq_decode(q, cache, table, seq_lens, centroids, rotation), ref), form
