"""Coverage proofs: a lane mapping covers its tile, every element exactly once.

A mapping is a set of sympy expressions giving tile coordinates as functions of the mapping's
free indices (lane, loop counters, vector element), each with a finite range. The domain is
finite and small (at most a few thousand points), so the proof enumerates it exhaustively with
numpy: the image must equal the tile and every element must be hit exactly once. It runs for
every variant at spec-load time, so an unsupported head dim or group size fails before rendering.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import sympy


def _numpy():
    """numpy, imported by the first proof rather than with kgen.ops (reading a spec, as `kgen
    list` does, needs no proof), together with the lambdify modules: kgen's floor division and
    modulo, evaluated elementwise (domains are non-negative here)."""
    import numpy as np

    return np, [{"FloorDiv": np.floor_divide, "Mod": np.mod}, "numpy"]


@dataclass(frozen=True)
class Coverage:
    """The statement that was proven, for `kgen show` and the tests."""

    name: str
    domain: str  # e.g. "lane < 64, it < 2"
    image: str  # e.g. "rows [0, 8) x 16-byte chunks [0, 16)"
    ok: bool
    detail: str = ""


def prove_cover(
    name: str,
    indices: Mapping[sympy.Symbol, int],
    coords: Sequence[sympy.Expr],
    tile: Sequence[int],
    where: sympy.Expr | None = None,
    image: str = "",
) -> Coverage:
    """Check that (coords evaluated over indices, optionally filtered by `where`) hits every
    point of the box `tile` exactly once and nothing outside it."""
    np, modules = _numpy()
    symbols = list(indices)
    grids = np.meshgrid(*(np.arange(indices[s]) for s in symbols), indexing="ij")
    flat = [g.ravel() for g in grids]
    values = [np.broadcast_to(np.asarray(sympy.lambdify(symbols, c, modules)(*flat)), flat[0].shape) for c in coords]
    keep = np.ones(flat[0].shape, bool)
    if where is not None:
        keep = np.broadcast_to(np.asarray(sympy.lambdify(symbols, where, modules)(*flat), bool), keep.shape)
    values = [v[keep].astype(np.int64) for v in values]
    domain = ", ".join(f"{s} < {indices[s]}" for s in symbols) + (f", where {where}" if where is not None else "")
    shown = image or " x ".join(f"[0, {n})" for n in tile)
    for axis, (v, n) in enumerate(zip(values, tile)):
        if v.size and (v.min() < 0 or v.max() >= n):
            return Coverage(name, domain, shown, False, f"coordinate {axis} leaves [0, {n}): {v.min()}..{v.max()}")
    counts = np.zeros(tuple(tile), np.int64)
    np.add.at(counts, tuple(values), 1)
    if (counts == 0).any():
        first = tuple(int(i) for i in np.argwhere(counts == 0)[0])
        return Coverage(name, domain, shown, False, f"{int((counts == 0).sum())} element(s) never covered, e.g. {first}")
    if (counts > 1).any():
        first = tuple(int(i) for i in np.argwhere(counts > 1)[0])
        return Coverage(name, domain, shown, False, f"{int((counts > 1).sum())} element(s) covered twice, e.g. {first}")
    return Coverage(name, domain, shown, True)


def _evaluate(indices: Mapping[sympy.Symbol, int], exprs: Sequence[sympy.Expr]) -> tuple[list, list[np.ndarray]]:
    np, modules = _numpy()
    symbols = list(indices)
    grids = np.meshgrid(*(np.arange(indices[s]) for s in symbols), indexing="ij")
    flat = [g.ravel() for g in grids]
    return flat, [np.broadcast_to(np.asarray(sympy.lambdify(symbols, e, modules)(*flat)), flat[0].shape) for e in exprs]


def same_map(name: str, indices: Mapping[sympy.Symbol, int], left: Sequence[sympy.Expr], right: Sequence[sympy.Expr]) -> Coverage:
    """Check two mappings agree at every point of the domain (e.g. a transpose read lands each
    element where the MFMA operand layout expects it)."""
    domain = ", ".join(f"{s} < {indices[s]}" for s in indices)
    flat, a = _evaluate(indices, left)
    _, b = _evaluate(indices, right)
    for x, y in zip(a, b):
        bad = (x != y).nonzero()[0]
        if bad.size:
            at = {str(s): int(f[bad[0]]) for s, f in zip(indices, flat)}
            return Coverage(name, domain, "", False, f"at {at}: {[int(v[bad[0]]) for v in a]} != {[int(v[bad[0]]) for v in b]}")
    return Coverage(name, domain, "identical element positions", True)
