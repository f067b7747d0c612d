"""The settings of a memory index, without torch (the command line reads their specs):
:class:`GraphParams` (the association graph), :class:`BuildParams` (the write path) and
:class:`ReadParams` (the read path; every method is a preset of it,
:mod:`memgas_gpu.retrieve.presets`).

Each is a :class:`~memgas_gpu.settings.Settings`: frozen, checked when made (a wrong
type, a NaN, a value out of range or not one of its choices is a
:class:`~memgas_gpu.settings.SettingsError` naming the field), copied with
``replace(**changes)``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Optional

from ..choices import BM25_METHODS, FUSIONS, GRAPH_RULES, GRAPHS, NORMS, ROUTERS
from ..settings import Spec, Settings, SettingsError, setting

__all__ = ["GraphParams", "BuildParams", "ReadParams", "MEMGAS_SIGNALS", "MAX_SETTING",
           "MAX_SKIP_SESSIONS"]

#: largest value of the settings that count candidates per node (``m``, ``topk``,
#: ``alpha``): they size buffers, and an index folder holding more is refused
MAX_SETTING = 1 << 20
#: largest ``skip_sessions`` an index folder may record
MAX_SKIP_SESSIONS = 1 << 31
#: the four dense granularity signals of MemGAS (the signals of :class:`ReadParams`)
MEMGAS_SIGNALS = ("dense_S", "dense_T", "dense_U", "dense_K")

_CANDIDATES = dict(kind="int", lo=1, hi=MAX_SETTING)
_SKIP = dict(kind="int", lo=0, hi=MAX_SKIP_SESSIONS)


def _source(name: str, value: Any) -> Any:
    if value is None:
        raise SettingsError(f"{name} must name a source, got None")
    return value


def _signal_names(name: str, value: Any) -> Any:
    """``"auto"``, or the names as a tuple (from ``"a+b"`` or a sequence); whether they
    are registered is :meth:`ReadParams.check`'s (the registry imports torch)."""
    if isinstance(value, str):
        if value == "auto":
            return value
        value = [x for x in value.split("+") if x]
    try:
        names = tuple(value)
    except TypeError:
        names = None
    if not names or not all(isinstance(s, str) and s for s in names):
        raise SettingsError(f"{name} must be 'auto', signal names joined by '+', or a "
                            f"sequence of signal names, got {value!r}")
    return names


def _cue_weights(name: str, value: Any) -> tuple:
    """``{cue: weight}`` (or pairs) as sorted ``(cue, weight)`` pairs; weights finite and
    >= 0; whether the cues are registered is :meth:`ReadParams.check`'s."""
    weight = Spec("real", lo=0)
    try:
        pairs = value.items() if isinstance(value, dict) else tuple(value)
        out = tuple(sorted((n, weight.check(f"{name} weight of {n!r}", w)) for n, w in pairs))
    except (TypeError, ValueError) as e:
        if isinstance(e, SettingsError):
            raise
        raise SettingsError(f"{name} must map cue names to weights >= 0, got "
                            f"{value!r:.80}") from None
    if not all(isinstance(n, str) and n for n, _ in out) or len({n for n, _ in out}) < len(out):
        raise SettingsError(f"{name} must map cue names to weights >= 0, got {value!r:.80}")
    return out


@dataclass(frozen=True)
class GraphParams(Settings):
    """Association-graph settings (docs/algorithm.md, "Write path"); recorded in an index
    folder's manifest (``params``).

    Attributes:
        m: candidates per node for the GMM association test (1 to :data:`MAX_SETTING`).
        skip_sessions: the first sessions of a conversation get no outgoing edges.
        rule: ``"gmm"`` (MemGAS) or ``"topk"`` (the ``no_gmm`` ablation).
        topk: edges per node of the ``"topk"`` rule.
    """

    m: int = setting(30, **_CANDIDATES)
    skip_sessions: int = setting(5, **_SKIP)
    rule: str = setting("gmm", "choice", choices=GRAPH_RULES)
    topk: int = setting(5, **_CANDIDATES)

    def key(self) -> str:
        return "gmm" if self.rule == "gmm" else f"topk{self.topk}"

    @classmethod
    def from_key(cls, key: str, base: "GraphParams") -> "GraphParams":
        """The settings of a stored graph ``key`` (``"gmm"`` or ``"topk<k>"``)."""
        if key == "gmm":
            return cls(base.m, base.skip_sessions, "gmm", base.topk)
        return cls(base.m, base.skip_sessions, "topk", int(key[4:]))


@dataclass(frozen=True)
class BuildParams(Settings):
    """Settings of the write path (one name and one default per setting), stored with the
    index (``index.config["build"]``) as :class:`ReadParams` is with a retrieval;
    ``MemoryIndex.build``, ``memgas index`` / ``eval`` and the Ray backend take it.

    Attributes:
        summaries, keywords: where the U and K texts come from: ``"offline"`` (extractive
            summaries, TF-IDF keywords), ``"source"`` / ``"dataset"`` (the dataset's own),
            a MemGAS ``.jsonl`` file, or a source object (see
            :func:`~memgas_gpu.expand.expand_dataset`).
        m: candidates per node for the GMM association test (:attr:`GraphParams.m`; the
            paper: 30).
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

    summaries: Any = setting("offline", "custom", convert=_source)
    keywords: Any = setting("offline", "custom", convert=_source)
    m: int = setting(GraphParams.m, **_CANDIDATES)
    skip_sessions: int = setting(GraphParams.skip_sessions, **_SKIP)
    concat: bool = setting(True, "bool")
    lexical: bool = setting(True, "bool")
    keep_turns: bool = setting(True, "bool")
    keep_text: bool = setting(True, "bool")
    tokenizer: Any = setting(None, "any")

    def graph(self) -> GraphParams:
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
        return cls(**{k: v for k, v in record.items() if k in known})


@dataclass(frozen=True)
class ReadParams(Settings):
    """Settings of the read path (one name and one default per setting).

    Attributes:
        signals: signal names (:data:`~memgas_gpu.retrieve.signals.SIGNALS`), a
            ``"+"``-joined string, or ``"auto"``
            (:func:`~memgas_gpu.retrieve.engine.auto_signals`); kept as a tuple of names
            or ``"auto"``.
        norm: ``"none"``, ``"z"``, ``"max"`` or ``"minmax"`` (per query and signal).
        router: ``"inverse"`` (paper, w ∝ 1/H), ``"one_minus"`` (authors' code, 1 - H)
            or ``"uniform"``.
        temperature: router softmax temperature λ (> 0).
        fusion: ``"ppr"``, ``"seeds"``, ``"sum"`` or ``"rrf"``.
        alpha: seed nodes kept (1 to :data:`MAX_SETTING`).
        damping: PageRank probability of following an edge, in [0, 1].
        graph: ``"dense"``, ``"topk"``, ``"lexical"``, ``"both"`` or ``"none"``.
        topk: edges per node of the ``"topk"`` graph (the ``no_gmm`` ablation).
        k1, b, bm25_method: BM25 settings (bm25s defaults).
        speaker_gamma: speaker cue of ``bm25_Tmax``: when a query names exactly one
            speaker of its conversation, that speaker's messages count ``1 + gamma``
            times in the turn documents (0: off; :mod:`memgas_gpu.retrieve.cues`).
        time_beta: weight of the time cue added to the fused score: ``time_beta`` times
            1 for a session dated inside the interval of the query's date expression
            ("in May 2023", "on 7 July, 2023"; relative ones with a query date), else 0
            (0: off; :mod:`memgas_gpu.retrieve.cues`, docs/multi-evidence.md).
        cues: ``{cue: weight}`` of registered cues with no setting of their own (a
            ``"cue"`` signal of :func:`~memgas_gpu.retrieve.signals.register`), each
            added to the fused score times its weight.
    """

    signals: object = setting(MEMGAS_SIGNALS, "custom", convert=_signal_names)
    norm: str = setting("none", "choice", choices=NORMS)
    router: str = setting("inverse", "choice", choices=ROUTERS)
    temperature: float = setting(0.2, "real", lo=0, lo_open=True)
    fusion: str = setting("ppr", "choice", choices=FUSIONS)
    alpha: int = setting(15, **_CANDIDATES)
    damping: float = setting(0.1, "real", lo=0, hi=1)
    graph: str = setting("dense", "choice", choices=GRAPHS)
    topk: int = setting(GraphParams.topk, **_CANDIDATES)
    k1: float = setting(1.5, "real", lo=0)
    b: float = setting(0.75, "real", lo=0, hi=1)
    bm25_method: str = setting("lucene", "choice", choices=BM25_METHODS)
    speaker_gamma: float = setting(0.0, "real", lo=0)
    time_beta: float = setting(0.0, "real", lo=0)
    cues: tuple = setting((), "custom", convert=_cue_weights)

    def check(self) -> "ReadParams":
        """``self`` when every signal name is registered, else :class:`SettingsError`:
        the check that needs the signal registry (it imports torch), so it is not made
        when the object is; :func:`~memgas_gpu.retrieve.engine.resolve` makes it."""
        from .signals import cue_weights, fused_signals

        if self.signals != "auto":
            bad = [s for s in self.signals if s not in fused_signals()]
            if bad:
                raise SettingsError(f"unknown signal(s) {bad}; choose from "
                                    f"{', '.join(fused_signals())}")
        try:
            cue_weights(self)  # every cue it weighs is registered
        except ValueError as e:
            raise SettingsError(str(e)) from None
        return self

    def describe(self) -> dict:
        d = asdict(self)
        if isinstance(d["signals"], (tuple, list)):
            d["signals"] = "+".join(d["signals"])
        if d["cues"]:
            d["cues"] = dict(d["cues"])
        else:  # recorded only when given (records of earlier versions stay the same)
            del d["cues"]
        return d
