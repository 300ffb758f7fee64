"""Generated MSDA forward kernels under the Triton interpreter, against the float64 reference."""

from __future__ import annotations

import pytest
import torch

from conftest import ROOT, JitStandIn, load_module
from kgen.reference.msda import derive_level_start_index, msda_forward_grid_sample
from kgen.spec import load_spec
from kgen.verify.msda import make_inputs
from kgen.ops.msda import Case

SPEC = load_spec(ROOT / "specs" / "msda.yaml")
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def generated(short: str, head_dim: int):
    return load_module(ROOT / "generated" / "msda" / f"msda_fwd_{short}_m8_d{head_dim}_l4_k4.py")


def run_case(module, case: Case, dtype: torch.dtype, seed: int, explicit_start: bool = True):
    x = make_inputs(case, module.HEADS, module.HEAD_DIM, module.POINTS, dtype, "cpu", seed)
    start = derive_level_start_index(x["spatial_shapes"]) if explicit_start else None
    out = module.msda_forward(x["value"], x["spatial_shapes"], start, x["sampling_locations"], x["attention_weights"])
    ref = msda_forward_grid_sample(
        x["value"].double(), x["spatial_shapes"], None, x["sampling_locations"].double(), x["attention_weights"].double()
    )
    return out, ref, x


@pytest.mark.parametrize("short", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("head_dim", [32, 48])
def test_ragged_shapes_match_reference(short, head_dim):
    dtype = DTYPES[short]
    tol = SPEC.options.tolerances[str(dtype).removeprefix("torch.")]
    module = generated(short, head_dim)
    # Q=45 leaves a ragged 13-query tail after one 32-query block; odd, non-square levels.
    case = Case(batch=3, queries=45, spatial_shapes=((5, 11), (3, 6), (2, 2), (1, 3)), locations=(-0.2, 1.2), line=None)
    out, ref, _ = run_case(module, case, dtype, seed=7, explicit_start=head_dim == 32)
    assert out.shape == (3, 45, 8 * head_dim) and out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, atol=tol.atol, rtol=tol.rtol)
    assert ref.abs().max() > 0.1, "the test must not pass on an all-zero output"


def test_far_outside_samples_contribute_exactly_zero():
    module = generated("f32", 32)
    case = Case(batch=1, queries=7, spatial_shapes=((4, 5), (3, 3), (2, 2), (1, 1)), locations=(-0.2, 1.2), line=None)
    x = make_inputs(case, 8, 32, 4, torch.float32, "cpu", seed=3)
    far = x["sampling_locations"].clone()
    far[..., 0] = torch.where(torch.arange(7)[None, :, None, None, None] % 2 == 0, -5.0, 1e9)
    out = module.msda_forward(x["value"], x["spatial_shapes"], None, far, x["attention_weights"])
    assert torch.equal(out, torch.zeros_like(out))


def test_level_start_index_none_equals_explicit():
    module = generated("f32", 48)
    case = Case(batch=2, queries=9, spatial_shapes=((6, 4), (3, 2), (2, 5), (1, 2)), locations=(-0.1, 1.1), line=None)
    a, _, x = run_case(module, case, torch.float32, seed=11, explicit_start=True)
    b = module.msda_forward(x["value"], x["spatial_shapes"], None, x["sampling_locations"], x["attention_weights"])
    assert torch.equal(a, b)


@pytest.mark.parametrize("batch, queries", [(0, 5), (2, 0), (0, 0)])
def test_empty_batch_or_queries(batch, queries):
    module = generated("bf16", 32)
    value = torch.randn(batch, 12, 8, 32).bfloat16()
    shapes = torch.tensor([[2, 3], [1, 3], [1, 2], [1, 1]])
    loc = torch.rand(batch, queries, 8, 4, 4, 2).bfloat16()
    w = torch.rand(batch, queries, 8, 4, 4).bfloat16()
    out = module.msda_forward(value, shapes, None, loc, w)
    assert out.shape == (batch, queries, 256) and out.dtype == torch.bfloat16


def _args(dtype=torch.float32, batch=2, queries=3):
    shapes = torch.tensor([[2, 3], [1, 3], [1, 2], [1, 1]])
    return [
        torch.randn(batch, 12, 8, 32, dtype=dtype),
        shapes,
        None,
        torch.rand(batch, queries, 8, 4, 4, 2, dtype=dtype),
        torch.rand(batch, queries, 8, 4, 4, dtype=dtype),
    ]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: a.__setitem__(0, a[0].half()), "value: expected dtype torch.float32, got torch.float16"),
        (lambda a: a.__setitem__(3, a[3][:, :, :4]), "sampling_locations: expected shape (B=2, Q=3, 8, 4, 4, 2), got (2, 3, 4, 4, 4, 2)"),
        (lambda a: a.__setitem__(4, a[4][:1]), "attention_weights: expected shape (B=2, Q=3, 8, 4, 4), got (1, 3, 8, 4, 4)"),
        (lambda a: a.__setitem__(1, a[1].int()), "spatial_shapes: expected dtype torch.int64, got torch.int32"),
        (lambda a: a.__setitem__(0, a[0].transpose(1, 2).contiguous().transpose(1, 2)), "value: expected a contiguous tensor"),
        (lambda a: a.__setitem__(0, a[0].to("meta")), "spatial_shapes: expected device meta (that of value), got cpu"),
        (lambda a: a.__setitem__(1, [[2, 3]]), "spatial_shapes: expected a torch.Tensor, got list"),
    ],
)
def test_wrapper_rejects_bad_arguments_by_name(mutate, message):
    module = generated("f32", 32)
    args = _args()
    mutate(args)
    with pytest.raises((ValueError, TypeError)) as err:
        module.msda_forward(*args)
    assert message in str(err.value)


def test_wrapper_rejects_sizes_beyond_the_proven_maximum():
    module = generated("f32", 32)
    with pytest.raises(ValueError, match=r"B=65 exceeds 64, the declared maximum"):
        module.msda_forward(*_args(batch=65, queries=1))


def test_planted_bug_is_caught_by_the_numerical_check(tmp_path):
    """The check can fail: the same kernel with the corner weights swapped disagrees."""
    from kgen.verify.msda import check

    source = (ROOT / "generated" / "msda" / "msda_fwd_f32_m8_d32_l4_k4.py").read_text()
    planted = source.replace("v01 * (weight * lx * (1.0 - ly))", "v01 * (weight * (1.0 - lx) * ly)")
    planted = planted.replace("v10 * (weight * (1.0 - lx) * ly)", "v10 * (weight * lx * (1.0 - ly))", 1)
    assert planted != source
    path = tmp_path / "planted.py"
    path.write_text(planted)
    variant = next(v for v in __import__("kgen.ops.msda", fromlist=["variants"]).variants(SPEC) if v.name == "msda_fwd_f32_m8_d32_l4_k4")
    results = check(load_module(path), SPEC, variant, "cpu")
    # The backward is intact. Gradient cases may carry a "[<class> schedule] " prefix: with a
    # tuning file, the module's other size class runs the forward and gradients once more.
    forward = [r for r in results if "grad_" not in r["case"]]
    assert forward and not any(r["ok"] for r in forward)


def test_static_check_flags_plain_globals_in_jit_functions():
    from kgen.verify.static import jit_global_problems

    source = "import triton\nLEVELS = 4\nOK = tl.constexpr(2)\n@triton.jit\ndef k(x):\n    for l in range(LEVELS + OK):\n        pass\n"
    problems = jit_global_problems(source, "k.py")
    assert len(problems) == 1 and "reads global LEVELS" in problems[0]
    assert jit_global_problems((ROOT / "generated" / "msda" / "msda_fwd_f32_m8_d32_l4_k4.py").read_text(), "g") == []


@pytest.mark.parametrize("name, heads, levels, points", [("m2_d128_l5_k8", 2, 5, 8), ("m1_d24_l3_k4", 1, 3, 4), ("m16_d16_l2_k4", 16, 2, 4)])
def test_wrapper_names_the_shape_each_variant_was_generated_for(name, heads, levels, points):
    module = load_module(ROOT / "generated" / "msda" / f"msda_fwd_f32_{name}.py")
    assert (module.HEADS, module.LEVELS, module.POINTS) == (heads, levels, points)
    d = module.HEAD_DIM
    shapes = torch.tensor([[3, 2]] * (levels + 1))  # one level too many
    value = torch.randn(2, 6 * (levels + 1), heads, d)
    loc = torch.rand(2, 3, heads, levels + 1, points, 2)
    with pytest.raises(ValueError, match=rf"spatial_shapes: expected shape \({levels}, 2\), got \({levels + 1}, 2\)"):
        module.msda_forward(value, shapes, None, loc, torch.rand(2, 3, heads, levels + 1, points))
    with pytest.raises(ValueError, match=rf"sampling_locations: expected shape \(B=2, Q=3, {heads}, {levels}, {points}, 2\)"):
        module.msda_forward(value, shapes[:levels], None, loc, torch.rand(2, 3, heads, levels, points))


def test_usual_calls_skip_the_full_checks_and_other_valid_calls_still_pass(monkeypatch):
    """A plain contiguous call is recognised in one comparison per argument and never runs
    _check_arguments (host time); a valid call it does not recognise (a size-1 dim with an odd
    stride, which the kernels accept) goes through the full checks and gives the same result."""
    module = generated("f32", 32)
    args = _args(batch=1)
    calls = []
    full_checks = module._check_arguments
    monkeypatch.setattr(module, "_check_arguments", lambda *a: calls.append(a) or full_checks(*a))
    out = module.msda_forward(*args)
    assert calls == []
    odd = list(args)
    odd[0] = args[0].as_strided(args[0].shape, (7, *args[0].stride()[1:]))
    assert torch.equal(module.msda_forward(*odd), out) and len(calls) == 1


def test_calls_without_gradients_record_no_autograd_node():
    module = generated("f32", 32)
    args = _args()
    assert module.msda_forward(*args).grad_fn is None
    args[3].requires_grad_()
    assert module.msda_forward(*args).grad_fn is not None
    with torch.no_grad():
        assert module.msda_forward(*args).grad_fn is None


def test_point_loop_unrolls_only_within_the_compile_time_budget():
    """Unrolled, L=5 x K=8 samples of D=128 tiles took LLVM minutes on sm_90 (fp64 backward:
    over 5, unfinished); such variants loop over points at run time, the small ones stay unrolled."""
    detr = (ROOT / "generated" / "msda" / "msda_fwd_f32_m8_d32_l4_k4.py").read_text()
    large = (ROOT / "generated" / "msda" / "msda_fwd_f64_m2_d128_l5_k8.py").read_text()
    assert detr.count("for k in tl.static_range(POINTS):") == 1 and "tl.range(" not in detr
    assert "for s_first in tl.static_range(0, LEVELS * POINTS, SAMPLE_STEP):" in detr
    assert large.count("for k in tl.range(POINTS):") == 1 and "static_range(POINTS)" not in large and "static_range(0," not in large
    assert "for s_first in tl.range(0, LEVELS * POINTS, SAMPLE_STEP):" in large


def test_repeat_launches_skip_triton_dispatch_and_stay_correct(monkeypatch):
    """On the GPU a call whose specialization (schedule, device, dtype and 16-byte alignment of
    every tensor, class of each size) ran before launches the compiled kernel directly, its constexprs in parameter
    order: a second call of other sizes reuses it and matches the reference; a misaligned tensor,
    another dtype or the other direction compiles anew. Run here through the interpreter behind
    the same contract."""
    module = generated("f32", 32)
    assert not module._REUSE_COMPILED  # the interpreter (and AMD) always take Triton's dispatch
    monkeypatch.setattr(module, "_REUSE_COMPILED", True)
    monkeypatch.setattr(module, "_COMPILED", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    forward = JitStandIn(module._msda_fwd_f32_m8_d32_l4_k4_kernel)
    monkeypatch.setattr(module, "_msda_fwd_f32_m8_d32_l4_k4_kernel", forward)
    levels = ((5, 11), (3, 6), (2, 2), (1, 3))
    for batch, queries, seed in ((2, 37, 1), (1, 5, 2)):
        x = make_inputs(Case(batch, queries, levels, (-0.2, 1.2), None), 8, 32, 4, torch.float32, "cpu", seed)
        args = (x["value"], x["spatial_shapes"], derive_level_start_index(x["spatial_shapes"]), x["sampling_locations"], x["attention_weights"])
        out = module._forward_impl(*args)
        ref = msda_forward_grid_sample(*(a.double() if a.is_floating_point() else a for a in args))
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
        assert ref.abs().max() > 0.1
    assert len(forward.compiled) == 1 and forward.compiled[0].launches == 1

    # The same call with value one float past a 16-byte boundary: a new specialization.
    shifted = torch.empty(x["value"].numel() + 1)[1:].view_as(x["value"]).copy_(x["value"])
    assert shifted.data_ptr() % 16 != 0
    torch.testing.assert_close(module._forward_impl(shifted, *args[1:]), out, atol=0, rtol=0)
    assert len(forward.compiled) == 2
    # Pointers of another dtype (as grad_value's buffer differs by size class): a new one too.
    as_double = [a.double() if a.is_floating_point() else a for a in args]
    torch.testing.assert_close(module._forward_impl(*as_double), out.double(), atol=1e-5, rtol=1e-5)
    assert len(forward.compiled) == 3

    backward = JitStandIn(module._msda_bwd_f32_m8_d32_l4_k4_kernel)
    monkeypatch.setattr(module, "_msda_bwd_f32_m8_d32_l4_k4_kernel", backward)
    grad = torch.randn(out.shape)
    first = module._backward_impl(grad, *args)
    again = module._backward_impl(grad, *args)
    assert len(backward.compiled) == 1 and backward.compiled[0].launches == 1
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
