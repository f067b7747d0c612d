"""``memgas_hybrid``: MemGAS routing and propagation over dense AND lexical signals.

Every *signal* is a ``[Q, N]`` score of each question against the N sessions of its
conversation, attached to one granularity node of the association graph:

===============  ===========================================  =====
signal           score                                        node
===============  ===========================================  =====
``dense_S/T/U/K``  cosine of the question and S, T (mean of turn   S/T/U/K
                 embeddings), U, K embeddings (as ``memgas``)
``dense_Tmax``   cosine of the best turn of the session           T
                 (needs the index's per-turn embeddings)
``bm25_S``       BM25 over the conversation's session texts   S
``bm25_Tmax``    best turn of the session (BM25 over turns)   T
``bm25_Tmean``   mean turn score of the session               T
``bm25_U``       BM25 over the summaries                      U
``bm25_K``       BM25 over the keyword lists                  K
===============  ===========================================  =====

Read path for one question (``fusion="ppr"``: DESIGN.md's MemGAS with signals in
place of granularities; the default ``fusion="sum"`` stops after step 2, see below):

1. **Normalise** each signal over the conversation's sessions (``norm``; default
   z-score ``(x - mean) / std``).  Cosines live in [-1, 1] and are compressed (MiniLM:
   most sessions within 0.1 of each other) while BM25 scores are unbounded and vary
   with query length and IDF; a softmax at one temperature over raw scores would make
   BM25 look confident (near one-hot) and cosine look flat (near uniform) whatever
   their actual quality.  After the z-score every signal has mean 0 and unit variance
   for every query, so the router's entropy compares the *shape* of the distributions
   (how far the best sessions stand out, in standard deviations), and the weighted sum
   below adds commensurable numbers.  Max-normalisation (``x / max``) keeps BM25's
   zero floor but leaves cosine compressed near 1, so it is offered but not default.
2. **Route**: ``p_s = softmax(z_s / λ)``, ``H_s`` its entropy, ``w_s ∝ 1 / H_s``
   (``router="inverse"``, the paper's), or uniform weights (``router="uniform"``).
3. **Seeds**: node score = Σ of ``w_s · z_s`` over the signals attached to that node;
   keep the top ``α`` nodes, negatives to 0.
4. **Propagate**: personalized PageRank on the association graph (``graph="dense"``,
   the MemGAS GMM graph; ``"lexical"``: edges from BM25-weighted term vectors tested
   by the same GMM; ``"both"``: their union; ``"none"``), damping ``d``.
5. Session score = sum of its node masses.

Other ``fusion`` modes: ``"sum"`` (the default: Σ_s w_s z_s over all sessions, no seed
cut, no graph; on LoCoMo dev it ties the best ``ppr`` setting at recall_all@3 and is
better at @10, see docs/hybrid.md), ``"seeds"`` (step 4 skipped) and ``"rrf"``
(reciprocal-rank fusion, Σ_s w_s / (60 + rank_s)).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import torch
from torch import Tensor

from .. import ops

__all__ = ["HybridParams", "DENSE_SIGNALS", "SIGNALS", "DEFAULT_SIGNALS", "EXTRACTIVE_SIGNALS",
           "extractive_summaries", "resolve_signals", "hybrid_signals", "fuse", "retrieve_hybrid",
           "lexical_graph"]

DENSE_SIGNALS = ("dense_S", "dense_T", "dense_Tmax", "dense_U", "dense_K")
SIGNALS = DENSE_SIGNALS + ("bm25_S", "bm25_Tmax", "bm25_Tmean", "bm25_U", "bm25_K")
#: granularity node (0 S, 1 T, 2 U, 3 K) each signal seeds
NODE_OF = {"dense_S": 0, "dense_T": 1, "dense_Tmax": 1, "dense_U": 2, "dense_K": 3, "bm25_S": 0,
           "bm25_Tmax": 1, "bm25_Tmean": 1, "bm25_U": 2, "bm25_K": 3}
#: chosen by the sweeps in docs/hybrid.md (LoCoMo dev, leave-one-conversation-out checked)
DEFAULT_SIGNALS = ("bm25_S", "bm25_Tmax", "bm25_U", "dense_Tmax", "dense_U")
#: the default signals when the index's summaries are *extractive* (``summaries="offline"``:
#: sentences copied from the session): the U signals then repeat the S evidence and count it
#: twice, so they are left out (LoCoMo dev: 79.5 -> 82.1 recall_all@3, docs/hybrid.md)
EXTRACTIVE_SIGNALS = ("bm25_S", "bm25_Tmax", "dense_Tmax")
NORMS = ("z", "max", "minmax", "none")
FUSIONS = ("ppr", "seeds", "sum", "rrf")
GRAPHS = ("dense", "lexical", "both", "none")
ROUTERS = ("inverse", "one_minus", "uniform")


@dataclass
class HybridParams:
    """Settings of ``method="memgas_hybrid"`` (every signal and stage switchable).

    Attributes:
        signals: signal names (see the module table; default :data:`DEFAULT_SIGNALS`:
            BM25 over sessions, best turn and summaries, dense best turn and summaries).
        norm: per-query, per-signal normalisation ``"z"`` (default), ``"max"``,
            ``"minmax"``, ``"none"``.
        temperature: router softmax temperature λ on normalised scores.
        router: ``"inverse"`` (paper, ``w ∝ 1/H``), ``"one_minus"`` or ``"uniform"``.
        alpha: seed nodes kept.
        damping: PPR probability of following an edge.
        fusion: ``"sum"`` (default: routed sum of all sessions' normalised scores),
            ``"ppr"`` (seeds + personalized PageRank, the full MemGAS read path),
            ``"seeds"`` (top-α seeds summed per session), ``"rrf"``.
        graph: ``"dense"`` (default), ``"lexical"``, ``"both"``, ``"none"``.
        k1, b, bm25_method: BM25 settings (``bm25s`` defaults).
        auto_signals: when ``signals`` is :data:`DEFAULT_SIGNALS` and the index's summaries
            are extractive (``summaries="offline"``), use :data:`EXTRACTIVE_SIGNALS`
            instead (see :func:`resolve_signals`); ``False`` keeps ``signals`` as given.
    """

    signals: tuple = DEFAULT_SIGNALS
    norm: str = "z"
    temperature: float = 1.0
    router: str = "inverse"
    alpha: int = 15
    damping: float = 0.1
    fusion: str = "sum"
    graph: str = "dense"
    k1: float = 1.5
    b: float = 0.75
    bm25_method: str = "lucene"
    auto_signals: bool = True

    def check(self) -> "HybridParams":
        sig = tuple(self.signals.split("+")) if isinstance(self.signals, str) else tuple(
            self.signals)
        bad = [s for s in sig if s not in NODE_OF]
        if bad or not sig:
            raise ValueError(f"unknown signal(s) {bad}; choose from {', '.join(SIGNALS)}")
        for name, value, allowed in (("norm", self.norm, NORMS), ("fusion", self.fusion, FUSIONS),
                                     ("graph", self.graph, GRAPHS),
                                     ("router", self.router, ROUTERS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        return replace(self, signals=sig)


def extractive_summaries(index) -> bool:
    """True when the index's summaries were extracted from the session text (the
    ``"offline"`` TF-IDF extractor), as recorded in its build config."""
    cfg = getattr(index, "config", None) or {}
    summ = (cfg.get("expansion") or {}).get("summaries") or {}
    return isinstance(summ, dict) and summ.get("method") == "offline"


def resolve_signals(index, params: HybridParams) -> HybridParams:
    """``params`` (checked) with :data:`EXTRACTIVE_SIGNALS` in place of the default signal
    set when ``auto_signals`` is on and :func:`extractive_summaries` holds."""
    p = params.check()
    if p.auto_signals and p.signals == DEFAULT_SIGNALS and extractive_summaries(index):
        p = replace(p, signals=EXTRACTIVE_SIGNALS)
    return p


def _normalise(x: Tensor, valid: Tensor, norm: str) -> Tensor:
    """``[Q, S, N]`` → normalised over N (valid sessions only); invalid → 0."""
    v = valid[:, None, :]
    cnt = v.sum(-1, keepdim=True).clamp_min(1).to(x.dtype)
    xm = torch.where(v, x, torch.zeros_like(x))
    if norm == "z":
        mean = xm.sum(-1, keepdim=True) / cnt
        var = (torch.where(v, x - mean, torch.zeros_like(x)) ** 2).sum(-1, keepdim=True)
        sd = (var / (cnt - 1).clamp_min(1)).sqrt()
        out = (x - mean) / sd.clamp_min(1e-12)
    elif norm == "max":
        mx = torch.where(v, x, torch.full_like(x, float("-inf"))).amax(-1, keepdim=True)
        out = x / mx.abs().clamp_min(1e-12)
    elif norm == "minmax":
        mx = torch.where(v, x, torch.full_like(x, float("-inf"))).amax(-1, keepdim=True)
        mn = torch.where(v, x, torch.full_like(x, float("inf"))).amin(-1, keepdim=True)
        out = (x - mn) / (mx - mn).clamp_min(1e-12)
    else:
        out = x
    return torch.where(v, out, torch.zeros_like(out))


def hybrid_signals(index, qi: Tensor, names: Sequence[str], rows: Tensor, valid: Tensor,
                   dev: torch.device, k1: float = 1.5, b: float = 0.75,
                   bm25_method: str = "lucene") -> Tensor:
    """Raw ``[Q, S, N_max]`` signals, in the order of ``names``."""
    from ..lexical import BM25Params, lexical_signals
    from .search import _similarities

    out = torch.zeros(qi.numel(), len(names), rows.shape[1], dtype=torch.float32, device=dev)
    dense = [n for n in names if n in DENSE_SIGNALS and n != "dense_Tmax"]
    if "dense_Tmax" in names:
        out[:, list(names).index("dense_Tmax")] = best_turn_similarity(index, qi, rows, valid,
                                                                        dev)
    if dense:
        sims = _similarities(index, qi, rows, valid, "all", dev)
        for j, n in enumerate(names):
            if n in dense:
                out[:, j] = sims[:, NODE_OF[n]]
    lex = [n for n in names if n not in DENSE_SIGNALS]
    if lex:
        got = lexical_signals(index, qi, lex, BM25Params(k1, b, bm25_method), device=str(dev))
        for j, n in enumerate(names):
            if n in got:
                out[:, j] = got[n]
    return torch.where(valid.to(dev)[:, None, :], out, torch.zeros_like(out))


def best_turn_similarity(index, qi: Tensor, rows: Tensor, valid: Tensor,
                         dev: torch.device) -> Tensor:
    """``[Q, N_max]``: max over each session's turns of the cosine with the question
    (-1 for a session without turns), one product per conversation."""
    if getattr(index, "turns", None) is None:
        raise ValueError("signal dense_Tmax needs per-turn embeddings: build the index with "
                         "keep_turns=True")
    Q, N = rows.shape
    out = torch.full((Q, N), -1.0, dtype=torch.float32, device=dev)
    conv = index.q_conv[qi]
    ptr = index.turn_ptr
    for c in torch.unique(conv).tolist():
        qs = torch.nonzero(conv == c).squeeze(1)
        a, b = int(index.conv_offsets[c]), int(index.conv_offsets[c + 1])
        slots = index.row_slot[a:b]
        cnt = ptr[slots + 1] - ptr[slots]
        pos = torch.repeat_interleave(torch.arange(b - a), cnt)
        first = torch.cat([torch.zeros(1, dtype=torch.long), cnt.cumsum(0)[:-1]])
        tid = ptr[slots][pos] + torch.arange(pos.numel()) - first[pos]
        sims = index.q_emb[qi[qs]].to(dev) @ index.turns[tid].to(dev).T  # [q, turns]
        blk = torch.full((qs.numel(), N), float("-inf"), device=dev)
        blk.scatter_reduce_(1, pos.to(dev)[None].expand_as(sims), sims.float(), "amax")
        out[qs.to(dev)] = torch.where(torch.isinf(blk), torch.full_like(blk, -1.0), blk)
    return out


def _router(z: Tensor, valid: Tensor, p: HybridParams) -> Tensor:
    Q, S, _ = z.shape
    if p.router == "uniform":
        return torch.full((Q, S), 1.0 / S, dtype=z.dtype, device=z.device)
    return ops.entropy_router(z, p.temperature, p.router, valid[:, None, :])


def _ppr_packed(index, conv: Tensor, start: Tensor, seeds: Tensor, valid: Tensor,
                graph: tuple, damping: float) -> Tensor:
    """PPR of ``[Q, 4, N]`` seeds on the block-diagonal graph → ``[Q, 4, N]`` masses."""
    dev = seeds.device
    Q, G, N = seeds.shape
    n = index.n_rows * G
    pos = (start.to(dev)[:, None, None] + torch.arange(N, device=dev)[None, None, :]) * G \
        + torch.arange(G, device=dev)[None, :, None]
    ok = valid[:, None, :].expand(Q, G, N)
    pos = torch.where(ok, pos, torch.zeros_like(pos))
    slot, R = ops.query_waves(conv.to(dev))
    reset = torch.zeros(R, n, dtype=torch.float64, device=dev)
    rws = slot[:, None, None].expand(Q, G, N)
    reset.index_put_((rws[ok], pos[ok]), seeds[ok].to(torch.float64), accumulate=True)
    _, conv_of_node = index.node_layout()
    pr = ops.personalized_pagerank(graph[0].to(dev), graph[1].to(dev), reset, damping,
                                   1e-10, 100, blocks=conv_of_node.to(dev))
    return torch.where(ok, pr[rws, pos], torch.zeros_like(pr[rws, pos]))


def fuse(index, z_raw: Tensor, valid: Tensor, conv: Tensor, start: Tensor,
         params: HybridParams, graph: Optional[tuple] = None) -> Tensor:
    """Session scores ``[Q, N]`` from raw signals ``[Q, S, N]`` (ordered as
    ``params.signals``); ``graph`` is the CSR for ``fusion="ppr"``."""
    p = params
    dev = z_raw.device
    valid = valid.to(dev)
    z = _normalise(z_raw.double(), valid, p.norm)
    w = _router(z, valid, p)  # [Q, S]
    if p.fusion == "rrf":
        rank = torch.argsort(torch.argsort(torch.where(valid[:, None], z, torch.full_like(
            z, float("-inf"))), dim=-1, descending=True, stable=True), dim=-1).to(z.dtype)
        return (w[..., None] / (60.0 + rank)).sum(1)
    contrib = w[..., None] * z  # [Q, S, N]
    if p.fusion == "sum":
        return contrib.sum(1)
    Q, S, N = z.shape
    node = torch.zeros(Q, 4, N, dtype=z.dtype, device=dev)
    idx = torch.tensor([NODE_OF[s] for s in p.signals], device=dev)
    node.index_add_(1, idx, contrib)
    ok = valid[:, None, :].expand(Q, 4, N)
    seeds = ops.seed_scores(node.reshape(Q, 4 * N), p.alpha, ok.reshape(Q, 4 * N))
    seeds = seeds.view(Q, 4, N)
    if p.fusion == "seeds" or p.graph == "none":
        return seeds.sum(1)
    return _ppr_packed(index, conv, start, seeds, valid, graph, p.damping).sum(1)


def lexical_graph(index, m: int = 30, skip_sessions: Optional[int] = None,
                  device: Optional[str] = None, k1: float = 1.5, b: float = 0.75) -> tuple:
    """Association graph over the same ``4*row + g`` nodes from *lexical* similarity.

    Node vectors are L2-normalised BM25 document weights (``idf · tfc`` of every term,
    corpus statistics per conversation and granularity; T = mean of the session's
    normalised turn vectors), over the conversation's terms; similarity = cosine; the
    top ``m`` earlier nodes are tested by the same 2-component GMM as the dense graph.
    Cached in ``index.lexical.graphs``.
    """
    from ..ops.bm25 import bm25_weights

    lex = index.lexical
    if lex is None:
        raise ValueError("this index has no lexical data: build it with lexical=True")
    skip = index.params.skip_sessions if skip_sessions is None else skip_sessions
    key = f"lexgmm_m{m}_s{skip}_k{k1}_b{b}"
    if key in lex.graphs:
        return lex.graphs[key]
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    edges = []
    offs = index.conv_offsets.tolist()
    for c in range(index.n_conversations):
        rows = torch.arange(offs[c], offs[c + 1])
        nr = rows.numel()
        if nr == 0:
            continue
        slots = index.row_slot[rows]
        vecs, parts = [], []
        for g in "STUK":
            ptr = lex.doc_ptr[g]
            cnt = ptr[slots + 1] - ptr[slots]
            doc_row = torch.repeat_interleave(torch.arange(nr), cnt)
            first = torch.cat([torch.zeros(1, dtype=torch.long), cnt.cumsum(0)[:-1]])
            ids = ptr[slots][doc_row] + torch.arange(doc_row.numel()) - first[doc_row]
            parts.append((lex.docs[g].rows(ids), doc_row))
        terms = torch.unique(torch.cat([d.indices for d, _ in parts]))
        Vc = terms.numel()
        for docs, doc_row in parts:
            local = torch.searchsorted(terms, docs.indices)
            W, col_key = bm25_weights(docs.indptr, local, docs.tf,
                                      torch.zeros(docs.n_rows, dtype=torch.long), Vc, k1=k1, b=b)
            d_i, col = W.indices()
            dense = torch.zeros(docs.n_rows, Vc, dtype=torch.float32)
            dense[d_i, col_key[col]] = W.values().float()
            dense = torch.nn.functional.normalize(dense, dim=1)
            per_row = torch.zeros(nr, Vc).index_add_(0, doc_row, dense)
            vecs.append(torch.nn.functional.normalize(per_row, dim=1))
        emb = torch.stack(vecs, 1).reshape(nr * 4, Vc).to(dev)
        sess = torch.arange(nr).repeat_interleave(4).to(dev)
        e = ops.association_edges(emb, sess, m=m, skip_sessions=skip, accept="gmm")
        edges.append(e.cpu() + offs[c] * 4)
    e = torch.cat(edges, 1) if edges else torch.zeros(2, 0, dtype=torch.long)
    lex.graphs[key] = ops.symmetric_csr(e, index.n_rows * 4)
    return lex.graphs[key]


def _graph(index, p: HybridParams, dev: torch.device):
    if p.fusion != "ppr" or p.graph == "none":
        return None
    if p.graph == "dense":
        return index.graph(device=str(dev))
    lg = lexical_graph(index, index.params.m, device=str(dev), k1=p.k1, b=p.b)
    if p.graph == "lexical":
        return lg
    key = f"both_k{p.k1}_b{p.b}"
    if key not in index.lexical.graphs:
        dg = index.graph(device=str(dev))
        edges = []
        for ip, ix in (dg, lg):
            src = torch.repeat_interleave(torch.arange(ip.numel() - 1), ip[1:] - ip[:-1])
            edges.append(torch.stack([src, ix]))
        index.lexical.graphs[key] = ops.symmetric_csr(torch.cat(edges, 1), index.n_rows * 4)
    return index.lexical.graphs[key]


def retrieve_hybrid(index, qi: Tensor, params: HybridParams, dev: torch.device):
    """Scores ``[Q, N_max]`` (``-inf`` padding) of ``memgas_hybrid``."""
    from .search import _gather_layout

    p = resolve_signals(index, params)
    conv, start, n, valid, rows = _gather_layout(index, qi)
    x = hybrid_signals(index, qi, p.signals, rows, valid, dev, p.k1, p.b, p.bm25_method)
    scores = fuse(index, x, valid, conv, start, p, _graph(index, p, dev))
    return scores.float().masked_fill(~valid.to(dev), float("-inf"))
