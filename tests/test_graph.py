"""Association graph: parity with the scikit-learn reference, CSR invariants, edge cases."""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from memgas_gpu.ops import association_edges, build_association_graph, node_layout, symmetric_csr

from _synth import conversation, torch_single_thread  # noqa: F401

pytest.importorskip("sklearn")
from memgas_gpu.reference import reference_edges  # noqa: E402


def _adj(edges) -> dict:
    out = defaultdict(set)
    for a, b in (edges.T.tolist() if torch.is_tensor(edges) else edges):
        out[a].add(b)
    return out


def _node_agreement(ours, ref, n: int) -> float:
    A, B = _adj(ours), _adj(ref)
    return sum(A[i] == B[i] for i in range(n)) / n


def _check_csr(indptr, indices, n):
    assert indptr.dtype == indices.dtype == torch.int64 and indptr.shape == (n + 1,)
    rows = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    assert not (rows == indices).any()  # no self-loops
    key = rows * n + indices
    assert (key[1:] > key[:-1]).all()  # sorted per row, no duplicates
    assert torch.equal(torch.sort(indices * n + rows).values, key)  # symmetric


def test_parity_reference_30_sessions():
    E, s, _ = conversation(30, d=64, seed=0)
    ours = association_edges(E, s)
    ref = reference_edges(E, s)
    rate = _node_agreement(ours, ref, len(E))
    print(f"\ngraph vs scikit-learn reference: same edge set for {rate:.2%} of {len(E)} nodes")
    assert rate >= 0.995
    indptr, indices = build_association_graph(E, s)
    _check_csr(indptr, indices, len(E))


@pytest.mark.slow
def test_parity_reference_150_sessions_d384():
    E, s, _ = conversation(150, d=384, seed=5)
    rate = _node_agreement(association_edges(E, s), reference_edges(E, s), len(E))
    print(f"\ngraph vs scikit-learn reference (600 nodes, d=384): {rate:.2%} same edge sets")
    assert rate >= 0.995


def test_parity_uneven_sessions_and_large_m():
    # 3 granularities, a session with only 1 node, and m larger than the candidate pool
    E, s, _ = conversation(14, d=48, n_gran=3, seed=2)
    keep = torch.ones(len(s), dtype=torch.bool)
    keep[3 * 7 + 1:3 * 7 + 3] = False
    E, s = E[keep], s[keep]
    for m in (10, 50):
        assert _node_agreement(association_edges(E, s, m=m), reference_edges(E, s, m=m),
                               len(E)) >= 0.995


def test_few_sessions_no_edges():
    E, s, _ = conversation(5, seed=1)
    assert association_edges(E, s).shape == (2, 0)
    indptr, indices = build_association_graph(E, s)
    assert indptr.tolist() == [0] * (len(E) + 1) and indices.numel() == 0
    assert association_edges(E[:0], s[:0]).shape == (2, 0)


def test_skip_sessions_zero_and_first_session():
    E, s, _ = conversation(3, seed=1)
    e = association_edges(E, s, skip_sessions=0)
    ref = reference_edges(E, s, skip_sessions=0)
    assert len(ref) == 24  # sessions 1 and 2 link back; session 0 has no candidates
    assert sorted(map(tuple, e.T.tolist())) == sorted(ref)
    assert (s[e[0]] > s[e[1]]).all() and (s[e[0]] > 0).all()


def test_zero_vectors():
    E, s, _ = conversation(12, d=32, seed=3)
    E = E.clone()
    E[20] = 0  # session 5: 20 earlier nodes < m, so no tie-order ambiguity
    E[23] = 0
    ours = association_edges(E, s)
    assert _node_agreement(ours, reference_edges(E, s), len(E)) >= 0.995
    assert set(_adj(ours)[20]) == set(range(20))  # constant row: all accepted


def test_multiple_conversations_block_diagonal():
    convs = [conversation(n, d=32, seed=i) for i, n in enumerate([9, 3, 14, 7])]
    E = torch.cat([c[0] for c in convs])
    s = torch.cat([c[1] for c in convs])  # session ids restart at 0 per conversation
    cid = torch.cat([torch.full((len(c[1]),), i) for i, c in enumerate(convs)])
    offs = np.cumsum([0] + [len(c[1]) for c in convs])
    sep = torch.cat([association_edges(c[0], c[1]) + int(o) for c, o in zip(convs, offs)], 1)
    both = association_edges(E, s, conversation_of_node=cid)
    assert torch.equal(both, sep)
    # tiny chunks and GMM batches give the same edges
    assert torch.equal(association_edges(E, s, conversation_of_node=cid, max_elements=50,
                                         gmm_batch=7), sep)
    assert torch.equal(association_edges(E, s, conversation_of_node=cid, batch_size=3), sep)
    indptr, indices = build_association_graph(E, s, conversation_of_node=cid)
    _check_csr(indptr, indices, len(E))
    rows = torch.repeat_interleave(torch.arange(len(E)), indptr[1:] - indptr[:-1])
    assert torch.equal(cid[rows], cid[indices])


def test_incremental_append():
    E, s, _ = conversation(20, d=32, seed=4)
    k = 4 * 12
    old = association_edges(E[:k], s[:k])
    full = association_edges(E, s)
    assert torch.equal(full[:, :old.shape[1]], old)  # identical old edges, new ones appended
    new = association_edges(E, s, first_node=k)
    assert torch.equal(torch.cat([old, new], 1), full)
    a = build_association_graph(E, s)
    b = symmetric_csr(torch.cat([old, new], 1), len(E))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_node_layout():
    sess = torch.tensor([7, 7, 9, 9, 9, 2, 0, 0, 5])
    conv = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1])
    ss, cs, rank = node_layout(sess, conv)
    assert ss.tolist() == [0, 0, 2, 2, 2, 5, 6, 6, 8]
    assert cs.tolist() == [0] * 6 + [6] * 3
    assert rank.tolist() == [0, 0, 1, 1, 1, 2, 0, 0, 1]


def test_accept_all_gives_fixed_topk_edges():
    from memgas_gpu.ops import association_edges

    g = torch.Generator().manual_seed(5)
    emb = torch.randn(40, 8, generator=g)
    sess = torch.arange(10).repeat_interleave(4)
    e = association_edges(emb, sess, m=5, skip_sessions=5, accept="all")
    sims = emb @ emb.T
    expect = set()
    for v in range(20, 40):
        earlier = (v // 4) * 4
        top = torch.topk(sims[v, :earlier], 5).indices.tolist()
        expect |= {(v, j) for j in top}
    assert set(map(tuple, e.T.tolist())) == expect
