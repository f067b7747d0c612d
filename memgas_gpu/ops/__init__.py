"""Core tensor ops of MemGAS (device-agnostic torch; see each module for the algorithm)."""
from .coverage import mmr, order_scores, xquad
from .cues import field_weighted_counts, time_affinity
from .fusion import node_scores, reciprocal_rank_fusion, sum_granularities, weighted_sum
from .gmm1d import gmm1d_accept
from .graph import association_edges, build_association_graph, node_layout, symmetric_csr
from .normalise import NORMS, normalise_signals
from .ppr import csr_adjacency, personalized_pagerank
from .propagate import propagate, query_waves, seed_scores
from .rank import rank_sessions
from .router import ROUTER_MODES, entropy_router, router_weights
from .scores import memgas_session_scores
from .selfcheck import backend
from .similarity import (block_pattern, packed_reset, packed_session_sums,
                         packed_similarities, regular_packed_scores,
                         regular_router_seeds)
from .sparse import check_csr, quiet_sparse_warnings

__all__ = [
    "mmr",
    "order_scores",
    "xquad",
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
    "block_pattern",
    "packed_similarities",
    "regular_router_seeds",
    "packed_reset",
    "packed_session_sums",
    "regular_packed_scores",
    "backend",
    "quiet_sparse_warnings",
    "check_csr",
]
