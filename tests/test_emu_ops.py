"""kgen.emu on small FlyDSL kernels, one construct at a time: buffer loads and stores (widths,
byte offsets, bounds), lane predication, loop-carried state, conversions and rounding, shuffles,
LDS (with the race check), the MFMA and transpose read through the API, and refusals: every
construct outside the modelled subset stops the emulator with an error naming it and its line."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import torch

from kgen.emu import EmuFault, EmuUnsupported, isa, load_module

HEADER = """\
import torch
import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir.dialects import fly
from flydsl._mlir.dialects import llvm as _llvm
from flydsl.expr import arith
from flydsl.expr.typing import T, Vector


@flyc.jit
def rsrc(t, base):
    return fx.rocdl.get_buffer_rsrc(fx.rocdl.make_buffer_ptr(fx.get_iter(t) + base))


@flyc.jit
def store(v, rd, voffset):
    fx.rocdl.raw_ptr_buffer_store(v, rd, fx.Int32(voffset), fx.Int32(0))

"""

RNG = np.random.default_rng(11)


def module(tmp_path, body: str, name="kern"):
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return load_module(path), path


def lines_of(path, text):
    return [i + 1 for i, line in enumerate(path.read_text().splitlines()) if text in line]


# ---- memory ---------------------------------------------------------------------------------------------

COPY = """
@flyc.kernel
def copy_kernel(src: fx.Tensor, dst: fx.Tensor, words: fx.Constexpr[int], shift: fx.Constexpr[int]):
    lane = fx.thread_idx.x
    base = fx.block_idx.x * 64 * words
    ty = T.i32 if words == 1 else T.vec(words, T.i32)
    v = fx.rocdl.raw_ptr_buffer_load(ty, rsrc(src, base), fx.Int32(lane * 4 * words), fx.Int32(shift))
    store(v, rsrc(dst, base), (63 - lane) * 4 * words)


@flyc.jit
def run(src: fx.Tensor, dst: fx.Tensor, words: fx.Constexpr[int], shift: fx.Constexpr[int], grid: fx.Constexpr[int]):
    copy_kernel(src, dst, words, shift).launch(grid=(grid, 1, 1), block=(64, 1, 1))
"""


@pytest.mark.parametrize("words", [1, 2, 4])
def test_buffer_loads_and_stores_move_the_addressed_bytes(tmp_path, words):
    mod, _ = module(tmp_path, COPY)
    grid = 3
    src = torch.from_numpy(RNG.integers(-(2**31), 2**31, size=grid * 64 * words + 1, dtype=np.int64).astype(np.int32))
    dst = torch.full((grid * 64 * words,), -7, dtype=torch.int32)
    mod.run(src, dst, words, 4, grid)  # soffset 4 bytes: every lane reads one word further on
    s = src.numpy()
    for p in range(grid):
        for lane in range(64):
            got = dst.numpy()[(p * 64 + 63 - lane) * words:][:words]
            assert list(got) == list(s[(p * 64 + lane) * words + 1:][:words])


def test_an_access_outside_a_tensor_is_a_fault_naming_it_and_the_line(tmp_path):
    mod, path = module(tmp_path, COPY)
    src, dst = torch.arange(64 * 2, dtype=torch.int32), torch.zeros(64 * 2, dtype=torch.int32)
    with pytest.raises(EmuFault) as err:
        mod.run(src, dst, 2, 4, 1)  # lane 63 reads 4 bytes past the end
    msg = str(err.value)
    assert "kernel argument `src`" in msg and "outside" in msg and "lane 63" in msg
    assert f"{path}:{lines_of(path, 'raw_ptr_buffer_load')[0]}:" in msg and "program (0, 0, 0)" in msg
    assert (dst == 0).all()  # nothing written back from a failed launch


def test_lanes_storing_different_values_to_one_address_is_a_fault(tmp_path):
    mod, _ = module(tmp_path, """
        @flyc.kernel
        def clash(out: fx.Tensor):
            lane = fx.thread_idx.x
            store(lane, rsrc(out, 0), (lane & 1) * 4)

        @flyc.jit
        def run(out: fx.Tensor):
            clash(out).launch(grid=(1, 1, 1), block=(64, 1, 1))
    """)
    with pytest.raises(EmuFault, match="different values"):
        mod.run(torch.zeros(2, dtype=torch.int32))


# ---- control flow ---------------------------------------------------------------------------------------

FLOW = """
@flyc.kernel
def flow(out: fx.Tensor, n: fx.Constexpr[int]):
    lane = fx.thread_idx.x
    rd = rsrc(out, 0)
    init = [fx.Int32(0), fx.Float32(1.0)]
    results = init
    for i, st in range(0, n, 1, init=init):
        s = fx.Int32(st[0]) + fx.Int32(i) * lane
        results = yield [s, fx.Float32(st[1]) * 2.0]
    total = fx.Int32(results[0])
    power = fx.Float32(results[1])
    x = fx.Int32(1)
    if lane < 3:
        x = x + 10
    else:
        x = x + 20
    if lane < 5:
        store(total, rd, lane * 4)
        store(power, rd, 256 + lane * 4)
    store(x, rd, 512 + lane * 4)


@flyc.jit
def run(out: fx.Tensor, n: fx.Constexpr[int]):
    flow(out, n).launch(grid=(1, 1, 1), block=(64, 1, 1))
"""


@pytest.mark.parametrize("n", [0, 1, 5])
def test_loop_carried_state_and_lane_predicated_stores(tmp_path, n):
    mod, _ = module(tmp_path, FLOW)
    out = torch.full((3 * 64,), -7, dtype=torch.int32)
    mod.run(out, n)
    o = out.numpy()
    lanes = np.arange(64)
    assert list(o[:5]) == list(lanes[:5] * (n * (n - 1) // 2)) and (o[5:64] == -7).all()
    assert list(o[64:69].view(np.float32)) == [2.0**n] * 5 and (o[69:128] == -7).all()
    assert list(o[128:]) == [11] * 3 + [21] * 61


def test_a_value_from_inside_the_loop_used_after_it_is_refused(tmp_path):
    mod, path = module(tmp_path, FLOW.replace("    total = fx.Int32(results[0])", "    total = s"))
    with pytest.raises(EmuUnsupported, match="`s` was assigned inside a range") as err:
        mod.run(torch.zeros(3 * 64, dtype=torch.int32), 2)
    assert f"(called from line {lines_of(path, 'store(total, rd')[0]}" in str(err.value)


# ---- values ---------------------------------------------------------------------------------------------

VALUES = """
@flyc.kernel
def values(src: fx.Tensor, out: fx.Tensor):
    lane = fx.thread_idx.x
    x = fx.Float32(fx.rocdl.raw_ptr_buffer_load(T.f32, rsrc(src, 0), fx.Int32(lane * 4), fx.Int32(0)))
    rd = rsrc(out, 0)
    pair = Vector.from_elements([x, x * 3.0], dtype=fx.Float32).to(fx.BFloat16).bitcast(fx.Int32)
    store(pair[0], rd, lane * 4)
    h = Vector.from_elements([x, -x], dtype=fx.Float32).to(fx.Float16).bitcast(fx.Int32)
    store(h[0], rd, 256 + lane * 4)
    store(arith.maxnumf(x, x.shuffle_xor(5, 64)), rd, 512 + lane * 4)
    store((x - 1.5).exp2(fastmath=arith.FastMathFlags.afn), rd, 768 + lane * 4)
    i = fx.Int32(x * 100.0)
    store((i >> 3) + ((-i) & 0xFF) * (i % 7) - (i // 5), rd, 1024 + lane * 4)
    store((x > 0.25).select(i, lane), rd, 1280 + lane * 4)
    store(_llvm.inline_asm(T.f32, [fx.Int32(i).ir_value()], "v_cvt_f32_ubyte1 $0, $1", "=v,v"), rd, 1536 + lane * 4)


@flyc.jit
def run(src: fx.Tensor, out: fx.Tensor):
    values(src, out).launch(grid=(1, 1, 1), block=(64, 1, 1))
"""


def test_conversions_rounding_integer_ops_and_shuffles_match_numpy(tmp_path):
    mod, _ = module(tmp_path, VALUES)
    x = (RNG.standard_normal(64) * 3).astype(np.float32)
    out = torch.zeros(7 * 64, dtype=torch.int32)
    mod.run(torch.from_numpy(x), out)
    o = out.numpy()
    bf = lambda v: isa.f32_to_bf16_bits(np.asarray(v, np.float32)).astype(np.uint32)  # noqa: E731
    assert np.array_equal(o[:64].view(np.uint32), bf(x) | bf(x * np.float32(3.0)) << 16)
    f16 = lambda v: np.asarray(v, np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)  # noqa: E731
    assert np.array_equal(o[64:128].view(np.uint32), f16(x) | f16(-x) << 16)
    assert np.array_equal(o[128:192].view(np.float32), np.fmax(x, x[np.arange(64) ^ 5]))
    exp2 = np.exp2((x - np.float32(1.5)).astype(np.float64)).astype(np.float32)
    assert np.array_equal(o[192:256].view(np.float32), exp2)
    i = np.trunc(x * np.float32(100.0)).astype(np.int32)
    with np.errstate(over="ignore"):
        want = (i >> 3) + ((-i) & 0xFF) * np.fmod(i, 7) - np.floor_divide(i, 5)
    assert np.array_equal(o[256:320], want)
    assert np.array_equal(o[320:384], np.where(x > 0.25, i, np.arange(64)))
    assert np.array_equal(o[384:448].view(np.float32), ((i.view(np.uint32) >> 8) & 0xFF).astype(np.float32))


# ---- LDS, MFMA, transpose read ----------------------------------------------------------------------------

LDS = """
@fx.struct
class Smem:
    words: fx.Array[fx.Int32, 128, 16]


@flyc.kernel
def lds_kernel(out: fx.Tensor):
    lane = fx.thread_idx.x
    lds = fx.SharedAllocator().allocate(Smem).peek()
    lds.words[lane] = lane * 3
    fx.rocdl.sched_barrier(0)
    store(lds.words[63 - lane], rsrc(out, 0), lane * 4)


@flyc.jit
def run(out: fx.Tensor):
    lds_kernel(out).launch(grid=(2, 1, 1), block=(64, 1, 1))
"""


def test_lds_round_trip_between_lanes(tmp_path):
    mod, _ = module(tmp_path, LDS)
    out = torch.zeros(64, dtype=torch.int32)
    mod.run(out)
    assert list(out.numpy()) == [3 * (63 - lane) for lane in range(64)]


def test_a_cross_lane_lds_dependency_without_a_fence_is_a_race(tmp_path):
    mod, path = module(tmp_path, LDS.replace("    fx.rocdl.sched_barrier(0)\n", ""))
    with pytest.raises(EmuFault, match="LDS race") as err:
        mod.run(torch.zeros(64, dtype=torch.int32))
    assert f":{lines_of(path, 'store(lds.words[63 - lane]')[0]}:" in str(err.value)


def test_programs_of_a_launch_depending_on_each_other_is_a_race(tmp_path):
    mod, _ = module(tmp_path, """
        @flyc.kernel
        def ring(out: fx.Tensor, n: fx.Constexpr[int]):
            lane = fx.thread_idx.x
            pid = fx.block_idx.x
            rd = rsrc(out, 0)
            at = fx.Int32((pid + 1) % n * 256 + lane * 4)
            nxt = fx.Int32(fx.rocdl.raw_ptr_buffer_load(T.i32, rd, at, fx.Int32(0)))
            store(nxt + 1, rd, pid * 256 + lane * 4)

        @flyc.jit
        def run(out: fx.Tensor, n: fx.Constexpr[int]):
            ring(out, n).launch(grid=(n, 1, 1), block=(64, 1, 1))
    """)
    with pytest.raises(EmuFault, match="another program of this launch"):
        mod.run(torch.zeros(3 * 64, dtype=torch.int32), 3)


def test_never_written_lds_reads_as_nan_bytes(tmp_path):
    mod, _ = module(tmp_path, LDS.replace("lds.words[63 - lane]", "lds.words[64 + lane]"))
    out = torch.zeros(64, dtype=torch.int32)
    mod.run(out)
    assert (out == -1).all()  # 0xFF bytes: NaN in every float format


MFMA = """
@fx.struct
class Smem:
    tile: fx.Array[fx.Int64, 64, 16]


@flyc.kernel
def mfma_kernel(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, v: fx.Tensor, out: fx.Tensor):
    lane = fx.thread_idx.x
    atom = fx.make_mma_atom(fx.rocdl.MFMA(16, 16, 32, fx.BFloat16))
    av = Vector(fx.rocdl.raw_ptr_buffer_load(T.vec(4, T.i32), rsrc(a, 0), fx.Int32(lane * 16), fx.Int32(0)))
    bv = Vector(fx.rocdl.raw_ptr_buffer_load(T.vec(4, T.i32), rsrc(b, 0), fx.Int32(lane * 16), fx.Int32(0)))
    cv = Vector(fx.rocdl.raw_ptr_buffer_load(T.vec(4, T.f32), rsrc(c, 0), fx.Int32(lane * 16), fx.Int32(0)))
    d = Vector(fly.mma_atom_call_ssa([cv.type], atom, [av.bitcast(fx.BFloat16)], [bv.bitcast(fx.BFloat16)], cv))
    store(d, rsrc(out, 0), lane * 16)
    # a 16 x 16 bf16 tile to LDS row-major (row r = lane // 4 of lanes 0..63, 4 elements per lane)
    lds = fx.SharedAllocator().allocate(Smem).peek()
    raw = fx.rocdl.raw_ptr_buffer_load(T.vec(2, T.i32), rsrc(v, 0), fx.Int32(lane * 8), fx.Int32(0))
    (lds.tile.ptr + lane).store(Vector(raw).bitcast(fx.Int64))
    fx.gpu.barrier()
    g4 = lane >> 4
    r16 = lane & 15
    u8 = fx.recast_iter(fx.Uint8, lds.tile.ptr)
    tr = fx.rocdl.ds_read_tr16_b64(T.vec(4, T.i16), fx.to_llvm_ptr(u8 + ((g4 * 4 + (r16 >> 2)) * 32 + (r16 & 3) * 8)))
    store(Vector(tr.result), rsrc(out, 0), 1024 + lane * 8)


@flyc.jit
def run(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, v: fx.Tensor, out: fx.Tensor):
    mfma_kernel(a, b, c, v, out).launch(grid=(1, 1, 1), block=(64, 1, 1))
"""


def test_mfma_and_transpose_read_through_the_api(tmp_path):
    mod, _ = module(tmp_path, MFMA)
    a = torch.randn(64, 8).to(torch.bfloat16)  # lane operands as the MFMA takes them
    b = torch.randn(64, 8).to(torch.bfloat16)
    c = torch.randn(64, 4)
    v = torch.randint(-(2**15), 2**15, (16, 16), dtype=torch.int16)  # [k][n]
    out = torch.zeros(1024 // 4 + 64 * 2, dtype=torch.int32)
    mod.run(a, b, c, v, out)
    bits = lambda t: t.view(torch.int16).numpy().view(np.uint16)  # noqa: E731
    want = isa.mfma_f32_16x16(bits(a), bits(b), c.numpy(), 32)
    assert np.array_equal(out.numpy()[:256].view(np.float32).reshape(64, 4), want)
    tile = v.numpy().view(np.uint16)
    got = out.numpy()[256:].view(np.uint16).reshape(64, 4)
    for lane in range(64):  # the 16x16x16 B operand: K rows 4 (lane // 16) .. + 3 of column lane % 16
        assert list(got[lane]) == list(tile[4 * (lane // 16) : 4 * (lane // 16) + 4, lane % 16])


# ---- refusals -------------------------------------------------------------------------------------------

UNSUPPORTED = [
    ("    x = fx.rocdl.ds_bpermute(T.i32, lane, lane)\n", "flydsl.expr.rocdl.ds_bpermute", "ds_bpermute"),
    ('    x = _llvm.inline_asm(T.i32, [lane.ir_value()], "v_mul_lo_u32 $0, $1, $1", "=v,v")\n',
     "inline asm 'v_mul_lo_u32 $0, $1, $1'", "v_mul_lo_u32"),
    ("    while lane < 3:\n        lane = lane + 1\n", "`while` loop", "while lane"),
    ("    for i in range(4):\n        lane = lane + 1\n", "range() without init=", "for i in range(4)"),
    ("    if lane:\n        lane = lane + 1\n", "`if` on a i32 value", "if lane:"),
    ("    if lane < 4:\n        lane = lane.shuffle_xor(1, 64)\n", "shuffle_xor inside an `if` on a per-lane",
     "shuffle_xor"),
    ("    x = 1 if lane < 3 else 2\n", "run-time (per-lane) value used as a Python bool", "1 if lane < 3"),
    ("    x = lane.shrui(2)\n", "`.shrui` of a i32 value", "lane.shrui"),
]


@pytest.mark.parametrize("snippet, words, at", UNSUPPORTED, ids=[at for _, _, at in UNSUPPORTED])
def test_an_unsupported_construct_is_refused_naming_it_and_its_line(tmp_path, snippet, words, at):
    mod, path = module(tmp_path, f"""
@flyc.kernel
def odd(out: fx.Tensor):
    lane = fx.thread_idx.x
{snippet}    store(lane, rsrc(out, 0), fx.thread_idx.x * 4)


@flyc.jit
def run(out: fx.Tensor):
    odd(out).launch(grid=(1, 1, 1), block=(64, 1, 1))
""")
    with pytest.raises(EmuUnsupported) as err:
        mod.run(torch.zeros(64, dtype=torch.int32))
    assert words in str(err.value)
    assert f"{path}:{lines_of(path, at)[0]}:" in str(err.value)


def test_an_unmodelled_import_is_refused_at_load(tmp_path):
    with pytest.raises(EmuUnsupported, match=r"flydsl\.expr\.coop"):
        module(tmp_path, "from flydsl.expr import coop\n")


def test_the_real_flydsl_stays_untouched(tmp_path):
    before = {k: v for k, v in sys.modules.items() if k.startswith("flydsl")}
    mod, _ = module(tmp_path, LDS)
    assert {k: v for k, v in sys.modules.items() if k.startswith("flydsl")} == before
    if "flydsl.expr" in sys.modules:
        assert sys.modules["flydsl.expr"].Int32 is not mod.fx.Int32


def test_type_promotion_is_flydsls():
    """Mixed-type operations promote as flydsl.expr.numeric does (compared with the installed flydsl)."""
    numeric = pytest.importorskip("flydsl.expr.numeric")
    from kgen.emu import lanes

    for ta in lanes.DTYPES:
        for tb in lanes.DTYPES:
            if "Index" in (ta.name, tb.name):
                continue  # not a storable numeric type in either
            try:
                want = numeric._resolve_numeric_type(getattr(numeric, ta.name), getattr(numeric, tb.name)).__name__
            except (ValueError, TypeError):
                want = None
            assert lanes.common_type(ta, tb).name == want, (ta, tb)
