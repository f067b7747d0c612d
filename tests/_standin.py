"""Deterministic stand-ins for the oracle tests: an encoder whose vectors the test knows,
a summary/keyword source from a table, and a small hand-written conversation.

Nothing here computes what the library computes: the tests derive every expected
number from these inputs with numpy, bm25s or igraph.
"""
from __future__ import annotations

import hashlib
from typing import Mapping, Optional, Sequence

import numpy as np
import torch

from memgas_gpu import Conversation, Dataset, Question, Session


class StandInEncoder:
    """``encode(list[str]) -> [n, dim]`` float32: the vector of a text is ``table[text]``
    when given there, else a unit vector drawn from a generator seeded by the text's hash
    (so every text has a fixed, known vector)."""

    def __init__(self, table: Optional[Mapping[str, Sequence[float]]] = None, dim: int = 8,
                 name: str = "standin") -> None:
        self.table = {k: np.asarray(v, dtype=np.float32) for k, v in (table or {}).items()}
        self.dim = dim
        self.fingerprint = f"{name}/d{dim}"
        self.calls = 0

    def vector(self, text: str) -> np.ndarray:
        if text in self.table:
            return self.table[text]
        seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
        v = np.random.default_rng(seed).normal(size=self.dim)
        return (v / np.linalg.norm(v)).astype(np.float32)

    def encode(self, texts, progress=None, **_):
        self.calls += 1
        if isinstance(texts, str):
            return torch.from_numpy(self.vector(texts).copy())
        return torch.from_numpy(np.stack([self.vector(t) for t in texts]).reshape(-1, self.dim))


class TableSource:
    """A summary/keyword source returning given texts by session id."""

    name = "table"

    def __init__(self, texts: Mapping[str, str]) -> None:
        self.texts = dict(texts)

    def config(self) -> dict:
        return {}

    def generate(self, kind, sessions, conversations):
        return [self.texts[s.id] for s in sessions]


#: (turns, summary, keywords) of the small conversation used by the oracle tests
SESSIONS = [
    (("[a]: I adopted a puppy named Biscuit last week", "[b]: a puppy, how lovely",
      "[a]: Biscuit chews every shoe in the house"),
     "Adopted a puppy called Biscuit", "puppy; Biscuit; adoption"),
    (("[a]: My sister plays the violin in an orchestra", "[b]: which orchestra",
      "[a]: the city orchestra, she plays violin every Sunday"),
     "Sister plays violin in the city orchestra", "sister; violin; orchestra"),
    (("[a]: We went hiking in the mountains near the lake", "[b]: was the lake cold",
      "[a]: freezing, but the mountains were beautiful"),
     "Hiking trip to mountains and a lake", "hiking; mountains; lake"),
    (("[a]: I started learning to bake sourdough bread", "[b]: bread is hard",
      "[a]: my sourdough starter is named Doug", "[b]: a bread starter with a name"),
     "Learning to bake sourdough bread", "bake; sourdough; bread; starter"),
    (("[a]: Biscuit the puppy learned to sit", "[b]: good puppy"),
     "The puppy Biscuit learned a trick", "puppy; trick; sit"),
    (("[a]: my sister had a violin concert at the lake pavilion",
      "[b]: the orchestra at the lake, how nice",
      "[a]: she played a solo on the violin"),
     "Sister's violin concert at the lake", "violin; concert; lake; sister"),
    (("[a]: I baked bread for the hiking trip", "[b]: sourdough on the mountains",
      "[a]: yes, the bread survived the hike"),
     "Brought homemade bread on a hike", "bread; hiking; sourdough"),
    (("[a]: the puppy ate my sourdough starter", "[b]: oh no, poor Doug",
      "[a]: Biscuit is fine, Doug is gone"),
     "The puppy ate the sourdough starter", "puppy; sourdough; starter"),
]

QUESTIONS = [
    "What is the name of the puppy?",
    "Which instrument does the sister play in the orchestra?",
    "Where did they go hiking near a lake?",
    "What happened to the sourdough starter Doug?",
    "What trick did the puppy learn?",
]


def small_conversation(n_sessions: int = len(SESSIONS), questions: Sequence[str] = QUESTIONS,
                       cid: str = "c0") -> tuple[Conversation, TableSource, TableSource]:
    """The first ``n_sessions`` sessions of :data:`SESSIONS` with the ``questions``, and
    the summary and keyword sources of all of :data:`SESSIONS`."""
    sessions = [Session(f"s{i}", f"2024-01-{i + 1:02d}", turns)
                for i, (turns, _, _) in enumerate(SESSIONS[:n_sessions])]
    qs = [Question(f"q{j}", text) for j, text in enumerate(questions)]
    summ = TableSource({f"s{i}": u for i, (_, u, _) in enumerate(SESSIONS)})
    keyw = TableSource({f"s{i}": k for i, (_, _, k) in enumerate(SESSIONS)})
    return Conversation(cid, sessions, qs), summ, keyw


def small_dataset(n_sessions: int = len(SESSIONS), questions: Sequence[str] = QUESTIONS):
    conv, summ, keyw = small_conversation(n_sessions, questions)
    return Dataset([conv], format="test", source="standin"), summ, keyw
