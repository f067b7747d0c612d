"""The optional LLM relation judge of the TAN (typed relation + confidence as JSON).

:func:`llm_judge` wraps a :class:`~memgas_gpu.llm.ChatClient` (cached and retried like
every LLM call of the library) into the ``judge(pairs)`` callable that
:func:`~memgas_gpu.gam.topics.accept_links` takes: ``pairs`` of ``(new topic summary,
earlier topic summary)``, one request each, all sent in one batch.
"""
from __future__ import annotations

import json
import re
from typing import Callable, Sequence

from .topics import RELATIONS

__all__ = ["relation_prompt", "parse_relation", "llm_judge"]

_PROMPT = (
    "You are linking two memory topics of a long conversation. Classify the relation "
    "of topic B to topic A as one of: support, contradict, coreference, causal, semantic, "
    "unrelated; and give your confidence between 0 and 1. Reply with JSON only, as "
    '{{"relation": "...", "confidence": 0.0}}.\n\nTopic A:\n{a}\n\nTopic B:\n{b}')
_OBJ = re.compile(r"\{.*?\}", re.S)


def relation_prompt(earlier: str, new: str) -> str:
    """The judge prompt for one candidate pair (topic A is the earlier one)."""
    return _PROMPT.format(a=earlier, b=new)


def parse_relation(reply: str) -> tuple[str, float]:
    """``(relation, confidence)`` from a reply; anything unparseable or an unknown
    relation is ``("unrelated", 0.0)``; the confidence is clipped to [0, 1]."""
    m = _OBJ.search(reply or "")
    if not m:
        return "unrelated", 0.0
    try:
        obj = json.loads(m.group(0))
        rel = str(obj.get("relation", "")).strip().lower()
        conf = float(obj.get("confidence", 0.0))
    except (ValueError, TypeError, AttributeError):
        return "unrelated", 0.0
    if rel not in RELATIONS or conf != conf:
        return "unrelated", 0.0
    return rel, min(max(conf, 0.0), 1.0)


def llm_judge(client) -> Callable[[Sequence[tuple[str, str]]], list[tuple[str, float]]]:
    """A relation judge over ``client`` (a :class:`~memgas_gpu.llm.ChatClient`)."""
    from ..llm.client import ChatRequest

    def judge(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, float]]:
        reqs = [ChatRequest.user(relation_prompt(old, new), f"gam relation {i}",
                                 max_tokens=40) for i, (new, old) in enumerate(pairs)]
        return [parse_relation(r) for r in client.map(reqs, desc="gam relations")] \
            if reqs else []

    return judge
