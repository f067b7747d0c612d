"""Small records of a memory index: conversation metadata; the write path's and the
graph's settings live in :mod:`.params` (imported here for the modules that read them
from this one)."""
from __future__ import annotations

from dataclasses import dataclass

from .params import BuildParams, GraphParams

__all__ = ["BuildParams", "GraphParams", "ConversationMeta"]


@dataclass
class ConversationMeta:
    id: str
    session_ids: list[str]
    session_dates: list[str]
