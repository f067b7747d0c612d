"""Entropy router: both weighting modes, H = 0 guard, padding masks."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from memgas_gpu.ops import entropy_router, router_weights
from memgas_gpu.reference import reference_router_weights

from _synth import clustered_unit_vectors, torch_single_thread  # noqa: F401


def _data(Q=7, G=4, N=25, d=32, seed=0):
    x = clustered_unit_vectors(Q + G * N, d=d, seed=seed)
    return x[:Q], x[Q:].view(G, N, d)


@pytest.mark.parametrize("mode", ["inverse", "one_minus"])
@pytest.mark.parametrize("temperature", [0.1, 0.2, 1.0])
def test_matches_reference(mode, temperature):
    q, X = _data()
    w = router_weights(q, X, temperature, mode)
    ref = np.stack([reference_router_weights(qi, X, temperature, mode) for qi in q])
    np.testing.assert_allclose(w.numpy(), ref, rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(w.sum(1), torch.ones(len(q)))


def test_hand_checked_entropies():
    # G=2, N=2: first granularity uniform (H = log 2), second one-hot-ish (H ~ 0)
    sims = torch.tensor([[[0.0, 0.0], [100.0, 0.0]]])
    H1 = math.log(2)
    w = entropy_router(sims, temperature=1.0, mode="inverse")
    assert torch.isfinite(w).all()
    assert w[0, 1] > 0.999 and abs(float(w.sum()) - 1) < 1e-6
    w2 = entropy_router(sims, temperature=1.0, mode="one_minus")
    H2 = 100 * math.exp(-100)  # numerically ~0
    expect = torch.tensor([(1 - H1) / ((1 - H1) + (1 - H2)), (1 - H2) / ((1 - H1) + (1 - H2))])
    torch.testing.assert_close(w2[0], expect)


def test_h_zero_guard_single_session():
    # N = 1 gives p = 1 and H = 0 for every granularity: equal finite weights
    w = entropy_router(torch.randn(3, 4, 1), mode="inverse")
    torch.testing.assert_close(w, torch.full((3, 4), 0.25))


def test_equal_entropies_give_uniform_weights():
    sims = torch.randn(2, 1, 10).expand(2, 4, 10)
    torch.testing.assert_close(entropy_router(sims), torch.full((2, 4), 0.25))


def test_valid_mask_equals_truncation():
    sims = torch.randn(5, 4, 12, dtype=torch.float64)
    n = torch.tensor([12, 3, 7, 1, 10])
    valid = torch.arange(12)[None, None, :] < n[:, None, None]
    garbage = torch.where(valid, sims, torch.full_like(sims, 1e3))
    w = entropy_router(garbage, 0.2, "inverse", valid)
    for i in range(5):
        torch.testing.assert_close(w[i], entropy_router(sims[i:i + 1, :, :n[i]])[0])


def test_one_dim_query_and_errors():
    q, X = _data(Q=1)
    assert router_weights(q[0], X).shape == (4,)
    with pytest.raises(ValueError):
        entropy_router(torch.zeros(1, 4, 3), mode="bogus")
    with pytest.raises(ValueError):
        entropy_router(torch.zeros(4, 3))
