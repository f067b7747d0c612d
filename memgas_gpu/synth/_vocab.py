"""Vocabularies for the synthetic chat grammar (``vocab.json`` beside this module):
shared slots and one entry per topic.

Every value is plain ASCII so the JSON output needs no escapes.  Topic slots:
``thing`` (noun phrases), ``ger`` (gerund phrases), ``place`` and ``qual``
(adjectives); the shared slots in :data:`COMMON` fill everything else.
Words that planted facts rely on (``adopted``, ``personal best``, ``monthly rent``...)
are kept out of the filler vocabulary so evidence stays findable.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["COMMON", "TOPICS", "TOPIC_NAMES"]

with open(Path(__file__).with_name("vocab.json"), encoding="ascii") as _f:
    _DATA = json.load(_f)

#: slots shared by every topic (names, cities, weekdays, ...)
COMMON: dict[str, list[str]] = _DATA["common"]
#: topic -> its slots ``thing``, ``ger``, ``place``, ``qual``
TOPICS: dict[str, dict[str, list[str]]] = _DATA["topics"]
TOPIC_NAMES: list[str] = sorted(TOPICS)
