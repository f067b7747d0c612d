"""Every retrieval method, as a named preset of :class:`~memgas_gpu.retrieve.ReadParams`,
and the signal sets the presets use. No torch: the command line lists the methods from
here. Adding a method is one entry in :data:`PRESETS`.
"""
from __future__ import annotations

from .params import MEMGAS_SIGNALS, ReadParams

__all__ = ["PRESETS", "METHODS", "DEFAULT_METHOD", "MEMGAS_SIGNALS", "HYBRID_SIGNALS",
           "HYBRID_EXTRACTIVE_SIGNALS"]

#: ``memgas_hybrid``'s signals when the summaries are written (LLM, dataset, file): BM25
#: over sessions, best turn and summaries, dense best turn and summaries (docs/hybrid.md)
HYBRID_SIGNALS = ("bm25_S", "bm25_Tmax", "bm25_U", "dense_Tmax", "dense_U")
#: ``memgas_hybrid``'s signals when the summaries are extractive (sentences copied from
#: the session, ``summaries="offline"``): the U signals would count the S evidence twice
HYBRID_EXTRACTIVE_SIGNALS = ("bm25_S", "bm25_Tmax", "dense_Tmax")


def _flat(signal: str) -> ReadParams:
    return ReadParams(signals=(signal,), norm="none", router="uniform", fusion="sum")


#: every method, as a preset of :class:`ReadParams` (:data:`MEMGAS_SIGNALS`, the paper's
#: four dense granularities, are its default signals)
PRESETS: dict[str, ReadParams] = {
    "memgas": ReadParams(),
    "no_gmm": ReadParams(graph="topk"),
    "no_ppr": ReadParams(fusion="seeds"),
    "no_router": ReadParams(router="uniform"),
    "no_association": ReadParams(graph="none"),
    "session": _flat("dense_S"),
    "turn": _flat("dense_T"),
    "summary": _flat("dense_U"),
    "keyword": _flat("dense_K"),
    "concat": _flat("dense_concat"),
    "bm25": _flat("bm25_S"),
    "memgas_hybrid": ReadParams(signals="auto", norm="z", router="inverse", temperature=1.0,
                                fusion="sum", speaker_gamma=1.0, time_beta=2.0),
}
METHODS = tuple(PRESETS)
#: the method used when none is named (``memgas eval``, ``memgas search``, ``retrieve``,
#: ``MemoryIndex.search``): the best of :data:`METHODS` on LoCoMo dev (README, "Methods")
DEFAULT_METHOD = "memgas_hybrid"
