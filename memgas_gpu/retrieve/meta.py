"""Small records of a memory index: the write path's settings, graph settings and
conversation metadata."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional

__all__ = ["BuildParams", "GraphParams", "ConversationMeta"]


@dataclass(frozen=True)
class BuildParams:
    """Settings of the write path (one name and one default per setting), stored with the
    index (``index.config["build"]``) as :class:`~memgas_gpu.retrieve.ReadParams` is with
    a retrieval; ``MemoryIndex.build``, ``memgas index`` / ``eval`` and the Ray backend
    take it.

    Attributes:
        summaries, keywords: where the U and K texts come from: ``"offline"`` (extractive
            summaries, TF-IDF keywords), ``"source"`` / ``"dataset"`` (the dataset's own),
            a MemGAS ``.jsonl`` file, or a source object (see
            :func:`~memgas_gpu.expand.expand_dataset`).
        m: candidates per node for the GMM association test (>= 1; the paper: 30).
        skip_sessions: the first sessions of a conversation get no outgoing edges (>= 0;
            the paper: 5).
        concat: also store the embedding of ``"{summary} {keywords} {session}"`` (the
            ``concat`` baseline; the reference calls it "hybrid").
        lexical: tokenise every text for the BM25 signals (``memgas_hybrid``, ``bm25``).
        keep_turns: keep every turn's embedding (``dense_Tmax``, the evidence turns).
        keep_text: keep every turn's text (the evidence ``search`` returns, the speaker
            cue).
        tokenizer: a :class:`memgas_gpu.lexical.Tokenizer`, or None for the default
            (lowercase, Lucene English stopwords plus chat fillers, Snowball stemming).
    """

    summaries: Any = "offline"
    keywords: Any = "offline"
    m: int = 30
    skip_sessions: int = 5
    concat: bool = True
    lexical: bool = True
    keep_turns: bool = True
    keep_text: bool = True
    tokenizer: Any = None

    def check(self) -> "BuildParams":
        """``self``, or ``ValueError`` naming the first bad setting."""
        for name in ("m", "skip_sessions"):
            v = getattr(self, name)
            lo = 1 if name == "m" else 0
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
        for name in ("concat", "lexical", "keep_turns", "keep_text"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got "
                                 f"{getattr(self, name)!r}")
        for name in ("summaries", "keywords"):
            if getattr(self, name) is None:
                raise ValueError(f"{name} must name a source, got None")
        return self

    def with_settings(self, **settings) -> "BuildParams":
        """A checked copy with ``settings`` (names of fields) replaced."""
        known = {f.name for f in fields(self)}
        bad = sorted(set(settings) - known)
        if bad:
            raise TypeError(f"unknown build setting(s) {bad}; settings are "
                            f"{', '.join(sorted(known))}")
        return replace(self, **settings).check()

    def graph(self) -> "GraphParams":
        return GraphParams(m=self.m, skip_sessions=self.skip_sessions)

    def describe(self) -> dict:
        """JSON-ready record (a source or tokenizer object by its name or settings)."""
        d = asdict(self)
        for name in ("summaries", "keywords"):
            v = d[name]
            if not isinstance(v, str):
                d[name] = getattr(v, "name", type(v).__name__)
        tok = self.tokenizer
        d["tokenizer"] = tok.describe() if tok is not None and hasattr(tok, "describe") \
            else tok
        return d

    @classmethod
    def from_record(cls, record: Optional[dict]) -> "BuildParams":
        """The settings a stored :meth:`describe` record names (sources as their names;
        the tokenizer is the index's own, not rebuilt here)."""
        record = dict(record or {})
        record.pop("tokenizer", None)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in known}).check()


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
