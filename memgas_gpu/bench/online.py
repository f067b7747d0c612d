"""Benchmark points of the memory service: add, remove and search latency against the
number of conversations the index holds (the asked conversation keeps its size), and one
LongMemEval-M-shaped point.

The indexes hold real lexical data (synthetic session texts, tokenised) and random
embeddings of the encoder's width (timing does not depend on their values; encoding the
haystacks would dominate the run).  Every conversation is a copy of one template
conversation under its own session ids, so it is stored in its own slots, as distinct
conversations are; the LongMemEval-shaped haystacks draw their sessions from a shared
pool, stored once, with the template haystack's graph as a stand-in for each one's own
(the search cost depends on the edge count, not on which nodes they join).
"""
from __future__ import annotations

import math
import os
import random
import tempfile
import time
from typing import Callable, Optional, Sequence

import torch

from ..granularity import N_GRAN
from ..retrieve.presets import DEFAULT_METHOD
from .timing import Record, percentile

__all__ = ["online_index", "haystack_index", "online_point", "haystack_point", "slope",
           "synthetic_conversation"]


def synthetic_conversation(n_sessions: int, seed: int, turns: int = 6, words: int = 30):
    """One synthetic conversation of ``n_sessions`` sessions (LongMemEval-shaped text)."""
    from ..data import load_dataset
    from ..synth import write_synthetic

    with tempfile.TemporaryDirectory(prefix="memgas_online_") as tmp:
        path = os.path.join(tmp, "one.json")
        write_synthetic(path, questions=1, sessions=n_sessions, turns=turns, words=words,
                        pool=n_sessions, seed=seed, progress=False)
        return load_dataset(path)


def _unit(g: torch.Generator, *shape) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)


def online_index(n_conversations: int, n_sessions: int, enc, seed: int = 0):
    """A :class:`~memgas_gpu.retrieve.MemoryIndex` of ``n_conversations`` conversations of
    ``n_sessions`` sessions each (see the module docstring), recorded as built by ``enc``.

    Returns:
        ``(index, template conversation)``.
    """
    from ..expand import expand_dataset
    from ..lexical import LexicalIndex, TermMatrix, build_lexical
    from ..retrieve import MemoryIndex
    from ..retrieve.graphs import build_graph
    from ..memory.meta import ConversationMeta
    from ..retrieve.params import GraphParams
    from ..memory.texts import TextTable

    ds = synthetic_conversation(n_sessions, seed)
    conv = ds[0]
    sessions = conv.sessions
    exp = expand_dataset(ds)
    one = build_lexical(ds, exp, sessions, [])
    C, S, d = n_conversations, len(sessions), enc.dim
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor([len(s.turns) for s in sessions])
    n_turns = int(counts.sum())
    docs, ptr = {}, {}
    for code, m in one.docs.items():  # the template's documents, once per conversation
        nnz, n_docs = int(m.indptr[-1]), m.n_rows
        indptr = torch.cat([m.indptr[:1]] + [m.indptr[1:] + c * nnz for c in range(C)])
        docs[code] = TermMatrix(indptr, m.indices.repeat(C), m.tf.repeat(C))
        p = one.doc_ptr[code]
        ptr[code] = torch.cat([p[:1]] + [p[1:] + c * n_docs for c in range(C)])
    lex = LexicalIndex(one.tokenizer, one.vocab, docs, ptr, one.queries)
    metas = [ConversationMeta(f"conv-{c}", [f"c{c}-{s.id}" for s in sessions],
                              [s.date for s in sessions]) for c in range(C)]
    base = MemoryIndex(conversations=metas[:1], questions=[],
                       conv_offsets=torch.tensor([0, S]), row_slot=torch.arange(S),
                       gran=_unit(g, S, N_GRAN, d), concat=None,
                       q_emb=torch.zeros(0, d), q_conv=torch.zeros(0, dtype=torch.long),
                       graphs={}, params=GraphParams(), config={})
    ip, ix = build_graph(base.view(), base.params, device="cpu", progress=False)
    nnz = int(ix.numel())
    graph = (torch.cat([ip[:1]] + [ip[1:] + c * nnz for c in range(C)]),
             torch.cat([ix + c * S * N_GRAN for c in range(C)]))
    texts = [t for s in sessions for t in s.turns]
    idx = MemoryIndex(
        conversations=metas, questions=[],
        conv_offsets=torch.arange(0, C * S + 1, S), row_slot=torch.arange(C * S),
        gran=base.view().gran.repeat(C, 1, 1), concat=_unit(g, C * S, d),
        q_emb=torch.zeros(0, d), q_conv=torch.zeros(0, dtype=torch.long),
        graphs={"gmm": graph}, params=GraphParams(),
        config={"encoder": enc.describe(), "encoder_fingerprint": enc.fingerprint,
                "expansion": exp.config},
        lexical=lex, turns=_unit(g, C * n_turns, d),
        turn_ptr=torch.cat([torch.zeros(1, dtype=torch.long), counts.repeat(C).cumsum(0)]),
        turn_text=TextTable.from_strings(texts * C))
    return idx, conv


def haystack_index(n_haystacks: int, n_sessions: int, pool: int, enc, seed: int = 0):
    """A LongMemEval-shaped :class:`~memgas_gpu.retrieve.MemoryIndex`: ``n_haystacks``
    haystacks of ``n_sessions`` sessions drawn from a pool of ``pool`` distinct sessions
    (each stored once; see the module docstring)."""
    from ..expand import expand_dataset
    from ..lexical import build_lexical
    from ..retrieve import MemoryIndex
    from ..retrieve.graphs import build_graph
    from ..memory.meta import ConversationMeta
    from ..retrieve.params import GraphParams
    from ..memory.texts import TextTable
    from .data import index_from_nodes

    ds = synthetic_conversation(pool, seed, turns=4, words=20)
    sessions = ds[0].sessions
    exp = expand_dataset(ds)
    lex = build_lexical(ds, exp, sessions, [])
    d = enc.dim
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    rows = [sorted(rng.sample(range(pool), n_sessions)) for _ in range(n_haystacks)]
    metas = [ConversationMeta(f"hay-{h}", [sessions[j].id for j in r],
                              [sessions[j].date for j in r]) for h, r in enumerate(rows)]
    counts = torch.tensor([len(s.turns) for s in sessions])
    gran = _unit(g, pool, N_GRAN, d)
    first = index_from_nodes(gran[torch.tensor(rows[0])].reshape(-1, d), [n_sessions])
    ip, ix = build_graph(first.view(), first.params, device="cpu", progress=False)
    nnz, per = int(ix.numel()), n_sessions * N_GRAN
    H = n_haystacks
    graph = (torch.cat([ip[:1]] + [ip[1:] + h * nnz for h in range(H)]),
             torch.cat([ix + h * per for h in range(H)]))
    idx = MemoryIndex(
        conversations=metas, questions=[],
        conv_offsets=torch.arange(0, H * n_sessions + 1, n_sessions),
        row_slot=torch.tensor([j for r in rows for j in r]),
        gran=gran, concat=_unit(g, pool, d), q_emb=torch.zeros(0, d),
        q_conv=torch.zeros(0, dtype=torch.long), graphs={"gmm": graph},
        params=GraphParams(),
        config={"encoder": enc.describe(), "encoder_fingerprint": enc.fingerprint,
                "expansion": exp.config},
        lexical=lex, turns=_unit(g, int(counts.sum()), d),
        turn_ptr=torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]),
        turn_text=TextTable.from_strings(t for s in sessions for t in s.turns))
    return idx, sessions


QUESTIONS = ("what did I say about the {} last time?", "when did we talk about the {}?",
             "which {} did I mention?", "do you remember my {}?")
TOPICS = ("garden", "trip", "dog", "budget", "concert", "recipe", "bike", "novel")


def _question(i: int) -> str:
    return QUESTIONS[i % len(QUESTIONS)].format(TOPICS[(i // len(QUESTIONS)) % len(TOPICS)])


def _record(op: str, size: dict, times: list, note: str) -> Record:
    return Record("online", op, dict(size), list(times), 1.0, "calls", "", note, None, None,
                  {"p50_ms": 1e3 * percentile(times, 50), "p99_ms": 1e3 * percentile(times, 99)})


def online_point(enc, n_conversations: int, n_sessions: int = 50, calls: int = 20,
                 method: str = DEFAULT_METHOD, device: Optional[str] = None, seed: int = 0,
                 log: Callable[[str], None] = print) -> list[Record]:
    """``add_session``, ``remove_session`` and one-query ``search`` (right after the
    write, as an agent that adds a session and then asks) on random conversations of an
    index of ``n_conversations``; each timed call one at a time."""
    idx, conv = online_index(n_conversations, n_sessions, enc, seed)
    rng = random.Random(seed)
    dev = device or str(enc.device)
    new = conv.sessions[: calls + 2]
    add, remove, search = [], [], []
    for k in range(calls + 2):
        cid = f"conv-{rng.randrange(n_conversations)}"
        s = type(new[k])(f"new-{k}", new[k].date, new[k].turns, new[k].first_lengths)
        t0 = time.perf_counter()
        idx.add_session(cid, s, encoder=enc)
        t1 = time.perf_counter()
        idx.search(cid, [_question(k)], k=10, method=method, encoder=enc, device=dev)
        t2 = time.perf_counter()
        idx.remove_session(cid, s.id)
        t3 = time.perf_counter()
        if k >= 2:  # warm-up: tokenizer, encoder, first views
            add.append(t1 - t0)
            search.append(t2 - t1)
            remove.append(t3 - t2)
    size = {"conversations": n_conversations, "sessions": n_sessions, "method": method,
            "threads": torch.get_num_threads()}
    recs = [_record("add_session", size, add, "encode + tokenise + link one session"),
            _record("search after write", size, search, "one new question, end to end"),
            _record("remove_session", size, remove, "relink the conversation")]
    for r in recs:
        log(f"  online {r.impl:18s} {n_conversations:6d} conversations  p50 "
            f"{r.extra['p50_ms']:8.2f} ms  p99 {r.extra['p99_ms']:8.2f} ms")
    return recs


def haystack_point(enc, n_haystacks: int = 500, n_sessions: int = 500, pool: int = 10000,
                   calls: int = 20, device: Optional[str] = None, seed: int = 0,
                   methods: Sequence[str] = ("memgas", DEFAULT_METHOD),
                   log: Callable[[str], None] = print) -> list[Record]:
    """One new question against one haystack of a LongMemEval-shaped index: the first
    search of a haystack (its view and postings are built) and the next ones, per
    method; plus add and remove of a session."""
    idx, sessions = haystack_index(n_haystacks, n_sessions, pool, enc, seed)
    rng = random.Random(seed)
    dev = device or str(enc.device)
    size = {"haystacks": n_haystacks, "sessions": n_sessions, "pool": pool,
            "threads": torch.get_num_threads()}
    recs = []
    idx.search("hay-0", [_question(0)], k=10, encoder=enc, device=dev)  # warm-up
    for m in methods:
        first, nxt = [], []
        for k in range(calls):
            hid = f"hay-{rng.randrange(1, n_haystacks)}"
            for out in (first, nxt):
                t0 = time.perf_counter()
                idx.search(hid, [_question(k)], k=10, method=m, encoder=enc, device=dev)
                out.append(time.perf_counter() - t0)
            idx.clear_cache()  # the next haystack's first search builds its view again
        recs.append(_record(f"search {m} first", dict(size, method=m), first,
                            "first question of a haystack: its view, postings, cues"))
        recs.append(_record(f"search {m} next", dict(size, method=m), nxt,
                            "a further question of the same haystack"))
    add, remove = [], []
    for k in range(calls):
        hid = f"hay-{rng.randrange(n_haystacks)}"
        s = sessions[rng.randrange(len(sessions))]
        s = type(s)(f"new-{k}", s.date, s.turns, s.first_lengths)
        t0 = time.perf_counter()
        idx.add_session(hid, s, encoder=enc)
        t1 = time.perf_counter()
        idx.remove_session(hid, s.id)
        t2 = time.perf_counter()
        add.append(t1 - t0)
        remove.append(t2 - t1)
    recs.append(_record("add_session", size, add, "LongMemEval shape"))
    recs.append(_record("remove_session", size, remove, "LongMemEval shape"))
    for r in recs:
        log(f"  haystacks {r.impl:26s} p50 {r.extra['p50_ms']:8.2f} ms  "
            f"p99 {r.extra['p99_ms']:8.2f} ms")
    return recs


def batch_point(enc, n_haystacks: int = 200, n_sessions: int = 100, pool: int = 2000,
                batch: int = 64, rounds: int = 5, device: Optional[str] = None,
                seed: int = 0, log: Callable[[str], None] = print) -> list[Record]:
    """One batch of ``batch`` single-question requests over as many random haystacks
    (``search_many``, as a server's micro-batch): over a set of conversations never read
    together (each read alone before: its derived data warm) and the same batch again
    (its view cached), alternating, ``rounds`` times."""
    from ..retrieve.search import SearchRequest

    idx, _ = haystack_index(n_haystacks, n_sessions, pool, enc, seed)
    rng = random.Random(seed)
    dev = device or str(enc.device)
    for h in range(n_haystacks):  # every haystack read alone once
        idx.search(f"hay-{h}", [_question(h)], k=10, encoder=enc, device=dev)
    cold, warm = [], []
    for r in range(rounds + 1):
        reqs = [SearchRequest(f"hay-{h}", [_question(i)], k=10)
                for i, h in enumerate(rng.sample(range(n_haystacks), batch))]
        for out in (cold, warm):
            t0 = time.perf_counter()
            idx.search_many(reqs, encoder=enc, device=dev)
            out.append(time.perf_counter() - t0)
    cold, warm = cold[1:], warm[1:]
    size = {"haystacks": n_haystacks, "sessions": n_sessions, "batch": batch,
            "threads": torch.get_num_threads()}
    ratio = percentile(cold, 50) / percentile(warm, 50)
    recs = [_record("batch over new conversations", size, cold,
                    "a view of conversations never read together: joined from theirs"),
            _record("batch again (warm)", size, warm, "the same batch: its view cached")]
    recs[0].extra["vs_warm"] = ratio
    log(f"  batch of {batch} over new conversations p50 {recs[0].extra['p50_ms']:.1f} ms, "
        f"warm {recs[1].extra['p50_ms']:.1f} ms: {ratio:.2f}x")
    return recs


def slope(records: Sequence[Record], op: str) -> float:
    """Least-squares slope of log(p50) against log(conversations) for ``op``: 0 when the
    latency does not grow with the index, 1 when it grows in proportion."""
    pts = [(math.log(r.size["conversations"]), math.log(r.extra["p50_ms"]))
           for r in records if r.impl == op and r.extra.get("p50_ms", 0) > 0]
    if len(pts) < 2:
        return float("nan")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else float("nan")
