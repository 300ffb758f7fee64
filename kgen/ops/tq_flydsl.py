"""FlyDSL (gfx950) part of the TQ decode lowering: the design's constraints, the kernel's own
numbers, the address expressions the template prints, and the proofs that every lane mapping
covers its tile exactly once.

Single source: each lane mapping is written once here as a sympy expression over the lane
decomposition (r16, g4, tok4, c4) and loop counters; the template prints exactly these
expressions (through `FlyDslPrinter`) and the proofs evaluate exactly these expressions. Cache and
tensor addresses are the shared plan's offsets (`ctx.offsets`, derived from the spec's layout),
split into a per-lane part (VGPR), a per-tile part (SGPR) and a per-program base (64-bit pointer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import sympy

from kgen.algebra import FloorDiv, Mod, PythonPrinter, Range, bounds, decide_width, index_symbol
from kgen.algebra.coverage import Coverage, prove_cover, same_map
from kgen.targets import AmdTarget, elem, lane

LOAD_BYTES = 16  # buffer_load_dwordx4: the widest global load of a lane
BUFFER_LOADS = {1: "dword", 2: "dwordx2", 4: "dwordx4"}  # 32-bit words -> buffer_load_<suffix>
WORD = 4  # bytes per 32-bit word (VGPR)
MIN_LOAD_WORDS = 2  # K/V loads of one word: `Vector` needs a vector type, and <1 x i32> aborts LLVM
LDS_ROW_PAD = 16  # bytes of pad per LDS row, so 16 lanes reading 16 B of 16 rows hit distinct banks
BF16 = 2  # bytes per bf16 element
LDS_WORD = 8  # the LDS tile is addressed in 8-byte words (its pointer's element type is i64)

# Lane decomposition the kernel names (t = lane): MFMA row/column, lane group, dequant token and
# slice. Defined by the target's operand layouts and LANES_PER_TOKEN in `lane_symbols`.
r16, g4, tok4, c4 = (index_symbol(n) for n in ("r16", "g4", "tok4", "c4"))
# Compile-time loop counters of the kernel (fx.range_constexpr) and other trace-time ints.
i, c, w, h, ld, slot0 = (index_symbol(n) for n in ("i", "c", "w", "h", "ld", "slot0"))
# Run-time per-lane values the kernel names.
q_row, q_col, q_src, q_b_row, block = (index_symbol(n) for n in ("q_row", "q_col", "q_src", "q_b_row", "block"))


class FlyDslPrinter(PythonPrinter):
    """FlyDSL integer arithmetic in a kernel body.

    `constexprs` are trace-time Python ints (Constexpr kernel parameters, range_constexpr
    counters); every other symbol is an fx.Int32 value. Floor division and modulo are printed
    only for a power-of-two divisor and an operand proven non-negative, as `>>` and `&` (a
    dynamic `//` on fx.Int32 is a signed division: compare-and-select chains). Min prints as a
    select. A 64-bit expression widens its first run-time factor with fx.Int64(...), so no
    intermediate product is formed in 32 bits.
    """

    def __init__(self, ranges, names: Mapping[sympy.Symbol, str], constexprs=(), bits: int = 32):
        super().__init__(names)
        self.ranges, self.constexprs, self.bits = ranges, frozenset(constexprs), bits

    def with_bits(self, bits: int) -> "FlyDslPrinter":
        return FlyDslPrinter(self.ranges, self.names, self.constexprs, bits)

    def _is_runtime(self, e: sympy.Expr) -> bool:
        return any(s not in self.constexprs for s in e.free_symbols)

    def _print(self, e: sympy.Expr) -> str:
        if isinstance(e, (FloorDiv, Mod)):
            a, b = e.args
            lo, _ = bounds(a, self.ranges)
            if not (b.is_Integer and int(b) > 0 and int(b) & (int(b) - 1) == 0) or lo < 0:
                raise ValueError(f"{e}: FlyDSL prints only power-of-two // and % of operands proven non-negative")
            shift = int(b).bit_length() - 1
            # parenthesized: >> and & bind looser than + and * in Python
            return f"({self._atom(a)} >> {shift})" if isinstance(e, FloorDiv) else f"({self._atom(a)} & {int(b) - 1})"
        if isinstance(e, sympy.Min) and len(e.args) == 2:
            a, b = sorted(e.args, key=lambda x: x.is_Integer)
            return f"({self._print(a)} < {self._print(b)}).select({self._print(a)}, {self._print(b)})"
        if self.bits == 64 and e.is_Symbol and self._is_runtime(e):
            return f"fx.Int64({self._symbol(e)})"
        return super()._print(e)

    def __call__(self, expr: sympy.Expr) -> str:
        text = self._print(sympy.sympify(expr))
        return text[1:-1] if isinstance(expr, (FloorDiv, Mod)) else text

    def _terms(self, terms: list[sympy.Expr]) -> list[sympy.Expr]:
        # Run-time terms first, then trace-time ones, the number last (stable otherwise).
        return sorted(terms, key=lambda t: (not self._is_runtime(t), t.is_Number))

    def _factors(self, e: sympy.Expr) -> list[sympy.Expr]:
        # Run-time values first (the int64 cast then happens before any product), then
        # trace-time constants, the number last.
        factors = super()._factors(e)
        return sorted(factors, key=lambda f: (not self._is_runtime(f), f.is_Number))

    def _product(self, e: sympy.Expr) -> str:
        factors = self._factors(e)
        if factors[-1] == -1:
            return "-" + self._atom(sympy.Mul(*factors[:-1]))
        narrow = self.with_bits(32)
        parts, widened = [], self.bits != 64
        for f in factors:
            parts.append((narrow if widened else self)._atom(f))
            widened |= self._is_runtime(f)
        return " * ".join(parts)

    def _sum(self, terms: list[sympy.Expr]) -> str:
        terms = self._terms(terms)
        if self.bits != 64:
            return super()._sum(terms)
        # Every run-time term is widened on its own (none of them is formed in 32 bits).
        return " + ".join(self._print(t) for t in terms).replace("+ -", "- ")

    def _atom(self, e: sympy.Expr) -> str:
        text = self._print(e)
        return f"({text})" if e.is_Add else text


@dataclass(frozen=True)
class LaneMaps:
    """The kernel's lane mappings as sympy expressions (printed by the template, proven here)."""

    lane_defs: dict  # r16, g4, tok4, c4 as functions of `lane`
    exprs: dict  # name -> expression over the kernel's named symbols
    ranges: dict  # ranges of the kernel-local symbols (for printing and bounds)


def lower_kernel(ctx):
    """Constraints, derived numbers, proofs and printed expressions of the FlyDSL kernel."""
    from kgen.ops.tq_decode import KernelPart

    shared, reject = ctx.consts, ctx.reject
    target: AmdTarget = ctx.spec.options.target
    d, qg, bs, tile, group = (shared[n] for n in ("HEAD_DIM", "QG", "BS", "TILE", "GROUP"))
    qk, pv = target.qk_mfma, target.pv_mfma

    # ---- constraints of this design, each with the nearest values that work ------------------
    if d % qk.k:
        nearest = sorted({max(qk.k, d // qk.k * qk.k), (d // qk.k + 1) * qk.k})
        raise reject("dims.head_dim", f"head_dim {d} does not split into {qk.k}-wide MFMA K-chunks ({qk.mnemonic})", f"nearest that work: {', '.join(map(str, nearest))}")
    if qg > qk.m:
        raise reject("variants.axes.QG", f"QG {qg} exceeds the {qk.m} rows of one MFMA tile (query rows of a kv head share its B operand) and this design has no plan for more", f"nearest that works: {qk.m} (or split the heads over kv-head groups of at most {qk.m})")
    if tile != qk.m or tile != pv.k:
        raise reject("dims.TILE", f"TILE must equal the MFMA token dimension ({qk.m})", f"use {qk.m}")
    # Packed K and V of a tile are loaded token-major: the wave's lanes split into TILE groups of
    # lanes_per_token lanes, each group loads one token's bytes, each lane whole 32-bit words.
    lanes_per_token = target.wave // tile
    key_bytes = shared["KEY_BYTES"]
    elems_per_byte = d // key_bytes  # packed elements per byte (2 for 4-bit fields)
    step = lanes_per_token * WORD * elems_per_byte  # head_dim granule of one word per lane
    if key_bytes % (lanes_per_token * WORD) or key_bytes != shared["VALUE_BYTES"]:
        raise reject("dims.head_dim", f"the {lanes_per_token} lanes of a token load its {key_bytes} packed K (and V) bytes in whole 32-bit words, so head_dim must be a multiple of {step}", f"nearest that work: {', '.join(map(str, _nearest(d, step)))}")
    lane_words = key_bytes // (lanes_per_token * WORD)  # packed words per lane, tile and stream
    if lane_words < MIN_LOAD_WORDS:
        raise reject("dims.head_dim", f"head_dim {d} leaves each of the {lanes_per_token} lanes of a token {lane_words * WORD} packed bytes per stream; K/V loads here are buffer_load_dwordx2 or wider (a single-dword vector load aborts LLVM's AMDGPU lowering)", f"nearest that works: {d * MIN_LOAD_WORDS // lane_words}")
    load_words = min(LOAD_BYTES // WORD, lane_words)  # one buffer load: at most dwordx4
    row_bytes = d * BF16
    q_chunks_per_row = row_bytes // LOAD_BYTES
    if q_chunks_per_row > target.wave or target.wave % q_chunks_per_row:
        most = target.wave * LOAD_BYTES // BF16
        raise reject("dims.head_dim", f"a query row is staged by {q_chunks_per_row} lanes of 16 bytes, which must divide the {target.wave} lanes", f"nearest that works: {most}")
    if group // bs > target.wave:
        raise reject("dims.GROUP", f"GROUP/BS = {group // bs} block-table entries per group must fit the {target.wave} lanes (one per lane)", f"use GROUP <= {target.wave * bs}")

    nib_bits = shared["KEY_BYTES"] * 8 // d
    q_rows_per_pass = target.wave // q_chunks_per_row
    q_stage_rows = -(-qg // q_rows_per_pass) * q_rows_per_pass
    pitch = row_bytes + LDS_ROW_PAD
    lds_tile_rows = max(tile, q_stage_rows)
    # name -> (value, the one-line comment rendered next to it in the module)
    table = {
        "TILE": (tile, "tokens per MFMA tile (M of the QK MFMA, K of the PV MFMA)"),
        "KEY_BYTES": (shared["KEY_BYTES"], "packed K bytes per (slot, kv head)"),
        "VALUE_BYTES": (shared["VALUE_BYTES"], "packed V bytes per (slot, kv head)"),
        "WAVE": (target.wave, "lanes per program (one wave64)"),
        "LANES_PER_TOKEN": (lanes_per_token, "lanes that load one token's packed K (and V) bytes"),
        "MFMA_MN": (qk.m, "M = N of both MFMA shapes"),
        "QK_K": (qk.k, f"K depth of {qk.mnemonic}"),
        "PV_K": (pv.k, f"K depth of {pv.mnemonic}"),
        "D_ROWS": (qk.m * qk.n // target.wave, "f32 accumulator rows per lane (rows g4*D_ROWS ..)"),
        "QK_K_CHUNKS": (d // qk.k, "QK MFMAs per tile (contraction over head_dim)"),
        "PV_N_CHUNKS": (d // pv.m, "PV MFMAs per tile (16 output dims each)"),
        "NIB_BITS": (nib_bits, "bits per quantized element"),
        "BYTE_PAIR_ENTRIES": (1 << (2 * nib_bits), "centroid-pair table entries: one per packed byte"),
        "KV_LOAD_WORDS": (load_words, f"packed 32-bit words per buffer load (buffer_load_{BUFFER_LOADS[load_words]})"),
        "KV_LOADS": (lane_words // load_words, "buffer loads per lane, tile and stream (K or V)"),
        "TILES_PER_GROUP": (group // tile, "tiles unrolled per loop iteration"),
        "TILES_PER_BLOCK": (bs // tile, "tiles that share one cache block"),
        "BLOCKS_PER_GROUP": (group // bs, "block-table entries one group walks (one per lane)"),
        "BS_SHIFT": (bs.bit_length() - 1, "token -> block index is a shift"),
        "GROUP_SHIFT": (group.bit_length() - 1, "token -> group index is a shift"),
        "LDS_ROW_PITCH": (pitch, f"bytes between LDS tile rows: {row_bytes} B of bf16 + {LDS_ROW_PAD} B pad (bank spread)"),
        "Q_ROWS_PER_PASS": (q_rows_per_pass, "q rows staged per 16-byte-per-lane pass"),
        "Q_STAGE_ROWS": (q_stage_rows, "q rows staged in LDS (>= QG, whole passes)"),
        "Q_STAGE_PASSES": (q_stage_rows // q_rows_per_pass, "16-byte q loads per lane"),
        "LDS_KTAB_BYTES": (4 << (2 * nib_bits), "LDS: centroid-pair table (u32 per entry)"),
        "LDS_TILE_ROWS": (lds_tile_rows, "LDS tile rows: q staging, then each K tile, then each V tile"),
        "LDS_TILE_BYTES": (lds_tile_rows * pitch, "LDS: the one tile buffer"),
    }
    table["LDS_BYTES"] = (table["LDS_KTAB_BYTES"][0] + table["LDS_TILE_BYTES"][0], "LDS per program (one wave)")
    consts = {k: v for k, (v, _) in table.items() if k not in shared}
    if consts["LDS_BYTES"] > target.lds_bytes:
        # the tile buffer grows with head_dim (rows of head_dim bf16 + pad); the pair table does not
        fits = [x for x in (d >> k for k in range(1, 8)) if x % step == 0 and x >= step * MIN_LOAD_WORDS and table["LDS_KTAB_BYTES"][0] + lds_tile_rows * (x * BF16 + LDS_ROW_PAD) <= target.lds_bytes]
        raise reject("dims.head_dim", f"LDS need {consts['LDS_BYTES']} B (pair table {table['LDS_KTAB_BYTES'][0]} B + {lds_tile_rows} rows x {pitch} B) exceeds {target.arch}'s {target.lds_bytes} B", f"nearest that works: {fits[0]}" if fits else "no head_dim fits this target")
    c_all = {**shared, **consts}

    maps = lane_maps(ctx, c_all, lanes_per_token)
    proofs = _proofs(ctx, c_all, maps, lanes_per_token)
    printed = _print_all(ctx, maps)
    printed.update({f"doc.{k}": doc for k, (_, doc) in table.items()})
    return KernelPart(consts=consts, proofs=proofs, printed=printed, mapping=_explain(c_all, printed))


def _nearest(value: int, step: int) -> list[int]:
    """The multiples of `step` next to `value` that are powers of two (head_dim must be one)."""
    lower = [x for x in (1 << k for k in range(20)) if x <= value and x % step == 0]
    upper = [x for x in (1 << k for k in range(20)) if x >= value and x % step == 0]
    return sorted({*lower[-1:], *upper[:1]})


def _padding_rows(qg: int, staged: int) -> str:
    if staged == qg:
        return ""
    rows = f"row {qg} repeats" if staged == qg + 1 else f"rows {qg}..{staged - 1} repeat"
    return f"; staged {rows} row {qg - 1}"


def _explain(cn: Mapping[str, int], k: Mapping[str, str]) -> tuple[str, ...]:
    """Which lane loads which bytes, in words, from the derived numbers and printed expressions."""
    lb = cn["KV_LOAD_WORDS"] * WORD
    lpt, loads, epb = cn["LANES_PER_TOKEN"], cn["KV_LOADS"], cn["HEAD_DIM"] // cn["KEY_BYTES"]
    chunk = "c4" if loads == 1 else f"({lpt}*ld + c4)"
    loads_txt = f"{loads} x {lb} B" + (f" (ld < {loads})" if loads > 1 else "")
    return (
        f"lane t = 0..{cn['WAVE'] - 1}: r16 = {k['r16']}, g4 = {k['g4']} (MFMA row, lane group); tok4 = {k['tok4']}, c4 = {k['c4']} (token, slice)",
        f"K, V: lane t loads {loads_txt} of token tok4 of each {cn['TILE']}-token tile (buffer_load_{BUFFER_LOADS[cn['KV_LOAD_WORDS']]}): "
        f"bytes {chunk}*{lb} .. +{lb - 1} of its {cn['KEY_BYTES']} packed bytes = head_dim elements {chunk}*{lb * epb} .. +{lb * epb - 1}",
        f"  cache byte = block base + [{k['kv_lane_byte']}] (per lane){' + ' + k['kv_load_byte'] if loads > 1 else ''} + [{k['k_tile_byte']}] (K; V adds {cn['KEY_BYTES']})",
        f"  dequantized into LDS row tok4 (pitch {cn['LDS_ROW_PITCH']} B) as bf16, the same elements; {cn['LANES_PER_TOKEN']} lanes fill a {cn['HEAD_DIM']}-element row",
        f"metadata: lane t loads 4 fp16 (dwordx2) of k_norm, v_scale, v_zero for tokens g4*{cn['D_ROWS']} .. +{cn['D_ROWS'] - 1}: the QK result rows it holds",
        f"q: lane t stages 16 B of row {k['q_row']} per pass i < {cn['Q_STAGE_PASSES']} (elements ({k['q_col']})*8 ..) into LDS"
        + _padding_rows(cn["QG"], cn["Q_STAGE_ROWS"]),
        f"QK: {cn['QK_K_CHUNKS']} x 16x16x{cn['QK_K']} MFMA per tile, A = K[token r16][dims {cn['QK_K']}*c + 8*g4 ..+7] from LDS, B = q[query r16][same dims] in VGPRs",
        f"PV: {cn['PV_N_CHUNKS']} x 16x16x{cn['PV_K']} MFMA per tile, A = V[tokens][dims 16*h ..] by ds_read_b64_tr_b16 at LDS byte {k['tr_byte']}; acc: {cn['PV_N_CHUNKS'] * cn['D_ROWS']} f32 per lane",
        f"out: lane t with r16 < QG stores dims 16*h + 4*g4 .. +3 of query row r16 at byte {k['out_byte']}",
        f"LDS: {cn['LDS_KTAB_BYTES']} B centroid-pair table + {cn['LDS_TILE_ROWS']} rows x {cn['LDS_ROW_PITCH']} B tile = {cn['LDS_BYTES']} B",
    )


def lane_maps(ctx, cn: Mapping[str, int], lanes_per_token: int) -> LaneMaps:
    """Every address the kernel forms, as one expression each (single source for print and proof)."""
    target = ctx.spec.options.target
    qk, pv = target.qk_mfma, target.pv_mfma
    S, off = ctx.sym, ctx.offsets
    seq, kvh, part, slot, row, e, phys = (index_symbol(n) for n in ("seq", "kv_head", "part", "slot", "row", "e", "phys_block"))
    d, qg, tile, wave = cn["HEAD_DIM"], cn["QG"], cn["TILE"], cn["WAVE"]
    pitch, qcpr = cn["LDS_ROW_PITCH"], cn["HEAD_DIM"] * BF16 // LOAD_BYTES
    kv_load = cn["KV_LOAD_WORDS"] * WORD  # bytes of one K (or V) buffer load
    epb = d // cn["KEY_BYTES"]  # packed elements per byte
    # the lane's ld-th load of a token: 16-byte (or smaller) slice ld*LANES_PER_TOKEN + c4, so the
    # lanes of a token read its bytes contiguously in every load
    kv_slice = ld * lanes_per_token + c4
    lane_defs = {
        r16: Mod(lane, qk.m),  # MFMA row of A / column of B and D
        g4: FloorDiv(lane, qk.m),  # lane group: K sub-range of A/B, D rows g4*D_ROWS ..
        tok4: FloorDiv(lane, lanes_per_token),  # token this lane dequantizes
        c4: Mod(lane, lanes_per_token),  # which 16-byte slice of the token's K/V bytes
    }

    q_clamp = cn["Q_STAGE_ROWS"] != qg  # staged rows >= QG load row QG-1
    b_clamp = cn["Q_STAGE_ROWS"] < qk.n  # B operand rows >= the staged rows read the last one

    def lds(row_: sympy.Expr, col: sympy.Expr) -> sympy.Expr:
        """Byte address of bf16 element `col` of LDS tile row `row_` (padded pitch)."""
        return row_ * pitch + col * BF16

    def words(byte_expr: sympy.Expr) -> sympy.Expr:
        out = sympy.expand(byte_expr / LDS_WORD)
        assert all(t.as_coeff_Mul()[0].is_Integer for t in sympy.Add.make_args(out)), (byte_expr, "not 8-byte aligned")
        return out

    def linear(expr, at):
        return sympy.expand(expr.subs(at, simultaneous=True))

    k_lane = linear(off["k_bytes"], {slot: tok4, kvh: 0}) - linear(off["k_bytes"], {slot: 0, kvh: 0}) + c4 * kv_load
    v_lane = linear(off["v_bytes"], {slot: tok4, kvh: 0}) - linear(off["v_bytes"], {slot: 0, kvh: 0}) + c4 * kv_load
    assert sympy.expand(k_lane - v_lane) == 0, "K and V share the per-lane byte offset"
    meta_lane = {f: linear(off[f"{f}_bytes"], {slot: g4 * cn["D_ROWS"], kvh: 0}) - linear(off[f"{f}_bytes"], {slot: 0, kvh: 0}) for f in ("k_norm", "v_scale", "v_zero")}
    assert len({sympy.srepr(x) for x in meta_lane.values()}) == 1, "the meta fields share the per-lane byte offset"

    exprs = {
        # lane decomposition
        **{s.name: x for s, x in lane_defs.items()},
        # centroid-pair table: lane writes entry lane + i*WAVE = (hi nibble << 4) | lo nibble
        "ktab_entry": lane + i * wave,
        "ktab_lo": Mod(lane, cn["N_CENTROIDS"]),
        "ktab_hi": FloorDiv(lane, cn["N_CENTROIDS"]) + i * (wave // cn["N_CENTROIDS"]),
        # q staging, pass i: staged row and 16-byte chunk of it; rows >= QG load row QG-1
        "q_row": FloorDiv(lane, qcpr) + i * cn["Q_ROWS_PER_PASS"],
        "q_col": Mod(lane, qcpr),
        "q_src": sympy.Min(q_row, qg - 1),
        "query_base": off["query_base"],  # elements, per program
        "q_load_byte": sympy.expand(off["query_row"].subs({row: q_src if q_clamp else q_row, e: q_col * (LOAD_BYTES // BF16)}, simultaneous=True) * BF16),
        "q_stage_word": words(lds(q_row, q_col * (LOAD_BYTES // BF16))),
        # QK B operand, chunk c: q[row r16][dims c*QK_K + g4*8 ..]; rows past the staged ones
        # read the last staged row (defined data, columns never stored)
        "q_b_row": sympy.Min(r16, cn["Q_STAGE_ROWS"] - 1),
        "q_b_word": words(lds(q_b_row if b_clamp else r16, c * qk.k + g4 * qk.k_per_lane)),
        # QK A operand, chunk c: K[token r16][dims c*QK_K + g4*8 ..]
        "k_a_word": words(lds(r16, c * qk.k + g4 * qk.k_per_lane)),
        # K/V tile write, packed word w of load ld: token tok4, its elements from byte
        # kv_slice*kv_load + w*4 on (epb elements per byte)
        "kv_lds_word": words(lds(tok4, (kv_slice * kv_load + w * WORD) * epb)),
        # ds_read_b64_tr_b16 address, output chunk h: row tok4, dims h*16 + c4*4 .. +3
        "tr_byte": lds(tok4, h * pv.m + c4 * pv.k_per_lane),
        # cache block: 64-bit base in int32 words, per-lane (VGPR) and per-tile (SGPR) bytes
        "block_base_words": sympy.expand(off["block_base_bytes"].subs(phys, block) / 4),
        "kv_lane_byte": k_lane,
        "kv_load_byte": sympy.expand(kv_slice * kv_load - c4 * kv_load),  # load ld's offset (trace-time)
        "k_tile_byte": linear(off["k_bytes"], {slot: slot0}),
        "v_tile_byte": linear(off["v_bytes"], {slot: slot0}),
        "meta_lane_byte": meta_lane["k_norm"],
        "k_norm_tile_byte": linear(off["k_norm_bytes"], {slot: slot0}),
        "v_scale_tile_byte": linear(off["v_scale_bytes"], {slot: slot0}),
        "v_zero_tile_byte": linear(off["v_zero_bytes"], {slot: slot0}),
        # tensors: per-program bases (elements, added to the 64-bit pointer), in-program bytes
        "block_table_base": off["block_table_base"],
        "out_parts_base": off["out_parts_base"],
        "out_byte": sympy.expand(off["out_parts_row"].subs({row: r16, e: h * pv.m + g4 * cn["D_ROWS"]}, simultaneous=True) * BF16),
        "partials_base": off["partials_base"],
    }
    assert exprs["block_base_words"].as_coeff_Mul()[0].is_Integer, "cache block stride is a whole number of int32 words"
    ranges = {
        **ctx.ranges,
        lane: Range(0, wave - 1, "lane"),
        **{s: Range(0, _hi(x, wave), "lane decomposition") for s, x in lane_defs.items()},
        i: Range(0, max(cn["Q_STAGE_PASSES"], cn["BYTE_PAIR_ENTRIES"] // wave) - 1, "pass"),
        c: Range(0, cn["QK_K_CHUNKS"] - 1, "QK chunk"),
        w: Range(0, cn["KV_LOAD_WORDS"] - 1, "packed word of a load"),
        ld: Range(0, cn["KV_LOADS"] - 1, "K/V load of a lane"),
        h: Range(0, cn["PV_N_CHUNKS"] - 1, "PV chunk"),
        slot0: Range(0, cn["BS"] - tile, "first slot of the tile"),
        q_row: Range(0, cn["Q_STAGE_ROWS"] - 1, "staged q row"),
        q_col: Range(0, qcpr - 1, "16-byte chunk of a q row"),
        q_src: Range(0, qg - 1, "q row loaded"),
        q_b_row: Range(0, min(qk.n, cn["Q_STAGE_ROWS"]) - 1, "q row read"),
        block: Range(0, ctx.spec.dims["num_blocks"].max - 1, "block-table entry"),
    }
    return LaneMaps(lane_defs, exprs, ranges)


def _hi(expr, wave):
    return max(int(expr.subs(lane, t)) for t in range(wave))


def _print_all(ctx, maps: LaneMaps) -> dict[str, str]:
    """Every expression of `maps` printed for the kernel body, with its proven int width."""
    S = ctx.sym
    names = {
        S["Hk"]: "num_kv_heads",
        S["P"]: "num_partitions",
        S["max_blocks"]: "max_blocks",
        index_symbol("kv_head"): "kv_head",
    }
    constexprs = (S["Hk"], S["P"], S["max_blocks"], i, c, w, h, ld, slot0)
    out = {}
    for name, expr in maps.exprs.items():
        bits = decide_width(name, expr, maps.ranges).bits
        out[name] = FlyDslPrinter(maps.ranges, names, constexprs, bits)(expr)
    return out


def _proofs(ctx, cn: Mapping[str, int], maps: LaneMaps, lanes_per_token: int) -> tuple[Coverage, ...]:
    """The lane -> element mappings of the FlyDSL kernel, each proven a bijection onto its tile
    (or, for operand reads, identical to the target's operand layout)."""
    target = ctx.spec.options.target
    qk, pv = target.qk_mfma, target.pv_mfma
    x, d_rows = maps.exprs, cn["D_ROWS"]
    wave, d, tile, qg, bs = cn["WAVE"], cn["HEAD_DIM"], cn["TILE"], cn["QG"], cn["BS"]
    pitch, row_bytes = cn["LDS_ROW_PITCH"], cn["HEAD_DIM"] * BF16
    byte, s0i, f_ = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("byte", "s0i", "f_"))
    hk, kvh = ctx.sym["Hk"], index_symbol("kv_head")

    def at(expr, lane_expr=lane, **subs):
        """`expr` with the lane decomposition expanded, at lane `lane_expr`."""
        expr = sympy.sympify(expr).subs({q_src: x["q_src"], q_b_row: x["q_b_row"]})
        expr = expr.subs({q_row: x["q_row"], q_col: x["q_col"]}).subs(maps.lane_defs)
        expr = expr.subs({sympy.Symbol(k, integer=True): v for k, v in subs.items()}, simultaneous=True)
        return expr.subs(lane, lane_expr, simultaneous=True) if lane_expr is not lane else expr

    def tile_elem(addr):
        """(row, bf16 element) of LDS tile byte `addr` under the padded pitch."""
        return [FloorDiv(addr, pitch), FloorDiv(Mod(addr, pitch), BF16)]

    proofs = []
    # (1) centroid-pair table: lane t fills entries t + i*WAVE; entry b holds nibbles (b & 15, b >> 4)
    n_fill = cn["BYTE_PAIR_ENTRIES"] // wave
    proofs.append(prove_cover("centroid-pair table fill", {lane: wave, i: n_fill}, [at(x["ktab_entry"])], [cn["BYTE_PAIR_ENTRIES"]], image=f"{cn['BYTE_PAIR_ENTRIES']} entries"))
    entry = at(x["ktab_entry"])
    proofs.append(same_map("centroid-pair entry == its (lo, hi) nibbles", {lane: wave, i: n_fill}, [at(x["ktab_lo"]), at(x["ktab_hi"])], [Mod(entry, cn["N_CENTROIDS"]), FloorDiv(entry, cn["N_CENTROIDS"])]))

    # (2) q staging: 16 bytes per lane and pass into the padded LDS rows, each byte once ...
    q_dom = {lane: wave, i: cn["Q_STAGE_PASSES"], byte: LOAD_BYTES}
    q_row_l, q_col_l = at(x["q_row"]), at(x["q_col"])
    stage = at(x["q_stage_word"], q_row=q_row_l, q_col=q_col_l) * LDS_WORD + byte
    proofs.append(prove_cover("q rows staged to LDS (padded pitch)", q_dom, [FloorDiv(stage, pitch), Mod(stage, pitch)], [cn["Q_STAGE_ROWS"], row_bytes], image=f"{cn['Q_STAGE_ROWS']} rows x {row_bytes} B"))
    # ... and the element staged at (row, dim) is query row min(row, QG-1), same dim
    src_row = at(x["q_src"], q_row=q_row_l)
    load = at(x["q_load_byte"], q_src=src_row, q_col=q_col_l) + byte
    proofs.append(same_map("q staged element == query element (rows >= QG repeat QG-1)", q_dom, [FloorDiv(load, row_bytes), Mod(load, row_bytes)], [sympy.Min(FloorDiv(stage, pitch), qg - 1), Mod(stage, pitch)]))

    # (3) packed K/V chunks per lane: within a cache block of Hk = 3 heads, head 2, the K bytes
    # of the tile at slot0 (every tile of the block) are loaded once each
    env = {hk: 3, kvh: 2}
    kv_load = cn["KV_LOAD_WORDS"] * WORD
    load_name = f"{cn['KV_LOADS']} x {BUFFER_LOADS[cn['KV_LOAD_WORDS']]}"
    kv_dom = {lane: wave, s0i: cn["TILES_PER_BLOCK"], ld: cn["KV_LOADS"], byte: kv_load}
    for field, tile_name in (("k", "k_tile_byte"), ("v", "v_tile_byte")):
        addr = at(x["kv_lane_byte"]) + x["kv_load_byte"] + at(x[tile_name], slot0=s0i * tile) + byte
        origin = ctx.offsets[f"{field}_bytes"].subs(index_symbol("slot"), 0)
        rel = (addr - origin).subs(env)
        stride = int((ctx.offsets[f"{field}_bytes"].subs(index_symbol("slot"), 1) - origin).subs(env))
        proofs.append(prove_cover(f"packed {field.upper()} chunks per lane ({load_name})", kv_dom, [FloorDiv(rel, stride), Mod(rel, stride)], [bs, cn["KEY_BYTES"]], image=f"{bs} slots x {cn['KEY_BYTES']} B of {field.upper()}"))

    # (4) dequantized words to LDS: the lane's byte j of word w (elements 2j, 2j+1, from the
    # pair table or the two nibble levels) lands at the (token, dim) its nibbles came from
    nib, jb = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("nib", "jb"))
    epb = d // cn["KEY_BYTES"]
    wr_dom = {lane: wave, ld: cn["KV_LOADS"], w: cn["KV_LOAD_WORDS"], jb: WORD, nib: epb}
    # nibble nib of byte jb of word w of the lane's load ld: (slot, byte of the K record) that
    # the printed per-lane cache offset reads (the tile part selects the tile's first slot)
    read = (at(x["kv_lane_byte"]) + x["kv_load_byte"] + w * WORD + jb).subs(env)
    slot_stride = int((ctx.offsets["k_bytes"].subs(index_symbol("slot"), 1) - ctx.offsets["k_bytes"].subs(index_symbol("slot"), 0)).subs(env))
    loaded = [FloorDiv(read, slot_stride), epb * Mod(read, slot_stride) + nib]
    written = at(x["kv_lds_word"]) * LDS_WORD + (epb * jb + nib) * BF16
    proofs.append(prove_cover("K tile to LDS (padded pitch)", wr_dom, tile_elem(written), [tile, d], image=f"{tile} tokens x {d} bf16"))
    proofs.append(same_map("K pair-table words land where their nibbles came from", wr_dom, tile_elem(written), loaded))
    # V levels: cvt_f32_ubyte(lo, j), cvt_f32_ubyte(hi, j) give vector positions 2j, 2j+1
    proofs.append(same_map("V level writes land where their nibbles came from", wr_dom, tile_elem(written), loaded))

    # (5) QK operands, chunk c: A = K tile rows (token r16), B = q rows (query r16)
    op_dom = {lane: wave, c: cn["QK_K_CHUNKS"], elem: qk.k_per_lane}
    a_row, a_k = qk.a_element()
    k_read = at(x["k_a_word"]) * LDS_WORD + elem * BF16
    proofs.append(same_map("QK A operand == K tile (token, dim)", op_dom, tile_elem(k_read), [a_row, c * qk.k + a_k]))
    proofs.append(prove_cover("QK A reads cover the K tile", op_dom, tile_elem(k_read), [tile, d], image=f"{tile} tokens x {d}"))
    b_k, b_col = qk.b_element()
    q_read = at(x["q_b_word"], q_b_row=at(x["q_b_row"])) * LDS_WORD + elem * BF16
    proofs.append(same_map("QK B operand == staged q (query, dim)", op_dom, tile_elem(q_read), [sympy.Min(b_col, cn["Q_STAGE_ROWS"] - 1), c * qk.k + b_k]))
    proofs.append(prove_cover("QK B reads cover q rows < QG", op_dom, tile_elem(q_read), [qg, d], where=sympy.StrictLessThan(b_col, qg), image=f"QG={qg} rows x {d}"))

    # (6) scores (QK result) feed PV's B operand unchanged; metadata is loaded in that layout
    c_row, c_col = qk.c_element()
    pb_k, pb_col = pv.b_element()
    proofs.append(same_map("QK result layout == PV B operand layout", {lane: wave, elem: pv.k_per_lane}, [c_row, c_col], [pb_k, pb_col]))
    meta_dom = {lane: wave, s0i: cn["TILES_PER_BLOCK"], elem: d_rows}
    for f_name in ("k_norm", "v_scale", "v_zero"):
        addr = at(x["meta_lane_byte"]) + at(x[f"{f_name}_tile_byte"], slot0=s0i * tile) + elem * 2
        origin = ctx.offsets[f"{f_name}_bytes"].subs(index_symbol("slot"), 0)
        rel = (addr - origin).subs(env)
        proofs.append(same_map(f"{f_name} loads in accumulator layout (slot == QK result row)", meta_dom, [FloorDiv(rel, 2), Mod(rel, 2)], [s0i * tile + c_row, 0]))
    rel0 = (at(x["meta_lane_byte"]) + at(x["k_norm_tile_byte"], slot0=s0i * tile)).subs(env)
    proofs.append(same_map("metadata loads are 8-byte aligned (dwordx2)", {lane: wave, s0i: cn["TILES_PER_BLOCK"]}, [Mod(rel0, 8)], [0]))

    # (7) V read back through the hardware transpose == PV A operand, and covers the tile
    src_lane, src_col = target.transpose_source(pv.k_per_lane)
    tr_dom = {lane: wave, elem: pv.k_per_lane, h: cn["PV_N_CHUNKS"]}
    tr = at(x["tr_byte"], lane_expr=src_lane) + src_col * BF16
    a_m, a_kk = pv.a_element()
    proofs.append(same_map("V transpose read == PV A operand", tr_dom, tile_elem(tr), [a_kk, h * pv.m + a_m]))
    proofs.append(prove_cover("V transpose reads cover the V tile", tr_dom, tile_elem(tr), [tile, d], image=f"{tile} tokens x {d}"))
    proofs.append(same_map("transpose addresses are 8-byte aligned", {lane: wave, h: cn["PV_N_CHUNKS"]}, [Mod(at(x["tr_byte"]), 8)], [0]))

    # (8) stores: output rows < QG, each (row, dim) once, holding the PV result it should
    o_row, o_col = pv.c_element()
    st_dom = {lane: wave, elem: d_rows, h: cn["PV_N_CHUNKS"]}
    out_el = FloorDiv(at(x["out_byte"]), BF16) + elem
    keep = sympy.StrictLessThan(at(r16), qg)
    proofs.append(prove_cover("output rows < QG stored once", st_dom, [FloorDiv(out_el, d), Mod(out_el, d)], [qg, d], where=keep, image=f"QG={qg} rows x {d}"))
    proofs.append(same_map("stored output == PV result (query, dim)", st_dom, [FloorDiv(out_el, d), Mod(out_el, d)], [o_col, h * pv.m + o_row]))
    proofs.append(prove_cover("exp_sums/max_logits rows < QG (lane group 0 of 4 identical)", {lane: wave}, [at(r16)], [qg], where=sympy.And(keep, sympy.Eq(at(g4), 0)), image=f"QG={qg} rows"))
    return tuple(proofs)
