"""The forward's `words` location form on CPU: where it is offered (proven from the layouts), what
it generates, bit-for-bit agreement with separate loads under the interpreter in every dtype it
packs, the per-class chain of location forms, and the wrapper's refusal of misaligned tensors."""

from __future__ import annotations

import pytest
import torch

from conftest import ROOT, load_module
from kgen.errors import SpecError
from kgen.generate import generate
from kgen.ops import msda
from kgen.spec import load_spec
from kgen.tune import Launch
from kgen.verify.msda import check
from test_msda_tune import GOOD, PLANAR, SMALL, line_of, narrow, spec_copy, tuning, variant

SCHEDULE_LINE = "  block_q: 32        # queries per program"


def with_default_locations(text: str, form: str) -> str:
    return text.replace(SCHEDULE_LINE, f"  locations: {form}\n{SCHEDULE_LINE}")


def small_inputs(dtype: torch.dtype, queries: int = 37):
    """SMALL's inputs (M=1, D=24, L=3, K=4): locations reaching outside the levels, 37 queries
    (ragged against every block_q), random weights."""
    g = torch.Generator().manual_seed(11)
    shapes = torch.tensor([[5, 7], [3, 4], [2, 2]])
    areas = shapes[:, 0] * shapes[:, 1]
    value = torch.randn(2, int(areas.sum()), 1, 24, generator=g).to(dtype)
    loc = (torch.rand(2, queries, 1, 3, 4, 2, generator=g) * 1.4 - 0.2).to(dtype)
    weights = (torch.rand(2, queries, 1, 3, 4, generator=g) + 0.05).to(dtype)
    return value, shapes, torch.cumsum(areas, 0) - areas, loc, weights


def test_words_are_offered_for_16_and_32_bit_dtypes_with_unrolled_point_loops():
    spec = load_spec(ROOT / "specs" / "msda.yaml")
    for name in ("msda_fwd_bf16_m8_d32_l4_k4", "msda_fwd_f16_m8_d32_l4_k4", "msda_fwd_f32_m8_d32_l4_k4"):
        got = msda.tune_candidates(spec, variant(spec, name))
        words = [c for c in got if c.locations == "words"]
        assert words and all(c.point_loop == "unrolled" for c in words), name
        # Every unrolled candidate also comes as words.
        assert {(c.block_q, c.num_warps, c.corners) for c in words} == {
            (c.block_q, c.num_warps, c.corners) for c in got if c.point_loop == "unrolled" and c.locations == "separate"
        }, name
    v = variant(spec, "msda_fwd_f32_m8_d32_l4_k4")
    run_time = msda.locations_problem(spec, v, Launch(32, 4, 1, "run_time", "fused", "words"))
    assert "needs an unrolled point loop" in run_time
    f64 = variant(spec, "msda_fwd_f64_m8_d32_l4_k4")
    assert "not 64-bit ones" in msda.locations_problem(spec, f64, Launch(32, 4, 1, "unrolled", "fused", "words"))
    # bf16 DETR: a level's 8 location values are 2 words, its 4 weights 1, starting on words.
    locations, weights = msda.word_runs(spec, variant(spec, "msda_fwd_bf16_m8_d32_l4_k4"))
    assert (locations.words, locations.values_per_word, str(locations.level)) == (2, 4, "2*l")
    assert (weights.words, weights.values_per_word, str(weights.level)) == (1, 4, "l")


def test_words_are_refused_where_a_level_is_not_a_run_of_whole_words(tmp_path):
    """Planar locations (x and y apart) and runs that end mid-word (bf16, K=2 weights: 4 bytes)
    are refused, at the spec's line when its schedule names words."""
    spec = load_spec(spec_copy(tmp_path, PLANAR))
    assert "contiguously" in msda.word_runs(spec, variant(spec, SMALL))
    text = with_default_locations(PLANAR, "words")
    with pytest.raises(SpecError) as err:
        list(generate(load_spec(spec_copy(tmp_path, text)), ROOT))
    assert err.value.line == line_of(text, "  locations: words") and err.value.field == "schedule.locations"
    two_points = narrow().replace("dtype: [float32]", "dtype: [bfloat16]").replace("{M: 1, D: 24, L: 3, K: 4}", "{M: 1, D: 24, L: 3, K: 2}")
    spec = load_spec(spec_copy(tmp_path, two_points))
    why = msda.word_runs(spec, variant(spec, "msda_fwd_bf16_m1_d24_l3_k2"))
    assert "0.5 words" in why, why
    assert not [c for c in msda.tune_candidates(spec, variant(spec, "msda_fwd_bf16_m1_d24_l3_k2")) if c.locations == "words"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_words_everywhere_match_the_separate_loads_bitwise(tmp_path, dtype):
    """A spec schedule of words: one form (no flag), every value shifted out of its word; under
    the interpreter the output equals the separate loads' bit for bit."""
    text = narrow().replace("dtype: [float32]", f"dtype: [{dtype}]")
    separate = next(o.text for o in generate(load_spec(spec_copy(tmp_path, text)), ROOT) if "m1_d24" in o.variant)
    spec = load_spec(spec_copy(tmp_path, with_default_locations(text, "words")))
    words = next(o.text for o in generate(spec, ROOT) if "m1_d24" in o.variant)
    forward = words[words.index("def _msda_fwd_") : words.index("def _corner_backward")]
    assert "WORD_LOCATIONS" not in words and "loc_base =" not in forward and "tl.pointer_type(tl.int64)" in forward
    assert "loc_x = _word_value(" in forward and "weight = _word_value(" in forward
    facts = {f.name: f.value for f in msda.lower(spec, next(v for v in msda.variants(spec) if "m1_d24" in v.name)).facts}
    assert facts["locations forward"] == "decoder words, encoder words"
    modules = []
    for name, source in (("separate", separate), ("words", words)):
        path = tmp_path / f"{name}_{dtype}.py"
        path.write_text(source)
        modules.append(load_module(path))
    args = small_inputs(getattr(torch, dtype))
    outs = [m.msda_forward(*args) for m in modules]
    assert outs[0].abs().sum() > 0 and torch.equal(outs[0], outs[1])
    # Swapping two points' locations changes the output: a wrong lane would not go unseen.
    swapped = args[3].clone()
    swapped[..., 1, :], swapped[..., 2, :] = args[3][..., 2, :], args[3][..., 1, :]
    assert not torch.equal(modules[1].msda_forward(*args[:3], swapped, args[4]), outs[0])


def test_misaligned_tensors_are_refused_by_name(tmp_path):
    text = with_default_locations(narrow().replace("dtype: [float32]", "dtype: [bfloat16]"), "words")
    spec = load_spec(spec_copy(tmp_path, text))
    path = tmp_path / "words.py"
    path.write_text(next(o.text for o in generate(spec, ROOT) if "m1_d24" in o.variant))
    module = load_module(path)
    value, shapes, start, loc, weights = small_inputs(torch.bfloat16)
    # The same values one element (2 bytes) into a buffer: contiguous, but off the 8-byte grid.
    shifted = torch.empty(weights.numel() + 1, dtype=weights.dtype)[1:].view(weights.shape)
    shifted.copy_(weights)
    with pytest.raises(ValueError, match=r"attention_weights: expected data aligned to 8 bytes .* 2 bytes past"):
        module.msda_forward(value, shapes, start, loc, shifted)
    shifted = torch.empty(loc.numel() + 3, dtype=loc.dtype)[3:].view(loc.shape)
    shifted.copy_(loc)
    with pytest.raises(ValueError, match=r"sampling_locations: expected data aligned to 8 bytes .* 6 bytes past"):
        module.msda_forward(value, shapes, start, shifted, weights)
    assert torch.equal(module.msda_forward(value, shapes, start, loc, weights.clone()), module.msda_forward(value, shapes, start, loc, weights))


def test_location_forms_chain_per_size_class_and_every_class_matches_the_reference(tmp_path):
    """Words in the decoder, paired in the encoder: WORD_LOCATIONS alone picks between them (the
    last form of the chain needs no flag). Beside an encoder with a run-time point loop, the words
    class indexes its words by the unrolled step. Every class matches the reference under the
    interpreter (forward and gradients)."""
    words, paired = dict(GOOD, locations="words"), dict(GOOD, locations="paired")
    entries = {SMALL: {"decoder": {"forward": words, "backward": GOOD}, "encoder": {"forward": paired, "backward": GOOD}}}
    spec = load_spec(spec_copy(tmp_path, narrow(), tuning=tuning(entries)))
    text = next(o.text for o in generate(spec, ROOT) if o.variant == SMALL)
    forward = text[text.index(f"def _{SMALL}_kernel(") : text.index("def _corner_backward")]
    assert "WORD_LOCATIONS: tl.constexpr," in forward and "PAIRED_LOCATIONS" not in text
    assert "        if WORD_LOCATIONS:\n" in forward and "            if WORD_LOCATIONS:\n" in forward and "            else:\n" in forward
    assert '("decoder", 8192, (16, 2, 1, 4, True), ' in text and '("encoder", None, (16, 2, 1, 4, False), ' in text
    path = tmp_path / f"{SMALL}.py"
    path.write_text(text)
    module = load_module(path)
    assert module._launch(8192, backward=False)[1]["WORD_LOCATIONS"] and not module._launch(8193, backward=False)[1]["WORD_LOCATIONS"]
    results = check(module, spec, variant(spec, SMALL), "cpu")
    assert any(r["case"].startswith("[encoder schedule]") for r in results) and all(r["ok"] for r in results), results

    # Words beside a run-time point loop (separate loads) in the encoder: the point loop differs
    # by class too, and the words class's single unrolled step indexes its words by k_step.
    entries[SMALL]["encoder"]["forward"] = dict(GOOD, point_loop="run_time")
    spec = load_spec(spec_copy(tmp_path, narrow(), tuning=tuning(entries)))
    text = next(o.text for o in generate(spec, ROOT) if o.variant == SMALL)
    forward = text[text.index(f"def _{SMALL}_kernel(") : text.index("def _corner_backward")]
    assert "POINT_STEP: tl.constexpr," in forward and "loc_words[k_step]" in forward and "PAIRED_LOCATIONS" not in text
    path = tmp_path / f"{SMALL}_run_time.py"
    path.write_text(text)
    results = check(load_module(path), spec, variant(spec, SMALL), "cpu")
    assert any(r["case"].startswith("[encoder schedule]") for r in results) and all(r["ok"] for r in results), results
