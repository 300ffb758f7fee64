"""The PTX of the Triton TQ decode's nibble unpacking, run exhaustively on a model of its instructions.

Compiled for NVIDIA, the generated decode unpacks K nibbles into bf16 codebook entries and V
nibbles into fp16 levels with inline PTX. The chunked form takes two int32 words per call and
pairs them nibble by nibble: _unpack_k_pairs and _unpack_v_words; in long partitions its K
lookup reads a byte-pair table in shared memory instead, filled by _k_pair_table and read by
_table_k_pairs (modelled here with a shared memory and a lane id per lane). The shared-tile form
takes a word of 4 packed bytes per call: _unpack_k and _unpack_v. The interpreter runs the plain Triton
arm instead, so CI's numerics never execute the PTX.
Here the asm text of the generated module is parsed and every instruction it uses is modelled on
numpy arrays (one lane per input word). The two halves of a word take separate paths, so each
half runs through all 65536 packed byte pairs (the other half a permutation of them), through the
exact text that ships, against the codebook and the level arithmetic. The H200 runs it for real
(benchmarks/RESULTS.md).
"""

from __future__ import annotations

import ast
import re

import numpy as np
import pytest

from conftest import ROOT
from kgen.reference import tq as ref

DECODE = ROOT / "generated" / "tq_decode" / "tq_decode_triton_d128_qg8_bs16.py"  # chunked form
SHARED_TILE = ROOT / "generated" / "tq_decode" / "tq_decode_triton_d128_qg16_bs16.py"
ALL_PAIRS = np.arange(1 << 16, dtype=np.uint32)  # two packed bytes: b0 | b1 << 8
# One word of 4 packed bytes per lane: every pair in the low half, a permutation of them in the high half.
WORDS = ALL_PAIRS | np.random.default_rng(1).permutation(ALL_PAIRS) << 16


def _inline_asm(source: str, function: str, which: int = 0) -> tuple[str, str, int]:
    """(asm text, constraints, pack) of the `which`-th tl.inline_asm_elementwise call inside
    `function` (positional or keyword asm and constraints)."""
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "inline_asm_elementwise"]
    call = sorted(calls, key=lambda n: (n.lineno, n.col_offset))[which]
    kw = {k.arg: k.value for k in call.keywords}
    kw.update(zip(("asm", "constraints", "args"), call.args))
    constant = lambda node: eval(compile(ast.Expression(node), "<asm>", "eval"), {"__builtins__": {}})  # noqa: E731
    return constant(kw["asm"]), constant(kw["constraints"]), constant(kw["pack"])


def _prmt(a, b, sel):
    """prmt.b32 default mode: byte i of the result is byte sel[i] & 7 of {b, a}, sign-replicated when sel[i] & 8."""
    sel = np.broadcast_to(np.asarray(sel, dtype=np.uint32), np.shape(a))
    pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = np.zeros_like(a)
    for i in range(4):
        s = (sel >> (4 * i)) & 0xF
        byte = np.choose((s & 7).astype(np.int64), pool)
        byte = np.where(s & 8, np.where(byte & 0x80, 0xFF, 0), byte)
        out |= byte.astype(np.uint32) << (8 * i)
    return out


def _lop3(a, b, c, lut):
    out = np.zeros_like(a)
    for bit in range(8):  # minterm `bit` of (a, b, c) with weights 0xF0, 0xCC, 0xAA
        if lut >> bit & 1:
            ta = a if bit & 4 else ~a
            tb = b if bit & 2 else ~b
            tc = c if bit & 1 else ~c
            out |= ta & tb & tc
    return out


def _f16x2(op, *regs):
    """An fp16x2 operation, exact in float64 and rounded once to fp16 per lane (.rn)."""
    lanes = []
    for shift in (0, 16):
        vals = [((r >> shift) & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64) for r in regs]
        lanes.append(op(*vals).astype(np.float16).view(np.uint16).astype(np.uint32) << shift)
    return lanes[0] | lanes[1]


OPS = {
    "and.b32": lambda a, b: a & b,
    "shl.b32": lambda a, b: (a << b) & 0xFFFFFFFF,
    "shr.b32": lambda a, b: a >> b,
    "mov.b32": lambda a: a,
    "mov.u32": lambda a: a,
    "add.u32": lambda a, b: (a + b) & 0xFFFFFFFF,
    "mad.lo.u32": lambda a, b, c: (a * b + c) & 0xFFFFFFFF,
    "prmt.b32": _prmt,
    "lop3.b32": lambda a, b, c, lut: _lop3(a, b, c, int(lut[0])),
    "sub.f16x2": lambda a, b: _f16x2(lambda x, y: x - y, a, b),
    "fma.rn.f16x2": lambda a, b, c: _f16x2(lambda x, y, z: x * y + z, a, b, c),
}


class SharedMemory:
    """Shared memory as 32-bit words from byte address `base` on; every word starts as a sentinel
    no table entry equals (the lookups must only read what the fill wrote)."""

    SENTINEL = 0xDEADBEEF

    def __init__(self, base: int, size: int):
        self.base, self.words = base, np.full(size // 4, self.SENTINEL, dtype=np.uint32)

    def index(self, address: np.ndarray) -> np.ndarray:
        assert np.all(address % 4 == 0), "unaligned shared access"
        i = (address.astype(np.int64) - self.base) // 4
        assert np.all((i >= 0) & (i < len(self.words))), "shared access outside the table"
        return i


def run_ptx(asm: str, operands: dict[str, np.ndarray], shared: SharedMemory | None = None, lane: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Run the straight-line asm over lanes; operands maps "$n" to uint32 arrays (outputs come back).
    `shared` serves ld.shared / st.shared.v4 (32-bit words), `lane` gives each lane's %laneid."""
    regs = dict(operands)
    if lane is not None:
        regs["%laneid"] = lane.astype(np.uint32)
    shape = next(iter(operands.values())).shape
    for line in asm.splitlines():
        for statement in line.split("//")[0].split(";"):
            statement = statement.strip()
            if not statement or statement in "{}" or statement.startswith((".reg", "{ .reg")):
                continue
            opcode, rest = statement.split(None, 1)
            if opcode == "st.shared.v4.u32":  # [address], {a, b, c, d}
                address, values = re.fullmatch(r"\[(\S+)\],\s*\{(.*)\}", rest).groups()
                at = shared.index(regs[address])
                for k, v in enumerate(v.strip() for v in values.split(",")):
                    shared.words[at + k] = regs[v]
                continue
            if opcode == "ld.shared.u32":  # dest, [address]
                dest, address = re.fullmatch(r"(\S+),\s*\[(\S+)\]", rest).groups()
                regs[dest] = shared.words[shared.index(regs[address])]
                continue
            if opcode not in OPS:
                raise AssertionError(f"instruction outside the model: {opcode} (extend OPS or the test)")
            dest, *args = [a.strip() for a in rest.split(",")]
            values = [regs[a] if a in regs else np.full(shape, int(a, 0), dtype=np.uint32) for a in args]
            regs[dest] = OPS[opcode](*values).astype(np.uint32)
    return regs


def _table_operands(constraints: str, pack: int, words: list[int], first: int) -> dict[str, np.ndarray]:
    """Each 32-bit argument appears `pack` times in the operand list, from $first on."""
    assert constraints.count("r") - constraints.count("=r") == 1 + pack * len(words)
    return {f"${first + pack * i + j}": np.full_like(WORDS, w) for i, w in enumerate(words) for j in range(pack)}


def _codebook_words(codebook: np.ndarray) -> list[int]:
    """The byte planes rotate_query stores (low bytes, then high bytes), read as 8 little-endian words."""
    bits = codebook.astype(np.float32).view(np.uint32) >> 16  # bf16 bits (the test codebooks are exact in bf16)
    planes = np.concatenate([bits & 0xFF, bits >> 8]).astype(np.uint8)
    return [int(w) for w in planes.view("<u4")]


def _halves():
    """(bytes 0 and 1, bytes 2 and 3) of every lane's word."""
    return [((WORDS >> shift) & 0xFF, (WORDS >> (shift + 8)) & 0xFF) for shift in (0, 16)]


def check_unpack_k(asm, constraints, pack, codebook):
    """Outputs: $0, $1 the low nibbles' entries of bytes (0, 1) and (2, 3); $2, $3 the high nibbles'
    (an output the text never writes fails)."""
    out = run_ptx(asm, {"$4": WORDS, **_table_operands(constraints, pack, _codebook_words(codebook), 5)})
    bits = (codebook.astype(np.float32).view(np.uint32) >> 16).astype(np.uint32)
    ok = True
    for half, (b0, b1) in enumerate(_halves()):
        low = bits[b0 & 15] | bits[b1 & 15] << 16  # element 2j of both bytes' records
        high = bits[b0 >> 4] | bits[b1 >> 4] << 16
        ok &= np.array_equal(out.get(f"${half}"), low) and np.array_equal(out.get(f"${half + 2}"), high)
    return ok


def check_unpack_k_pairs(asm, constraints, pack, codebook):
    """$0..$7: the bf16 entry of nibble n (byte n // 2, low first) of word $8 in the low half, of
    word $9 in the high half; the 8 table words are $10, $12, ... (each with its packed copy)."""
    assert (constraints, pack) == ("=r,=r,=r,=r,=r,=r,=r,=r,r,r" + ",r" * 16, 2)
    a, b = _word_pairs()
    tables = {f"${10 + 2 * i + j}": np.full_like(a, w) for i, w in enumerate(_codebook_words(codebook)) for j in range(2)}
    out = run_ptx(asm, {"$8": a, "$9": b, **tables})
    bits = (codebook.astype(np.float32).view(np.uint32) >> 16).astype(np.uint32)
    ok = True
    for n in range(8):
        shift = 4 * n
        ok &= np.array_equal(out.get(f"${n}"), bits[(a >> shift) & 15] | bits[(b >> shift) & 15] << 16)
    return ok


TABLE_BASE = 0x400  # where the model puts the table (the kernel's address is ptxas's choice)


def _pair_entries(codebook: np.ndarray) -> np.ndarray:
    """What _k_pair_table's Triton code hands the fill, per byte value b: bf16 c[b & 15] | c[b >> 4] << 16."""
    bits = (codebook.astype(np.float32).view(np.uint32) >> 16).astype(np.uint32)
    b = np.arange(256)
    return (bits[b & 15] | bits[b >> 4] << 16).astype(np.uint32)


def fill_pair_table(source: str, codebook: np.ndarray, fill_lanes: np.ndarray, fill_asm: str | None = None) -> SharedMemory:
    """_k_pair_table's fill, each table row b written by a lane whose %laneid is fill_lanes[b] (the
    layout decides which lane writes which row; any must do)."""
    declare, constraints, _ = _inline_asm(source, "_k_pair_table", 0)
    size = int(re.search(r"\.b8 k_pair_table\[(\d+)\]", declare).group(1))
    row = size // 256
    fill, constraints, pack = _inline_asm(source, "_k_pair_table", 1)
    assert (constraints, pack) == ("=r,r,r", 1)
    shared = SharedMemory(TABLE_BASE, size)
    rows = (TABLE_BASE + np.arange(256) * row).astype(np.uint32)
    run_ptx(fill_asm or fill, {"$1": _pair_entries(codebook), "$2": rows}, shared, lane=fill_lanes)
    return shared


def check_table_k_pairs(source, codebook, fill_lanes, lookup_asm=None, lane_asm=None, fill_asm=None):
    """$0..$7: output 2b + h is the pair (c[low], c[high]) of byte b of word h ($8, $9), read by each
    lane (%laneid = index % 32) through its own copy; the lane's base from _k_pair_table's last asm."""
    shared = fill_pair_table(source, codebook, fill_lanes, fill_asm)
    a, b = _word_pairs()
    lane = np.arange(len(a)) % 32
    lane_base, constraints, pack = _inline_asm(source, "_k_pair_table", 2)
    assert (constraints, pack) == ("=r,r", 1)
    base = run_ptx(lane_asm or lane_base, {"$1": np.full_like(a, TABLE_BASE)}, lane=lane)["$0"]
    asm, constraints, pack = _inline_asm(source, "_table_k_pairs")
    assert (constraints, pack) == ("=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", 2)
    out = run_ptx(lookup_asm or asm, {"$8": a, "$9": b, "$10": base, "$11": base}, shared, lane=lane)
    entries = _pair_entries(codebook)
    return all(np.array_equal(out.get(f"${2 * byte + h}"), entries[(word >> (8 * byte)) & 0xFF]) for byte in range(4) for h, word in enumerate((a, b)))


def check_unpack_v(asm, mid):
    """Outputs as check_unpack_k's, fp16 levels n - mid."""
    out = run_ptx(asm, {"$4": WORDS})

    def levels(n0, n1):
        f = lambda n: (n.astype(np.float64) - mid).astype(np.float16).view(np.uint16).astype(np.uint32)  # noqa: E731
        return f(n0) | f(n1) << 16

    ok = True
    for half, (b0, b1) in enumerate(_halves()):
        ok &= np.array_equal(out.get(f"${half}"), levels(b0 & 15, b1 & 15))
        ok &= np.array_equal(out.get(f"${half + 2}"), levels(b0 >> 4, b1 >> 4))
    return ok


def _word_pairs():
    """Two words per lane whose byte i pairs, over the lanes, take every (a, b) byte pair, with a
    different pairing at each byte position (so reading the wrong byte shows)."""
    a = b = np.zeros_like(ALL_PAIRS)
    for i in range(4):
        a = a | ((ALL_PAIRS + 37 * i) & 0xFF) << (8 * i)
        b = b | (((ALL_PAIRS >> 8) + 53 * i) & 0xFF) << (8 * i)
    return a.astype(np.uint32), b.astype(np.uint32)


def check_unpack_v_words(asm, constraints, pack, mid, fp16_1024_bits=0x6400):
    """$0..$7: nibble n (byte n // 2, low first) of word $8 in the low half, of word $9 in the high
    half, as fp16 levels n - mid; $10 (and its packed copy $11) holds 1024 in both fp16 halves."""
    assert (constraints, pack) == ("=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", 2)
    a, b = _word_pairs()
    out = run_ptx(asm, {"$8": a, "$9": b, "$10": np.full_like(a, fp16_1024_bits * 0x10001), "$11": np.full_like(a, fp16_1024_bits * 0x10001)})
    f = lambda n: (n.astype(np.float64) - mid).astype(np.float16).view(np.uint16).astype(np.uint32)  # noqa: E731
    ok = True
    for n in range(8):
        shift = 4 * n
        ok &= np.array_equal(out.get(f"${n}"), f((a >> shift) & 15) | f((b >> shift) & 15) << 16)
    return ok


def _codebooks():
    rng = np.random.default_rng(0)
    lloyd = ref.lloyd_max_centroids(128).numpy()
    shuffled = rng.permutation(lloyd)  # unsorted: the lookup must not lean on order
    wide = rng.standard_normal(16) * np.exp2(rng.integers(-20, 20, 16))  # every byte value range, both signs
    return [(name, _round_bf16(c)) for name, c in (("lloyd-max", lloyd), ("shuffled", shuffled), ("wide", wide))]


def _round_bf16(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.view(np.float32)


@pytest.fixture(scope="module")
def source():
    return DECODE.read_text()


@pytest.mark.parametrize("name,codebook", _codebooks(), ids=lambda x: x if isinstance(x, str) else "")
def test_k_unpack_looks_up_every_nibble_pair(name, codebook):
    asm, constraints, pack = _inline_asm(SHARED_TILE.read_text(), "_unpack_k")
    assert pack == 4
    assert check_unpack_k(asm, constraints, pack, codebook), name


@pytest.mark.parametrize("name,codebook", _codebooks(), ids=lambda x: x if isinstance(x, str) else "")
def test_k_pair_unpack_looks_up_every_nibble_of_both_words(source, name, codebook):
    asm, constraints, pack = _inline_asm(source, "_unpack_k_pairs")
    assert check_unpack_k_pairs(asm, constraints, pack, codebook), name


FILL_LANES = {
    "row b by lane b % 32": np.arange(256) % 32,
    "by lane b // 8": np.arange(256) // 8,
    "random lanes": np.random.default_rng(2).integers(0, 32, 256),
}


@pytest.mark.parametrize("fill", FILL_LANES, ids=str)
@pytest.mark.parametrize("name,codebook", _codebooks(), ids=lambda x: x if isinstance(x, str) else "")
def test_k_pair_table_looks_up_every_byte_of_both_words(source, name, codebook, fill):
    """Every lane reads its own copy (a sentinel in any copy the fill missed fails), for every
    byte pair at each byte position, whichever lanes wrote the rows."""
    assert check_table_k_pairs(source, codebook, FILL_LANES[fill]), (name, fill)


def test_k_pair_table_reads_of_a_warp_hit_distinct_banks(source):
    """The point of one copy per lane: whatever bytes 32 lanes look up, their addresses lie in 32
    distinct banks (4-byte words, 32 banks), so a warp's read is one shared-memory wavefront."""
    lane_base, _, _ = _inline_asm(source, "_k_pair_table", 2)
    lane = np.arange(32)
    base = run_ptx(lane_base, {"$1": np.full(32, TABLE_BASE, dtype=np.uint32)}, lane=lane)["$0"]
    asm, _, _ = _inline_asm(source, "_table_k_pairs")
    rng = np.random.default_rng(3)
    for _ in range(64):
        words = rng.integers(0, 1 << 32, (2, 32), dtype=np.uint64).astype(np.uint32)
        regs = run_ptx(asm.replace("ld.shared.u32", "mov.u32 ").replace("[row]", "row"), {"$8": words[0], "$9": words[1], "$10": base, "$11": base})
        for out in range(8):  # the addresses each read went to (the model's mov stands in for the read)
            assert len(set(((regs[f"${out}"] // 4) % 32).tolist())) == 32


def _v_level_mid(source: str) -> int:
    return int(re.search(r"^V_LEVEL_MID = (\d+)$", source, re.M).group(1))


def test_v_word_unpack_gives_every_centred_level_pair(source):
    asm, constraints, pack = _inline_asm(source, "_unpack_v_words")
    assert _v_level_mid(source) == 8
    assert check_unpack_v_words(asm, constraints, pack, mid=_v_level_mid(source))


def test_v_unpack_gives_every_centred_level():
    source = SHARED_TILE.read_text()
    asm, constraints, pack = _inline_asm(source, "_unpack_v")
    assert (constraints, pack) == ("=r,=r,=r,=r,r", 4)
    assert _v_level_mid(source) == 8
    assert check_unpack_v(asm, mid=_v_level_mid(source))


@pytest.mark.parametrize(
    "function,old,new",
    [
        ("_unpack_k", "0x6240", "0x6420"),  # entries of the wrong nibbles
        ("_unpack_k", "0x7777", "0xFFFF"),  # top bits left in the selectors: sign-replicated bytes
        ("_unpack_k", "lop3.b32 low, a, b, upper, 0xD8", "lop3.b32 low, a, b, upper, 0xE4"),  # halves swapped
        ("_unpack_k", "shr.b32 word, $4, 16", "shr.b32 word, $4, 8"),  # the second half from the wrong bytes
        ("_unpack_k", "prmt.b32 $3, low, high, 0x7351", "prmt.b32 $2, low, high, 0x7351"),  # an output written twice
        ("_unpack_k_pairs", "$8, $9, 0x51", "$9, $8, 0x51"),  # the two words swapped in one pair
        ("_unpack_k_pairs", "$8, $9, 0x62", "$8, $9, 0x51"),  # byte 2 never read
        ("_unpack_k_pairs", "prmt.b32 a, $18, $20, sel", "prmt.b32 a, $18, $18, sel"),  # a table word lost
        ("_unpack_k_pairs", "prmt.b32 $5, low, high, 0x7351", "prmt.b32 $4, low, high, 0x7351"),  # an output written twice
        ("_unpack_v", "0xFFF0FFF0", "0xFFF8FFF8"),  # part of the low nibble kept in the high level
        ("_unpack_v", "sub.f16x2 t, whole, low_offset", "sub.f16x2 t, low_offset, whole"),
        ("_unpack_v", "exponent, 0x4342", "exponent, 0x4140"),  # bytes 2 and 3 never read
        ("_unpack_v_words", "$8, $9, 0x0501", "$8, $9, 0x0400"),  # byte 1 never read
        ("_unpack_v_words", "$8, $9, 0x0602", "$9, $8, 0x0602"),  # the two words swapped in one pair
        ("_unpack_v_words", "0x00F000F0", "0x00F800F8"),  # a low-nibble bit kept in the high level
        ("_unpack_v_words", "sub.f16x2 $6, low, low_centre", "sub.f16x2 $7, low, low_centre"),  # an output written twice
    ],
)
def test_planted_ptx_bugs_fail(source, function, old, new):
    """Each planted bug, in one place (the first where the text occurs twice), fails the check."""
    if function in ("_unpack_v", "_unpack_k"):
        source = SHARED_TILE.read_text()
    asm, constraints, pack = _inline_asm(source, function)
    assert asm.count(old) >= 1, old
    bad = asm.replace(old, new, 1)
    codebook = _codebooks()[2][1]
    mid = _v_level_mid(source)
    if function == "_unpack_k":
        ok = check_unpack_k(bad, constraints, pack, codebook)
    elif function == "_unpack_k_pairs":
        ok = check_unpack_k_pairs(bad, constraints, pack, codebook)
    elif function == "_unpack_v_words":
        ok = check_unpack_v_words(bad, constraints, pack, mid)
    else:
        ok = check_unpack_v(bad, mid=mid)
    assert not ok


@pytest.mark.parametrize(
    "where,old,new",
    [
        ("lookup", "$9, 0, 0x4441", "$9, 0, 0x4440"),  # byte 1 of word 1 never read
        ("lookup", "$9, 0, 0x4442", "$8, 0, 0x4442"),  # word 0 read for word 1
        ("lookup", "ld.shared.u32 $3, [row]", "ld.shared.u32 $2, [row]"),  # an output written twice
        ("lookup", "mad.lo.u32 row, byte, 128, $10", "mad.lo.u32 row, byte, 64, $10"),  # rows of the wrong pitch
        ("lane", "mad.lo.u32 $0, lane, 4, $1", "mad.lo.u32 $0, lane, 0, $1"),  # every lane on copy 0: right values, but see the bank test
        ("fill", "and.b32 slot, slot, 7", "and.b32 slot, slot, 3"),  # half of each row's copies never written
        ("fill", "add.u32 slot, lane, 7", "add.u32 slot, lane, 6"),  # one 16-byte slot missed by some lanes' rows
    ],
)
def test_planted_pair_table_bugs_fail(source, where, old, new):
    codebook = _codebooks()[2][1]
    lookup, lane, fill = (_inline_asm(source, f, i)[0] for f, i in (("_table_k_pairs", 0), ("_k_pair_table", 2), ("_k_pair_table", 1)))
    text = {"lookup": lookup, "lane": lane, "fill": fill}[where]
    assert text.count(old) >= 1, old
    bad = text.replace(old, new, 1)
    if where == "lane":  # copy 0 holds the right entries: only the bank spread tells
        base = run_ptx(bad, {"$1": np.full(32, TABLE_BASE, dtype=np.uint32)}, lane=np.arange(32))["$0"]
        assert len(set(((base // 4) % 32).tolist())) < 32
        return
    ok = check_table_k_pairs(source, codebook, FILL_LANES["random lanes"], **{f"{where}_asm": bad})
    assert not ok


def test_every_decode_variant_ships_the_same_ptx():
    """The PTX is variant-independent (4-bit fields, 16 centroids): one exhaustive run covers all.
    The chunked variants have _unpack_k_pairs, the pair table's _k_pair_table and _table_k_pairs,
    and _unpack_v_words; the shared-tile ones _unpack_k and _unpack_v."""
    texts = {f: set() for f in ("_unpack_k_pairs", "_k_pair_table", "_table_k_pairs", "_unpack_v_words", "_unpack_k", "_unpack_v")}
    for p in (ROOT / "generated" / "tq_decode").glob("tq_decode_triton_*.py"):
        source = p.read_text()
        present = [f for f in texts if f"def {f}(" in source]
        assert present in (["_unpack_k_pairs", "_k_pair_table", "_table_k_pairs", "_unpack_v_words"], ["_unpack_k", "_unpack_v"]), (p.name, present)
        for f in present:
            texts[f].add(tuple(_inline_asm(source, f, i)[0] for i in range(3 if f == "_k_pair_table" else 1)))
    assert all(len(t) == 1 for t in texts.values()), {f: len(t) for f, t in texts.items()}


def test_model_of_prmt_and_lop3():
    """The model itself, on cases worked from the PTX ISA's definitions of prmt (default mode) and lop3."""
    a, b = np.array([0x33221100], dtype=np.uint32), np.array([0x77665544], dtype=np.uint32)
    assert _prmt(a, b, 0x3210)[0] == 0x33221100
    assert _prmt(a, b, 0x7654)[0] == 0x77665544
    assert _prmt(a, b, 0x4040)[0] == 0x44004400
    neg = np.array([0x000080FF], dtype=np.uint32)
    assert _prmt(neg, np.zeros(1, np.uint32), 0x9810)[0] == 0xFFFF80FF  # bit 3: replicate the sign of byte 1, byte 0
    assert _lop3(np.array([0xF0], np.uint32), np.array([0xCC], np.uint32), np.array([0xAA], np.uint32), 0xD8)[0] == 0xD8
