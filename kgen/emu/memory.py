"""Memory as a program sees it: kernel tensors (global), LDS arrays, pointers, views, buffer
descriptors, and the byte-level accesses every load and store goes through.

Every allocation is a numpy byte array. An access outside it is a fault (on a GPU it would read
a neighbour or fault, depending on what lies there). LDS starts as 0xFF bytes (NaN in every float
format, -1 as an integer), so a read of never-written LDS shows up instead of reading as zero.

Workgroups of one launch are not ordered: a program reading bytes another program of the launch
wrote, or overwriting bytes another program read or wrote, is reported (this emulator runs the
programs one after another, which would hide such a race).

LDS accesses are also checked against the compiler's view of a wave: it schedules each lane's
instructions as one thread's, so a lane reading (or overwriting) LDS bytes another lane wrote
(or read) is only ordered if a scheduling fence lies between the two: `sched_barrier` without
DS bits in its mask, or a barrier. Such a cross-lane dependency with no fence between is reported
as an LDS race, the bug class where the kernel works in this emulator (which runs instructions
in program order) but not after the compiler reorders.
"""

from __future__ import annotations

import numpy as np

from kgen.emu import isa
from kgen.emu.errors import EmuFault, EmuUnsupported
from kgen.emu.lanes import Boolean, DType, Index, Int32, IrType, Scalar, Val, Vector, as_value, convert
from kgen.emu.wave import LANES, current_wave

LDS_LIMIT = 160 * 1024  # gfx950 LDS per workgroup
_LANE_BITS = np.uint64(1) << np.arange(LANES, dtype=np.uint64)


class Memory:
    """One allocation: a kernel tensor argument ('global') or one LDS array of a program ('lds')."""

    def __init__(self, name: str, data: np.ndarray, space: str):
        self.name, self.data, self.space = name, data, space
        self.written = False
        if space == "global":  # per byte: the program that last wrote it, the one(s) that read it
            self.w_prog = np.full(data.size, -1, dtype=np.int32)
            self.r_prog = np.full(data.size, -1, dtype=np.int32)  # -2: read by several programs
        if space == "lds":
            n = data.size
            self.w_lane = np.full(n, -1, dtype=np.int16)  # last writer lane of each byte
            self.w_epoch = np.full(n, -1, dtype=np.int64)  # fence count at that write
            self.r_mask = np.zeros(n, dtype=np.uint64)  # lanes that read the byte since r_epoch
            self.r_epoch = np.full(n, -1, dtype=np.int64)

    def describe(self) -> str:
        return f"LDS array `{self.name}`" if self.space == "lds" else f"kernel argument `{self.name}`"

    def _lanes_and_bytes(self, addr: np.ndarray, nbytes: int, what: str):
        wave = current_wave()
        lanes = wave.active_lanes
        a = addr[lanes]
        bad = (a < 0) | (a + nbytes > self.data.size)
        if bad.any():
            i = int(np.argmax(bad))
            raise EmuFault(f"{what} of {nbytes} bytes at byte offset {int(a[i])} of {self.describe()}"
                           f" ({self.data.size} bytes): outside it (lane {int(lanes[i])})")
        return wave, lanes, a[:, None] + np.arange(nbytes)

    def read_uniform(self, byte: int, nbytes: int, what: str) -> np.ndarray:
        """A scalar-memory read (SMEM ignores the exec mask): nbytes at one address."""
        if byte < 0 or byte + nbytes > self.data.size:
            raise EmuFault(f"{what} of {nbytes} bytes at byte offset {byte} of {self.describe()}"
                           f" ({self.data.size} bytes): outside it")
        return self.data[byte : byte + nbytes].copy()

    def read(self, addr: np.ndarray, nbytes: int, what: str) -> np.ndarray:
        """[64, nbytes] bytes at each active lane's address (zeros for inactive lanes)."""
        wave, lanes, idx = self._lanes_and_bytes(addr, nbytes, what)
        if self.space == "lds":
            self._check_read(wave, lanes, idx, what)
        else:
            self._programs_read(wave, idx, what)
        out = np.zeros((LANES, nbytes), dtype=np.uint8)
        out[lanes] = self.data[idx]
        return out

    def write(self, addr: np.ndarray, raw: np.ndarray, what: str) -> None:
        """Store each active lane's bytes; lanes writing one byte must agree on its value."""
        wave, lanes, idx = self._lanes_and_bytes(addr, raw.shape[1], what)
        vals = raw[lanes]
        flat_i, flat_v = idx.ravel(), vals.ravel()
        order = np.argsort(flat_i, kind="stable")
        si, sv = flat_i[order], flat_v[order]
        clash = (si[1:] == si[:-1]) & (sv[1:] != sv[:-1])
        if clash.any():
            k = int(np.argmax(clash))
            raise EmuFault(f"{what}: lanes store different values to byte {int(si[k])} of {self.describe()}"
                           " in one instruction (which value lands is not defined)")
        if self.space == "lds":
            self._check_write(wave, lanes, idx, what)
        else:
            self._programs_write(wave, flat_i, flat_v, what)
        self.data[flat_i] = flat_v
        self.written = True

    # -- ordering between the programs of a launch, and between the lanes of a wave (see above) --

    def _programs_read(self, wave, idx, what):
        writer = self.w_prog[idx]
        if ((writer >= 0) & (writer != wave.pid)).any():
            raise EmuFault(f"{what} of {self.describe()} reads bytes another program of this launch wrote"
                           " (workgroups are not ordered)")
        flat = idx.ravel()
        readers = self.r_prog[flat]
        self.r_prog[flat] = np.where((readers == -1) | (readers == wave.pid), wave.pid, -2)

    def _programs_write(self, wave, flat, values, what):
        """Storing the value a byte already holds is harmless whoever wrote or read it before."""
        changes = self.data[flat] != values
        touched = lambda who: (who != -1) & (who != wave.pid)  # noqa: E731
        if (changes & (touched(self.w_prog[flat]) | touched(self.r_prog[flat]))).any():
            raise EmuFault(f"{what} to {self.describe()} changes bytes another program of this launch wrote"
                           " or read (workgroups are not ordered)")
        self.w_prog[flat] = wave.pid

    def _check_read(self, wave, lanes, idx, what):
        writer = self.w_lane[idx]
        race = (self.w_epoch[idx] == wave.epoch) & (writer >= 0) & (writer != lanes[:, None])
        if race.any():
            r, c = np.argwhere(race)[0]
            raise EmuFault(f"LDS race: {what} by lane {int(lanes[r])} reads byte {int(idx[r, c])} of"
                           f" {self.describe()} that lane {int(writer[r, c])} wrote with no scheduling fence"
                           " (sched_barrier / barrier) between")
        flat = idx.ravel()
        stale = self.r_epoch[flat] != wave.epoch
        self.r_mask[flat[stale]] = 0
        self.r_epoch[flat] = wave.epoch
        np.bitwise_or.at(self.r_mask, flat, np.repeat(_LANE_BITS[lanes], idx.shape[1]))

    def _check_write(self, wave, lanes, idx, what):
        others = ~_LANE_BITS[lanes][:, None]
        war = (self.r_epoch[idx] == wave.epoch) & ((self.r_mask[idx] & others) != 0)
        writer = self.w_lane[idx]
        waw = (self.w_epoch[idx] == wave.epoch) & (writer >= 0) & (writer != lanes[:, None])
        if war.any() or waw.any():
            kind, hit = ("read", war) if war.any() else ("wrote", waw)
            r, c = np.argwhere(hit)[0]
            raise EmuFault(f"LDS race: {what} by lane {int(lanes[r])} overwrites byte {int(idx[r, c])} of"
                           f" {self.describe()} that another lane {kind} with no scheduling fence"
                           " (sched_barrier / barrier) between")
        self.w_lane[idx] = np.repeat(lanes[:, None], idx.shape[1], axis=1)
        self.w_epoch[idx] = wave.epoch


# ---- bytes <-> values ------------------------------------------------------------------------------------


def value_bytes(v: Val) -> np.ndarray:
    """[64, nbytes] little-endian bytes of each lane's value."""
    if v.dtype is Boolean:
        raise EmuUnsupported("a memory access of Boolean values")
    a = np.ascontiguousarray(v.a if isinstance(v, Vector) else v.a[:, None])
    return a.view(np.uint8).reshape(LANES, -1)


def bytes_value(raw: np.ndarray, ty: IrType) -> Val:
    vals = np.ascontiguousarray(raw).view(ty.dtype.storage).reshape(LANES, -1)
    return Scalar.of(ty.dtype, vals[:, 0].copy()) if ty.n is None else Vector.of(ty.dtype, vals.copy())


def lane_offsets(offset, what: str) -> np.ndarray:
    """An element offset (Python int or integer value) as int64 per lane; signed values are
    sign-extended, unsigned ones zero-extended (GEP semantics)."""
    if isinstance(offset, (bool, np.bool_)):
        raise EmuUnsupported(f"{what}: a bool offset")
    if isinstance(offset, (int, np.integer)):
        return np.full(LANES, int(offset), dtype=np.int64)
    if isinstance(offset, Scalar) and offset.dtype.is_int and offset.dtype is not Boolean:
        a = offset.a
        return a.astype(np.int64) if offset.dtype.kind in ("sint", "index") else a.astype(np.uint64).astype(np.int64)
    raise EmuUnsupported(f"{what}: offset of type {getattr(offset, 'type', type(offset).__name__)}")


def uniform(v, what: str) -> int:
    """A wave-uniform integer (an SGPR operand): a Python int, or a value equal in every lane. A
    value that differs between lanes (a divergent loop bound, a waterfall loop) is not modelled."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    a = v if isinstance(v, np.ndarray) else lane_offsets(v, what)
    if not (a == a[0]).all():
        raise EmuUnsupported(f"{what} differs between lanes (e.g. {sorted(set(a.tolist()))[:4]}); the emulator"
                             " models wave-uniform values here")
    return int(a[0])


# ---- pointers, descriptors, views --------------------------------------------------------------------


class Ptr:
    """A FlyDSL pointer: an allocation, a byte address per lane, an element type, and what kind of
    pointer it is ('global', 'buffer' (a buffer-descriptor pointer), 'lds', 'llvm' (to_llvm_ptr))."""

    def __init__(self, mem: Memory, byte: np.ndarray, dtype: DType, kind: str):
        self.mem, self.byte, self.dtype, self.kind = mem, byte, dtype, kind

    @property
    def element_type(self) -> DType:
        return self.dtype

    def __add__(self, offset):
        step = lane_offsets(offset, "pointer arithmetic") * self.dtype.nbytes
        return Ptr(self.mem, self.byte + step, self.dtype, self.kind)

    __radd__ = __add__

    def __sub__(self, offset):
        return Ptr(self.mem, self.byte - lane_offsets(offset, "pointer arithmetic") * self.dtype.nbytes,
                   self.dtype, self.kind)

    def load(self, result_type=None) -> Val:
        ty = IrType(self.dtype) if result_type is None else result_type
        if not isinstance(ty, IrType):
            raise EmuUnsupported(f"pointer load of type {ty!r}")
        self._plain("load")
        return bytes_value(self.mem.read(self.byte, ty.nbytes, f"load of {ty}"), ty)

    def store(self, value) -> None:
        self._plain("store")
        v = as_value(value) if not isinstance(value, (int, float)) else convert(as_value(value), self.dtype)
        if v.dtype is not self.dtype:
            raise EmuUnsupported(f"store of {v.type} through a pointer to {self.dtype} (bitcast it first)")
        self.mem.write(self.byte, value_bytes(v), f"store of {v.type}")

    def __getitem__(self, offset):
        return (self + offset).load()

    def __setitem__(self, offset, value):
        (self + offset).store(value)

    def _plain(self, what):
        if self.kind == "llvm":
            raise EmuUnsupported(f"{what} through an !llvm.ptr (only ds_read_tr16_b64 takes one here)")

    def __repr__(self):
        return f"Ptr[{self.kind} {self.dtype} into {self.mem.describe()}]"


class Rsrc:
    """A buffer resource (`get_buffer_rsrc`): the descriptor's base address per lane."""

    def __init__(self, ptr: Ptr):
        self.mem, self.base = ptr.mem, ptr.byte

    def address(self, voffset, soffset, what: str) -> np.ndarray:
        offsets = []
        for name, off in (("voffset", voffset), ("soffset", soffset)):
            off = convert(as_value(off), Int32) if isinstance(off, int) else off
            if not isinstance(off, Scalar) or off.dtype.bits != 32 or not off.dtype.is_int:
                got = getattr(off, "type", type(off).__name__)
                raise EmuUnsupported(f"{what}: {name} of type {got} (expected i32)")
            offsets.append(off.a)
        return self.base + isa.buffer_offset(*offsets)


class Layout:
    """`fx.make_layout(shape, stride)`: the emulator models 1-D integer layouts."""

    def __init__(self, shape, stride):
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (shape, stride)):
            raise EmuUnsupported(f"make_layout({shape!r}, {stride!r}): only a 1-D layout of Python ints is modelled")
        self.shape, self.stride = shape, stride


class View:
    """`fx.make_view(ptr, layout)`: element i lives at ptr + i * stride. No bounds check (FlyDSL's
    memref load/store has none); through a buffer-descriptor pointer the byte offset is the
    instruction's unsigned 32-bit voffset."""

    def __init__(self, ptr: Ptr, layout: Layout):
        if ptr.kind not in ("global", "buffer", "lds"):
            raise EmuUnsupported(f"a view over a {ptr.kind} pointer")
        self.ptr, self.layout = ptr, layout

    def _address(self, i, what) -> np.ndarray:
        if isinstance(i, tuple):
            raise EmuUnsupported(f"{what}: a multi-dimensional coordinate")
        elems = lane_offsets(i, what) * self.layout.stride
        if self.ptr.kind == "buffer":  # i32 byte offset, read as the unsigned voffset
            return self.ptr.byte + isa.buffer_offset((elems * self.ptr.dtype.nbytes).astype(np.int32), 0)
        return self.ptr.byte + elems * self.ptr.dtype.nbytes

    def __getitem__(self, i) -> Val:
        ty = IrType(self.ptr.dtype)
        return bytes_value(self.ptr.mem.read(self._address(i, "view load"), ty.nbytes, "view load"), ty)

    def __setitem__(self, i, value) -> None:
        v = convert(as_value(value), self.ptr.dtype) if isinstance(value, (int, float)) else as_value(value)
        if v.dtype is not self.ptr.dtype or isinstance(v, Vector):
            raise EmuUnsupported(f"store of {v.type} into a view of {self.ptr.dtype}")
        self.ptr.mem.write(self._address(i, "view store"), value_bytes(v), "view store")


class KernelTensor:
    """A tensor argument inside a kernel (`fx.Tensor`): its data pointer via fx.get_iter."""

    def __init__(self, mem: Memory, dtype: DType, shape: tuple[int, ...]):
        self.mem, self.dtype, self.shape_ = mem, dtype, shape

    def iter_ptr(self) -> Ptr:
        return Ptr(self.mem, np.zeros(LANES, dtype=np.int64), self.dtype, "global")

    def __getitem__(self, key):
        raise EmuUnsupported("indexing a kernel tensor argument directly (make a view of it first)")

    __setitem__ = __getitem__


# ---- LDS -------------------------------------------------------------------------------------------------


class ArraySpec:
    """`fx.Array[dtype, size, align]` in an `@fx.struct`."""

    def __init__(self, dtype: DType, size: int, align: int | None = None):
        if not isinstance(dtype, DType) or dtype in (Boolean, Index) or not isinstance(size, int) or size < 1:
            raise EmuUnsupported(f"fx.Array[{dtype!r}, {size!r}]: expected a storable numeric type and a size >= 1")
        self.dtype, self.size, self.align = dtype, size, align or dtype.nbytes

    @property
    def nbytes(self) -> int:
        return self.dtype.nbytes * self.size


class LdsArray:
    """One allocated LDS array: index it (`lds.ktab[i]`) or take its pointer (`.ptr`)."""

    def __init__(self, name: str, spec: ArraySpec):
        wave = current_wave()
        if not wave.in_kernel:
            raise EmuUnsupported("SharedAllocator outside a @flyc.kernel")
        used = sum(m.data.size for m in wave.lds) + spec.nbytes
        if used > LDS_LIMIT:
            raise EmuFault(f"LDS allocations of {used} bytes exceed the {LDS_LIMIT} bytes of a gfx950 workgroup")
        self.mem = Memory(name, np.full(spec.nbytes, 0xFF, dtype=np.uint8), "lds")
        wave.lds.append(self.mem)
        self.dtype = spec.dtype

    @property
    def ptr(self) -> Ptr:
        return Ptr(self.mem, np.zeros(LANES, dtype=np.int64), self.dtype, "lds")

    def __getitem__(self, i):
        return self.ptr[i]

    def __setitem__(self, i, value):
        self.ptr[i] = value

    def view(self, layout: Layout) -> View:
        return View(self.ptr, layout)


def ds_read_tr16_b64(result_type: IrType, ptr: Ptr) -> Vector:
    """rocdl.ds_read_tr16_b64: each lane's 8 bytes at its LDS address, transposed across lanes."""
    current_wave().require_converged("ds_read_tr16_b64")
    if ptr.mem.space != "lds" or ptr.kind != "llvm":
        raise EmuUnsupported(f"ds_read_tr16_b64 of a {ptr.kind} pointer (expected fx.to_llvm_ptr of an LDS pointer)")
    if not isinstance(result_type, IrType) or result_type.n != 4 or result_type.dtype.bits != 16:
        raise EmuUnsupported(f"ds_read_tr16_b64 with result type {result_type!r} (expected 4 x 16-bit)")
    if (ptr.byte % 8).any():
        raise EmuUnsupported("ds_read_tr16_b64 of an address that is not 8-byte aligned (its result is not documented)")
    raw = ptr.mem.read(ptr.byte, 8, "ds_read_tr16_b64")
    rows = raw.view(np.uint16).reshape(LANES, 4)
    out = np.ascontiguousarray(isa.ds_read_tr16_b64(rows))
    return Vector.of(result_type.dtype, out.view(result_type.dtype.storage).reshape(LANES, 4))
