"""The FlyDSL API subset the emulator models, as the objects a generated module imports in place
of flydsl's (`import flydsl.expr as fx`, `from flydsl._mlir.dialects import fly`, ...).

Each namespace lists what it models; any other attribute raises EmuUnsupported naming it, so a
template change that reaches for an unmodelled construct stops the emulator instead of being
executed with a guessed meaning. `@flyc.jit` and `@flyc.kernel` come from kgen.emu.launch.
"""

from __future__ import annotations

import enum
import re

import numpy as np

from kgen.emu import isa, lanes
from kgen.emu.errors import EmuUnsupported
from kgen.emu.lanes import BFloat16, DType, Float16, Float32, Int32, IrType, Scalar, Vector, as_value, vec_type
from kgen.emu.memory import (ArraySpec, KernelTensor, LdsArray, Layout, Ptr, Rsrc, View, bytes_value,
                             ds_read_tr16_b64, uniform, value_bytes)
from kgen.emu.wave import LANES, current_wave


class Namespace:
    """A stand-in module: its members are the modelled constructs, everything else is refused."""

    def __init__(self, path: str, members: dict):
        self._path = path
        self.__dict__.update(members)
        self.__name__ = path

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise EmuUnsupported(f"`{self._path}.{name}` is outside the FlyDSL subset kgen.emu models")


# ---- types and annotations ----------------------------------------------------------------------


class _Types:
    """`T`: T.i32, T.f32, T.vec(n, T.i16), T.i32x4, ..."""

    _NAMES = {"bool": lanes.Boolean, "i8": lanes.Int8, "i16": lanes.Int16, "i32": Int32, "i64": lanes.Int64,
              "f16": lanes.Float16, "bf16": BFloat16, "f32": Float32, "f64": lanes.Float64}

    def __getattr__(self, name):
        if name in self._NAMES:
            return IrType(self._NAMES[name])
        m = re.fullmatch(r"(i8|i16|i32|i64|f16|bf16|f32)x(\d+)", name)
        if m:
            return IrType(self._NAMES[m.group(1)], int(m.group(2)))
        raise EmuUnsupported(f"`T.{name}` is outside the FlyDSL subset kgen.emu models")

    @staticmethod
    def vec(n, elem):
        return vec_type(n, elem)


T = _Types()


class Constexpr:
    """`fx.Constexpr[int]`: the argument is a Python value, fixed when the kernel is traced."""

    def __init__(self, kind=None):
        self.kind = kind

    def __class_getitem__(cls, kind):
        return cls(kind)


class Stream:
    def __init__(self, value=None):
        self.value = value


class TensorAnnotation:
    """`fx.Tensor`: a tensor argument (a torch tensor on the host)."""


class _ArrayFactory:
    def __class_getitem__(cls, params):
        params = params if isinstance(params, tuple) else (params,)
        if len(params) not in (2, 3):
            raise EmuUnsupported(f"fx.Array{list(params)}: expected [dtype, size] or [dtype, size, align]")
        return ArraySpec(*params)


class StructSpec:
    def __init__(self, name: str, fields: list[tuple[str, ArraySpec]]):
        self.name, self.fields = name, fields


def struct(cls):
    """`@fx.struct` of fx.Array fields (each becomes its own LDS allocation, as FlyDSL's static
    SharedAllocator makes one LDS global per leaf)."""
    fields = []
    for name, ann in cls.__dict__.get("__annotations__", {}).items():
        if not isinstance(ann, ArraySpec):
            raise EmuUnsupported(f"@fx.struct {cls.__name__}: field `{name}` of type {ann!r} (only fx.Array fields"
                                 " are modelled)")
        fields.append((name, ann))
    return StructSpec(cls.__name__, fields)


class _StructValue:
    def __init__(self, members: dict):
        self.__dict__.update(members)


class _Storage:
    def __init__(self, value):
        self._value = value

    def peek(self):
        return self._value


class SharedAllocator:
    def __init__(self, static: bool = True, **kwargs):
        if not static or kwargs:
            raise EmuUnsupported("SharedAllocator(static=False) or base_alignment: the static allocator is modelled")

    def allocate(self, spec, alignment=None):
        if isinstance(spec, StructSpec):
            return _Storage(_StructValue({n: LdsArray(f"{spec.name}.{n}", f) for n, f in spec.fields}))
        if isinstance(spec, ArraySpec):
            return _Storage(LdsArray("array", spec))
        raise EmuUnsupported(f"SharedAllocator.allocate({spec!r}): only @fx.struct and fx.Array are modelled")


# ---- ids, pointers, views --------------------------------------------------------------------------


class _Ids:
    def __init__(self, thread: bool):
        self.thread = thread

    def __getattr__(self, axis):
        if axis not in ("x", "y", "z"):
            raise EmuUnsupported(f"thread/block index `.{axis}`")
        wave = current_wave()
        if not wave.in_kernel:
            raise EmuUnsupported("thread_idx / block_idx outside a @flyc.kernel")
        i = "xyz".index(axis)
        if self.thread:
            return Scalar.of(Int32, np.arange(LANES, dtype=np.int32) if i == 0 else np.zeros(LANES, np.int32))
        return Scalar.of(Int32, np.full(LANES, wave.program[i], dtype=np.int32))


def get_iter(x) -> Ptr:
    if isinstance(x, KernelTensor):
        return x.iter_ptr()
    if isinstance(x, View):
        return x.ptr
    raise EmuUnsupported(f"fx.get_iter of {type(x).__name__}")


def make_view(ptr, layout):
    if not isinstance(ptr, Ptr) or not isinstance(layout, Layout):
        raise EmuUnsupported("fx.make_view(ptr, fx.make_layout(...)) is the modelled form")
    return View(ptr, layout)


def recast_iter(dtype, ptr):
    if not isinstance(dtype, DType) or not isinstance(ptr, Ptr) or ptr.kind == "llvm":
        raise EmuUnsupported(f"fx.recast_iter({dtype!r}, {ptr!r}): a numeric type and a FlyDSL pointer")
    return Ptr(ptr.mem, ptr.byte, dtype, ptr.kind)


def to_llvm_ptr(ptr):
    if not isinstance(ptr, Ptr) or ptr.kind != "lds":
        raise EmuUnsupported(f"fx.to_llvm_ptr({ptr!r}): only LDS pointers are modelled")
    return Ptr(ptr.mem, ptr.byte, ptr.dtype, "llvm")


def size(x):
    if isinstance(x, tuple) and all(isinstance(d, int) for d in x):
        return int(np.prod(x, dtype=np.int64))
    raise EmuUnsupported(f"fx.size of {type(x).__name__} (only a host tensor's .shape is modelled)")


def get_scalar(x):
    if isinstance(x, int):
        return x
    raise EmuUnsupported(f"fx.get_scalar of {type(x).__name__}")


# ---- MFMA ------------------------------------------------------------------------------------------------


class MfmaSpec:
    def __init__(self, m, n, k, elem_ab, elem_acc=None):
        self.shape, self.ab, self.acc = (m, n, k), elem_ab, elem_acc or Float32
        if (m, n) != (16, 16) or k not in (16, 32) or elem_ab not in (BFloat16, Float16) or self.acc is not Float32:
            raise EmuUnsupported(f"MFMA({m}, {n}, {k}, {elem_ab!r}, {elem_acc!r}): the emulator models"
                                 " v_mfma_f32_16x16x{16,32}_{bf16,f16}")


class MmaAtom:
    def __init__(self, spec):
        if not isinstance(spec, MfmaSpec):
            raise EmuUnsupported(f"fx.make_mma_atom of {spec!r}")
        self.k, self.ab = spec.shape[2], spec.ab


def mma_atom_call_ssa(results_, mma_atom, a, b, c, *, d=None):
    """fly.mma_atom_call_ssa([acc.type], atom, [a], [b], acc): one MFMA, D = A B + C."""
    current_wave().require_converged("an MFMA")
    a = a[0] if isinstance(a, list) and len(a) == 1 else a
    b = b[0] if isinstance(b, list) and len(b) == 1 else b
    if not isinstance(mma_atom, MmaAtom) or d is not None:
        raise EmuUnsupported("fly.mma_atom_call_ssa needs an fx.make_mma_atom atom (and no d=)")
    k, ab = mma_atom.k, mma_atom.ab
    for name, x, dtype, n in (("A", a, ab, k // 4), ("B", b, ab, k // 4), ("C", c, Float32, 4)):
        if not isinstance(x, Vector) or x.dtype is not dtype or x.numel != n:
            got = getattr(x, "type", type(x).__name__)
            raise EmuUnsupported(f"MFMA 16x16x{k}: operand {name} is {got}, expected vector<{n}x{dtype}>")
    if list(results_) != [c.type]:
        raise EmuUnsupported(f"MFMA result types {list(results_)} (expected [{c.type}])")
    fmt = "bf16" if ab is BFloat16 else "f16"
    return Vector.of(Float32, isa.mfma_f32_16x16(a.a.view(np.uint16), b.a.view(np.uint16), c.a, k, fmt))


# ---- rocdl ----------------------------------------------------------------------------------------------


def _location_only(kwargs: dict, what: str) -> None:
    """Builders take loc= / ip= (where the op goes in the IR); any other option may change meaning."""
    extra = sorted(set(kwargs) - {"loc", "ip"})
    if extra:
        raise EmuUnsupported(f"{what} with {', '.join(extra)}=")


_DS_SCHED_BITS = 0x080 | 0x100 | 0x200  # all_ds, ds_read, ds_write


def sched_barrier(mask, **kwargs):
    """A scheduling fence: nothing crosses it except the instruction classes in `mask`."""
    _location_only(kwargs, "sched_barrier")
    if not isinstance(mask, int):
        raise EmuUnsupported(f"sched_barrier({mask!r}): expected an int mask")
    if not mask & _DS_SCHED_BITS:
        current_wave().fence()


def s_waitcnt(bitfield=None, *, vmcnt=None, lgkmcnt=None, expcnt=None):
    """Waits for outstanding memory operations: the emulator completes each access at once."""


def barrier(*args, **kwargs):
    """gpu.barrier: with one wave per workgroup, an ordering point for LDS (a fence)."""
    _location_only(kwargs, "gpu.barrier")
    if args:
        raise EmuUnsupported("gpu.barrier with arguments")
    current_wave().require_converged("a barrier")
    current_wave().fence()


def make_buffer_ptr(ptr, num_records_bytes=None):
    if not isinstance(ptr, Ptr) or ptr.kind != "global":
        raise EmuUnsupported(f"make_buffer_ptr of {ptr!r}: expected a global pointer")
    if num_records_bytes is not None:
        raise EmuUnsupported("make_buffer_ptr(num_records_bytes=...): range-checked descriptors are not modelled")
    return Ptr(ptr.mem, ptr.byte, ptr.dtype, "buffer")


def get_buffer_rsrc(ptr):
    if not isinstance(ptr, Ptr) or ptr.kind != "buffer":
        raise EmuUnsupported(f"get_buffer_rsrc of {ptr!r}: expected a make_buffer_ptr pointer")
    return Rsrc(ptr)


def _cache_policy(aux):
    if aux not in (None, 0):  # glc/slc/... bits change caching, not results; only the default is exercised
        raise EmuUnsupported(f"buffer access with aux={aux!r}")


def raw_ptr_buffer_load(res, rsrc, offset, soffset, aux=None, **kwargs):
    _location_only(kwargs, "raw_ptr_buffer_load")
    _cache_policy(aux)
    if not isinstance(rsrc, Rsrc) or not isinstance(res, IrType) or res.nbytes not in (1, 2, 4, 8, 12, 16):
        raise EmuUnsupported(f"raw_ptr_buffer_load({res!r}, ...): a get_buffer_rsrc descriptor and 1-16 bytes")
    addr = rsrc.address(offset, soffset, "buffer_load")
    return bytes_value(rsrc.mem.read(addr, res.nbytes, f"buffer_load of {res}"), res)


def raw_ptr_buffer_store(vdata, rsrc, offset, soffset, aux=None, **kwargs):
    _location_only(kwargs, "raw_ptr_buffer_store")
    _cache_policy(aux)
    v = as_value(vdata)
    if not isinstance(rsrc, Rsrc) or v.type.nbytes not in (1, 2, 4, 8, 12, 16):
        raise EmuUnsupported(f"raw_ptr_buffer_store of {v.type}: a get_buffer_rsrc descriptor and 1-16 bytes")
    rsrc.mem.write(rsrc.address(offset, soffset, "buffer_store"), value_bytes(v), f"buffer_store of {v.type}")


def s_buffer_load(ptr, offset, *, count=1, cache_modifier=0):
    """SMEM load of `count` i32 words at element `offset` (x 4 bytes) from a wave-uniform descriptor."""
    if not isinstance(ptr, Ptr) or ptr.kind != "buffer" or count not in (1, 4) or cache_modifier:
        raise EmuUnsupported("s_buffer_load(buffer pointer, offset, count=1|4)")
    base = uniform(ptr.byte, "s_buffer_load descriptor")
    off = uniform(offset, "s_buffer_load offset")
    byte = base + (int(np.int32(np.int64(off) * 4)) & 0xFFFFFFFF)  # the i32 byte offset, unsigned
    raw = ptr.mem.read_uniform(byte, 4 * count, "s_buffer_load")
    return bytes_value(np.repeat(raw[None, :], LANES, axis=0), IrType(Int32, None if count == 1 else 4))


class _OpResult:
    def __init__(self, result):
        self.result = result


def ds_read_tr16_b64_op(res, ptr, **kwargs):
    _location_only(kwargs, "ds_read_tr16_b64")
    return _OpResult(ds_read_tr16_b64(res, ptr))


def rcp(res, arg, **kwargs):
    """V_RCP_F32."""
    _location_only(kwargs, "rocdl.rcp")
    x = as_value(arg)
    if res != IrType(Float32) or x.type != IrType(Float32):
        raise EmuUnsupported(f"rocdl.rcp({res!r}, {x.type}): the emulator models the f32 form")
    return Scalar.of(Float32, isa.rcp_f32(x.a))


# ---- arith, llvm ------------------------------------------------------------------------------------------


class FastMathFlags(enum.IntFlag):
    none = 0
    reassoc = 1
    nnan = 2
    ninf = 4
    nsz = 8
    arcp = 16
    contract = 32
    afn = 64
    fast = 127


def _float_pair(a, b, what):
    x, y = as_value(a), as_value(b)
    if x.type != y.type or not x.dtype.is_float:
        raise EmuUnsupported(f"{what} of {x.type} and {y.type} (two values of one float type)")
    return x, y


def maxnumf(a, b, *, fastmath=None):
    """llvm.maxnum (v_max_f32): the larger operand; a NaN operand yields the other."""
    x, y = _float_pair(a, b, "maxnumf")
    return lanes._float_op(x, y, np.fmax)


def minnumf(a, b, *, fastmath=None):
    x, y = _float_pair(a, b, "minnumf")
    return lanes._float_op(x, y, np.fmin)


def _asm_add(imm, x):
    return Scalar.of(Int32, (x.a.astype(np.int64) + imm).astype(np.int32))


def _asm_readlane(lane, x):
    current_wave().require_converged("v_readlane_b32")
    return Scalar.of(x.dtype, isa.readlane(x.a, lane))


# (pattern, constraints, operand type, result type, semantics(immediate, operand))
_ASM = (
    (r"v_add_u32 \$0, (-?\d+), \$1", "=v,v", "i32", "i32", lambda m, x: _asm_add(int(m), x)),
    (r"; pin \$0", "=v,0", None, None, lambda m, x: x),
    (r"v_readlane_b32 \$0, \$1, (\d+)", "=s,v", "i32", "i32", lambda m, x: _asm_readlane(int(m), x)),
    (r"v_cvt_f32_ubyte([0-3]) \$0, \$1", "=v,v", "i32", "f32",
     lambda m, x: Scalar.of(Float32, isa.cvt_f32_ubyte(x.a, int(m)))),
)


def inline_asm(res, operands_, asm_string, constraints, *, has_side_effects=None, is_align_stack=None,
               tail_call_kind=None, asm_dialect=None, operand_attrs=None):
    """The inline assembly kgen's templates use, each string given its ISA meaning; any other
    string is refused (the emulator cannot know what arbitrary assembly does)."""
    for pattern, cons, op_ty, res_ty, semantics in _ASM:
        m = re.fullmatch(pattern, asm_string)
        if m is None:
            continue
        if constraints != cons or len(operands_) != 1 or any(x is not None for x in (is_align_stack, tail_call_kind,
                                                                                       asm_dialect, operand_attrs)):
            break
        x = operands_[0]
        if not isinstance(x, Scalar) or x.dtype.bits != 32 or op_ty and repr(x.type) != op_ty:
            break
        out = semantics(m.group(1) if m.groups() else None, x)
        if res != (x.type if res_ty is None else getattr(T, res_ty)):
            break
        return out
    raise EmuUnsupported(f"inline asm {asm_string!r} with constraints {constraints!r} and {len(operands_)} operand(s)")


# ---- the namespaces -------------------------------------------------------------------------------------


def build(flyc: Namespace) -> dict[str, Namespace]:
    """The flydsl module tree for one loaded module (flyc carries that module's jit/kernel)."""
    dtypes = {t.name: t for t in lanes.DTYPES}
    rocdl = Namespace("flydsl.expr.rocdl", dict(
        make_buffer_ptr=make_buffer_ptr, get_buffer_rsrc=get_buffer_rsrc, raw_ptr_buffer_load=raw_ptr_buffer_load,
        raw_ptr_buffer_store=raw_ptr_buffer_store, s_buffer_load=s_buffer_load, ds_read_tr16_b64=ds_read_tr16_b64_op,
        sched_barrier=sched_barrier, s_waitcnt=s_waitcnt, rcp=rcp, MFMA=MfmaSpec))
    gpu = Namespace("flydsl.expr.gpu", dict(barrier=barrier))
    arith = Namespace("flydsl.expr.arith", dict(maxnumf=maxnumf, minnumf=minnumf, FastMathFlags=FastMathFlags))
    typing = Namespace("flydsl.expr.typing", dict(T=T, Vector=Vector, **dtypes))
    fx = Namespace("flydsl.expr", dict(
        **dtypes, Vector=Vector, T=T, struct=struct, Array=_ArrayFactory, SharedAllocator=SharedAllocator,
        thread_idx=_Ids(thread=True), block_idx=_Ids(thread=False), range_constexpr=range, const_expr=lambda x: x,
        get_iter=get_iter, make_view=make_view, make_layout=Layout, recast_iter=recast_iter, to_llvm_ptr=to_llvm_ptr,
        make_mma_atom=MmaAtom, get_scalar=get_scalar, size=size, Tensor=TensorAnnotation, Constexpr=Constexpr,
        Stream=Stream, rocdl=rocdl, gpu=gpu, arith=arith, typing=typing))
    fly = Namespace("flydsl._mlir.dialects.fly", dict(mma_atom_call_ssa=mma_atom_call_ssa))
    llvm = Namespace("flydsl._mlir.dialects.llvm", dict(inline_asm=inline_asm))
    dialects = Namespace("flydsl._mlir.dialects", dict(fly=fly, llvm=llvm))
    mlir = Namespace("flydsl._mlir", dict(dialects=dialects))
    root = Namespace("flydsl", dict(compiler=flyc, expr=fx, _mlir=mlir))
    return {"flydsl": root, "flydsl.compiler": flyc, "flydsl.expr": fx, "flydsl.expr.typing": typing,
            "flydsl.expr.arith": arith, "flydsl.expr.rocdl": rocdl, "flydsl.expr.gpu": gpu, "flydsl._mlir": mlir,
            "flydsl._mlir.dialects": dialects, "flydsl._mlir.dialects.fly": fly, "flydsl._mlir.dialects.llvm": llvm}
