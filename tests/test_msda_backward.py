"""MSDA backward: the generated custom op's gradients under the Triton interpreter (CPU).

gradcheck on the float64 variants, the other dtypes against float64 autograd through the
reference, empty batches, the deterministic (fixed-point) grad_value, the accumulation choice
derived from the spec's target, and the custom op under opcheck and torch.compile(fullgraph=True).
"""

from __future__ import annotations

import itertools
import sys

import pytest
import torch

from conftest import ROOT, load_module
from kgen.generate import generate
from kgen.ops import msda
from kgen.ops.msda import Case
from kgen.reference.msda import msda_forward_grid_sample
from kgen.errors import SpecError
from kgen.spec import load_spec
from kgen.verify.msda import check_gradients, gradcheck_result, make_inputs

SPEC = load_spec(ROOT / "specs" / "msda.yaml")
SHIPPED_ACCUMULATION = "grad_accumulation: {decoder: native, encoder: fp32}"
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}
# One (batch, head) row of programs per batch entry; Q=5 is a ragged single query block.
SMALL = Case(batch=1, queries=5, spatial_shapes=((3, 5), (2, 3), (1, 2), (2, 1)), locations=(-0.2, 1.2), line=None)


def generated(short: str, head_dim: int, shape: str = "m8_d{}_l4_k4"):
    module = load_module(ROOT / "generated" / "msda" / f"msda_fwd_{short}_{shape.format(head_dim)}.py")
    sys.modules[module.__name__] = module  # torch.compile looks functions' modules up by name
    return module


def _leaves(case: Case, module, dtype: torch.dtype, seed: int):
    x = make_inputs(case, module.HEADS, module.HEAD_DIM, module.POINTS, dtype, "cpu", seed, snap=False)
    leaves = [x[n].requires_grad_(True) for n in ("value", "sampling_locations", "attention_weights")]
    return x["spatial_shapes"], leaves


@pytest.mark.parametrize("shape", ["m8_d32_l4_k4", "m8_d48_l4_k4", "m2_d128_l5_k8"])
def test_gradcheck_float64(shape):
    """kgen's gradcheck on the inputs `kgen verify --device cuda` gives it (the first grad case,
    its default seed): they pass here, so none of their samples sits at a bilinear kink under the
    interpreter's arithmetic (the GPU's fp32 coordinates may round differently)."""
    module = generated("f64", 0, shape)
    result = gradcheck_result(module, SPEC.options.grad_cases[0].first_levels(module.LEVELS), "cpu")
    assert result["ok"], result
    # The interpreter runs programs one after another, so even the atomic scatter reruns bitwise.
    assert "grad_value 0.0e+00, grad_locations 0.0e+00, grad_weights 0.0e+00" in result["detail"], result


def test_gradcheck_catches_a_backward_off_by_five_percent(monkeypatch):
    """A planted bug: grad_locations scaled by 1.05 fails the finite-difference check. (On a
    mismatch gradcheck rebuilds the full Jacobian for its message, hours under the interpreter:
    that step is skipped here; the verdict comes before it.)"""
    module = generated("f64", 48)
    honest = module._backward_impl

    def skewed(*args):
        grad_value, grad_locations, grad_weights = honest(*args)
        return grad_value, grad_locations * 1.05, grad_weights

    monkeypatch.setattr(module, "_backward_impl", skewed)
    monkeypatch.setattr(sys.modules["torch.autograd.gradcheck"], "_run_slow_mode_and_get_error", lambda *a, **k: "")
    result = gradcheck_result(module, SMALL, "cpu", seed=48)
    assert not result["ok"] and "Jacobian mismatch" in result["detail"] and "input 1" in result["detail"], result


@pytest.mark.parametrize("wobble, deterministic, ok", [(1e-9, False, False), (1e-14, False, True), (1e-14, True, False)])
def test_gradcheck_allows_atomic_reruns_their_last_bits_only(monkeypatch, wobble, deterministic, ok):
    """On the GPU two backward runs of the atomic scatter differ in grad_value's last bits (the
    float64 adds land in another order). gradcheck allows that much (ATOMIC_RERUN_TOL) and no
    more, and nothing at all for a deterministic variant: planted here by a grad_value scaled by
    1 + `wobble` on every other call (a scale keeps zero gradients zero, which gradcheck checks)."""
    module = generated("f64", 48)
    honest = module._backward_impl
    calls = itertools.count()

    def wobbly(*args):
        grad_value, grad_locations, grad_weights = honest(*args)
        return grad_value * (1 + wobble * (next(calls) % 2)), grad_locations, grad_weights

    monkeypatch.setattr(module, "_backward_impl", wobbly)
    monkeypatch.setattr(module, "DETERMINISTIC", deterministic)
    result = gradcheck_result(module, SMALL, "cpu", seed=48)
    assert result["ok"] == ok, result
    assert "grad_locations 0.0e+00, grad_weights 0.0e+00" in result["detail"], result
    assert "grad_value 0.0e+00" not in result["detail"], result
    assert ok or "not reentrant" in result["detail"], result


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_verification_gradchecks_float64_variants_on_the_gpu(monkeypatch, device):
    """check() adds a gradcheck result for float64 variants on the GPU (stubbed here, with the
    other checks) and none for other dtypes or under the interpreter."""
    import kgen.verify.msda as verify_msda

    monkeypatch.setattr(verify_msda, "_forward_result", lambda *a, **k: {"case": "forward", "ok": True})
    monkeypatch.setattr(verify_msda, "check_gradients", lambda *a, **k: [{"case": "gradients", "ok": True}])
    monkeypatch.setattr(verify_msda, "gradcheck_result", lambda module, case, device: {"case": "gradcheck", "ok": True})
    variants = {v.name: v for v in msda.variants(SPEC)}
    for short in ("f64", "f32"):
        module = generated(short, 32)
        cases = verify_msda.check(module, SPEC, variants[f"msda_fwd_{short}_m8_d32_l4_k4"], device)
        assert [c["case"] for c in cases].count("gradcheck") == (short == "f64" and device == "cuda")


@pytest.mark.parametrize("short, head_dim", [("f32", 48), ("f16", 32), ("bf16", 48), ("f64", 32)])
def test_gradients_match_float64_reference(short, head_dim):
    module = generated(short, head_dim)
    tol = SPEC.options.grad_tolerances[str(DTYPES[short]).removeprefix("torch.")]
    case = Case(batch=2, queries=3, spatial_shapes=((4, 5), (3, 2), (1, 3), (2, 2)), locations=(-0.2, 1.2), line=None)
    results = check_gradients(module, case, DTYPES[short], "cpu", tol, seed=3)
    assert [r["case"].split()[0] for r in results] == ["grad_value", "grad_locations", "grad_weights"]
    assert all(r["ok"] for r in results), results


@pytest.mark.parametrize("batch, queries", [(0, 5), (2, 0), (0, 0)])
def test_empty_batch_or_queries_stay_connected_to_autograd(batch, queries):
    module = generated("bf16", 32)
    value = torch.randn(batch, 12, 8, 32).bfloat16().requires_grad_(True)
    loc = torch.rand(batch, queries, 8, 4, 4, 2).bfloat16().requires_grad_(True)
    attn = torch.rand(batch, queries, 8, 4, 4).bfloat16().requires_grad_(True)
    out = module.msda_forward(value, torch.tensor([[2, 3], [1, 3], [1, 2], [1, 1]]), None, loc, attn)
    assert out.shape == (batch, queries, 256) and out.requires_grad and out.grad_fn is not None
    out.sum().backward()
    for leaf in (value, loc, attn):
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape and leaf.grad.dtype == torch.bfloat16
    assert torch.equal(value.grad, torch.zeros_like(value))  # no query samples value: zero, not garbage


def test_planted_backward_bug_is_caught(tmp_path):
    """The gradient check can fail: swapping two corner weights in the grad_value scatter."""
    source = (ROOT / "generated" / "msda" / "msda_fwd_f32_m8_d32_l4_k4.py").read_text()
    planted = source.replace("pixel00 + 1, d, valid01, grad_out, weight * lx * hy", "pixel00 + 1, d, valid01, grad_out, weight * hx * ly", 1)
    assert planted != source
    path = tmp_path / "planted.py"
    path.write_text(planted)
    tol = SPEC.options.grad_tolerances["float32"]
    results = check_gradients(load_module(path), SMALL, torch.float32, "cpu", tol, seed=1)
    assert [r["ok"] for r in results] == [False, True, True]


def _spec_with(tmp_path, old: str, new: str, *more: tuple[str, str]):
    """The shipped spec with each `old` text replaced by its `new` one."""
    text = (ROOT / "specs" / "msda.yaml").read_text()
    for a, b in ((old, new), *more):
        assert a in text
        text = text.replace(a, b)
    (tmp_path / "specs").mkdir(exist_ok=True)
    path = tmp_path / "specs" / "msda.yaml"
    path.write_text(text)
    return load_spec(path)


def _generate_one(spec, variant: str) -> str:
    """The generated text of one variant (rendering all of them takes seconds each)."""
    every = msda.variants
    try:
        msda.variants = lambda s: [v for v in every(s) if v.name == variant]
        return next(o.text for o in generate(spec, ROOT))
    finally:
        msda.variants = every


def _module_from_spec(spec, variant: str, tmp_path):
    text = _generate_one(spec, variant)
    path = tmp_path / f"{variant}_{abs(hash(text)) % 10**8}.py"
    path.write_text(text)
    return load_module(path), text


def test_deterministic_grad_value_is_independent_of_accumulation_order(tmp_path):
    """Fixed-point grad_value: permuting the queries permutes the order in which every pixel's
    contributions are added (other programs, other lanes); the sum is still bitwise the same."""
    spec = _spec_with(tmp_path, "deterministic: false", "deterministic: true")
    module, text = _module_from_spec(spec, "msda_fwd_f32_m8_d32_l4_k4", tmp_path)
    assert set(module.GRAD_VALUE_ACCUMULATION.values()) == {"fixed_point"} and "(contribution * scale).to(tl.int64)" in text
    case = Case(batch=1, queries=40, spatial_shapes=((2, 3), (2, 2), (1, 2), (1, 1)), locations=(0.0, 1.0), line=None)
    shapes, (value, loc, attn) = _leaves(case, module, torch.float32, seed=5)
    start = torch.tensor([0, 6, 10, 12])
    grad_out = torch.randn(1, 40, 256, generator=torch.Generator().manual_seed(0))
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(1))
    args = (value.detach(), shapes, start)
    first = module._backward_op(grad_out, *args, loc.detach(), attn.detach())
    permuted = module._backward_op(grad_out[:, perm], *args, loc.detach()[:, perm], attn.detach()[:, perm])
    assert torch.equal(first[0], permuted[0])
    assert torch.equal(first[1][:, perm], permuted[1]) and torch.equal(first[2][:, perm], permuted[2])
    out = msda_forward_grid_sample(value.double(), shapes, None, loc.double(), attn.double())
    ref = torch.autograd.grad(out, value, grad_out.double())[0]
    torch.testing.assert_close(first[0].double(), ref.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "target, expected",
    [
        ("sm_90", {"float32": "native", "float16": "native", "bfloat16": "native", "float64": "native"}),
        ("sm_80", {"float32": "native", "float16": "native", "bfloat16": "fp32", "float64": "native"}),
    ],
)
def test_grad_value_accumulation_is_derived_from_the_target(tmp_path, target, expected):
    spec = _spec_with(tmp_path, "target: sm_90", f"target: {target}", (SHIPPED_ACCUMULATION, "grad_accumulation: native"))
    got = {v.values["dtype"]: msda.lower(spec, v).grad_accum for v in msda.variants(spec) if v.values["D"] == 32}
    assert got == expected
    plan = next(msda.lower(spec, v) for v in msda.variants(spec) if v.name == "msda_fwd_bf16_m8_d32_l4_k4")
    fact = next(f for f in plan.facts if f.name == "grad_value accumulation")
    assert ("lacks" if target == "sm_80" else "has") in fact.why and "sm_90" in fact.why
    module, _ = _module_from_spec(spec, "msda_fwd_bf16_m8_d32_l4_k4", tmp_path)
    buffer = torch.float32 if target == "sm_80" else torch.bfloat16
    assert [row[4] for row in module.SCHEDULES] == [buffer, buffer]
    # the target chose, not the spec; the module's docstring says which
    assert not any(a.by_spec for a in plan.accumulations)
    assert ("has no native bfloat16 atomic add" in module.__doc__) == (target == "sm_80")


def test_grad_accumulation_per_size_class_keeps_large_16_bit_sums_out_of_native_atomics(tmp_path):
    # The shipped spec: native adds for decoder-sized calls, an fp32 buffer above them for the
    # 16-bit variants (sm_90 has f16 and bf16 atomics); fp32 and fp64 keep their own adds.
    spec = load_spec(ROOT / "specs" / "msda.yaml")
    assert spec.options.schedule.grad_accumulation == {"decoder": "native", "encoder": "fp32"}
    got = {
        v.values["dtype"]: [(a.size_class, a.kind) for a in msda.lower(spec, v).accumulations]
        for v in msda.variants(spec) if v.values["D"] == 32
    }
    native, fp32 = [("decoder", "native"), ("encoder", "native")], [("decoder", "native"), ("encoder", "fp32")]
    assert got == {"float32": native, "float16": fp32, "bfloat16": fp32, "float64": native}
    plan = next(msda.lower(spec, v) for v in msda.variants(spec) if v.name == "msda_fwd_f16_m8_d32_l4_k4")
    assert plan.grad_accum == "by size class"
    fact = next(f for f in plan.facts if f.name == "grad_value accumulation encoder")
    assert "schedule.grad_accumulation: fp32" in fact.why
    assert [a.by_spec for a in plan.accumulations] == [False, True]
    module, _ = _module_from_spec(spec, "msda_fwd_f16_m8_d32_l4_k4", tmp_path)
    assert [row[4] for row in module.SCHEDULES] == [torch.float16, torch.float32]
    assert "- encoder: in an fp32 buffer, cast at the end (schedule.grad_accumulation: fp32;" in " ".join(module.__doc__.split())
    value = torch.randn(1, 5, 8, 32, dtype=torch.float16)
    assert module._grad_value_accumulator(value, 8192).dtype == torch.float16
    assert module._grad_value_accumulator(value, 8193).dtype == torch.float32


@pytest.mark.parametrize(
    "setting, message",
    [
        ("grad_accumulation: fp16", r"grad_accumulation: expected native, fp32 or a mapping"),
        ("grad_accumulation: {decoder: native}", r"grad_accumulation: expected one entry per size class of tune.size_classes \(decoder, encoder\), got decoder"),
        ("grad_accumulation: {decoder: native, encoder: fp16}", r"expected native or fp32 for size class 'encoder', got 'fp16'"),
        ("grad_accumulation: {decoder: native, encoder: fp32, huge: fp32}", r"got decoder, encoder, huge"),
    ],
)
def test_grad_accumulation_errors_name_the_field_and_line(tmp_path, setting, message):
    line = next(i for i, text in enumerate((ROOT / "specs" / "msda.yaml").read_text().splitlines(), 1) if SHIPPED_ACCUMULATION in text)
    with pytest.raises(SpecError, match=message) as err:
        _spec_with(tmp_path, SHIPPED_ACCUMULATION, setting)
    assert f"msda.yaml:{line}: schedule.grad_accumulation" in str(err.value)


def test_custom_op_passes_opcheck():
    module = generated("f32", 32)
    x = make_inputs(SMALL, 8, 32, 4, torch.float32, "cpu", seed=2, snap=False)
    args = (x["value"].requires_grad_(), x["spatial_shapes"], torch.tensor([0, 15, 21, 23]),
            x["sampling_locations"].requires_grad_(), x["attention_weights"].requires_grad_())
    assert module.FORWARD_OP.startswith("kgen::msda_fwd_f32_m8_d32_l4_k4")
    result = torch.library.opcheck(module._forward_op, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_torch_compile_fullgraph_forward_and_backward():
    module = generated("f32", 32)
    shapes, leaves = _leaves(SMALL, module, torch.float32, seed=4)

    def loss(value, loc, attn):
        return (module.msda_forward(value, shapes, None, loc, attn) ** 2).sum()

    compiled = torch.compile(loss, fullgraph=True)
    eager_leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    got, want = compiled(*leaves), loss(*eager_leaves)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want)
    for a, b in zip(leaves, eager_leaves):
        torch.testing.assert_close(a.grad, b.grad)


def test_eager_path_equals_the_custom_op_bitwise():
    """Eager calls skip torch.library's dispatcher (an autograd.Function over the same kernels);
    their outputs and gradients must be the custom op's, bit for bit."""
    module = generated("f32", 48)
    shapes, leaves = _leaves(SMALL, module, torch.float32, seed=6)
    op_leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    start = torch.tensor([0, 15, 21, 23])
    eager = module.msda_forward(leaves[0], shapes, start, leaves[1], leaves[2])
    through_op = module._forward_op(op_leaves[0], shapes, start, op_leaves[1], op_leaves[2])
    assert type(eager.grad_fn).__name__ != type(through_op.grad_fn).__name__  # two different paths
    grad = torch.randn_like(eager)
    eager.backward(grad)
    through_op.backward(grad)
    assert torch.equal(eager, through_op)
    for a, b in zip(leaves, op_leaves):
        assert torch.equal(a.grad, b.grad)
