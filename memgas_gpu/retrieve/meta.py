"""Small records of a memory index: graph settings and conversation metadata."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GraphParams", "ConversationMeta"]


@dataclass
class GraphParams:
    """Association-graph settings (docs/algorithm.md, "Write path")."""

    m: int = 30
    skip_sessions: int = 5
    rule: str = "gmm"  # "gmm" (MemGAS) or "topk" (the no_gmm ablation)
    topk: int = 5

    def key(self) -> str:
        return "gmm" if self.rule == "gmm" else f"topk{self.topk}"

    @classmethod
    def from_key(cls, key: str, base: "GraphParams") -> "GraphParams":
        """The settings of a stored graph ``key`` (``"gmm"`` or ``"topk<k>"``)."""
        if key == "gmm":
            return cls(base.m, base.skip_sessions, "gmm", base.topk)
        return cls(base.m, base.skip_sessions, "topk", int(key[4:]))


@dataclass
class ConversationMeta:
    id: str
    session_ids: list[str]
    session_dates: list[str]
