"""Core tensor ops of MemGAS (device-agnostic torch; see each module for the algorithm)."""
from .bm25f import field_weighted_counts
from .fusion import node_scores, reciprocal_rank_fusion, sum_granularities, weighted_sum
from .gmm1d import gmm1d_accept
from .graph import association_edges, build_association_graph, node_layout, symmetric_csr
from .normalise import NORMS, normalise_signals
from .ppr import csr_adjacency, personalized_pagerank
from .propagate import propagate, query_waves, seed_scores
from .query_layout import Layout, query_layout
from .rank import rank_sessions
from .router import ROUTER_MODES, entropy_router, router_weights
from .scores import memgas_session_scores
from .selfcheck import backend
from .sparse import check_csr, quiet_sparse_warnings
from .time_affinity import time_affinity
from .topm import range_top_m

__all__ = [
    "field_weighted_counts",
    "time_affinity",
    "gmm1d_accept",
    "association_edges",
    "build_association_graph",
    "node_layout",
    "symmetric_csr",
    "csr_adjacency",
    "personalized_pagerank",
    "ROUTER_MODES",
    "entropy_router",
    "router_weights",
    "memgas_session_scores",
    "seed_scores",
    "query_waves",
    "propagate",
    "NORMS",
    "normalise_signals",
    "weighted_sum",
    "reciprocal_rank_fusion",
    "node_scores",
    "sum_granularities",
    "rank_sessions",
    "Layout",
    "query_layout",
    "range_top_m",
    "backend",
    "quiet_sparse_warnings",
    "check_csr",
]
