"""MemGAS session scoring: parity with the per-query reference, ablations, packed batches."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from memgas_gpu.bench.data import index_from_nodes

from memgas_gpu.ops import (build_association_graph, memgas_session_scores,
                            seed_scores)

from _synth import conversation, torch_single_thread  # noqa: F401

pytest.importorskip("sklearn")
pytest.importorskip("igraph")
from memgas_gpu.reference import (edges_to_csr, reference_edges,  # noqa: E402
                                  reference_session_scores)


def _queries(E: torch.Tensor, q: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = E[torch.randint(0, len(E), (q,), generator=g)] + 0.12 * torch.randn(q, E.shape[1],
                                                                            generator=g)
    return x / x.norm(dim=1, keepdim=True)


@pytest.fixture(scope="module")
def conv():
    import igraph

    E, s, g = conversation(40, d=64, seed=1)
    edges = reference_edges(E, s)
    graph = igraph.Graph(n=len(E), edges=edges, directed=False)
    indptr, indices = (torch.from_numpy(a) for a in edges_to_csr(edges, len(E)))
    return E, s, g, graph, indptr, indices


@pytest.mark.parametrize("kw", [{}, {"router": "one_minus"}, {"use_ppr": False},
                                {"use_router": False}, {"alpha": 40, "damping": 0.5}])
def test_parity_reference(conv, kw):
    E, s, g, graph, indptr, indices = conv
    Q = _queries(E, 100, seed=0)
    ours = memgas_session_scores(Q, E, s, g, indptr, indices, **kw).numpy()
    ref = reference_session_scores(Q, E, s, g, graph, 40, **kw)
    same = np.mean([set(np.argsort(-a)[:10]) == set(np.argsort(-b)[:10])
                    for a, b in zip(ours, ref)])
    print(f"\nscores {kw}: same top-10 for {same:.1%} of queries; "
          f"max abs diff {np.abs(ours - ref).max():.1e}")
    assert same >= 0.99
    np.testing.assert_allclose(ours, ref, atol=1e-5)


def test_our_graph_gives_same_scores(conv):
    E, s, g, graph, indptr, indices = conv
    ip2, ix2 = build_association_graph(E, s)
    assert torch.equal(ip2, indptr) and torch.equal(ix2, indices)


def test_ppr_scores_sum_to_one_and_1d_query(conv):
    E, s, g, _, indptr, indices = conv
    Q = _queries(E, 5, seed=1)
    out = memgas_session_scores(Q, E, s, g, indptr, indices)
    assert out.shape == (5, 40) and out.dtype == torch.float64
    torch.testing.assert_close(out.sum(1), torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(memgas_session_scores(Q[2], E, s, g, indptr, indices), out[2])


def test_seed_scores_threshold_semantics():
    x = torch.tensor([[0.5, 0.9, 0.7, 0.7, -0.1, float("nan"), 0.1]], dtype=torch.float64)
    assert seed_scores(x, alpha=3).tolist() == [[0.0, 0.9, 0.7, 0.7, 0.0, 0.0, 0.0]]
    # ties at the threshold are kept: 4 seeds for alpha = 2
    y = torch.tensor([[0.2, 0.2, 0.2, 0.1]], dtype=torch.float64)
    assert seed_scores(y, alpha=2).tolist() == [[0.2, 0.2, 0.2, 0.0]]
    # alpha larger than n, negatives dropped
    assert seed_scores(torch.tensor([[0.3, -0.2]], dtype=torch.float64), alpha=15).tolist() == [[0.3, 0.0]]
    v = torch.tensor([[True, False, True, True]])
    z = torch.tensor([[0.1, 9.0, 0.3, 0.2]], dtype=torch.float64)
    assert seed_scores(z, alpha=2, valid=v).tolist() == [[0.0, 0.0, 0.3, 0.2]]


def test_all_negative_query_gives_zero_scores(conv):
    E, s, g, _, indptr, indices = conv
    q = torch.ones(1, E.shape[1])
    out = memgas_session_scores(q, -E.abs(), s, g, indptr, indices)
    assert torch.equal(out, torch.zeros_like(out))


def _packed_case():
    convs = [conversation(n, d=32, seed=10 + i) for i, n in enumerate([12, 7, 20])]
    graphs = [build_association_graph(c[0], c[1]) for c in convs]
    E = torch.cat([c[0] for c in convs])
    s = torch.cat([c[1] for c in convs])
    g = torch.cat([c[2] for c in convs])
    cid = torch.cat([torch.full((len(c[1]),), i) for i, c in enumerate(convs)])
    indptr, indices = build_association_graph(E, s, conversation_of_node=cid)
    qconv = torch.tensor([2, 0, 0, 1, 2, 2, 0])
    Q = torch.cat([_queries(convs[c][0], 1, seed=i) for i, c in enumerate(qconv.tolist())])
    return convs, graphs, E, s, g, cid, indptr, indices, qconv, Q


def packed_scores(Q, qconv, E, sizes, graph, device="cpu", **kw):
    """The engine's memgas preset over packed conversations (``kw``: the op's ablation
    flags, mapped onto settings)."""
    from memgas_gpu.retrieve import MemoryIndex, QueryBatch
    from memgas_gpu.retrieve.engine import resolve, score

    settings = {"alpha": kw.get("alpha")}
    if kw.get("use_ppr") is False:
        settings["fusion"] = "seeds"
    if kw.get("use_router") is False:
        settings["router"] = "uniform"
    idx = index_from_nodes(E, sizes, graph)
    p, _ = resolve(idx.snapshot(), "memgas", **settings)
    scores, n = score(idx.snapshot(), QueryBatch(Q, qconv), p, device)
    valid = torch.arange(scores.shape[1])[None, :] < n[:, None]
    return scores.masked_fill(~valid.to(scores.device), 0.0), valid


@pytest.mark.parametrize("kw", [{}, {"use_ppr": False}, {"use_router": False, "alpha": 5}])
def test_packed_equals_per_conversation(kw):
    convs, graphs, E, s, g, cid, indptr, indices, qconv, Q = _packed_case()
    scores, valid = packed_scores(Q, qconv, E, [12, 7, 20], (indptr, indices), **kw)
    assert scores.shape == valid.shape == (len(Q), 20)
    for i, c in enumerate(qconv.tolist()):
        E_c, s_c, g_c = convs[c]
        one = memgas_session_scores(Q[i], E_c, s_c, g_c, *graphs[c], **kw)
        N = len(one)
        assert valid[i].sum() == N
        torch.testing.assert_close(scores[i, :N], one, rtol=0, atol=1e-6)  # float32 sims
        assert (scores[i, N:] == 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_cuda_matches_cpu():
    convs, graphs, E, s, g, cid, indptr, indices, qconv, Q = _packed_case()
    cpu = packed_scores(Q, qconv, E, [12, 7, 20], (indptr, indices))[0]
    cuda = packed_scores(Q.cuda(), qconv.cuda(), E.cuda(), [12, 7, 20],
                         (indptr.cuda(), indices.cuda()), device="cuda")[0]
    torch.testing.assert_close(cuda.cpu(), cpu, rtol=0, atol=1e-6)


def test_query_waves_give_each_conversation_one_query_per_row():
    from memgas_gpu.ops import query_waves

    row, n = query_waves(torch.tensor([2, 0, 2, 1, 2, 0]))
    assert row.tolist() == [0, 0, 1, 0, 2, 1] and n == 3
    row, n = query_waves(torch.tensor([4, 1, 7]))  # LongMemEval: one row for all
    assert row.tolist() == [0, 0, 0] and n == 1
    assert query_waves(torch.zeros(0, dtype=torch.long))[1] == 0
