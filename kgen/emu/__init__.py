"""kgen.emu: run generated FlyDSL kernels on CPU, one 64-lane wave per program, lane by lane.

    module = kgen.emu.load_module("generated/tq_decode/tq_decode_gfx950_d128_qg8_bs16.py")
    out = module.tq_decode(query, kv_cache, block_table, seq_lens, centroids, rotation)

The generated module's own source runs, with `flydsl` resolved to this package's model of the
subset kgen's templates use (kgen.emu.api). Layers, bottom up: isa (the documented gfx950
instruction semantics), lanes (values over lanes, FlyDSL's types and rounding), wave (the exec
mask and program id), memory (tensors, LDS, pointers, buffer descriptors, bounds and LDS-race
checks), rewrite (FlyDSL's control-flow rewrite, executed), api (the flydsl names), launch
(loading a module, running a grid). Anything outside the subset raises EmuUnsupported naming it.
"""

from kgen.emu.errors import EmuError, EmuFault, EmuUnsupported
from kgen.emu.launch import load_module

__all__ = ["EmuError", "EmuFault", "EmuUnsupported", "load_module"]
