"""Lane values: a FlyDSL scalar or vector held by every lane of one 64-lane wave.

A value is a numpy array over lanes: shape [64] for a scalar (`fx.Int32`, `fx.Float32`, ...),
[64, n] for an n-element `Vector`. Types, promotion and conversions follow FlyDSL 0.4.2's
`flydsl.expr.numeric` / `typing.Vector` rules (read from its sources), and each operation rounds
the way the gfx950 instruction it lowers to does: fp32 arithmetic in IEEE round-to-nearest-even
(numpy float32), fp32 -> bf16 RNE (`v_cvt_pk_bf16_f32`), fp32 -> fp16 RNE, integers wrap.
Uniform (SGPR) values are simply lane arrays whose lanes agree; where the hardware needs a
wave-uniform value the consumer checks it.
"""

from __future__ import annotations

import operator

import numpy as np

from kgen.emu import isa
from kgen.emu.errors import EmuFault, EmuUnsupported
from kgen.emu.wave import current_wave

LANES = isa.LANES


class DType:
    """A FlyDSL numeric type (`fx.Int32`, `fx.BFloat16`, ...); calling it converts, as FlyDSL's
    constructors do. Storage: bf16 as its uint16 bit pattern, the rest as the numpy type."""

    def __init__(self, name: str, kind: str, bits: int, storage):
        self.name, self.kind, self.bits, self.storage = name, kind, bits, np.dtype(storage)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("sint", "uint", "index", "bool")

    @property
    def signed(self) -> bool:
        return self.kind == "sint"

    @property
    def nbytes(self) -> int:
        return max(1, self.bits // 8)

    @property
    def ir_type(self):
        return IrType(self)

    def __call__(self, value):
        if isinstance(value, Vector):
            raise EmuUnsupported(f"fx.{self.name}() of a Vector value (extract an element first)")
        return convert(as_value(value), self)

    def __repr__(self):
        return self.name


Boolean = DType("Boolean", "bool", 1, np.bool_)
Int8 = DType("Int8", "sint", 8, np.int8)
Int16 = DType("Int16", "sint", 16, np.int16)
Int32 = DType("Int32", "sint", 32, np.int32)
Int64 = DType("Int64", "sint", 64, np.int64)
Uint8 = DType("Uint8", "uint", 8, np.uint8)
Uint16 = DType("Uint16", "uint", 16, np.uint16)
Uint32 = DType("Uint32", "uint", 32, np.uint32)
Uint64 = DType("Uint64", "uint", 64, np.uint64)
Index = DType("Index", "index", 64, np.int64)  # scf.for induction variables (unsigned in FlyDSL)
Float16 = DType("Float16", "float", 16, np.float16)
BFloat16 = DType("BFloat16", "float", 16, np.uint16)
Float32 = DType("Float32", "float", 32, np.float32)
Float64 = DType("Float64", "float", 64, np.float64)
DTYPES = (Boolean, Int8, Int16, Int32, Int64, Uint8, Uint16, Uint32, Uint64, Index, Float16, BFloat16, Float32, Float64)


class IrType:
    """What `T.i32`, `T.vec(4, T.f32)` and `value.type` stand for: an element type and an
    optional vector length."""

    _SHORT = {"Boolean": "i1", "Int8": "i8", "Int16": "i16", "Int32": "i32", "Int64": "i64", "Uint8": "ui8",
              "Uint16": "ui16", "Uint32": "ui32", "Uint64": "ui64", "Index": "index", "Float16": "f16",
              "BFloat16": "bf16", "Float32": "f32", "Float64": "f64"}

    def __init__(self, dtype: DType, n: int | None = None):
        self.dtype, self.n = dtype, n

    @property
    def nbytes(self) -> int:
        return self.dtype.nbytes * (self.n or 1)

    def __eq__(self, other):
        return isinstance(other, IrType) and (self.dtype, self.n) == (other.dtype, other.n)

    def __hash__(self):
        return hash((self.dtype.name, self.n))

    def __repr__(self):
        short = self._SHORT[self.dtype.name]
        return short if self.n is None else f"vector<{self.n}x{short}>"


def vec_type(n: int, elem) -> IrType:
    """`T.vec(n, elem)`."""
    if not isinstance(elem, IrType) or elem.n is not None or not isinstance(n, int) or n < 1:
        raise EmuUnsupported(f"T.vec({n!r}, {elem!r}): expected a positive count and a scalar element type")
    return IrType(elem.dtype, n)


# ---- values ----------------------------------------------------------------------------------------


class Val:
    """One value per lane: `a` has shape [64] (scalar) or [64, n] (Vector)."""

    __slots__ = ("dtype", "a")
    __hash__ = object.__hash__

    @property
    def type(self) -> IrType:
        return IrType(self.dtype, None if self.a.ndim == 1 else self.a.shape[1])

    def ir_value(self):
        return self

    def to(self, dtype, *, rounding_mode=None):
        if rounding_mode is not None:
            raise EmuUnsupported("to(..., rounding_mode=...)")
        if not isinstance(dtype, DType):
            raise EmuUnsupported(f"to({dtype!r}): expected a FlyDSL numeric type")
        return convert(self, dtype)

    def bitcast(self, dtype):
        return bitcast(self, dtype)

    def select(self, if_true, if_false):
        return select(self, if_true, if_false)

    def exp2(self, *, fastmath=None):
        if not self.dtype.is_float or self.dtype.bits != 32:
            raise EmuUnsupported(f"exp2 of {self.dtype} (the emulator models fp32 v_exp_f32 only)")
        if _no_inf_nan(fastmath) and not np.isfinite(self.a[current_wave().mask]).all():
            raise EmuFault(f"exp2 with fastmath {fastmath!r} (no infs/NaNs) of a non-finite input: poison")
        return _same(self, isa.exp2_f32(self.a))

    def shuffle_xor(self, offset, width):
        wave = current_wave()
        wave.require_converged("shuffle_xor")
        if not isinstance(offset, int) or not isinstance(width, int) or width != LANES or not 0 < offset < LANES:
            raise EmuUnsupported(f"shuffle_xor({offset!r}, {width!r}): the emulator supports a constant offset in"
                                 f" 1..63 over the whole wave (width {LANES})")
        return _same(self, self.a[np.arange(LANES) ^ offset])

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise EmuUnsupported(f"`.{name}` of a {self.type} value is outside the FlyDSL subset kgen.emu models")

    def __bool__(self):
        raise EmuUnsupported(
            "a run-time (per-lane) value used as a Python bool: in fx.const_expr(), a conditional expression,"
            " and/or/not or a chained comparison (FlyDSL decides these while tracing)")

    def __index__(self):
        raise EmuUnsupported("a run-time (per-lane) value used where Python needs an int")

    __int__ = __float__ = __index__

    def __neg__(self):
        if self.dtype.is_float:
            return _float_op(self, self, lambda x, _: -x)
        return binary("sub", 0, self)

    def __abs__(self):
        if self.dtype is Boolean:
            raise EmuUnsupported("abs of a Boolean value")
        if self.dtype.is_float:
            return _float_op(self, self, lambda x, _: np.abs(x))
        return _same(self, np.abs(self.a))  # math.absi: wraps at the most negative value

    def __pow__(self, other):
        raise EmuUnsupported("** of a run-time value (math.powf / fpowi / ipowi are not modelled)")

    __rpow__ = __pow__

    def __invert__(self):
        if not self.dtype.is_int:
            raise EmuUnsupported(f"~ of {self.dtype}")
        return _same(self, ~self.a)

    def __repr__(self):
        return f"{type(self).__name__}[{self.type}]"


def _no_inf_nan(fastmath) -> bool:
    """Whether fastmath flags promise no inf/NaN operands (nnan = 2, ninf = 4 in MLIR's enum)."""
    if fastmath is None:
        return False
    if isinstance(fastmath, int):
        return bool(fastmath & 6)
    return any(f in str(fastmath) for f in ("ninf", "nnan", "fast"))


class Scalar(Val):
    """A FlyDSL Numeric: one element per lane."""

    @staticmethod
    def of(dtype: DType, a: np.ndarray) -> "Scalar":
        v = object.__new__(Scalar)
        v.dtype, v.a = dtype, a
        return v


class Vector(Val):
    """`flydsl.expr.typing.Vector`: n elements per lane. `Vector(x)` re-wraps a vector value, as
    FlyDSL's constructor does for a raw vector-typed ir.Value."""

    def __new__(cls, value=None, shape=None, dtype=None):
        if isinstance(value, Stale):
            value.fail()
        if not isinstance(value, Vector):
            got = f"a scalar {value.dtype} value" if isinstance(value, Scalar) else type(value).__name__
            raise EmuUnsupported(f"Vector() of {got}: expected a vector-typed value")
        n = value.a.shape[1]
        if shape is not None and int(np.prod(shape)) != n or dtype is not None and dtype is not value.dtype:
            raise EmuUnsupported(f"Vector({value!r}, shape={shape!r}, dtype={dtype!r}): shape or dtype differ")
        return value

    def __init__(self, *args, **kwargs):
        pass

    @staticmethod
    def of(dtype: DType, a: np.ndarray) -> "Vector":
        v = object.__new__(Vector)
        v.dtype, v.a = dtype, a
        return v

    @property
    def numel(self) -> int:
        return self.a.shape[1]

    @property
    def shape(self):
        return (self.numel,)

    def __len__(self):
        return self.numel

    def __iter__(self):
        return (self[i] for i in range(self.numel))

    def __getitem__(self, i):
        if isinstance(i, int) and not isinstance(i, bool):
            if not -self.numel <= i < self.numel:
                raise EmuUnsupported(f"vector index {i} out of range for {self.numel} elements")
            return Scalar.of(self.dtype, self.a[:, i].copy())
        if isinstance(i, Scalar) and i.dtype.is_int:
            idx = i.a.astype(np.int64)
            if ((idx < 0) | (idx >= self.numel))[current_wave().mask].any():
                raise EmuFault(f"dynamic vector index outside 0..{self.numel - 1}")
            return Scalar.of(self.dtype, self.a[np.arange(LANES), np.clip(idx, 0, self.numel - 1)])
        raise EmuUnsupported(f"vector index of type {type(i).__name__}")

    @classmethod
    def from_elements(cls, elements, dtype=None):
        elements = list(elements)
        if not elements:
            raise EmuUnsupported("Vector.from_elements of no elements")
        if dtype is None:
            dtype = as_value(elements[0]).dtype
        cols = []
        for e in elements:
            if isinstance(e, Vector):
                raise EmuUnsupported("Vector.from_elements of a Vector element")
            cols.append(convert(as_value(e), dtype).a)
        return Vector.of(dtype, np.stack(cols, axis=1))

    @classmethod
    def filled(cls, shape, fill_value, dtype):
        n = int(np.prod(shape)) if isinstance(shape, (tuple, list)) else shape
        if isinstance(fill_value, Vector):
            raise EmuUnsupported("Vector.filled with a Vector fill value")
        scalar = convert(as_value(fill_value), dtype)
        return Vector.of(dtype, np.repeat(scalar.a[:, None], n, axis=1))


def _same(like: Val, a: np.ndarray) -> Val:
    return (Vector if isinstance(like, Vector) else Scalar).of(like.dtype, a)


# ---- Python scalars, types and conversions -----------------------------------------------------------


class Stale:
    """What a name bound inside a range(..., init=) loop body holds after the loop (in FlyDSL
    the value exists only inside the scf.for); any use of it is refused."""

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def fail(self, *args, **kwargs):
        raise EmuUnsupported(f"`{object.__getattribute__(self, '_name')}` was assigned inside a range(..., init=)"
                             " loop and is used after it (only the yielded results exist after an scf.for)")

    __getattr__ = __setattr__ = __call__ = __getitem__ = __setitem__ = __iter__ = __len__ = __bool__ = fail
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = fail
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = __lshift__ = __rshift__ = fail
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = __neg__ = __index__ = fail
    __hash__ = object.__hash__


def as_numeric_dtype(x) -> DType:
    """FlyDSL's as_numeric: bool -> Boolean, int -> Int32 (Int64 beyond int32), float -> Float32."""
    if isinstance(x, (bool, np.bool_)):
        return Boolean
    if isinstance(x, (int, np.integer)):
        return Int32 if -(2**31) <= int(x) < 2**31 else Int64
    if isinstance(x, (float, np.floating)):
        return Float32
    if isinstance(x, Stale):
        x.fail()
    raise EmuUnsupported(f"a Python {type(x).__name__} where a FlyDSL numeric value is expected")


_CONSTANTS: dict = {}


def as_value(x) -> Val:
    """A lane value, or a Python scalar made into the constant FlyDSL would make of it. (Values
    are never modified in place, so constants are shared.)"""
    if isinstance(x, Val):
        return x
    if not isinstance(x, (bool, int, float, np.number, np.bool_)):
        as_numeric_dtype(x)  # refuses it, naming what it is
    key = (type(x), repr(x))  # repr keeps -0.0 apart from 0.0
    v = _CONSTANTS.get(key)
    if v is None:
        v = _constant(x)
        if len(_CONSTANTS) < 4096:
            _CONSTANTS[key] = v
    return v


def _constant(x) -> Val:
    dtype = as_numeric_dtype(x)
    if dtype.is_float:
        return Scalar.of(Float32, np.full(LANES, x, np.float32))
    if dtype is Boolean:
        return Scalar.of(Boolean, np.full(LANES, bool(x)))
    return Scalar.of(dtype, np.full(LANES, int(x), dtype.storage))


def to_f32(v: Val) -> np.ndarray:
    """Exact widening of a float value to fp32 (bf16 bits shift up; fp16 widens exactly)."""
    if v.dtype is BFloat16:
        return isa.bf16_bits_to_f32(v.a)
    return v.a.astype(np.float32)


def from_f32(x: np.ndarray, dtype: DType) -> np.ndarray:
    """fp32 -> storage of `dtype`, rounded to nearest even (the hardware conversions' rounding)."""
    if dtype is BFloat16:
        return isa.f32_to_bf16_bits(x)
    return x.astype(dtype.storage)


def convert(v: Val, dtype: DType) -> Val:
    """FlyDSL's value conversion (`fx.Int32(x)`, `x.to(dtype)`, promotion)."""
    src = v.dtype
    if src is dtype:
        return v
    a = v.a
    if dtype is Boolean:  # Boolean(x) is x != 0
        return _same_as(v, Boolean, (to_f32(v) if src.is_float else a) != 0)
    if src.is_float and dtype.is_float:  # extf is exact; truncf rounds to nearest even
        if dtype is Float64:
            return _same_as(v, dtype, to_f32(v).astype(np.float64))
        if src is Float64:
            if dtype is BFloat16:
                raise EmuUnsupported("Float64 -> BFloat16 conversion (convert to Float32 first)")
            return _same_as(v, dtype, a.astype(dtype.storage))
        return _same_as(v, dtype, from_f32(to_f32(v), dtype))
    if src.is_float:  # fptosi / fptoui, as v_cvt_i32_f32 does it: NaN -> 0, saturating
        f = (to_f32(v) if src is not Float64 else a).astype(np.float64)
        info = np.iinfo(dtype.storage) if dtype.kind != "index" else np.iinfo(np.int64)
        f = np.nan_to_num(f, nan=0.0, posinf=info.max, neginf=info.min)
        return _same_as(v, dtype, np.trunc(np.clip(f, info.min, info.max)).astype(dtype.storage))
    if dtype.is_float:  # sitofp / uitofp
        if dtype is BFloat16 or dtype is Float16:
            raise EmuUnsupported(f"{src} -> {dtype} conversion (convert to Float32 first)")
        wide = a.astype(np.uint64) if not _signed_source(src) else a.astype(np.int64)
        return _same_as(v, dtype, wide.astype(dtype.storage))
    # int -> int: sign-extend signed sources (of width > 1), zero-extend the rest, truncate when narrower
    wide = a.astype(np.int64) if _signed_source(src) else a.astype(np.uint64).astype(np.int64)
    return _same_as(v, dtype, wide.astype(dtype.storage))


def _signed_source(dtype: DType) -> bool:
    return dtype.kind == "sint"


def _same_as(like: Val, dtype: DType, a) -> Val:
    return (Vector if isinstance(like, Vector) else Scalar).of(dtype, np.asarray(a))


def bitcast(v: Val, dtype: DType) -> Val:
    """Reinterpret the lane's bits (little endian: element 0 in the low bits, as on AMDGPU)."""
    if not isinstance(dtype, DType) or dtype is Boolean or v.dtype is Boolean:
        raise EmuUnsupported(f"bitcast of {v.dtype} to {dtype!r}")
    if isinstance(v, Scalar):
        if dtype.bits != v.dtype.bits:
            raise EmuUnsupported(f"bitcast of a scalar {v.dtype} to {dtype}: widths differ")
        return Scalar.of(dtype, v.a.view(dtype.storage))
    total = v.numel * v.dtype.bits
    if total % dtype.bits:
        raise EmuUnsupported(f"bitcast of {v.type} to {dtype}: {total} bits do not divide")
    raw = np.ascontiguousarray(v.a).view(np.uint8).reshape(LANES, -1)
    return Vector.of(dtype, raw.view(dtype.storage).reshape(LANES, total // dtype.bits))


_FLOAT_RANK = {"Float64": 3, "Float32": 2, "Float16": 1, "BFloat16": 1}


def _widen_float(t: DType, bits: int) -> DType:
    if t.bits >= bits:
        return t
    return Float32 if bits <= 32 else Float64


def common_type(ta: DType, tb: DType) -> DType:
    """FlyDSL's promotion lattice (`_resolve_numeric_type`)."""
    if ta is tb:
        return ta
    if ta.is_float or tb.is_float:
        if ta.is_float and not tb.is_float:
            return _widen_float(ta, tb.bits)
        if tb.is_float and not ta.is_float:
            return _widen_float(tb, ta.bits)
        if ta.bits != tb.bits and max(ta.bits, tb.bits) >= 16:
            return ta if ta.bits > tb.bits else tb
        ra, rb = _FLOAT_RANK[ta.name], _FLOAT_RANK[tb.name]
        if ra != rb:
            return ta if ra > rb else tb
        return _widen_float(ta, ta.bits + 1)  # f16 with bf16
    sa, sb = ta.kind == "sint" or ta is Boolean, tb.kind == "sint" or tb is Boolean
    if sa == sb:
        return ta if ta.bits >= tb.bits else tb
    unsigned, signed = (ta, tb) if not sa else (tb, ta)
    return unsigned if unsigned.bits >= signed.bits else signed


# ---- arithmetic ---------------------------------------------------------------------------------------

_ARITH = {"add", "sub", "mul", "truediv", "floordiv", "mod"}
_INT_ONLY = {"and", "or", "xor", "lshift", "rshift"}
_CMP = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq,
        "ne": operator.ne}


def _operands(op: str, lhs, rhs):
    """Promote both operands to the operation's common type and a common shape."""
    lhs, rhs = as_value(lhs), as_value(rhs)
    ta, tb = lhs.dtype, rhs.dtype
    if op in _ARITH:  # Boolean widens to Int32 for arithmetic
        ta, tb = (Int32 if ta is Boolean else ta), (Int32 if tb is Boolean else tb)
    common = common_type(ta, tb)
    if op in _INT_ONLY and common.is_float:
        raise EmuUnsupported(f"{op} of {common} values (integer-only operation)")
    lhs, rhs = convert(lhs, common), convert(rhs, common)
    if isinstance(lhs, Vector) or isinstance(rhs, Vector):
        n = lhs.numel if isinstance(lhs, Vector) else rhs.numel
        if isinstance(lhs, Vector) and isinstance(rhs, Vector) and lhs.numel != rhs.numel:
            raise EmuUnsupported(f"{op} of vectors of {lhs.numel} and {rhs.numel} elements")
        lhs, rhs = (x if isinstance(x, Vector) else Vector.of(x.dtype, np.repeat(x.a[:, None], n, axis=1))
                    for x in (lhs, rhs))
    return lhs, rhs, common


def binary(op: str, lhs, rhs) -> Val:
    x, y, t = _operands(op, lhs, rhs)
    shape_of = Vector if isinstance(x, Vector) else Scalar
    if op in _CMP:
        if t.is_float:
            return shape_of.of(Boolean, _CMP[op](to_f32(x) if t.bits < 32 else x.a, to_f32(y) if t.bits < 32 else y.a))
        if t.kind == "uint" or t.kind == "index":
            return shape_of.of(Boolean, _CMP[op](x.a.view(_unsigned(t)), y.a.view(_unsigned(t))))
        return shape_of.of(Boolean, _CMP[op](x.a, y.a))
    if t.is_float:
        fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.divide,
              "floordiv": lambda p, q: np.floor(p / q), "mod": np.fmod}.get(op)
        if fn is None:
            raise EmuUnsupported(f"{op} of {t} values")
        return _float_op(x, y, fn)
    if op == "truediv":  # integer / integer is a float division in FlyDSL
        ft = Float64 if t.bits > 32 else Float32
        return binary("truediv", convert(x, ft), convert(y, ft))
    return shape_of.of(t, _int_op(op, t, x.a, y.a))


def _unsigned(t: DType):
    return np.dtype(f"uint{max(8, t.bits)}") if t is not Boolean else np.bool_


def _int_op(op: str, t: DType, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Integer arithmetic wraps (numpy arrays do not warn on integer overflow)."""
    if op in ("add", "sub", "mul"):
        if t is Boolean:
            raise EmuUnsupported(f"{op} of Boolean values")
        return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](p, q).astype(t.storage)
    if op in ("and", "or", "xor"):
        return {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op](p, q)
    if op in ("lshift", "rshift"):
        amount = (q.astype(np.int64) & (t.bits - 1)).astype(t.storage)  # the shifter uses the low bits
        if op == "lshift":
            return np.left_shift(p, amount).astype(t.storage)
        if t.kind == "sint":
            return np.right_shift(p, amount)  # arith.shrsi
        u = _unsigned(t)
        return np.right_shift(p.view(u), amount.view(u)).view(t.storage)  # arith.shrui
    if op in ("floordiv", "mod"):
        if (q == 0)[current_wave().mask].any():
            raise EmuFault(f"integer {op} by zero")
        q = np.where(q == 0, 1, q).astype(t.storage)
        with np.errstate(all="ignore"):
            if t.kind == "sint":  # floordivsi rounds down; remsi takes the dividend's sign
                return (np.floor_divide(p, q) if op == "floordiv" else np.fmod(p, q)).astype(t.storage)
            u = _unsigned(t)
            pu, qu = p.view(u), q.view(u)
            return (pu // qu if op == "floordiv" else pu % qu).view(t.storage)
    raise EmuUnsupported(f"{op} of {t} values")


def _float_op(x: Val, y: Val, fn) -> Val:
    """fp32 and fp64 in numpy (IEEE, round to nearest even); fp16 and bf16 through fp32 and back,
    which is exact for + - * / (fp32 keeps more than 2p+2 bits of a 16-bit format)."""
    with np.errstate(all="ignore"):
        if x.dtype.bits >= 32:
            return _same(x, fn(x.a, y.a).astype(x.dtype.storage))
        return _same(x, from_f32(fn(to_f32(x), to_f32(y)).astype(np.float32), x.dtype))


def select(cond, if_true, if_false) -> Val:
    """arith.select: Numeric.select / Vector.select, operands promoted to their common type."""
    cond = as_value(cond)
    if cond.dtype is not Boolean:
        cond = binary("ne", cond, 0)
    t, f = as_value(if_true), as_value(if_false)
    common = common_type(t.dtype, f.dtype)
    t, f = convert(t, common), convert(f, common)
    if isinstance(t, Vector) or isinstance(f, Vector):
        n = t.numel if isinstance(t, Vector) else f.numel
        t, f = (x if isinstance(x, Vector) else _splat_scalar(x, n) for x in (t, f))
        if t.numel != f.numel:
            raise EmuUnsupported("select between vectors of different lengths")
        c = cond.a if isinstance(cond, Vector) else cond.a[:, None]
        return Vector.of(common, np.where(c, t.a, f.a))
    if isinstance(cond, Vector):
        raise EmuUnsupported("a Vector condition selecting between scalars")
    return Scalar.of(common, np.where(cond.a, t.a, f.a))


def _splat_scalar(x: Scalar, n: int) -> Vector:
    return Vector.of(x.dtype, np.repeat(x.a[:, None], n, axis=1))


def _install_operators():
    def make(op, reverse=False):
        if reverse:
            return lambda self, other: binary(op, other, self) if _operand(other) else NotImplemented
        return lambda self, other: binary(op, self, other) if _operand(other) else NotImplemented

    for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "and", "or", "xor", "lshift", "rshift"):
        setattr(Val, f"__{op}__", make(op))
        setattr(Val, f"__r{op}__", make(op, reverse=True))
    for op in _CMP:
        setattr(Val, f"__{op}__", make(op))


def _operand(x) -> bool:
    return isinstance(x, (Val, bool, int, float, np.number))


_install_operators()
