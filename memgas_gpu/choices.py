"""The named choices of the read path's settings, in one place without torch (the
settings objects, the command line and the tensor ops read them).

* :data:`NORMS`: per-query normalisation of a signal (``ReadParams.norm``,
  :func:`memgas_gpu.ops.normalise_signals`).
* :data:`ROUTER_MODES` and :data:`ROUTERS`: the entropy router's weights
  (:func:`memgas_gpu.ops.entropy_router`), and those plus ``"uniform"``
  (``ReadParams.router``).
* :data:`FUSIONS`: how the routed signals become session scores (``ReadParams.fusion``).
* :data:`GRAPHS`: the graph PageRank propagates over (``ReadParams.graph``).
* :data:`GRAPH_RULES`: how the association graph links nodes (``GraphParams.rule``).
* :data:`BM25_METHODS`: BM25 variants (``ReadParams.bm25_method``,
  :func:`memgas_gpu.ops.bm25_weights`).
"""
from __future__ import annotations

__all__ = ["NORMS", "ROUTER_MODES", "ROUTERS", "FUSIONS", "GRAPHS", "GRAPH_RULES",
           "BM25_METHODS"]

#: ``z`` (z-score), ``max`` (x / max |x|), ``minmax`` ((x - min) / (max - min)), ``none``
NORMS = ("z", "max", "minmax", "none")
#: entropy router weights: the paper's w ∝ 1/H, the authors' code's 1 - H
ROUTER_MODES = ("inverse", "one_minus")
#: the read path's routers: the entropy router's modes, or the same weight for every signal
ROUTERS = ROUTER_MODES + ("uniform",)
#: personalized PageRank from seed nodes, the seeds alone, Σ w·z, reciprocal-rank fusion
FUSIONS = ("ppr", "seeds", "sum", "rrf")
#: the MemGAS GMM graph, top-k edges, the lexical graph, both, no edges
GRAPHS = ("dense", "topk", "lexical", "both", "none")
#: association-graph rules: the GMM test (MemGAS) or fixed top-k (the no_gmm ablation)
GRAPH_RULES = ("gmm", "topk")
#: BM25 variants (bm25s's names; ``lucene`` is its default)
BM25_METHODS = ("lucene", "robertson", "atire")
