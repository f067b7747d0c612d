"""GAM: hierarchical graph-based agentic memory (event graphs, semantic-boundary
consolidation, topic network, drill-down retrieval), batched. See docs/gam.md.

The names below load on first use, so that ``memgas_gpu.gam.presets`` and
``memgas_gpu.gam.params`` (settings and method names, for the command line) import
without the tensor code.
"""
from __future__ import annotations

from .._lazy import lazy_exports

_HOME = {
    "SEGMENTATIONS": "params", "GamParams": "params", "FLAT_METHODS": "params",
    "GAM_METHODS": "presets", "METHODS": "presets", "preset": "presets",
    "add_boundary_noise": "boundary", "segment": "boundary",
    "EventTable": "events", "build_events": "events", "epg_links": "events",
    "GamIndex": "index", "TurnRetrieval": "index",
    "RELATIONS": "topics", "Topics": "topics",
    "GamWriter": "writer",
}

__all__ = list(_HOME)


__getattr__, __dir__ = lazy_exports(__name__, _HOME)
