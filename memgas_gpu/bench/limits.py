"""Arithmetic limits and goal figures: how close a measured time is to what the chip allows.

The limit of a piece of work is ``max(FLOPs / peak FLOP/s, bytes / peak bandwidth)`` on
one H200 (dense bf16 989 TFLOP/s, HBM3e 4.8 TB/s; the issue's figures; the MemGAS design notes quote
the more conservative 790 TFLOP/s and 4.3 TB/s). The FLOP and byte counts below are
the minimum the algorithm needs (each input read once, each output written once);
our kernels compute similarities in float32, so the bf16 peak flatters the limit.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

__all__ = ["PEAK_FLOPS", "PEAK_BYTES", "limit_seconds", "graph_cost", "query_cost",
           "bm25_cost", "encode_cost", "GOALS", "RATIO_GOALS", "evaluate_goals"]

PEAK_FLOPS = 989e12  # H200 SXM dense bf16
PEAK_BYTES = 4.8e12  # H200 HBM3e
N_GRAN = 4


def limit_seconds(flops: float, nbytes: float) -> float:
    """``max(flops / PEAK_FLOPS, bytes / PEAK_BYTES)``."""
    return max(flops / PEAK_FLOPS, nbytes / PEAK_BYTES)


def graph_cost(n_conv: int, n_sessions: int, dim: int, m: int = 30, skip_sessions: int = 5,
               elem: int = 4) -> tuple[float, float]:
    """FLOPs and bytes of the association-graph build.

    Node ``v`` of session ``i >= skip_sessions`` is compared with the ``4 i`` nodes of
    earlier sessions: ``16 * sum_i i`` dot products of length ``d`` per conversation,
    i.e. O(n^2 d). Bytes: every embedding read once, and ``m`` candidate (score, index)
    pairs per node written and read back for the GMM.
    """
    pairs = N_GRAN * N_GRAN * sum(range(skip_sessions, n_sessions))
    flops = 2.0 * dim * pairs * n_conv
    nodes = n_conv * n_sessions * N_GRAN
    nbytes = nodes * dim * elem + 2 * nodes * m * (4 + 8)
    return flops, float(nbytes)


def query_cost(n_queries: int, n_sessions: int, dim: int, nnz: int, n_nodes: int,
               n_conv: int, iters: Optional[int] = None, damping: float = 0.1,
               tol: float = 1e-10, elem: int = 4) -> tuple[float, float]:
    """FLOPs and bytes of routing + PPR + ranking for ``n_queries`` questions.

    Each question reads its haystack's ``4 N`` node embeddings (O(Q N d)); the packed
    PPR runs ``ceil(Q / C)`` rows over the block-diagonal graph for ``iters`` iterations
    (default ``ceil(log(tol) / log(d))``, the power-iteration contraction), each reading
    the CSR once (int32 columns, int64 row pointers) and streaming the state (read ``p``,
    write the new ``p`` and ``p / deg``: 3 float64 per node and row). The neighbour
    gathers are not counted: a haystack's block (a few thousand nodes) stays in cache.
    """
    if iters is None:
        iters = max(1, math.ceil(math.log(tol) / math.log(damping)))
    rows = max(1, math.ceil(n_queries / max(1, n_conv)))
    sim_flops = 2.0 * n_queries * N_GRAN * n_sessions * dim
    sim_bytes = n_queries * N_GRAN * n_sessions * dim * elem
    ppr_flops = 2.0 * iters * nnz * rows
    ppr_bytes = iters * (nnz * 4 + n_nodes * 8 + 3 * n_nodes * 8 * rows)
    return sim_flops + ppr_flops, float(sim_bytes + ppr_bytes)


def bm25_cost(post, terms, width: int = 0) -> tuple[float, float]:
    """FLOPs and bytes of BM25 scoring over precomputed postings
    (:func:`memgas_gpu.lexical.bm25_postings`): the postings of every (query, term) pair
    are read once (a weight and a document index each, two FLOPs per posting) and the
    dense ``[Q, width]`` float32 scores are written once."""
    import torch

    ck = post.col_key.cpu()
    n_cols = int(ck.numel())
    Q = terms.q_indptr.numel() - 1
    out_bytes = 4.0 * Q * width
    if n_cols == 0:
        return 0.0, out_bytes
    df = (post.col_ptr[1:] - post.col_ptr[:-1]).cpu()
    rows = torch.repeat_interleave(torch.arange(Q),
                                   (terms.q_indptr[1:] - terms.q_indptr[:-1]).cpu())
    key = terms.q_group.cpu()[rows] * terms.n_terms + terms.q_indices.cpu()
    pos = torch.searchsorted(ck, key).clamp_max(n_cols - 1)
    touched = int(df[pos][ck[pos] == key].sum())
    per = post.score.element_size() + post.doc.element_size()
    return 2.0 * touched, float(touched * per) + out_bytes


def encode_cost(lengths: Sequence[int], layers: int, hidden: int, intermediate: int
                ) -> float:
    """Forward FLOPs of a BERT encoder over windows of ``lengths`` real tokens.

    Per token ``2 L (4 h^2 + 2 h i)`` for the projections and feed-forward, plus
    ``4 L h n`` for attention over a window of ``n`` tokens (BERT-base: ~0.19 GFLOP per
    token at n = 512).
    """
    dense = 2.0 * layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    return float(sum(n * dense + 4.0 * layers * hidden * n * n for n in lengths))


#: H200 goals: (key, description, stage, size filter, extra filter, kind, target).
#: kind "max_s": seconds must be <= target; "min_rate": work/s must be >= target.
GOALS = [
    ("graph", "graph build, 500 x 500 sessions", "graph",
     {"haystacks": 500, "sessions": 500}, {}, "max_s", 0.3),
    ("query", "500 queries (routing + PPR + ranking)", "query",
     {"haystacks": 500, "sessions": 500}, {}, "max_s", 2e-3),
    ("bm25", "BM25, 500 queries", "bm25", {"haystacks": 500, "sessions": 500}, {}, "max_s",
     1e-3),
    ("encode", "BERT-base encoding, real tokens/s", "encode", {}, {"model": "12x768"},
     "min_rate", 2.5e6),
    ("index", "full LongMemEval-M-shaped index (500 x 500 sessions)", "index", {},
     {"full_haystacks": 500}, "max_s", 600.0),
]

#: CPU goals: ours / reference speed ratio of the headline points.
RATIO_GOALS = {"graph": 200.0, "query": 20.0, "encode": 1.5}


def _match(rec, stage: str, shape: dict, extra: dict) -> bool:
    return rec.impl == "ours" and rec.stage == stage and all(
        rec.size.get(k) == v for k, v in shape.items()) and all(
        rec.extra.get(k) == v for k, v in extra.items())


def evaluate_goals(records) -> list[dict]:
    """One row per H200 goal: measured value, limit, and whether it is met.

    The matching headline record is used (``extra["headline"]``), else the largest
    matching sweep point; a goal with no matching record is reported as not measured.
    For ``index``, ``extra["full_seconds"]`` (extrapolated to the full dataset) is used
    when present.
    """
    rows = []
    for key, desc, stage, shape, extra, kind, target in GOALS:
        cands = [r for r in records if _match(r, stage, shape, extra)]
        cands.sort(key=lambda r: (not r.extra.get("headline"), -r.work))
        row = {"goal": key, "what": desc, "target": target, "kind": kind, "measured": None,
               "limit": None, "met": None, "note": ""}
        if cands:
            r = cands[0]
            secs = r.extra.get("full_seconds", r.seconds) if stage == "index" else r.seconds
            flops, nbytes = r.extra.get("flops"), r.extra.get("bytes")
            lim = limit_seconds(flops or 0.0, nbytes or 0.0) if (flops or nbytes) else None
            if kind == "max_s":
                row["measured"], row["limit"] = secs, lim
                row["met"] = secs <= target
            else:
                row["measured"] = r.rate
                row["limit"] = r.work / lim if lim else None
                row["met"] = r.rate >= target
            row["note"] = r.note
            row["size"] = dict(r.size)
        rows.append(row)
    return rows
