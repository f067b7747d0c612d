"""Small synthetic fixtures shared by the ops tests and benchmarks (no I/O, seeded)."""
from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def torch_single_thread():
    """Run a test module with one torch intra-op thread (import it to activate).

    The batched ops launch many small kernels; on a shared 2-core machine two OpenMP
    threads competing with other processes made them 20-50x slower (busy-wait barriers
    on a descheduled thread), while one thread is stable.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def clustered_unit_vectors(n: int, d: int = 64, n_clusters: int = 8, spread: float = 0.6,
                           seed: int = 0) -> torch.Tensor:
    """``[n, d]`` float32 unit vectors drawn around ``n_clusters`` random centres."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_clusters, d, generator=g)
    centres = centres / centres.norm(dim=1, keepdim=True)
    lab = torch.randint(0, n_clusters, (n,), generator=g)
    x = centres[lab] + spread * torch.randn(n, d, generator=g) / d ** 0.5
    return (x / x.norm(dim=1, keepdim=True)).float()


def conversation(n_sessions: int, d: int = 64, n_gran: int = 4, seed: int = 0,
                 n_topics: int = 6):
    """A synthetic conversation: ``n_sessions * n_gran`` interleaved nodes.

    Sessions have a topic; their granularity nodes are noisy copies of a session vector,
    so similar sessions are related (graph structure) and granularities differ.

    Returns:
        ``(node_emb [n, d] float32, session_of_node [n] int64, gran_of_node [n] int64)``.
    """
    g = torch.Generator().manual_seed(seed)
    topics = torch.randn(n_topics, d, generator=g)
    t = torch.randint(0, n_topics, (n_sessions,), generator=g)
    sess = topics[t] + 0.8 * torch.randn(n_sessions, d, generator=g)
    nodes = sess.repeat_interleave(n_gran, dim=0) + 0.7 * torch.randn(n_sessions * n_gran, d,
                                                                       generator=g)
    nodes = nodes / nodes.norm(dim=1, keepdim=True)
    session_of_node = torch.arange(n_sessions).repeat_interleave(n_gran)
    gran_of_node = torch.arange(n_gran).repeat(n_sessions)
    return nodes.float(), session_of_node, gran_of_node


def gmm_rows(n_rows: int, m: int = 30, seed: int = 0) -> np.ndarray:
    """``[n_rows, m]`` float32 score rows of five kinds, each row sorted descending.

    Kinds (in equal shares): standard normal rows; bimodal rows; rows with ties
    (values on a coarse grid); near-constant rows (spread 1e-3..1e-2 around ~0.5,
    i.e. variance comparable to ``reg_covar``); real-similarity-like rows (top-m dot
    products of clustered random unit vectors).
    """
    rng = np.random.default_rng(seed)
    k = n_rows // 5
    kinds = []
    kinds.append(rng.normal(size=(k, m)) * rng.uniform(0.01, 2, (k, 1)) + rng.normal(size=(k, 1)))
    a = rng.uniform(0.5, 3.0, (k, 1))
    mix = rng.random((k, m)) < rng.uniform(0.1, 0.6, (k, 1))
    kinds.append(np.where(mix, a, 0.0) + rng.normal(size=(k, m)) * rng.uniform(0.05, 0.6, (k, 1)))
    kinds.append(np.round(rng.normal(size=(k, m)) * 2) / 4 + rng.integers(0, 3, (k, 1)))
    kinds.append(0.5 + rng.normal(size=(k, 1)) * 0.1
                 + rng.normal(size=(k, m)) * 10 ** rng.uniform(-3, -2, (k, 1)))
    rest = n_rows - 4 * k
    emb = clustered_unit_vectors(rest + 400, d=96, n_clusters=12, seed=seed).numpy()
    sims = emb[:rest] @ emb[rest:].T
    kinds.append(-np.sort(-sims, axis=1)[:, :m])
    rows = np.concatenate(kinds, axis=0).astype(np.float32)
    return -np.sort(-rows, axis=1)
