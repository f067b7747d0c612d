"""What a search answers, as plain data (no torch: the HTTP client returns the same
type)."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SearchResult"]


@dataclass
class SearchResult:
    """Answer to one query of :meth:`MemoryIndex.search`.

    Attributes:
        conversation_id: the conversation searched.
        session_ids: the top-k session ids, best first.
        scores: their scores.
        evidence: for each returned session, its best-matching turns as
            ``(turn index, text, score)``, best first (text is ``None`` when the index
            keeps no texts).
        dates: each returned session's date (``""`` when unknown).
        metadata: each returned session's metadata (``{}`` when it has none).
    """

    conversation_id: str
    session_ids: list
    scores: list
    evidence: list
    dates: list = field(default_factory=list)
    metadata: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"conversation_id": self.conversation_id, "session_ids": self.session_ids,
                "scores": self.scores,
                "evidence": [[{"turn": t, "text": x, "score": s} for t, x, s in ev]
                             for ev in self.evidence],
                "dates": self.dates, "metadata": self.metadata}

    @classmethod
    def from_dict(cls, d: dict) -> "SearchResult":
        """The result ``to_dict`` gave (what the HTTP API answers)."""
        return cls(d["conversation_id"], list(d["session_ids"]), list(d["scores"]),
                   [[(e["turn"], e["text"], e["score"]) for e in ev] for ev in d["evidence"]],
                   list(d.get("dates", [])), [dict(m) for m in d.get("metadata", [])])
