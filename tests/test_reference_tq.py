"""Tests for the TurboQuant decode reference (kgen.reference.tq)."""

import math

import numpy as np
import pytest
import torch

from kgen.reference.tq import (
    allocate_cache,
    cache_block_bytes,
    decode_attention,
    decode_attention_partitioned,
    gather_dequantized,
    hadamard_rotation,
    lloyd_max_centroids,
    merge_partitions,
    store,
)

# operators.md section 2, positive half for d = 128 (upstream's numbers).
OPS_TABLE_128 = [0.01135, 0.03431, 0.05806, 0.08330, 0.11104, 0.14300, 0.18283, 0.24138]
# J. Max (1960), 16-level Lloyd-Max quantizer of N(0, 1), positive half: an independent check.
MAX_1960_STD = [0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6180, 2.0690, 2.7326]


# ----------------------------------------------------------------------------- helpers


def unpack_slot(cache, slot, head, block_size, num_kv_heads, head_dim):
    """Independent byte-level decode of one (slot, kv head): plain integer offsets and numpy."""
    row = cache[slot // block_size].numpy()
    off = slot % block_size
    base = (off * num_kv_heads + head) * head_dim
    kbytes, vbytes = row[base: base + head_dim // 2], row[base + head_dim // 2: base + head_dim]

    def nibbles(bs):
        out = []
        for b in bs.tolist():
            out += [b & 0xF, b >> 4]  # element 2j = low nibble, 2j+1 = high nibble
        return np.array(out)

    meta_start = block_size * num_kv_heads * head_dim

    def fp16(field):
        at = meta_start + 2 * ((head * 3 + field) * block_size + off)
        return float(np.frombuffer(row[at: at + 2].tobytes(), dtype=np.float16)[0])

    return nibbles(kbytes), nibbles(vbytes), fp16(0), fp16(1), fp16(2)


def random_kv(seed, num_tokens, num_kv_heads, head_dim, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g) * 2.0 + 0.3
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g) * 1.5 - 0.2
    return k.to(dtype), v.to(dtype)


def build_paged(seed, seq_lens, *, block_size, num_kv_heads, head_dim, extra_blocks=7,
                norm_correction=False):
    """Cache filled with random K/V for ragged sequences, through a shuffled block table.

    Unused block-table entries hold a huge block id, so any dereference past a sequence fails.
    """
    g = torch.Generator().manual_seed(seed)
    nblocks = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(nblocks) + extra_blocks
    perm = torch.randperm(num_blocks, generator=g)
    width = max(max(nblocks), 1)
    table = torch.full((len(seq_lens), width), 10**6, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(nblocks):
        table[i, :nb] = perm[used: used + nb].int()
        used += nb
    cache = allocate_cache(num_blocks, block_size, num_kv_heads, head_dim, "cpu")
    centroids, rotation = lloyd_max_centroids(head_dim), hadamard_rotation(head_dim)
    for i, n in enumerate(seq_lens):
        k, v = random_kv(seed + 100 + i, n, num_kv_heads, head_dim)
        t = torch.arange(n)
        slots = table[i].long()[t // block_size] * block_size + t % block_size
        store(cache, k, v, slots, block_size=block_size, centroids=centroids, rotation=rotation,
              norm_correction=norm_correction)
    return cache, table, torch.tensor(seq_lens, dtype=torch.int32), centroids, rotation


def attention_fp64(query, kv, rotation, num_kv_heads, scale):
    """Direct fp64 softmax attention on the dequantized cache, one query head at a time."""
    num_seqs, num_q_heads, head_dim = query.shape
    qg = num_q_heads // num_kv_heads
    q_rot = query.double() @ rotation.double()
    out = torch.zeros(num_seqs, num_q_heads, head_dim, dtype=torch.float64)
    for i, (k_hat, v_hat) in enumerate(kv):
        if k_hat.shape[0] == 0:
            continue
        for h in range(num_q_heads):
            s = k_hat[:, h // qg].double() @ q_rot[i, h] * scale
            p = torch.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v_hat[:, h // qg].double()
    return out


# ----------------------------------------------------------------------------- quantizer tables


def test_centroids_d128_match_tables():
    c = lloyd_max_centroids(128)
    assert c.dtype == torch.float32 and c.shape == (16,)
    pos = c[8:].double()
    sigma = 1 / math.sqrt(128)
    # Exact Lloyd-Max agrees with Max's classical table to its 4 decimals.
    torch.testing.assert_close(pos, torch.tensor(MAX_1960_STD, dtype=torch.float64) * sigma,
                               atol=1e-5, rtol=0)
    # operators.md's values agree to ~1e-4 (its two outermost entries sit slightly inside the
    # exact optimum: 0.18283 vs 0.182877, 0.24138 vs 0.241529).
    torch.testing.assert_close(pos, torch.tensor(OPS_TABLE_128, dtype=torch.float64),
                               atol=2e-4, rtol=0)
    assert abs(pos[:6] - torch.tensor(OPS_TABLE_128[:6], dtype=torch.float64)).max() < 2e-5


@pytest.mark.parametrize("d", [64, 128, 256])
def test_centroids_sorted_symmetric_scaled(d):
    c = lloyd_max_centroids(d)
    assert torch.all(c[1:] > c[:-1])
    assert torch.equal(c, -c.flip(0))  # exactly symmetric, so the middle midpoint is 0.0
    torch.testing.assert_close(c, lloyd_max_centroids(128) * math.sqrt(128 / d), rtol=1e-5, atol=0)


def test_centroids_are_lloyd_fixed_point():
    """Each centroid is the conditional mean of N(0, 1/d) over its cell (checked numerically)."""
    d = 128
    c = lloyd_max_centroids(d).double()
    sigma = 1 / math.sqrt(d)
    x = torch.linspace(-10 * sigma, 10 * sigma, 2_000_001, dtype=torch.float64)
    w = torch.exp(-0.5 * (x / sigma) ** 2)
    cell = torch.bucketize(x, (c[1:] + c[:-1]) / 2)
    means = torch.bincount(cell, w * x, 16) / torch.bincount(cell, w, 16)
    torch.testing.assert_close(means, c, atol=1e-6, rtol=0)


def test_hadamard():
    for d in (1, 2, 64, 128, 256):
        h = hadamard_rotation(d)
        assert h.dtype == torch.float32 and h.shape == (d, d)
        torch.testing.assert_close(h @ h.T, torch.eye(d), atol=1e-5, rtol=0)
        assert torch.equal(h, h.T)
        assert torch.all(h.abs() == h[0, 0])
    for bad in (0, 96, 3):
        with pytest.raises(ValueError, match="power of two"):
            hadamard_rotation(bad)


def test_block_bytes_and_allocation():
    assert cache_block_bytes(16, 2, 128) == 4288
    assert cache_block_bytes(16, 8, 128) == 16 * 8 * 134
    c = allocate_cache(5, 16, 2, 128, "cpu")
    assert c.dtype == torch.uint8 and c.shape == (5, 4288)


# ----------------------------------------------------------------------------- store


@pytest.mark.parametrize("norm_correction", [False, True])
def test_store_round_trip(norm_correction):
    bs, hk, d, num_blocks = 16, 2, 128, 6
    k, v = random_kv(1, 40, hk, d)
    slots = torch.randperm(num_blocks * bs, generator=torch.Generator().manual_seed(2))[:40]
    centroids, rotation = lloyd_max_centroids(d), hadamard_rotation(d)
    cache = allocate_cache(num_blocks, bs, hk, d, "cpu")
    store(cache, k, v, slots, block_size=bs, centroids=centroids, rotation=rotation,
          norm_correction=norm_correction)

    c64 = centroids.double()
    for t in range(40):
        slot = int(slots[t])
        for h in range(hk):
            kidx, vidx, knorm, vscale, vzero = unpack_slot(cache, slot, h, bs, hk, d)
            kk, vv = k[t, h].double(), v[t, h].double()
            # Key: indices pick the nearest centroid of the rotated unit vector.
            y = (kk / kk.norm()) @ rotation.double()
            dist = (y[:, None] - c64[None, :]).abs()
            assert torch.all(dist[torch.arange(d), torch.from_numpy(kidx)] <= dist.min(1).values + 1e-6)
            k_hat = c64[torch.from_numpy(kidx)] * knorm
            want_norm = kk.norm() / (c64[torch.from_numpy(kidx)].norm() if norm_correction else 1)
            assert knorm == pytest.approx(float(want_norm), rel=1e-3)
            if norm_correction:
                assert float(k_hat.norm()) == pytest.approx(float(kk.norm()), rel=1e-3)
            k_back = k_hat @ rotation.double().T  # undo the rotation
            assert float(torch.cosine_similarity(k_back, kk, dim=0)) > 0.9
            # Value: asymmetric 4-bit; reconstruction within scale/2 (+ fp16 rounding of meta).
            assert vzero == pytest.approx(float(vv.min()), rel=1e-3)
            assert vscale == pytest.approx(float(vv.max() - vv.min()) / 15, rel=1e-3)
            v_hat = torch.from_numpy(vidx).double() * vscale + vzero
            slack = (abs(vzero) + 15 * vscale) * 2**-10
            assert (v_hat - vv).abs().max() <= vscale / 2 + slack


def test_gather_matches_independent_unpack():
    bs, hk, d = 16, 2, 64
    cache, table, seq_lens, centroids, _ = build_paged(3, [5, 33], block_size=bs,
                                                       num_kv_heads=hk, head_dim=d)
    kv = gather_dequantized(cache, table, seq_lens, block_size=bs, num_kv_heads=hk, head_dim=d,
                            centroids=centroids)
    for i, (k_hat, v_hat) in enumerate(kv):
        assert k_hat.shape == v_hat.shape == (int(seq_lens[i]), hk, d)
        assert k_hat.dtype == v_hat.dtype == torch.float32
        for t in range(int(seq_lens[i])):
            slot = int(table[i, t // bs]) * bs + t % bs
            for h in range(hk):
                kidx, vidx, knorm, vscale, vzero = unpack_slot(cache, slot, h, bs, hk, d)
                torch.testing.assert_close(k_hat[t, h], centroids[torch.from_numpy(kidx)] * knorm)
                torch.testing.assert_close(v_hat[t, h],
                                           torch.from_numpy(vidx).float() * vscale + vzero)


def test_store_unsorted_centroids_identity_rotation():
    """Upstream's kernel test setup: random unsorted centroids, identity rotation."""
    bs, hk, d = 16, 2, 64
    g = torch.Generator().manual_seed(14)
    centroids = torch.randn(16, generator=g) * 0.15
    k, v = random_kv(15, 20, hk, d)
    cache = allocate_cache(2, bs, hk, d, "cpu")
    store(cache, k, v, torch.arange(20), block_size=bs, centroids=centroids, rotation=torch.eye(d))
    for t in range(20):
        for h in range(hk):
            kidx = torch.from_numpy(unpack_slot(cache, t, h, bs, hk, d)[0])
            y = k[t, h].double() / k[t, h].double().norm()
            dist = (y[:, None] - centroids.double()[None, :]).abs()
            assert torch.all(dist[torch.arange(d), kidx] <= dist.min(1).values + 1e-6)


def test_store_skips_negative_slots_and_touches_only_its_bytes():
    bs, hk, d, num_blocks = 16, 2, 128, 3
    g = torch.Generator().manual_seed(4)
    cache = torch.randint(0, 256, (num_blocks, cache_block_bytes(bs, hk, d)), generator=g,
                          dtype=torch.uint8)
    before = cache.clone()
    k, v = random_kv(5, 3, hk, d, dtype=torch.bfloat16)
    kw = dict(block_size=bs, centroids=lloyd_max_centroids(d), rotation=hadamard_rotation(d))
    store(cache, k, v, torch.tensor([-1, -1, -1]), **kw)
    assert torch.equal(cache, before)

    store(cache, k, v, torch.tensor([-1, 21, -5]), **kw)  # block 1, offset 5
    changed = (cache != before).nonzero().tolist()
    data = {(1, b) for b in range((5 * hk) * d, (5 * hk + hk) * d)}
    meta = {(1, bs * hk * d + 2 * ((h * 3 + f) * bs + 5) + i)
            for h in range(hk) for f in range(3) for i in range(2)}
    assert {tuple(x) for x in changed} <= data | meta
    assert len(changed) > d  # it did write


def test_nibble_order_and_tie_rule():
    """Identity rotation, k = (-1, 1, 0, ...): indices (0, 15, 7, 7, ...).

    0.0 lies exactly on the midpoint of centroids 7 and 8 and goes to the lower one, 7.
    """
    bs, hk, d = 16, 2, 128
    cache = allocate_cache(2, bs, hk, d, "cpu")
    k = torch.zeros(1, hk, d)
    k[0, :, 0], k[0, :, 1] = -1.0, 1.0
    v = (torch.arange(d) % 16).float().expand(1, hk, d)  # min 0, max 15 -> scale 1, q = v
    store(cache, k, v, torch.tensor([0]), block_size=bs, centroids=lloyd_max_centroids(d),
          rotation=torch.eye(d))
    for h in range(hk):
        kb = cache[0, h * d: h * d + d // 2]
        vb = cache[0, h * d + d // 2: (h + 1) * d]
        assert kb[0] == 0xF0 and torch.all(kb[1:] == 0x77)
        assert vb[0] == 0x10 and vb[1] == 0x32 and vb[7] == 0xFE and vb[8] == 0x10


def test_metadata_offsets_hand_crafted():
    """BS=16, Hk=2, d=128: block bytes 4288, metadata starts at byte 4096, fp16 [head][field][slot]."""
    bs, hk, d = 16, 2, 128
    cache = allocate_cache(3, bs, hk, d, "cpu")
    k = torch.full((1, hk, d), 1e-3)
    k[0, 0, :2] = torch.tensor([3.0, 4.0])  # norm ~5
    k[0, 1, :2] = torch.tensor([5.0, 12.0])  # norm ~13
    v = torch.linspace(-2.0, 13.0, d).repeat(1, hk, 1)
    v[0, 1] = v[0, 1] * 2 + 4  # head 1: min 0, max 30 -> scale 2, zero 0
    v[0, 1, 3] = 1.0
    store(cache, k, v, torch.tensor([2 * bs + 5]), block_size=bs,
          centroids=lloyd_max_centroids(d), rotation=hadamard_rotation(d))
    row = cache[2].numpy()

    def meta(h, f):
        at = 4096 + 2 * ((h * 3 + f) * bs + 5)
        return float(np.frombuffer(row[at: at + 2].tobytes(), dtype=np.float16)[0])

    assert meta(0, 0) == pytest.approx(5.0, rel=1e-3) and meta(1, 0) == pytest.approx(13.0, rel=1e-3)
    assert meta(0, 1) == 1.0 and meta(0, 2) == -2.0
    assert meta(1, 1) == 2.0 and meta(1, 2) == 0.0
    written = np.nonzero(row[4096:])[0] + 4096
    assert set(written.tolist()) <= {4096 + 2 * ((h * 3 + f) * bs + 5) + i
                                      for h in range(2) for f in range(3) for i in range(2)}
    assert not row[: 5 * hk * d].any() and not row[6 * hk * d: 4096].any()
    assert not cache[0].any() and not cache[1].any()


# ----------------------------------------------------------------------------- attention


def make_query(seed, num_seqs, num_q_heads, head_dim):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_seqs, num_q_heads, head_dim, generator=g) * 2


@pytest.mark.parametrize("bs,hk,qg,d,scale", [(16, 2, 4, 128, None), (32, 1, 6, 64, 0.3)])
def test_decode_attention_matches_fp64(bs, hk, qg, d, scale):
    seq_lens = [1, 15, 16, 0, 17, 300]
    cache, table, sl, centroids, rotation = build_paged(6, seq_lens, block_size=bs,
                                                        num_kv_heads=hk, head_dim=d)
    query = make_query(7, len(seq_lens), hk * qg, d)
    out = decode_attention(query.to(torch.bfloat16).float(), cache, table, sl, block_size=bs,
                           num_kv_heads=hk, centroids=centroids, rotation=rotation,
                           softmax_scale=scale)
    assert out.dtype == torch.float32 and out.shape == (len(seq_lens), hk * qg, d)
    kv = gather_dequantized(cache, table, sl, block_size=bs, num_kv_heads=hk, head_dim=d,
                            centroids=centroids)
    want = attention_fp64(query.to(torch.bfloat16).float(), kv, rotation, hk,
                          1 / math.sqrt(d) if scale is None else scale)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    assert torch.all(out[3] == 0)  # seq_len 0
    # seq_len 1: the output is exactly that token's dequantized value.
    torch.testing.assert_close(out[0].view(hk, qg, d), kv[0][1][0][:, None, :].expand(hk, qg, d))


def test_decode_attention_approximates_unquantized():
    """Sanity: with the Hadamard rotation, TQ attention is close to exact attention on k, v."""
    bs, hk, qg, d, n = 16, 2, 4, 128, 64
    k, v = random_kv(8, n, hk, d)
    cache = allocate_cache(n // bs, bs, hk, d, "cpu")
    centroids, rotation = lloyd_max_centroids(d), hadamard_rotation(d)
    store(cache, k, v, torch.arange(n), block_size=bs, centroids=centroids, rotation=rotation,
          norm_correction=True)
    q = make_query(9, 1, hk * qg, d) * 0.2  # logits with std ~1: a not too peaky softmax
    out = decode_attention(q, cache, torch.arange(n // bs)[None], torch.tensor([n]),
                           block_size=bs, num_kv_heads=hk, centroids=centroids, rotation=rotation)
    kk, vv = k.repeat_interleave(qg, dim=1), v.repeat_interleave(qg, dim=1)
    p = torch.softmax(torch.einsum("hd,nhd->hn", q[0], kk) / math.sqrt(d), dim=-1)
    exact = torch.einsum("hn,nhd->hd", p, vv)
    assert (out[0] - exact).norm() < 0.2 * exact.norm()  # measured ~0.1 (mostly V rounding)


@pytest.mark.parametrize("tokens_per_partition,num_partitions", [(32, 16), (64, 8), (256, 4), (512, 1)])
def test_partitioned_merge_equals_decode(tokens_per_partition, num_partitions):
    bs, hk, qg, d = 16, 2, 4, 128
    seq_lens = [1, 15, 16, 0, 17, 300]
    cache, table, sl, centroids, rotation = build_paged(10, seq_lens, block_size=bs,
                                                        num_kv_heads=hk, head_dim=d)
    query = make_query(11, len(seq_lens), hk * qg, d)
    kw = dict(block_size=bs, num_kv_heads=hk, centroids=centroids, rotation=rotation)
    out, exp_sums, max_logits = decode_attention_partitioned(
        query, cache, table, sl, tokens_per_partition=tokens_per_partition,
        num_partitions=num_partitions, **kw)
    assert out.shape == (len(seq_lens), hk, num_partitions, qg, d)
    assert exp_sums.shape == max_logits.shape == (len(seq_lens), hk, num_partitions, qg)
    for i, n in enumerate(seq_lens):
        for p in range(num_partitions):
            if p * tokens_per_partition >= n:  # empty partition contract
                assert torch.all(max_logits[i, :, p] == -math.inf)
                assert torch.all(exp_sums[i, :, p] == 0) and torch.all(out[i, :, p] == 0)
            else:
                assert torch.all(exp_sums[i, :, p] >= 1)  # the max term contributes exp(0)
    merged = merge_partitions(out, exp_sums, max_logits)
    torch.testing.assert_close(merged, decode_attention(query, cache, table, sl, **kw),
                               atol=1e-5, rtol=1e-5)
    assert not torch.isnan(merged).any()


def test_partitioned_rejects_uncovered_tokens():
    cache, table, sl, centroids, rotation = build_paged(12, [40], block_size=16, num_kv_heads=1,
                                                        head_dim=64)
    with pytest.raises(ValueError, match="cover"):
        decode_attention_partitioned(make_query(13, 1, 2, 64), cache, table, sl, block_size=16,
                                     num_kv_heads=1, centroids=centroids, rotation=rotation,
                                     tokens_per_partition=16, num_partitions=2)


def test_merge_hand_built():
    """Two partitions with known softmax state, one empty; plus an all-empty row -> zeros."""
    out = torch.zeros(2, 1, 3, 1, 2)
    out[0, 0, 0, 0] = torch.tensor([1.0, 2.0])
    out[0, 0, 2, 0] = torch.tensor([3.0, -4.0])
    exp_sums = torch.tensor([[[[2.0], [0.0], [1.0]]], [[[0.0], [0.0], [0.0]]]])
    max_logits = torch.tensor([[[[1.0], [-math.inf], [1.0 + math.log(3.0)]]],
                               [[[-math.inf], [-math.inf], [-math.inf]]]])
    merged = merge_partitions(out, exp_sums, max_logits)
    # weights relative to M = 1 + ln 3: 2 * exp(-ln 3) = 2/3 and 1 * 1 = 1
    want = (2 / 3 * torch.tensor([1.0, 2.0]) + torch.tensor([3.0, -4.0])) / (2 / 3 + 1)
    torch.testing.assert_close(merged[0, 0], want)
    assert merged.shape == (2, 1, 2) and torch.all(merged[1] == 0)
