"""Dataset statistics (``memgas stats``)."""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from .data.model import Dataset

__all__ = ["DatasetStats", "dataset_stats", "approx_tokens"]


def approx_tokens(text: str) -> int:
    """A cheap token estimate: ~4/3 tokens per whitespace word (BERT-like wordpieces)."""
    return (len(text.split()) * 4 + 2) // 3


@dataclass
class DatasetStats:
    conversations: int = 0
    sessions_total: int = 0
    sessions_distinct: int = 0
    turns_total: int = 0
    turns_distinct: int = 0
    approx_tokens_total: int = 0
    approx_tokens_distinct: int = 0
    questions: int = 0
    abstentions: int = 0
    questions_without_evidence: int = 0
    questions_per_type: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def dataset_stats(ds: Dataset) -> DatasetStats:
    """Counts over a dataset; "distinct" counts each session content once."""
    st = DatasetStats(conversations=len(ds))
    seen: dict[tuple, int] = {}
    types: Counter = Counter()
    for c in ds:
        st.sessions_total += len(c.sessions)
        for s in c.sessions:
            tok = seen.get(s.key)
            if tok is None:
                tok = sum(approx_tokens(t) for t in s.turns)
                seen[s.key] = tok
                st.turns_distinct += len(s.turns)
                st.approx_tokens_distinct += tok
            st.turns_total += len(s.turns)
            st.approx_tokens_total += tok
        for q in c.questions:
            st.questions += 1
            st.abstentions += q.is_abstention
            st.questions_without_evidence += not q.evidence_session_ids
            types[q.type or "(none)"] += 1
    st.sessions_distinct = len(seen)
    st.questions_per_type = dict(sorted(types.items()))
    return st
