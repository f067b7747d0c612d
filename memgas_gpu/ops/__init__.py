"""Core tensor ops of MemGAS (device-agnostic torch; see each module for the algorithm)."""
from .gmm1d import gmm1d_accept
from .graph import association_edges, build_association_graph, node_layout, symmetric_csr
from .ppr import csr_adjacency, personalized_pagerank
from .router import ROUTER_MODES, entropy_router, router_weights
from .scores import (memgas_session_scores, memgas_session_scores_packed, query_waves,
                     seed_scores)
from .similarity import (block_pattern, packed_reset, packed_session_sums,
                         packed_similarities, query_rows, regular_packed_scores,
                         regular_router_seeds)

__all__ = [
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
    "memgas_session_scores_packed",
    "seed_scores",
    "query_waves",
    "block_pattern",
    "packed_similarities",
    "regular_router_seeds",
    "packed_reset",
    "packed_session_sums",
    "regular_packed_scores",
    "query_rows",
]
