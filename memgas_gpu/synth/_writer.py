"""Stream a synthetic LongMemEval-format file to disk.

Layout (as LongMemEval): a JSON list of instances, each with its own haystack of
``sessions`` sessions.  ``sessions - k`` of them are drawn from a shared pool (the
same id and identical content recur across haystacks), ``k`` (1-3) are evidence
sessions unique to the question, with ids ``answer_<qid>_<j>`` and a planted sentence
on a message flagged ``"has_answer": true``. ``distinct_sessions="all"`` renders every
filler session on its own instead (ids ``filler_<qid>_<position>``): nothing recurs,
so deduplication saves nothing, as in a real user's history.

Speed: the pool is rendered once, and each pool session is cached as its encoded
JSON; an instance is written by concatenating cached bytes, so the file size, not
the text generation, bounds the run (LongMemEval-M shape: ~2.7 GB).  Only one
instance is ever held in memory, and the output goes to a temporary sibling that
is renamed into place on success (nothing half-written on error or Ctrl-C).

Determinism: every random draw comes from ``random.Random`` streams seeded from
``(seed, role)`` strings, so a seed gives the same bytes on any platform, and
question ``i`` does not depend on how many questions follow it.
"""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Optional, Union

from .._io import atomic_write
from ..errors import MemgasError
from ..progress import Progress
from ._facts import QUESTION_TYPES, evidence_count, make_fact
from ._text import Grammar
from ._vocab import TOPIC_NAMES

__all__ = ["SCALES", "DEFAULT_ABSTENTION_RATE", "DEFAULT_DISTRACTOR_RATE", "LIMITS",
           "MAX_EVIDENCE", "MAX_POOL_WORDS", "MAX_TOTAL_WORDS", "SynthParamError",
           "SynthSummary", "validate_params", "write_synthetic", "format_date"]

#: Presets: ``s`` is a quick test file, ``m`` the LongMemEval-M shape (500 questions,
#: 500 sessions per haystack, ~1M tokens per haystack).
SCALES: dict[str, dict[str, int]] = {
    "s": {"questions": 20, "sessions": 20, "turns": 6, "words": 40},
    "m": {"questions": 500, "sessions": 500, "turns": 10, "words": 180},
}
DEFAULT_ABSTENTION_RATE = 0.06  # LongMemEval: 30 of 500 questions
DEFAULT_DISTRACTOR_RATE = 0.1
MAX_EVIDENCE = 3
#: Largest accepted value of each size (generous: LongMemEval-M is 500 questions x 500
#: sessions x 10 messages x ~180 words); beyond them a run takes hours or fills a disk.
LIMITS: dict[str, int] = {"questions": 100_000, "sessions": 10_000, "turns": 1_000,
                          "words": 10_000, "pool": 1_000_000}
#: Most words in one file, questions x sessions x turns x words (about 60 GB;
#: LongMemEval-M: 4.5e8 words, 2.5 GB).
MAX_TOTAL_WORDS = 10**10
#: Most words in the shared pool, pool x turns x words: it is rendered once and held in
#: memory (about 1.5 GB).
MAX_POOL_WORDS = 2 * 10**8
_EPOCH = datetime(2023, 1, 1)


class SynthParamError(MemgasError, ValueError):
    """An invalid generator parameter; ``param`` names it (e.g. ``"sessions"``;
    ``"size"``: questions x sessions x turns x words, ``"pool_size"``: pool x turns x
    words)."""

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        super().__init__(f"{param}: {message}")
        self.message = message


@dataclass(frozen=True)
class SynthSummary:
    """What :func:`write_synthetic` wrote."""

    path: str
    questions: int
    sessions: int
    turns: int
    words: int
    pool: int
    abstentions: int
    evidence_sessions: int
    bytes: int
    seconds: float
    #: distinct sessions in the file (at most: a pool session may never be drawn)
    distinct_sessions: int = 0

    def line(self) -> str:
        """A one-line human summary."""
        filler = "all filler sessions distinct" if self.pool == 0 else f"pool {self.pool}"
        return (f"wrote {self.path}: {self.questions} questions ({self.abstentions} _abs) x "
                f"{self.sessions} sessions x {self.turns} messages (~{self.words} words), "
                f"{filler} + {self.evidence_sessions} evidence sessions "
                f"(<= {self.distinct_sessions} distinct of {self.questions * self.sessions}), "
                f"{self.bytes / 1e6:.1f} MB in {self.seconds:.1f} s")


def validate_params(questions: int, sessions: int, turns: int, words: int,
                    pool: Optional[int], abstention_rate: float,
                    distractor_rate: float = 0.0,
                    distinct_sessions: Union[int, str, None] = None) -> None:
    """Raise :class:`SynthParamError` for values the generator cannot honour."""
    if distinct_sessions is not None:
        if pool is not None:
            raise SynthParamError("distinct_sessions", "give either pool or distinct_sessions")
        if distinct_sessions != "all":
            if not isinstance(distinct_sessions, int) or isinstance(distinct_sessions, bool):
                raise SynthParamError("distinct_sessions",
                                      f"must be an integer or 'all', got {distinct_sessions!r}")
            if distinct_sessions < sessions - 1:
                raise SynthParamError(
                    "distinct_sessions", f"must be >= sessions - 1 = {sessions - 1} (the "
                    f"filler sessions of one haystack) or 'all', got {distinct_sessions}")
    if questions < 1:
        raise SynthParamError("questions", f"must be >= 1, got {questions}")
    if sessions < MAX_EVIDENCE:
        raise SynthParamError("sessions", f"must be >= {MAX_EVIDENCE} (the most evidence "
                                          f"sessions a question plants), got {sessions}")
    if turns < 2:
        raise SynthParamError("turns", f"must be >= 2 (a user and an assistant message), got {turns}")
    if words < 1:
        raise SynthParamError("words", f"must be >= 1, got {words}")
    if pool is not None and pool < sessions - 1:
        raise SynthParamError("pool", f"must be >= sessions - 1 = {sessions - 1} (filler "
                                      f"sessions per haystack), got {pool}")
    _check_sizes(questions, sessions, turns, words, pool, distinct_sessions)
    if not 0.0 <= abstention_rate <= 1.0:
        raise SynthParamError("abstention_rate", f"must be in [0, 1], got {abstention_rate}")
    if not 0.0 <= distractor_rate <= 1.0:
        raise SynthParamError("distractor_rate", f"must be in [0, 1], got {distractor_rate}")


def _check_sizes(questions: int, sessions: int, turns: int, words: int,
                 pool: Optional[int], distinct_sessions: Union[int, str, None]) -> None:
    """The upper bounds: :data:`LIMITS`, :data:`MAX_TOTAL_WORDS`, :data:`MAX_POOL_WORDS`."""
    named = {"questions": questions, "sessions": sessions, "turns": turns, "words": words}
    if isinstance(distinct_sessions, int):
        named["distinct_sessions"] = distinct_sessions
    elif pool is not None:
        named["pool"] = pool
    for name, value in named.items():
        top = LIMITS.get(name, LIMITS["pool"])
        if value > top:
            raise SynthParamError(name, f"must be <= {top:,}, got {value:,}")
    total = questions * sessions * turns * words
    if total > MAX_TOTAL_WORDS:
        raise SynthParamError("size", f"the file would hold {total:,} words (questions x "
                                       f"sessions x turns x words); at most "
                                       f"{MAX_TOTAL_WORDS:,} (about 60 GB)")
    if distinct_sessions == "all":
        return
    n_pool = named.get("distinct_sessions", named.get("pool", 2 * sessions))
    if n_pool * turns * words > MAX_POOL_WORDS:
        which = "distinct_sessions" if "distinct_sessions" in named else "pool_size"
        raise SynthParamError(which, f"the shared pool of {n_pool:,} sessions would hold "
                                     f"{n_pool * turns * words:,} words (pool x turns x "
                                     f"words), held in memory; at most {MAX_POOL_WORDS:,}")


def format_date(d: datetime) -> str:
    """LongMemEval's date format, e.g. ``2023/05/20 (Sat) 02:21``."""
    return d.strftime("%Y/%m/%d (%a) %H:%M")


def _dumps(obj) -> bytes:
    return json.dumps(obj).encode("ascii")


def _hex_id(rng: random.Random, used: set) -> str:
    while True:
        h = f"{rng.getrandbits(32):08x}"
        if h not in used:
            used.add(h)
            return h


def _render_pool(grammar: Grammar, seed: int, pool: int, turns: int, words: int,
                 distractor_rate: float, bar) -> tuple[list[bytes], list[bytes]]:
    """Render the shared pool once: (JSON-encoded ids, JSON-encoded sessions).

    A ``distractor_rate`` fraction of pool sessions carries an unflagged fact sentence
    about some other entity (a near miss for the retriever).
    """
    rng = random.Random(f"memgas-synth:{seed}:pool")
    used: set = set()
    ids, bodies = [], []
    for _ in range(pool):
        ids.append(_dumps(f"pool_{_hex_id(rng, used)}"))
        bodies.append(_filler(grammar, rng, turns, words, distractor_rate))
        bar.update(1)
    return ids, bodies


def _filler(grammar: Grammar, rng: random.Random, turns: int, words: int,
            distractor_rate: float) -> bytes:
    """One JSON-encoded filler session (a distractor with probability distractor_rate)."""
    if rng.random() < distractor_rate:
        qtype = rng.choice(QUESTION_TYPES)
        fact = make_fact(qtype, rng, evidence_count(qtype, rng), False)
        role, sentence = rng.choice(fact.plants)
        at = rng.randrange(0 if role == "user" else 1, turns, 2)
        session = grammar.session(rng, fact.topic, turns, words, [(at, sentence)], flag=False)
    else:
        session = grammar.session(rng, rng.choice(TOPIC_NAMES), turns, words)
    return _dumps(session)


def _instance(grammar: Grammar, seed: int, index: int, abstain: bool, used: set,
              pool_ids: Optional[list[bytes]], pool_bodies: Optional[list[bytes]],
              sessions: int, turns: int, words: int,
              distractor_rate: float = 0.0) -> tuple[list[bytes], int]:
    """Encode question ``index`` as JSON byte chunks; also return its evidence count.
    Without a pool (``pool_bodies`` None) every filler session is rendered here."""
    rng = random.Random(f"memgas-synth:{seed}:q:{index}")
    qtype = QUESTION_TYPES[index % len(QUESTION_TYPES)]
    qhex = _hex_id(rng, used)
    n_ev = evidence_count(qtype, rng)
    fact = make_fact(qtype, rng, n_ev, abstain)
    filler = (rng.sample(range(len(pool_bodies)), sessions - n_ev) if pool_bodies is not None
              else range(sessions - n_ev))
    positions = sorted(rng.sample(range(sessions), n_ev))
    ev_ids = [f"answer_{qhex}_{j + 1}" for j in range(n_ev)]
    ev_bodies = []
    for role, sentence in fact.plants:
        at = rng.randrange(0 if role == "user" else 1, turns, 2)
        ev_bodies.append(_dumps(grammar.session(rng, fact.topic, turns, words, [(at, sentence)])))

    ids, bodies = [], []
    it = iter(filler)
    ev = dict(zip(positions, range(n_ev)))
    for p in range(sessions):
        if p in ev:
            ids.append(_dumps(ev_ids[ev[p]]))
            bodies.append(ev_bodies[ev[p]])
        elif pool_bodies is None:  # a session of its own, from its own random stream
            next(it)
            frng = random.Random(f"memgas-synth:{seed}:filler:{index}:{p}")
            ids.append(_dumps(f"filler_{qhex}_{p}"))
            bodies.append(_filler(grammar, frng, turns, words, distractor_rate))
        else:
            k = next(it)
            ids.append(pool_ids[k])
            bodies.append(pool_bodies[k])

    t = _EPOCH + timedelta(days=rng.randrange(180), minutes=rng.randrange(24 * 60))
    dates = []
    for _ in range(sessions):
        dates.append(t)
        t += timedelta(minutes=rng.randrange(2 * 60, 2 * 24 * 60))
    qdate = dates[-1] + timedelta(minutes=rng.randrange(60, 5 * 24 * 60))
    answer = fact.answer
    if callable(answer):
        answer = answer([dates[p] for p in positions])

    head = {
        "question_id": qhex + ("_abs" if abstain else ""),
        "question_type": qtype,
        "question": fact.question,
        "answer": answer,
        "question_date": format_date(qdate),
    }
    chunks = [_dumps(head)[:-1], b', "haystack_session_ids": [', b", ".join(ids),
              b'], "haystack_dates": ', _dumps([format_date(d) for d in dates]),
              b', "haystack_sessions": [', b", ".join(bodies),
              b'], "answer_session_ids": ', _dumps(ev_ids), b"}"]
    return chunks, n_ev


def write_synthetic(path: Union[str, os.PathLike], questions: int = SCALES["s"]["questions"],
                    sessions: int = SCALES["s"]["sessions"], turns: int = SCALES["s"]["turns"],
                    words: int = SCALES["s"]["words"], pool: Optional[int] = None, seed: int = 0,
                    abstention_rate: float = DEFAULT_ABSTENTION_RATE,
                    distractor_rate: float = DEFAULT_DISTRACTOR_RATE,
                    progress: Optional[bool] = True,
                    distinct_sessions: Union[int, str, None] = None) -> SynthSummary:
    """Write a synthetic LongMemEval-format JSON file, streaming, atomically.

    Args:
        path: output file; written via a temporary sibling renamed on success.
        questions: number of instances (one question and one haystack each).
        sessions: sessions per haystack (>= 3).
        turns: messages per session, alternating user/assistant (>= 2).
        words: about how many words per message.
        pool: size of the shared session pool the haystacks draw their filler
            sessions from (default ``2 * sessions``; at least ``sessions - 1``).
        seed: random seed; the same arguments and seed give identical bytes.
        abstention_rate: fraction of questions turned into ``_abs`` questions
            (rounded to a whole count, chosen at random).
        distractor_rate: fraction of pool sessions that mention an unrelated fact
            of the same kinds as the planted ones (not flagged ``has_answer``).
        progress: report progress on stderr (a bar on a terminal, plain lines in a
            log: :mod:`memgas_gpu.progress`); ``None`` follows the enclosing
            :func:`memgas_gpu.progress.defaults`, False: none.
        distinct_sessions: how many distinct filler sessions the file holds: an integer
            (the pool size; ``pool`` by another name) or ``"all"`` (every filler session
            rendered on its own: ``questions * sessions`` distinct sessions, nothing for
            deduplication to save). Not together with ``pool``.

    Returns:
        A :class:`SynthSummary` of what was written.

    Raises:
        SynthParamError: a parameter is out of range (nothing is written), including
            the upper bounds: :data:`LIMITS` per size, :data:`MAX_TOTAL_WORDS` words in
            the file, :data:`MAX_POOL_WORDS` words in the shared pool.
    """
    validate_params(questions, sessions, turns, words, pool, abstention_rate, distractor_rate,
                    distinct_sessions)
    all_distinct = distinct_sessions == "all"
    if distinct_sessions is not None and not all_distinct:
        pool = int(distinct_sessions)
    pool = 0 if all_distinct else (2 * sessions if pool is None else pool)
    t0 = time.perf_counter()
    grammar = Grammar()
    n_abs = round(questions * abstention_rate)
    abstain = set(random.Random(f"memgas-synth:{seed}:abs").sample(range(questions), n_abs))
    bar = Progress(pool + questions, "synth", unit="item", enabled=progress)
    try:
        pool_ids, pool_bodies = (None, None) if all_distinct else _render_pool(
            grammar, seed, pool, turns, words, distractor_rate, bar)
        used: set = set()
        n_evidence = 0
        with atomic_write(path, "wb") as f:
            f.write(b"[")
            for i in range(questions):
                chunks, n_ev = _instance(grammar, seed, i, i in abstain, used, pool_ids,
                                         pool_bodies, sessions, turns, words, distractor_rate)
                n_evidence += n_ev
                if i:
                    f.write(b", ")
                f.writelines(chunks)
                bar.update(1)
            f.write(b"]")
            size = f.tell()
    finally:
        bar.close()
    distinct = questions * sessions if all_distinct else min(questions * sessions,
                                                             pool + n_evidence)
    return SynthSummary(str(path), questions, sessions, turns, words, pool, n_abs, n_evidence,
                        size, time.perf_counter() - t0, distinct)
