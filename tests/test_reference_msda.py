"""Tests for the MSDA forward references (kgen.reference.msda)."""

import itertools

import pytest
import torch

from kgen.reference.msda import (
    derive_level_start_index,
    msda_forward_grid_sample,
    msda_forward_loop,
)

IMPLS = [msda_forward_grid_sample, msda_forward_loop]


def make_inputs(seed, B, Q, M, D, shapes, K, lo=-0.2, hi=1.2, dtype=torch.float64):
    """Random, never-zero inputs; locations uniform in [lo, hi] so borders are exercised."""
    g = torch.Generator().manual_seed(seed)
    spatial_shapes = torch.tensor(shapes, dtype=torch.int64)
    S = int((spatial_shapes[:, 0] * spatial_shapes[:, 1]).sum())
    L = len(shapes)
    value = torch.randn(B, S, M, D, generator=g, dtype=torch.float64)
    loc = lo + (hi - lo) * torch.rand(B, Q, M, L, K, 2, generator=g, dtype=torch.float64)
    attn = 0.1 + torch.rand(B, Q, M, L, K, generator=g, dtype=torch.float64)
    return (value.to(dtype), spatial_shapes, derive_level_start_index(spatial_shapes),
            loc.to(dtype), attn.to(dtype))


CONFIGS = [
    # (B, Q, M, D, shapes, K)
    (2, 7, 2, 24, [[5, 7], [3, 4], [2, 2]], 3),
    (1, 5, 1, 5, [[4, 6]], 3),  # L = 1
    (2, 3, 3, 8, [[1, 1], [6, 3]], 2),  # 1x1 level, tall level
    (1, 4, 2, 1, [[2, 9], [7, 1]], 4),  # D = 1, degenerate widths/heights
]


@pytest.mark.parametrize("seed,cfg", list(enumerate(CONFIGS)))
def test_references_agree_random(seed, cfg):
    B, Q, M, D, shapes, K = cfg
    args = make_inputs(seed, B, Q, M, D, shapes, K)
    fast = msda_forward_grid_sample(*args)
    slow = msda_forward_loop(*args)
    assert fast.shape == slow.shape == (B, Q, M * D)
    assert fast.dtype == slow.dtype == torch.float64
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=0)


def special_coords(n):
    """Normalised coordinates that hit exact corners, pixel centres and pixel boundaries."""
    centres = [(i + 0.5) / n for i in range(n)]
    boundaries = [i / n for i in range(n + 1)]  # includes exactly 0 and exactly 1
    just_out = [-0.5 / n, 1 + 0.5 / n]  # pixel coordinate exactly -1 and n: zero weight
    return centres + boundaries + just_out


def test_references_agree_special_locations():
    shapes = [[3, 4], [2, 5]]
    H0, W0 = shapes[0]
    xs, ys = special_coords(W0), special_coords(H0)
    pts = torch.tensor(list(itertools.product(xs, ys)), dtype=torch.float64)  # (P, 2)
    P = pts.shape[0]
    value, ss, lsi, _, attn = make_inputs(11, 1, P, 2, 3, shapes, 1)
    # Same normalised points for every head and both levels (so level 1 sees
    # non-special values too, which is fine for an agreement test).
    loc = pts.view(1, P, 1, 1, 1, 2).expand(1, P, 2, 2, 1, 2).contiguous()
    torch.testing.assert_close(
        msda_forward_grid_sample(value, ss, lsi, loc, attn),
        msda_forward_loop(value, ss, lsi, loc, attn),
        atol=1e-12,
        rtol=0,
    )


@pytest.mark.parametrize("impl", IMPLS)
def test_pixel_centres_boundaries_and_corners(impl):
    """Check closed-form values of the bilinear sample on one 3x4 level."""
    H, W, D = 3, 4, 2
    g = torch.Generator().manual_seed(3)
    img = torch.randn(H, W, D, generator=g, dtype=torch.float64)
    value = img.reshape(1, H * W, 1, D)
    ss = torch.tensor([[H, W]])

    def sample(x, y):
        loc = torch.tensor([x, y], dtype=torch.float64).view(1, 1, 1, 1, 1, 2)
        attn = torch.ones(1, 1, 1, 1, 1, dtype=torch.float64)
        return impl(value, ss, None, loc, attn).view(D)

    def close(a, b):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)

    for i, j in itertools.product(range(W), range(H)):
        # Pixel centre: exactly that pixel.
        close(sample((i + 0.5) / W, (j + 0.5) / H), img[j, i])
    for i in range(1, W):
        # Interior vertical pixel boundary at a centre row: mean of the two neighbours.
        close(sample(i / W, 0.5 / H), 0.5 * (img[0, i - 1] + img[0, i]))
    # Exact image corners: the sample point sits half a pixel outside in both
    # directions, so only one of four corners is inside, with weight 1/4.
    close(sample(0.0, 0.0), 0.25 * img[0, 0])
    close(sample(1.0, 0.0), 0.25 * img[0, W - 1])
    close(sample(0.0, 1.0), 0.25 * img[H - 1, 0])
    close(sample(1.0, 1.0), 0.25 * img[H - 1, W - 1])
    # Left edge at a centre row: half of the edge pixel.
    close(sample(0.0, 1.5 / H), 0.5 * img[1, 0])


@pytest.mark.parametrize("impl", IMPLS)
def test_far_outside_is_exactly_zero(impl):
    B, Q, M, D, shapes, K = 2, 3, 2, 5, [[5, 7], [3, 4]], 2
    value, ss, lsi, loc, attn = make_inputs(5, B, Q, M, D, shapes, K)
    far = torch.tensor([-5.0, 7.0], dtype=torch.float64)
    # Every coordinate pair drawn from {-5, 7}, including mixed in/out-of-range
    # pairs below: any point with one far coordinate must read nothing.
    idx = torch.randint(0, 2, loc.shape, generator=torch.Generator().manual_seed(1))
    far_loc = far[idx]
    out = impl(value, ss, lsi, far_loc, attn)
    assert torch.equal(out, torch.zeros_like(out))
    mixed = far_loc.clone()
    mixed[..., 0] = 0.5  # x inside, y far outside
    assert torch.equal(impl(value, ss, lsi, mixed, attn), torch.zeros_like(out))

    # Appending far-away points (with non-zero weights) must not change the result.
    base = impl(value, ss, lsi, loc, attn)
    loc2 = torch.cat([loc, far_loc], dim=4)
    attn2 = torch.cat([attn, attn + 1.0], dim=4)
    torch.testing.assert_close(impl(value, ss, lsi, loc2, attn2), base, atol=1e-12, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_hand_computed_two_levels(impl):
    # Level 0: 1x1 (value e); level 1: 2x2 [[a, b], [c, d]] row-major, D = 2.
    e = [7.0, -1.0]
    a, b, c, d = [1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]
    value = torch.tensor([e, a, b, c, d], dtype=torch.float64).view(1, 5, 1, 2)
    ss = torch.tensor([[1, 1], [2, 2]])
    loc = torch.tensor(
        [
            [[0.5, 0.5], [0.0, 0.0]],  # level 0: centre of the single pixel; ignored point
            [[0.6, 0.3], [0.1, 0.9]],  # level 1
        ],
        dtype=torch.float64,
    ).view(1, 1, 1, 2, 2, 2)
    attn = torch.tensor([[2.0, 0.0], [0.5, 3.0]], dtype=torch.float64).view(1, 1, 1, 2, 2)
    # level 0, point 0: pixel coords (0, 0) -> exactly e.
    # level 1, point 0: pixel (0.7, 0.1) -> x0 = y0 = 0, lx = 0.7, ly = 0.1.
    # level 1, point 1: pixel (-0.3, 1.3) -> x0 = -1, y0 = 1, lx = 0.7, ly = 0.3;
    #   only corner (0, 1) = c is inside, weight lx * (1 - ly) = 0.49.
    expected = []
    for ch in range(2):
        p0 = a[ch] * 0.3 * 0.9 + b[ch] * 0.7 * 0.9 + c[ch] * 0.3 * 0.1 + d[ch] * 0.7 * 0.1
        p1 = c[ch] * 0.49
        expected.append(2.0 * e[ch] + 0.5 * p0 + 3.0 * p1)
    out = impl(value, ss, torch.tensor([0, 1]), loc, attn)
    torch.testing.assert_close(out.view(2), torch.tensor(expected, dtype=torch.float64),
                               atol=1e-12, rtol=0)


def test_derive_level_start_index():
    ss = torch.tensor([[5, 7], [3, 4], [2, 2]], dtype=torch.int64)
    lsi = derive_level_start_index(ss)
    assert lsi.dtype == torch.int64 and lsi.device == ss.device
    assert lsi.tolist() == [0, 35, 47]
    assert derive_level_start_index(torch.tensor([[6, 9]])).tolist() == [0]
    # int32 shapes still yield int64 starts.
    assert derive_level_start_index(ss.int()).dtype == torch.int64


@pytest.mark.parametrize("impl", IMPLS)
def test_level_start_index_none_matches_derived(impl):
    value, ss, lsi, loc, attn = make_inputs(9, 2, 4, 2, 3, [[5, 7], [3, 4], [2, 2]], 2)
    assert torch.equal(impl(value, ss, None, loc, attn), impl(value, ss, lsi, loc, attn))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B,Q", [(0, 3), (2, 0), (0, 0)])
def test_empty_batch_or_queries(impl, B, Q):
    M, D = 2, 5
    value, ss, lsi, loc, attn = make_inputs(0, B, Q, M, D, [[3, 4], [2, 2]], 2)
    for dtype in (torch.float64, torch.float16):
        out = impl(value.to(dtype), ss, lsi, loc.to(dtype), attn.to(dtype))
        assert out.shape == (B, Q, M * D) and out.dtype == dtype


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "dtype,atol,rtol",
    [(torch.float32, 1e-5, 1e-5), (torch.float16, 1e-2, 1e-2), (torch.bfloat16, 5e-2, 2e-2)],
)
def test_low_precision_inputs(impl, dtype, atol, rtol):
    B, Q, M, D, shapes, K = 2, 5, 2, 6, [[5, 7], [3, 4]], 3
    value, ss, lsi, loc, attn = make_inputs(21, B, Q, M, D, shapes, K, dtype=dtype)
    out = impl(value, ss, lsi, loc, attn)
    assert out.dtype == dtype and out.shape == (B, Q, M * D)
    # Compare with float64 evaluated on the same (already rounded) inputs, so only
    # the internal float32 arithmetic and the final rounding to dtype differ.
    ref = msda_forward_grid_sample(value.double(), ss, lsi, loc.double(), attn.double())
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)
