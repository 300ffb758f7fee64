"""Load a generated FlyDSL module with the emulated flydsl in place of the real one, and run its
kernels: a grid of programs, each one 64-lane wave.

The module's own source is executed: its imports of `flydsl...` resolve (for this module only,
through its own `__import__`; sys.modules and the real flydsl are untouched) to kgen.emu.api,
its @flyc.jit / @flyc.kernel functions are rewritten as FlyDSL rewrites them (kgen.emu.rewrite)
and run on lane values, and its host code (torch, Triton) runs as it is. A kernel launch reads
the torch tensors it is given, runs every program in turn, and writes back what they stored.
"""

from __future__ import annotations

import ast
import builtins
import copy
import inspect
import itertools
import traceback
import types
from pathlib import Path

import numpy as np

from kgen.emu import api
from kgen.emu.errors import EmuError, EmuUnsupported
from kgen.emu.lanes import DType, as_value, convert
from kgen.emu.memory import KernelTensor, Memory
from kgen.emu.rewrite import RUNTIME, Rewriter
from kgen.emu.wave import LANES, Wave, current_wave, running


def load_module(path, name: str | None = None) -> types.ModuleType:
    """Execute the generated module at `path` against the emulated flydsl; returns the module."""
    loader = _Loader(Path(path))
    module = types.ModuleType(name or f"kgen_emu_{loader.path.stem}")
    module.__file__ = str(loader.path)
    module.__dict__["__builtins__"] = dict(builtins.__dict__, __import__=loader.import_)
    module.__dict__.update(RUNTIME)
    module.__dict__["__kgen_emu__"] = loader
    try:
        # dont_inherit: this file's `from __future__ import annotations` must not leak into the
        # module (FlyDSL reads @fx.struct field annotations as objects)
        exec(compile(loader.source, str(loader.path), "exec", dont_inherit=True), module.__dict__)
    except Exception as err:
        raise loader.located(err) from err
    return module


class _Loader:
    def __init__(self, path: Path):
        self.path = path
        self.source = path.read_text(encoding="utf-8")
        self.tree = ast.parse(self.source, str(path))
        flyc = api.Namespace("flydsl.compiler", dict(jit=lambda f: Jit(self, f), kernel=lambda f: Kernel(self, f)))
        self.modules = api.build(flyc)
        self.last_launch = None  # the last kernel launch's arguments (tests and checks inspect it)

    def import_(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (name == "flydsl" or name.startswith("flydsl.")):
            if name not in self.modules:
                raise EmuUnsupported(f"import of `{name}` (outside the FlyDSL subset kgen.emu models)")
            return self.modules[name] if fromlist else self.modules["flydsl"]
        return builtins.__import__(name, globals, locals, fromlist, level)

    def rewritten(self, func):
        """The function's definition in this module's source, rewritten (kgen.emu.rewrite)."""
        line = func.__code__.co_firstlineno
        node = next((n for n in self.tree.body if isinstance(n, ast.FunctionDef) and n.name == func.__name__
                     and line in [n.lineno] + [d.lineno for d in n.decorator_list]), None)
        if node is None:
            raise EmuUnsupported(f"{self.path}:{line}: @flyc.jit / @flyc.kernel on `{func.__name__}`, which is not"
                                 " a top-level function of the module")
        node = copy.deepcopy(node)
        node.decorator_list = []
        Rewriter(str(self.path)).function(node)
        namespace = {}
        code = compile(ast.fix_missing_locations(ast.Module([node], [])), str(self.path), "exec", dont_inherit=True)
        exec(code, func.__globals__, namespace)
        return namespace[func.__name__]

    def located(self, err: Exception, program=None) -> EmuError:
        """The error, with the innermost line of this module it came from and the program."""
        if getattr(err, "kgen_emu_located", False):
            return err
        frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == str(self.path)]
        where = ""
        if frames and not str(err).startswith(f"{self.path}:"):
            f, callers = frames[-1], [c.lineno for c in reversed(frames[:-1])][:3]
            where = f"{self.path}:{f.lineno}: `{(f.line or '').strip()}`"
            where += f" (called from line {', '.join(map(str, callers))}): " if callers else ": "
        kind = type(err) if isinstance(err, EmuError) else EmuError
        text = str(err) if isinstance(err, EmuError) else f"{type(err).__name__}: {err}"
        located = kind(where + text + (f" [program {program}]" if program is not None else ""))
        located.kgen_emu_located = True
        return located


class Jit:
    """@flyc.jit: inside a kernel, an inlined helper; on the host, a launcher function."""

    def __init__(self, loader: _Loader, func):
        self.loader, self.func, self._run = loader, func, None

    def __call__(self, *args, **kwargs):
        if self._run is None:
            self._run = self.loader.rewritten(self.func)
        if current_wave().in_kernel:
            return self._run(*args, **kwargs)
        return self._run(*map(_host_arg, args), **{k: _host_arg(v) for k, v in kwargs.items()})


class HostTensor:
    """A torch tensor passed to a host @flyc.jit function (FlyDSL sees a memref there)."""

    def __init__(self, tensor):
        self.tensor = tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.tensor.shape)


def _host_arg(x):
    import torch

    return HostTensor(x) if isinstance(x, torch.Tensor) else x


class Kernel:
    """@flyc.kernel: calling it binds arguments; `.launch(grid=, block=)` runs the grid."""

    def __init__(self, loader: _Loader, func):
        self.loader, self.func, self._run = loader, func, None
        self.signature = inspect.signature(func)

    def __call__(self, *args, **kwargs):
        if current_wave().in_kernel:
            raise EmuUnsupported(f"calling the kernel `{self.func.__name__}` from a kernel")
        return _Launch(self, self.signature.bind(*args, **kwargs))


class _Launch:
    def __init__(self, kernel: Kernel, bound: inspect.BoundArguments):
        self.kernel, self.bound = kernel, bound

    def launch(self, grid, block=(LANES, 1, 1), stream=None, **kwargs):
        kernel, loader = self.kernel, self.kernel.loader
        if kernel._run is None:
            kernel._run = loader.rewritten(kernel.func)
        grid = _dims(grid, "grid")
        if _dims(block, "block") != (LANES, 1, 1):
            raise EmuUnsupported(f"block={block!r}: the emulator runs one {LANES}-lane wave per workgroup")
        tensors, args = self._arguments()
        loader.last_launch = dict(self.bound.arguments, grid=grid)
        for pid, (z, y, x) in enumerate(itertools.product(*(range(n) for n in reversed(grid)))):
            try:
                with running(Wave((x, y, z), in_kernel=True, pid=pid)):
                    kernel._run(*args)
            except Exception as err:
                raise loader.located(err, program=(x, y, z)) from err
        for tensor, mem in tensors:
            if mem.written:
                _write_back(tensor, mem)

    def _arguments(self):
        tensors, args, spans = [], [], []
        for name, value in self.bound.arguments.items():
            ann = self.kernel.signature.parameters[name].annotation
            if isinstance(value, HostTensor):
                mem, span = _read_tensor(name, value.tensor)
                for other, (lo, hi) in spans:
                    if span[0] < hi and lo < span[1]:
                        raise EmuUnsupported(f"kernel arguments `{other}` and `{name}` share memory")
                spans.append((name, span))
                tensors.append((value.tensor, mem))
                args.append(KernelTensor(mem, _dtype_of(value.tensor), tuple(value.tensor.shape)))
            elif isinstance(ann, api.Constexpr):
                args.append(value)
            elif isinstance(ann, DType):
                args.append(convert(as_value(value), ann))
            else:
                raise EmuUnsupported(f"kernel argument `{name}` of type {type(value).__name__} annotated {ann!r}")
        return tensors, args


def _dims(d, what) -> tuple[int, int, int]:
    d = (d,) if isinstance(d, int) else tuple(d)
    if not 1 <= len(d) <= 3 or not all(isinstance(x, (int, np.integer)) and x >= 0 for x in d):
        raise EmuUnsupported(f"{what}={d!r}: expected up to three non-negative Python ints")
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))


def _dtype_of(tensor) -> DType:
    import torch

    from kgen.emu import lanes

    table = {torch.int8: lanes.Int8, torch.int16: lanes.Int16, torch.int32: lanes.Int32, torch.int64: lanes.Int64,
             torch.uint8: lanes.Uint8, torch.float16: lanes.Float16, torch.bfloat16: lanes.BFloat16,
             torch.float32: lanes.Float32, torch.float64: lanes.Float64}
    if tensor.dtype not in table:
        raise EmuUnsupported(f"a tensor argument of dtype {tensor.dtype}")
    return table[tensor.dtype]


def _read_tensor(name, tensor):
    if not tensor.is_contiguous():
        raise EmuUnsupported(f"kernel argument `{name}`: a non-contiguous tensor")
    import torch

    data = tensor.detach().reshape(-1).view(torch.uint8).cpu().numpy().copy()
    start = tensor.data_ptr()
    return Memory(name, data, "global"), (start, start + data.size)


def _write_back(tensor, mem: Memory) -> None:
    import torch

    flat = torch.from_numpy(mem.data).view(tensor.dtype).view(tensor.shape)
    with torch.no_grad():
        tensor.copy_(flat)

