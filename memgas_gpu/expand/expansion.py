"""Summary (U) and keyword (K) texts of every session; the granularities themselves are
defined in :mod:`memgas_gpu.granularity`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..data.model import Conversation, Dataset, Session
from ..progress import defaults
from .sources import OfflineSource, TextSource, describe_source, resolve_source

__all__ = ["Expansion", "expand_dataset"]


@dataclass
class Expansion:
    """Summary and keyword text per session, aligned with each conversation's sessions.

    Shared sessions (LongMemEval haystacks; same :attr:`Session.key`) are expanded
    once; their strings are shared objects here too.
    """

    summaries: dict[str, list[str]] = field(default_factory=dict)
    keywords: dict[str, list[str]] = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    def concat(self, conv: Conversation) -> list[str]:
        """``f"{summary} {keywords} {session}"`` (the reference's "hybrid" text)."""
        return [f"{u} {k} {s.text}" for s, u, k in
                zip(conv.sessions, self.summaries[conv.id], self.keywords[conv.id])]


def _distinct(ds: Dataset) -> tuple[list[Session], list[Conversation]]:
    seen: dict[tuple, int] = {}
    sessions, owners = [], []
    for c in ds:
        for s in c.sessions:
            if s.key not in seen:
                seen[s.key] = len(sessions)
                sessions.append(s)
                owners.append(c)
    return sessions, owners


def expand_dataset(ds: Dataset, summaries="offline", keywords="offline",
                   offline: Optional[OfflineSource] = None,
                   progress: Optional[bool] = None) -> Expansion:
    """Summaries (U) and keywords (K) for every session of ``ds``.

    Args:
        ds: the dataset.
        summaries: a source spec (see :func:`~memgas_gpu.expand.sources.resolve_source`):
            ``"offline"`` (default), ``"source"`` (LoCoMo's own), a JSONL path, or an
            object (e.g. the LLM stage).
        keywords: the same for keywords (``"source"`` is not available: no dataset
            ships keywords).
        offline: share one offline extractor between both kinds (one corpus pass).
        progress: progress of the sources that report it (the offline extractor):
            None follows the enclosing :func:`memgas_gpu.progress.defaults`.

    Returns:
        An :class:`Expansion`; ``config`` records which source produced what.
    """
    offline = offline or OfflineSource()
    src_u: TextSource = offline if summaries == "offline" else resolve_source(summaries)
    src_k: TextSource = offline if keywords == "offline" else resolve_source(keywords)
    sessions, owners = _distinct(ds)
    with defaults(progress):
        u = src_u.generate("summary", sessions, owners)
        k = src_k.generate("keywords", sessions, owners)
    by_key = {s.key: i for i, s in enumerate(sessions)}
    exp = Expansion(config={"summaries": describe_source(src_u),
                            "keywords": describe_source(src_k)})
    for c in ds:
        idx = [by_key[s.key] for s in c.sessions]
        exp.summaries[c.id] = [u[i] for i in idx]
        exp.keywords[c.id] = [k[i] for i in idx]
    return exp
