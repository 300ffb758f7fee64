"""The wave being executed: its program id, its exec mask (lane predication) and its LDS.

One program is one 64-lane wave (the templates launch one wave per workgroup). `current_wave()`
is what value operations consult for the active lanes; outside a kernel it is a free wave with
every lane active and no LDS.
"""

from __future__ import annotations

import contextlib

import numpy as np

from kgen.emu.errors import EmuUnsupported

LANES = 64


class Wave:
    def __init__(self, program: tuple[int, int, int] = (0, 0, 0), in_kernel: bool = False, pid: int = 0):
        self.program, self.pid = program, pid  # block index, and its position in the launch
        self.in_kernel = in_kernel
        self._masks = [np.ones(LANES, dtype=bool)]
        self._active = [np.arange(LANES)]
        # Scheduling fences seen so far (sched_barrier without DS bits, barrier): LDS accesses of
        # different lanes must be separated by one, or the compiler may reorder them (it reasons
        # per lane), see kgen.emu.memory.
        self.epoch = 0
        self.lds = []  # this program's LDS allocations (kgen.emu.memory.Memory)

    @property
    def mask(self) -> np.ndarray:
        return self._masks[-1]

    @property
    def active_lanes(self) -> np.ndarray:
        return self._active[-1]

    @property
    def predicated(self) -> bool:
        return len(self._masks) > 1

    @contextlib.contextmanager
    def predicate(self, lanes: np.ndarray):
        """Run a region with only `lanes` (of the currently active ones) active."""
        self._masks.append(self.mask & lanes)
        self._active.append(np.flatnonzero(self._masks[-1]))
        try:
            yield
        finally:
            self._masks.pop()
            self._active.pop()

    def require_converged(self, what: str) -> None:
        """Cross-lane and wave-level operations read or affect inactive lanes: not modelled inside
        an `if` on a per-lane condition."""
        if self.predicated:
            raise EmuUnsupported(f"{what} inside an `if` on a per-lane condition (a lane-predicated region)")

    def fence(self) -> None:
        self.epoch += 1


_FREE = Wave()
_current: Wave | None = None


def current_wave() -> Wave:
    return _current if _current is not None else _FREE


@contextlib.contextmanager
def running(wave: Wave):
    global _current
    previous, _current = _current, wave
    try:
        yield wave
    finally:
        _current = previous
