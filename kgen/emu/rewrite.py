"""Control flow: the source rewrite FlyDSL applies to @flyc.kernel / @flyc.jit functions, made to
execute instead of trace.

FlyDSL traces a kernel's Python body once and rewrites its control flow first
(flydsl/compiler/ast_rewriter.py). The emulator rewrites the same constructs so that running the
Python executes what the traced IR would:
- `for i in fx.range_constexpr(n)`: a plain Python loop (unrolled at trace time in FlyDSL too).
- `for iv, state in range(a, b, s, init=[...])`, whose body ends in `results = yield [...]`: an
  scf.for with loop-carried state. Here: a loop over a wave-uniform trip count; `state` is the
  carried values, `yield` hands the next ones on, `results` is what the loop returns (the init
  values when it runs zero times). Names bound in the body hold per-iteration values that do not
  exist after an scf.for: using one after the loop is reported, not silently given the last
  iteration's value.
- `if fx.const_expr(c)`: a plain Python `if` (c must be a Python value).
- any other `if c:` becomes a call with branch functions, exactly as FlyDSL's scf.if dispatch
  (names bound before the `if` and assigned in it are its results; names first bound inside stay
  local to the branch). A Python `c` picks a branch; a per-lane Boolean runs each branch with
  only its lanes active (the exec mask a divergent scf.if compiles to) and merges the results lane
  by lane, so stores under the condition happen only in those lanes.
Everything else FlyDSL would rewrite differently (`while`, `range()` without `init=`, `return` or
`break` inside a rewritten region, `yield` elsewhere) is refused with EmuUnsupported.
"""

from __future__ import annotations

import ast
import copy

import numpy as np

from kgen.emu.errors import EmuUnsupported
from kgen.emu.lanes import Boolean, Index, Scalar, Stale, Val, as_value, select
from kgen.emu.memory import uniform
from kgen.emu.wave import LANES, current_wave


def _call_name(node) -> str | None:
    if isinstance(node, ast.Call):
        return getattr(node.func, "id", None) or getattr(node.func, "attr", None)
    return None


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp)


def _walk_same_scope(nodes):
    """ast.walk over statements, not descending into nested scopes (functions, lambdas, classes,
    comprehensions), whose names do not bind in the enclosing function."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _stored_names(nodes) -> list[str]:
    """Names a region assigns (FlyDSL also counts `x[i] = ...` as assigning `x`)."""
    out = []
    for node in _walk_same_scope(nodes):
        name = None
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            name = node.id
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name):
            name = node.value.id
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = node.name
        if name is not None and name not in out:
            out.append(name)
    return out


def _target_names(target) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


class Rewriter:
    """Rewrites one function definition (see the module docstring)."""

    def __init__(self, filename: str):
        self.filename = filename
        self.count = 0

    def unsupported(self, node, what: str) -> EmuUnsupported:
        return EmuUnsupported(f"{self.filename}:{node.lineno}: {what}")

    def function(self, node: ast.FunctionDef, outer_active: set[str] = frozenset()) -> ast.FunctionDef:
        args = node.args
        active = set(outer_active) | {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        node.body = self.block(node.body, active)
        return node

    def block(self, stmts, active: set[str]) -> list:
        out = []
        for stmt in stmts:
            out.extend(self.statement(stmt, active))
        return out

    def statement(self, s, active: set[str]) -> list:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(s, ast.FunctionDef):
                self.function(s, active)  # FlyDSL: a nested function sees the enclosing scopes
            active.add(s.name)
            return [s]
        if isinstance(s, ast.While):
            raise self.unsupported(s, "`while` loop (FlyDSL's scf.while) in a kernel or jit function")
        if isinstance(s, ast.For):
            return self.for_loop(s, active)
        if isinstance(s, ast.If):
            return self.if_statement(s, active)
        if isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                if item.optional_vars is not None:
                    active |= _target_names(item.optional_vars)
            s.body = self.block(s.body, active)
            return [s]
        if isinstance(s, ast.Try):
            s.body = self.block(s.body, active)
            for h in s.handlers:
                h.body = self.block(h.body, active)
            s.orelse, s.finalbody = self.block(s.orelse, active), self.block(s.finalbody, active)
            return [s]
        self._no_stray_yield([s])
        if isinstance(s, ast.Assign):
            for t in s.targets:
                active |= _target_names(t)
        elif isinstance(s, (ast.AugAssign, ast.AnnAssign)):
            active |= _target_names(s.target)
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            active |= {(a.asname or a.name).split(".")[0] for a in s.names}
        return [s]

    def _no_stray_yield(self, nodes):
        for node in _walk_same_scope(nodes):
            if isinstance(node, (ast.Yield, ast.YieldFrom)):
                raise self.unsupported(node, "`yield` outside the last statement of a range(..., init=[...]) loop")

    def _no_escape(self, nodes, where: str):
        for node in _walk_same_scope(nodes):
            if isinstance(node, (ast.Return, ast.Break, ast.Continue)):
                kind = type(node).__name__.lower()
                raise self.unsupported(node, f"`{kind}` inside {where}")

    # -- for -------------------------------------------------------------------------------------

    def for_loop(self, s: ast.For, active: set[str]) -> list:
        name = _call_name(s.iter)
        inner = set(active) | _target_names(s.target)  # a loop body is its own scope in FlyDSL
        if name == "range_constexpr":
            s.iter.func = ast.copy_location(ast.Name("range", ast.Load()), s.iter.func)
            s.body, s.orelse = self.block(s.body, inner), self.block(s.orelse, set(active))
            return [s]
        if name == "range" and isinstance(s.iter.func, ast.Name):
            if not any(k.arg == "init" for k in s.iter.keywords):
                raise self.unsupported(s, "range() without init= (FlyDSL's scf.for with inferred loop-carried state);"
                                          " use fx.range_constexpr() or range(..., init=[...])")
            return self.carried_loop(s, inner)
        s.body, s.orelse = self.block(s.body, inner), self.block(s.orelse, set(active))
        return [s]

    def carried_loop(self, s: ast.For, inner: set[str]) -> list:
        if s.orelse:
            raise self.unsupported(s, "`else` on a range(..., init=) loop")
        last = s.body[-1]
        value = last.value if isinstance(last, (ast.Expr, ast.Assign)) else None
        if not isinstance(value, ast.Yield) or isinstance(last, ast.Assign) and len(last.targets) != 1:
            raise self.unsupported(s, "a range(..., init=) loop body must end in `yield [...]` or `x = yield [...]`")
        body = s.body[:-1]
        self._no_stray_yield(body)
        self._no_escape(body, "a range(..., init=) loop")
        self.count += 1
        loop = f"__emu_loop_{self.count}"
        out_names = _target_names(last.targets[0]) if isinstance(last, ast.Assign) else set()
        body = self.block(body, inner)
        carry = ast.Call(ast.Attribute(ast.Name(loop, ast.Load()), "carry", ast.Load()),
                         [value.value or ast.Constant(None)], [])
        step = ast.Assign([last.targets[0]], carry) if out_names else ast.Expr(carry)
        start = ast.Assign([ast.Name(loop, ast.Store())],
                           ast.Call(ast.Name("__emu_range", ast.Load()), s.iter.args, s.iter.keywords))
        new_for = ast.For(s.target, ast.Name(loop, ast.Load()), body + [step], [])
        after = []
        for name in _stored_names(body) + sorted(_target_names(s.target)):
            if name in out_names or name.startswith("__emu_"):
                continue
            mark = ast.Assign([ast.Name(name, ast.Store())],
                              ast.Call(ast.Attribute(ast.Name(loop, ast.Load()), "after", ast.Load()),
                                       [ast.Constant(name), ast.Name(name, ast.Load())], []))
            after.append(ast.Try([mark], [ast.ExceptHandler(ast.Name("NameError", ast.Load()), None, [ast.Pass()])],
                                 [], []))
        if out_names:
            after.append(ast.Assign([copy.deepcopy(last.targets[0])],
                                    ast.Attribute(ast.Name(loop, ast.Load()), "results", ast.Load())))
        return [self._place(n, s) for n in [start, new_for, *after]]

    # -- if --------------------------------------------------------------------------------------

    def if_statement(self, s: ast.If, active: set[str]) -> list:
        if _call_name(s.test) == "const_expr":
            s.test = s.test.args[0] if s.test.args else s.test
            s.body, s.orelse = self.block(s.body, set(active)), self.block(s.orelse, set(active))
            return [s]
        self._no_escape(s.body + s.orelse, "an `if` FlyDSL rewrites into a region (wrap a Python condition in"
                                           " fx.const_expr())")
        carried = [n for n in _stored_names(s.body + s.orelse) if n in active]
        self.count += 1
        branches = []
        for label, stmts in (("then", s.body), ("else", s.orelse)):
            fn = ast.FunctionDef(
                f"__emu_{label}_{self.count}",
                ast.arguments([], [ast.arg(n) for n in carried], None, [], [], None, []),
                self.block(stmts, set(active)) + [ast.Return(ast.Tuple([ast.Name(n, ast.Load()) for n in carried],
                                                                       ast.Load()))],
                [], None, None)
            branches.append(fn)
        call = ast.Call(ast.Name("__emu_if", ast.Load()),
                        [s.test, ast.Name(branches[0].name, ast.Load()), ast.Name(branches[1].name, ast.Load()),
                         ast.Tuple([ast.Name(n, ast.Load()) for n in carried], ast.Load()),
                         ast.Constant(tuple(carried))], [])
        if carried:
            dispatch = ast.Assign([ast.Tuple([ast.Name(n, ast.Store()) for n in carried], ast.Store())], call)
        else:
            dispatch = ast.Expr(call)
        return [self._place(n, s) for n in [*branches, dispatch]]

    @staticmethod
    def _place(node, at):
        for n in ast.walk(node):
            if "lineno" in n._attributes and not hasattr(n, "lineno"):
                n.lineno, n.col_offset = at.lineno, at.col_offset
                n.end_lineno, n.end_col_offset = at.end_lineno, at.end_col_offset
        return node


# ---- what the rewritten code calls -------------------------------------------------------------------


class Loop:
    """`range(start, stop, step, init=[...])`: iterate a wave-uniform trip count carrying values."""

    def __init__(self, *bounds, init, unroll=-1, unroll_full=False):
        if not 1 <= len(bounds) <= 3:
            raise EmuUnsupported(f"range() with {len(bounds)} positional arguments")
        start, stop, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds, 1) if len(bounds) == 2 else bounds
        self.start, self.stop, self.step = (uniform(b, f"range() {n}") for n, b in
                                            (("start", start), ("stop", stop), ("step", step)))
        if self.step <= 0:
            raise EmuUnsupported(f"range() step {self.step}: scf.for needs a positive step")
        if not isinstance(init, (list, tuple)):
            raise EmuUnsupported("range(..., init=...) needs a list of values")
        self.state = [self._value(v, f"init[{i}]") for i, v in enumerate(init)]
        self.types = [v.type for v in self.state]
        self.results = None

    @staticmethod
    def _value(v, what):
        if isinstance(v, (list, tuple, dict)):
            raise EmuUnsupported(f"loop-carried {what} is a container (carry its values one by one)")
        return as_value(v)

    def __iter__(self):
        for iv in range(self.start, self.stop, self.step):
            yield Scalar.of(Index, np.full(LANES, iv, dtype=np.int64)), list(self.state)
        self.results = self._packed()

    def carry(self, values):
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        if len(values) != len(self.types):
            raise EmuUnsupported(f"yield of {len(values)} values for {len(self.types)} loop-carried values")
        new = [self._value(v, f"yield[{i}]") for i, v in enumerate(values)]
        for i, (v, t) in enumerate(zip(new, self.types)):
            if v.type != t:
                raise EmuUnsupported(f"loop-carried value {i} enters as {t} and is yielded as {v.type}")
        self.state = new
        return self._packed()

    def _packed(self):
        return None if not self.state else self.state[0] if len(self.state) == 1 else list(self.state)

    @staticmethod
    def after(name, value):
        return Stale(name) if _holds_value(value) else value


def _holds_value(x) -> bool:
    if isinstance(x, Val):
        return True
    if isinstance(x, (list, tuple)):
        return any(_holds_value(e) for e in x)
    if isinstance(x, dict):
        return any(_holds_value(e) for e in x.values())
    return False


def dispatch_if(cond, then_fn, else_fn, values: tuple, names: tuple):
    """The rewritten `if`: a Python condition picks a branch; a per-lane Boolean runs both, each
    with its lanes active, and merges the branch results lane by lane."""
    if not isinstance(cond, Val):
        return (then_fn if cond else else_fn)(*values)
    if not isinstance(cond, Scalar) or cond.dtype is not Boolean:
        raise EmuUnsupported(f"`if` on a {cond.type} value (scf.if needs an i1 condition; compare it first)")
    wave = current_wave()
    with wave.predicate(cond.a):
        taken = then_fn(*values)
    with wave.predicate(~cond.a):
        other = else_fn(*values)
    return tuple(_merge(n, cond, t, e) for n, t, e in zip(names, taken, other))


def _merge(name, cond, t, e):
    if t is e:
        return t
    if isinstance(t, (list, tuple)) and type(t) is type(e) and len(t) == len(e):
        return type(t)(_merge(f"{name}[{i}]", cond, x, y) for i, (x, y) in enumerate(zip(t, e)))
    scalar = (Val, bool, int, float)
    if isinstance(t, scalar) and isinstance(e, scalar):
        if not isinstance(t, Val) and not isinstance(e, Val) and type(t) is type(e) and t == e:
            return t
        tv, ev = as_value(t), as_value(e)
        if tv.type != ev.type:
            raise EmuUnsupported(f"`{name}` is {tv.type} after one branch of an `if` on a per-lane condition"
                                 f" and {ev.type} after the other")
        return select(cond, tv, ev)
    raise EmuUnsupported(f"`{name}` is bound to different Python objects by the two branches of an `if` on a"
                         " per-lane condition")


RUNTIME = {"__emu_range": Loop, "__emu_if": dispatch_if}
