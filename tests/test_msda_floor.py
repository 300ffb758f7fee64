"""benchmarks/msda_floor.py, on CPU under the interpreter: its packed samples expand to
grid_sample's corners (weighted by the bilinear and attention weights they reproduce the
reference forward), and its floor kernels move exactly those rows (against torch's gather and
index_add)."""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import ROOT
from kgen.reference.msda import msda_forward_grid_sample

sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import msda_floor
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

LEVELS = [[5, 7], [3, 4], [2, 3]]


def _inputs(B=2, Q=19, M=3, D=8, K=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = torch.tensor(LEVELS)
    areas = shapes[:, 0] * shapes[:, 1]
    S = int(areas.sum())
    start = torch.cumsum(areas, 0) - areas
    value = torch.randn(B, S, M, D, generator=g, dtype=torch.float64)
    # Wider than [0, 1] so that corners fall outside their level on every side.
    loc = torch.rand(B, Q, M, len(LEVELS), K, 2, generator=g, dtype=torch.float64) * 1.4 - 0.2
    weights = torch.rand(B, Q, M, len(LEVELS), K, generator=g, dtype=torch.float64) + 0.05
    return value, shapes, start, loc, weights


def test_corner_rows_are_grid_samples_corners():
    value, shapes, start, loc, weights = _inputs()
    B, S, M, D = value.shape
    Q, L, K = loc.shape[1], loc.shape[3], loc.shape[4]
    packed, bias = msda_floor.sample_list(shapes, start, loc, S)
    rows = msda_floor.corner_rows(msda_floor.Samples(packed, bias, shapes, M))  # [B*M, L*K*4, Q]
    assert 0 < int((rows >= 0).sum()) < rows.numel()  # some corners inside, some dropped
    # Bilinear weights of the four corners, in the order corner_rows lists them (dy major).
    width = shapes[:, 1].view(1, 1, 1, L, 1).double()
    height = shapes[:, 0].view(1, 1, 1, L, 1).double()
    fx = loc[..., 0] * width - 0.5
    fy = loc[..., 1] * height - 0.5
    lx, ly = fx - torch.floor(fx), fy - torch.floor(fy)
    corner_w = torch.stack([(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx], -1) * weights[..., None]
    corner_w = corner_w.permute(0, 2, 3, 4, 5, 1).reshape(B * M, L * K * 4, Q)
    table = value.reshape(-1, D)
    picked = torch.where((rows >= 0)[..., None], table[rows.long().clamp(min=0)], 0.0)  # [B*M, LK4, Q, D]
    got = (picked * corner_w[..., None]).sum(1).reshape(B, M, Q, D).permute(0, 2, 1, 3).reshape(B, Q, M * D)
    want = msda_forward_grid_sample(value, shapes, start, loc, weights)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("schedule", [(16, 2, True), (32, 4, False)])
def test_floor_kernels_move_exactly_the_corner_rows(monkeypatch, schedule):
    value, shapes, start, loc, _ = _inputs(Q=37)  # ragged: not a multiple of either block
    value = value.float()
    packed, bias = msda_floor.sample_list(shapes, start, loc.float(), value.shape[1])
    samples = msda_floor.Samples(packed, bias, shapes, value.shape[2])
    grad = torch.randn(packed.shape[0], loc.shape[1], value.shape[-1], generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(msda_floor, "SCHEDULES", [schedule])
    msda_floor.check(samples, value, grad)
    # check() must fail on a kernel that drops corners: here, every list's last sample.
    dropped = msda_floor.Samples(packed.clone(), bias, shapes, value.shape[2])
    dropped.packed[:, -1] &= msda_floor.ROW_MASK.value
    real_gather = msda_floor.gather
    monkeypatch.setattr(msda_floor, "gather", lambda s, *a: real_gather(dropped, *a))
    with pytest.raises(AssertionError):
        msda_floor.check(samples, value, grad)
