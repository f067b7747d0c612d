"""Small records of a memory index: conversation metadata; the write path's and the
graph's settings live in :mod:`.params` (imported here for the modules that read them
from this one)."""
from __future__ import annotations

from typing import Optional

from dataclasses import dataclass

from ..retrieve.params import BuildParams, GraphParams

__all__ = ["BuildParams", "GraphParams", "ConversationMeta"]


@dataclass
class ConversationMeta:
    """A conversation's session ids and dates, in order, and each session's metadata
    (``None``: none has any)."""

    id: str
    session_ids: list[str]
    session_dates: list[str]
    session_metadata: Optional[list] = None

    def metadata(self, j: int) -> dict:
        """Session ``j``'s metadata (``{}`` when it has none)."""
        return dict(self.session_metadata[j]) if self.session_metadata else {}
