"""TurboQuant (TQ) decode attention over a 4-bit quantized, paged KV cache: PyTorch reference.

Semantics and byte layout follow /work/shared/operators.md section 2. Everything here is written
for readability and exactness (fp32 math, fp64 where cheap), not speed.

Cache layout ("SoA"), per block of BS tokens, Hk kv heads, head_dim d:
  data region      [slot 0..BS)[kv head 0..Hk)[ d/2 bytes K nibbles | d/2 bytes V nibbles ]
  metadata region  fp16 [kv head][field][slot], field 0 = K norm, 1 = V scale, 2 = V zero
Nibbles: byte j holds element 2j in the LOW nibble and element 2j+1 in the HIGH nibble.
A slot is block * BS + offset-in-block.
"""

import math

import torch

NUM_LEVELS = 16  # 4-bit indices
META_FIELDS = 3  # K norm, V scale, V zero (fp16 each)
KEY_NORM, V_SCALE, V_ZERO = range(META_FIELDS)


# ----------------------------------------------------------------------------- quantizer tables


def lloyd_max_centroids(head_dim: int, levels: int = NUM_LEVELS, tol: float = 1e-12) -> torch.Tensor:
    """Lloyd-Max quantizer of N(0, 1/head_dim): `levels` centroids, float32, sorted ascending.

    A coordinate of a rotated unit vector is roughly N(0, 1/d), so TQ quantizes it with the
    MSE-optimal scalar quantizer of that Gaussian. Lloyd iteration in standard-normal units
    (float64, closed forms via math.erf): boundaries = midpoints of neighbouring centroids,
    centroid = E[z | cell] = (pdf(lo) - pdf(hi)) / (cdf(hi) - cdf(lo)); then scale by 1/sqrt(d).
    """
    if head_dim <= 0 or levels < 2:
        raise ValueError(f"need head_dim > 0 and levels >= 2, got {head_dim}, {levels}")

    def pdf(z):
        return 0.0 if math.isinf(z) else math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)

    def cdf(z):
        return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))

    c = [-3.0 + 6.0 * (i + 0.5) / levels for i in range(levels)]  # uniform start over +-3 sigma
    for _ in range(100_000):
        b = [-math.inf] + [(c[i] + c[i + 1]) / 2 for i in range(levels - 1)] + [math.inf]
        new = [(pdf(b[i]) - pdf(b[i + 1])) / (cdf(b[i + 1]) - cdf(b[i])) for i in range(levels)]
        change = max(abs(x - y) for x, y in zip(new, c))
        c = new
        if change < tol:
            break
    else:
        raise RuntimeError("Lloyd-Max iteration did not converge")
    # The optimum is symmetric; mirror the upper half so that c[i] == -c[levels-1-i] exactly in
    # fp32 (then the middle midpoint is exactly 0.0, which makes the tie rule observable).
    upper = [(c[levels - 1 - i] - c[i]) / 2 for i in range(levels // 2)][::-1]
    half = ([0.0] if levels % 2 else []) + upper
    sym = [-x for x in upper[::-1]] + half
    sigma = 1.0 / math.sqrt(head_dim)
    return torch.tensor([x * sigma for x in sym], dtype=torch.float64).to(torch.float32)


def hadamard_rotation(head_dim: int) -> torch.Tensor:
    """Normalized Sylvester Hadamard matrix H/sqrt(d), float32 [d, d] (symmetric, orthonormal)."""
    if head_dim < 1 or head_dim & (head_dim - 1):
        raise ValueError(f"Hadamard rotation needs head_dim to be a power of two, got {head_dim}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < head_dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(head_dim)).to(torch.float32)


# ----------------------------------------------------------------------------- cache layout


def cache_block_bytes(block_size: int, num_kv_heads: int, head_dim: int) -> int:
    """Bytes of one cache block: 4-bit K and V data, then 3 fp16 metadata values per token/head."""
    return block_size * num_kv_heads * head_dim + num_kv_heads * META_FIELDS * block_size * 2


def allocate_cache(num_blocks, block_size, num_kv_heads, head_dim, device="cpu") -> torch.Tensor:
    """Zeroed uint8 cache [num_blocks, block_bytes]."""
    _check_head_dim(head_dim)
    nbytes = cache_block_bytes(block_size, num_kv_heads, head_dim)
    return torch.zeros(num_blocks, nbytes, dtype=torch.uint8, device=device)


def _check_head_dim(head_dim):
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be positive and even (two nibbles a byte), got {head_dim}")


def _views(cache, block_size, num_kv_heads, head_dim):
    """Views into `cache` (writes go through): data [nb, BS, Hk, d] uint8, meta [nb, Hk, 3, BS] fp16."""
    nb, nbytes = cache.shape
    if cache.dtype != torch.uint8 or nbytes != cache_block_bytes(block_size, num_kv_heads, head_dim):
        raise ValueError("cache must be uint8 [num_blocks, cache_block_bytes(BS, Hk, d)]")
    data_bytes = block_size * num_kv_heads * head_dim
    data = cache[:, :data_bytes].view(nb, block_size, num_kv_heads, head_dim)
    meta = cache[:, data_bytes:].view(torch.float16).view(nb, num_kv_heads, META_FIELDS, block_size)
    return data, meta


def _pack_nibbles(idx):
    """[..., d] ints in 0..15 -> [..., d/2] uint8; element 2j in the low nibble, 2j+1 in the high."""
    idx = idx.to(torch.uint8)
    return idx[..., 0::2] | (idx[..., 1::2] << 4)


def _unpack_nibbles(packed):
    """[..., d/2] uint8 -> [..., d] int64, inverse of _pack_nibbles."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack([lo, hi], dim=-1).flatten(-2).long()


# ----------------------------------------------------------------------------- quantization


def quantize_keys(k, centroids, rotation, norm_correction=False):
    """k [..., d] -> (idx [..., d] int64, stored norm [...] fp32), in fp32.

    Nearest centroid by bucketizing against the midpoints of the *sorted* centroids, so unsorted
    centroid tables work too. Tie rule: a value exactly on a midpoint goes to the smaller-valued
    centroid (torch.bucketize with right=False: b[i-1] < y <= b[i] -> cell i); with ascending
    centroids that is the lower index.
    """
    k = k.float()
    c = centroids.float().to(k.device)
    norm = k.norm(dim=-1)
    y = (k / (norm + 1e-8).unsqueeze(-1)) @ rotation.float().to(k.device)
    c_sorted, order = torch.sort(c, stable=True)  # equal centroids keep their index order
    mids = (c_sorted[1:] + c_sorted[:-1]) / 2
    idx = order[torch.bucketize(y.contiguous(), mids, right=False)]
    if norm_correction:
        # Rescale so that the reconstruction c[idx] * stored_norm has exactly the norm of k.
        norm = norm / c[idx].norm(dim=-1)
    return idx, norm


def quantize_values(v):
    """v [..., d] -> (idx [..., d] int64, scale [...], zero [...]), asymmetric 4-bit, in fp32.

    scale/zero are computed and used in fp32 here; the cache stores them rounded to fp16, which the
    dequantization then uses (so reconstruction error is scale/2 plus fp16 rounding of scale/zero).
    """
    v = v.float()
    zero = v.amin(dim=-1)
    scale = ((v.amax(dim=-1) - zero) / 15).clamp_min(1e-8)
    q = torch.floor((v - zero.unsqueeze(-1)) / scale.unsqueeze(-1) + 0.5).clamp(0, 15)
    return q.long(), scale, zero


def store(cache, k, v, slot_mapping, *, block_size, centroids, rotation, norm_correction=False):
    """Quantize k, v [num_tokens, Hk, d] and write them in place into `cache` at slot_mapping.

    slot_mapping: int [num_tokens], slot = block * block_size + offset; slots < 0 are skipped
    (padding tokens). Slots must be distinct.
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    _check_head_dim(head_dim)
    if v.shape != k.shape or slot_mapping.shape != (num_tokens,):
        raise ValueError("k, v must be [num_tokens, Hk, d] and slot_mapping [num_tokens]")
    data, meta = _views(cache, block_size, num_kv_heads, head_dim)

    slots = slot_mapping.long().to(cache.device)
    keep = slots >= 0
    slots = slots[keep]
    if slots.numel() and int(slots.max()) >= cache.shape[0] * block_size:
        raise ValueError("slot_mapping points past the end of the cache")
    k, v = k.to(cache.device)[keep], v.to(cache.device)[keep]
    block, offset = slots // block_size, slots % block_size

    kidx, knorm = quantize_keys(k, centroids, rotation, norm_correction)
    vidx, vscale, vzero = quantize_values(v)
    data[block, offset] = torch.cat([_pack_nibbles(kidx), _pack_nibbles(vidx)], dim=-1)
    for field, value in ((KEY_NORM, knorm), (V_SCALE, vscale), (V_ZERO, vzero)):
        meta[block, :, field, offset] = value.to(torch.float16)  # [T, Hk]
    return cache


# ----------------------------------------------------------------------------- dequantization


def read_slots(cache, slots, *, block_size, num_kv_heads, head_dim):
    """Raw stored fields for slots [T] (all >= 0): kidx, vidx [T, Hk, d] int64; knorm, vscale,
    vzero [T, Hk] fp32 (converted from the stored fp16)."""
    data, meta = _views(cache, block_size, num_kv_heads, head_dim)
    slots = slots.long().to(cache.device)
    block, offset = slots // block_size, slots % block_size
    packed = data[block, offset]  # [T, Hk, d] bytes
    half = head_dim // 2
    fields = [meta[block, :, f, offset].float() for f in range(META_FIELDS)]  # each [T, Hk]
    return dict(kidx=_unpack_nibbles(packed[..., :half]), vidx=_unpack_nibbles(packed[..., half:]),
                knorm=fields[KEY_NORM], vscale=fields[V_SCALE], vzero=fields[V_ZERO])


def sequence_slots(block_table_row, seq_len, block_size):
    """Slots of tokens 0..seq_len) of one sequence; table entries past the sequence are unused."""
    t = torch.arange(seq_len, device=block_table_row.device)
    used = block_table_row[: (seq_len + block_size - 1) // block_size].long()
    return used[t // block_size] * block_size + t % block_size


def gather_dequantized(cache, block_table, seq_lens, *, block_size, num_kv_heads, head_dim, centroids):
    """Per sequence: (k_hat_rot [seq_len, Hk, d], v_hat [seq_len, Hk, d]) fp32.

    k_hat is in the *rotated* space: centroid[kidx] * knorm. v_hat = vidx * scale + zero.
    """
    c = centroids.float().to(cache.device)
    out = []
    for row, n in zip(block_table.to(cache.device), seq_lens.tolist()):
        f = read_slots(cache, sequence_slots(row, n, block_size),
                       block_size=block_size, num_kv_heads=num_kv_heads, head_dim=head_dim)
        k_hat = c[f["kidx"]] * f["knorm"].unsqueeze(-1)
        v_hat = f["vidx"].float() * f["vscale"].unsqueeze(-1) + f["vzero"].unsqueeze(-1)
        out.append((k_hat, v_hat))
    return out


# ----------------------------------------------------------------------------- attention


def _scores(query, cache, block_table, seq_lens, block_size, num_kv_heads, centroids, rotation,
            softmax_scale):
    """Per sequence: (scores [Hk, QG, n] fp32, v_hat [n, Hk, d]); query head h -> kv head h // QG."""
    num_seqs, num_q_heads, head_dim = query.shape
    if num_q_heads % num_kv_heads:
        raise ValueError(f"Hq={num_q_heads} is not a multiple of Hk={num_kv_heads}")
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    q_rot = query.float().to(cache.device) @ rotation.float().to(cache.device)  # rotate q, not K
    q_rot = q_rot.view(num_seqs, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    kv = gather_dequantized(cache, block_table, seq_lens, block_size=block_size,
                            num_kv_heads=num_kv_heads, head_dim=head_dim, centroids=centroids)
    return [(torch.einsum("gqd,ngd->gqn", q_rot[i], k_hat) * scale, v_hat)
            for i, (k_hat, v_hat) in enumerate(kv)]


def decode_attention(query, cache, block_table, seq_lens, *, block_size, num_kv_heads, centroids,
                     rotation, softmax_scale=None):
    """One decode step: query [num_seqs, Hq, d] -> out [num_seqs, Hq, d] fp32 (unrotated V space).

    block_table int [num_seqs, max_blocks], seq_lens int [num_seqs]; seq_len 0 gives zeros.
    """
    num_seqs, num_q_heads, head_dim = query.shape
    out = torch.zeros(num_seqs, num_q_heads, head_dim, dtype=torch.float32, device=cache.device)
    per_seq = _scores(query, cache, block_table, seq_lens, block_size, num_kv_heads, centroids,
                      rotation, softmax_scale)
    for i, (s, v_hat) in enumerate(per_seq):
        if s.shape[-1]:
            out[i] = torch.einsum("gqn,ngd->gqd", torch.softmax(s, dim=-1), v_hat).flatten(0, 1)
    return out


def decode_attention_partitioned(query, cache, block_table, seq_lens, *, block_size, num_kv_heads,
                                 centroids, rotation, tokens_per_partition, num_partitions,
                                 softmax_scale=None):
    """Split-K form of decode_attention, as the kernel's first pass writes it.

    Partition p covers tokens [p*T, (p+1)*T), T = tokens_per_partition; partitions must cover
    every seq_len. Returns fp32
      out        [num_seqs, Hk, P, QG, d]  normalized within the partition (0 if empty)
      exp_sums   [num_seqs, Hk, P, QG]     sum_t exp(s_t - max_logits)    (0 if empty)
      max_logits [num_seqs, Hk, P, QG]     max_t s_t                      (-inf if empty)
    """
    num_seqs, num_q_heads, head_dim = query.shape
    qg = num_q_heads // num_kv_heads
    if len(seq_lens) and int(seq_lens.max()) > tokens_per_partition * num_partitions:
        raise ValueError("tokens_per_partition * num_partitions must cover every seq_len")
    dev = cache.device
    out = torch.zeros(num_seqs, num_kv_heads, num_partitions, qg, head_dim, device=dev)
    exp_sums = torch.zeros(num_seqs, num_kv_heads, num_partitions, qg, device=dev)
    max_logits = torch.full_like(exp_sums, -math.inf)
    per_seq = _scores(query, cache, block_table, seq_lens, block_size, num_kv_heads, centroids,
                      rotation, softmax_scale)
    for i, (s, v_hat) in enumerate(per_seq):
        for p in range(num_partitions):
            lo, hi = p * tokens_per_partition, min((p + 1) * tokens_per_partition, s.shape[-1])
            if lo >= hi:
                continue  # empty partition keeps (out 0, exp_sum 0, max -inf)
            sp = s[..., lo:hi]
            m = sp.amax(dim=-1)
            e = torch.exp(sp - m.unsqueeze(-1))
            l = e.sum(dim=-1)
            max_logits[i, :, p], exp_sums[i, :, p] = m, l
            out[i, :, p] = torch.einsum("gqn,ngd->gqd", e, v_hat[lo:hi]) / l.unsqueeze(-1)
    return out, exp_sums, max_logits


def merge_partitions(out_parts, exp_sums, max_logits):
    """Combine per-partition results: [num_seqs, Hk, P, QG, d] -> [num_seqs, Hk*QG, d] fp32.

    M = max_p m_p; w_p = exp_sums_p * exp(m_p - M) (0 where m_p = -inf);
    out = sum_p w_p out_p / sum_p w_p (0 when the sum is 0).
    """
    m = max_logits.float()
    big_m = m.amax(dim=2, keepdim=True)
    empty = torch.isinf(m) & (m < 0)
    # Guard exp(-inf - -inf) = nan for all-empty rows: such partitions simply weigh 0.
    w = torch.where(empty, torch.zeros_like(m), exp_sums.float() * torch.exp(m - big_m))
    total = w.sum(dim=2)  # [S, Hk, QG]
    acc = (w.unsqueeze(-1) * out_parts.float()).sum(dim=2)  # [S, Hk, QG, d]
    merged = torch.where(total.unsqueeze(-1) > 0, acc / total.clamp_min(1e-30).unsqueeze(-1),
                         torch.zeros_like(acc))
    num_seqs, num_kv_heads, qg, head_dim = merged.shape
    return merged.reshape(num_seqs, num_kv_heads * qg, head_dim)
