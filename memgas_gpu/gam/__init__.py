"""GAM: hierarchical graph-based agentic memory (event graphs, semantic-boundary
consolidation, topic network, drill-down retrieval), batched. See docs/gam.md."""
from .boundary import SEGMENTATIONS, add_boundary_noise, segment
from .events import EventTable, build_events, epg_links
from .index import FLAT_METHODS, GamIndex, GamParams, TurnRetrieval
from .presets import GAM_METHODS, METHODS, preset
from .topics import RELATIONS, Topics
from .writer import GamWriter

__all__ = ["SEGMENTATIONS", "add_boundary_noise", "segment", "EventTable", "build_events",
           "epg_links", "FLAT_METHODS", "GamIndex", "GamParams", "TurnRetrieval",
           "GAM_METHODS", "METHODS", "preset", "RELATIONS", "Topics", "GamWriter"]
