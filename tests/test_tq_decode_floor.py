"""benchmarks/tq_decode_floor.py on CPU under the interpreter: each floor form's per-program
checksum is the sum of exactly the bytes the decode reads for that program (each live token's K
and V records and fp16 metadata of its kv head, from operators.md §2's layout, enumerated byte by
byte here), on ragged sequences; a byte set off by one token or one tile fails the comparison."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import tq_decode_floor as floor
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

HK = 2
MAX_BLOCKS = 24  # 384 tokens at BS 16: partition_plan gives 2 partitions of one 256-token group
# Empty, one token, around a block's end, neither a multiple of 64 nor of 256 (in the first and
# in the second partition), the whole table, and past the table (the decode clamps it).
SEQ_LENS = [0, 1, 15, 16, 17, 100, 300, 384, 500]


def _inputs(decode, seed=0, max_blocks=MAX_BLOCKS):
    """Random cache bytes; each sequence's blocks drawn at random, its table entries past the
    sequence pointing at decoy blocks no sequence uses (read, they change the checksum)."""
    g = torch.Generator().manual_seed(seed)
    num_seqs = len(SEQ_LENS)
    num_blocks = num_seqs * max_blocks + 4
    cache = torch.randint(
        0, 256, (num_blocks, decode.cache_block_bytes(HK)), generator=g, dtype=torch.uint8
    )
    table = torch.randperm(num_blocks - 4, generator=g).view(num_seqs, max_blocks).int()
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32)
    used = (seq_lens.long() + decode.BS - 1) // decode.BS
    decoys = num_blocks - 4 + torch.randint(0, 4, table.shape, generator=g)
    table = torch.where(torch.arange(max_blocks) < used[:, None], table, decoys.int())
    return cache, table, seq_lens


def _token_offsets(decode, hk, table, seq, token, kv_head):
    """Byte offsets in the flat cache of one token of one kv head, from operators.md §2: its K
    and V nibble records (d/2 bytes each, in that order), then K norm, V scale and V zero (fp16
    each, field-major: [kv head][field][slot] after the data region)."""
    d, bs = decode.HEAD_DIM, decode.BS
    block, slot = int(table[seq, token // bs]), token % bs
    base = block * (bs * hk * d + hk * 3 * bs * 2)
    record = [base + (slot * hk + kv_head) * d + i for i in range(d)]
    meta = [base + bs * hk * d + ((kv_head * 3 + f) * bs + slot) * 2 for f in range(3)]
    return record, meta


def _expected(decode, cache, table, seq_lens, partitions, tile_groups, live=None):
    """int32 [num_seqs, Hk, P]: per program, the wrapping sum of its tokens' records as
    little-endian int32 words and of their metadata as int16, enumerated token by token. live
    (bool [num_seqs, tokens]) overrides which tokens count: the mutation checks."""
    flat = cache.reshape(-1).long()
    span = tile_groups * decode.GROUP
    num_tokens = table.shape[1] * decode.BS
    out = torch.zeros(len(seq_lens), HK, partitions, dtype=torch.int64)
    for seq in range(len(seq_lens)):
        for token in range(num_tokens):
            counted = token < seq_lens[seq] if live is None else live[seq, token]
            if not counted:
                continue
            for kv_head in range(HK):
                record, meta = _token_offsets(decode, HK, table, seq, token, kv_head)
                assert len(record) + 2 * len(meta) == decode.HEAD_DIM + 6  # 134 B at d128
                b = flat[torch.tensor(record)].view(-1, 4)
                words = b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16 | b[:, 3] << 24
                words = torch.where(words >= 2**31, words - 2**32, words)
                lo, hi = flat[torch.tensor(meta)], flat[torch.tensor(meta) + 1]
                halves = lo | hi << 8
                halves = torch.where(halves >= 2**15, halves - 2**16, halves)
                out[seq, kv_head, token // span] += words.sum() + halves.sum()
    return floor.wrap_int32(out)


def _run(decode, cache, table, seq_lens, partitions, tile_groups, form, tile=None):
    geo = floor.geometry(decode, tile)
    out = torch.full((len(seq_lens), HK, partitions), 0x5A5A5A5A, dtype=torch.int32)
    floor.stream_floor(geo, cache, table, seq_lens, out, HK, tile_groups, form)
    return out


@pytest.fixture(scope="module")
def d128():
    decode = floor.load("tq_decode_triton_d128_qg8_bs16")
    cache, table, seq_lens = _inputs(decode)
    partitions, tile_groups = decode.partition_plan(MAX_BLOCKS)
    assert (partitions, tile_groups) == (2, 1)
    want = _expected(decode, cache, table, seq_lens, partitions, tile_groups)
    return decode, cache, table, seq_lens, want


def test_torch_checksums_are_the_enumerated_bytes(d128):
    """What the benchmark checks the GPU runs against (token_sums, program_checksums) is the
    byte-by-byte enumeration, for the plan's partitions and for others."""
    decode, cache, table, seq_lens, want = d128
    geo = floor.geometry(decode)
    assert geo.token_bytes == 134
    sums = floor.token_sums(cache, table, HK, geo)
    live = floor.live_tokens(seq_lens, sums.shape[1])
    assert torch.equal(floor.program_checksums(sums, live, 2, geo.group), want)
    for partitions, tile_groups in ((1, 2), (4, 1)):
        assert torch.equal(
            floor.program_checksums(sums, live, partitions, tile_groups * geo.group),
            _expected(decode, cache, table, seq_lens, partitions, tile_groups),
        )


@pytest.mark.parametrize("form", list(floor.FORMS))
def test_each_form_reads_exactly_the_decode_s_bytes(d128, form):
    decode, cache, table, seq_lens, want = d128
    got = _run(decode, cache, table, seq_lens, 2, 1, form)
    floor.check(got, want, form)
    # Every program with tokens read something; the others stored 0.
    has_tokens = torch.tensor(SEQ_LENS)[:, None] > torch.arange(2) * decode.GROUP  # [seq, part]
    assert (got.transpose(1, 2)[has_tokens] != 0).all() and (
        got.transpose(1, 2)[~has_tokens] == 0
    ).all()


@pytest.mark.parametrize(
    "form, partitions, tile_groups, tile",
    [
        ("ahead1", 1, 2, None),  # one partition of two groups: 6 tiles in a row
        ("plain", 4, 1, None),  # partitions 2 and 3 empty: they read nothing and store 0
        ("ahead1", 2, 1, 128),  # 4 chunks a tile, as the decode's single-group launches
        ("staged", 2, 1, 128),
    ],
)
def test_other_partitions_and_tiles(d128, form, partitions, tile_groups, tile):
    decode, cache, table, seq_lens, _ = d128
    got = _run(decode, cache, table, seq_lens, partitions, tile_groups, form, tile)
    want = _expected(decode, cache, table, seq_lens, partitions, tile_groups)
    floor.check(got, want, form)
    if partitions == 4:
        assert (got[:, :, 2:] == 0).all()


@pytest.mark.parametrize("form", ["ahead1", "ahead1_kv"])
def test_d64_bs32(form):
    """d64 loads 8-byte K vectors and one V word a lane; 32-token blocks take two 16-token runs."""
    decode = floor.load("tq_decode_triton_d64_qg4_bs32")
    geo = floor.geometry(decode)
    assert (geo.k_vec, geo.k_words, geo.v_words, geo.tile, geo.token_bytes) == (8, 2, 1, 128, 70)
    max_blocks = 12  # 384 tokens again
    cache, table, seq_lens = _inputs(decode, seed=1, max_blocks=max_blocks)
    partitions, tile_groups = decode.partition_plan(max_blocks)
    got = _run(decode, cache, table, seq_lens, partitions, tile_groups, form)
    floor.check(got, _expected(decode, cache, table, seq_lens, partitions, tile_groups), form)


def test_a_wrong_byte_set_fails_the_check(d128):
    """The comparison catches a floor that reads one token past seq_len or drops one tile: the
    checksums of those byte sets differ from what the floor reads, and a floor run that really
    reads one more token per sequence fails against the right set."""
    decode, cache, table, seq_lens, want = d128
    got = _run(decode, cache, table, seq_lens, 2, 1, "ahead1")
    floor.check(got, want, "ahead1")
    num_tokens = MAX_BLOCKS * decode.BS
    live = torch.arange(num_tokens) < seq_lens.long()[:, None]

    past = live | (torch.arange(num_tokens) == seq_lens.long()[:, None])  # one token past seq_len
    with pytest.raises(AssertionError, match="program checksums differ"):
        floor.check(got, _expected(decode, cache, table, seq_lens, 2, 1, past), "one past")

    dropped = live.clone()
    dropped[6, 256:320] = False  # seq 6 (300 tokens): the first tile of its second partition
    wrong = _expected(decode, cache, table, seq_lens, 2, 1, dropped)
    assert (wrong != want).sum() == HK  # that sequence's second partition, every kv head
    with pytest.raises(AssertionError, match="program checksums differ"):
        floor.check(got, wrong, "one tile dropped")

    longer = _run(decode, cache, table, seq_lens + 1, 2, 1, "ahead1")
    with pytest.raises(AssertionError, match="program checksums differ"):
        floor.check(longer, want, "seq_lens + 1")


@pytest.mark.parametrize("words", [1024, 1000])
def test_contiguous_reference(words):
    g = torch.Generator().manual_seed(2)
    data = torch.randint(-(2**31), 2**31, (words,), generator=g, dtype=torch.int64).int()
    schedule = (128, 4, 4)
    out = torch.zeros(floor.contiguous_programs(data, schedule), dtype=torch.int32)
    floor.contiguous_floor(data, out, schedule)
    want = floor.contiguous_checksums(data, schedule)
    assert out.shape == want.shape == (2,)
    floor.check(out, want, "contiguous")
    assert floor.wrap_int32(data.long().sum().view(1)) == floor.wrap_int32(
        want.long().sum().view(1)
    )


def test_unsupported_variant_is_refused():
    with pytest.raises(ValueError, match="K_VEC"):
        floor.geometry(floor.load("tq_decode_triton_d256_qg4_bs16"))


def test_help_needs_no_gpu():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tq_decode_floor.py"), "--help"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "--configs" in result.stdout and "--warps" in result.stdout
