"""Benchmark point of the online API: ``MemoryIndex.search`` latency, one new question
against one long conversation, end to end (encode + every signal + fusion + ranking),
with the encode and scoring shares timed separately in the same run."""
from __future__ import annotations

import os
import tempfile
import time
from typing import Callable

import torch

from ..retrieve.presets import DEFAULT_METHOD
from .timing import Record, percentile

__all__ = ["search_index", "search_point"]


def search_index(n_sessions: int, enc, seed: int = 0):
    """A one-conversation :class:`MemoryIndex` of ``n_sessions`` synthetic sessions
    (LongMemEval-shaped text) with real lexical data and random embeddings of the
    encoder's width, recorded as built by ``enc`` (timing does not depend on the
    embedding values; encoding the haystack would dominate the benchmark's run time)."""
    from ..data import load_dataset
    from ..expand import expand_dataset
    from ..lexical import build_lexical
    from ..retrieve import MemoryIndex
    from ..memory.meta import ConversationMeta
    from ..retrieve.params import GraphParams
    from ..synth import write_synthetic

    with tempfile.TemporaryDirectory(prefix="memgas_search_") as tmp:
        path = os.path.join(tmp, "one.json")
        write_synthetic(path, questions=1, sessions=n_sessions, turns=10, words=30,
                        pool=n_sessions, seed=seed, progress=False)
        ds = load_dataset(path)
    conv = ds[0]
    exp = expand_dataset(ds)
    sessions = ds.distinct_sessions()
    g = torch.Generator().manual_seed(seed)
    d = enc.dim
    n = len(sessions)
    n_turns = sum(len(s.turns) for s in sessions)
    unit = lambda *shape: torch.nn.functional.normalize(  # noqa: E731
        torch.randn(*shape, d, generator=g), dim=-1)
    slot = {s.key: i for i, s in enumerate(sessions)}
    turn_ptr = torch.tensor([0] + [len(s.turns) for s in sessions]).cumsum(0)
    idx = MemoryIndex(
        conversations=[ConversationMeta(conv.id, [s.id for s in conv.sessions],
                                        [s.date for s in conv.sessions])],
        questions=list(conv.questions),
        conv_offsets=torch.tensor([0, len(conv.sessions)]),
        row_slot=torch.tensor([slot[s.key] for s in conv.sessions]),
        gran=unit(n, 4), concat=unit(n), q_emb=unit(len(conv.questions)),
        q_conv=torch.zeros(len(conv.questions), dtype=torch.long), graphs={},
        params=GraphParams(), lexical=build_lexical(ds, exp, sessions,
                                                    [q.text for q in conv.questions]),
        config={"encoder": enc.describe(), "encoder_fingerprint": enc.fingerprint,
                "expansion": exp.config},
        turns=unit(n_turns), turn_ptr=turn_ptr)
    idx.view().graph(device="cpu")  # the MemGAS graph, built once (as build does)
    return idx, conv.id


def _percentiles(name: str, times: list, size: dict, note: str) -> Record:
    rec = Record("search", name, dict(size), times, 1.0, "queries", "", note,
                 None, None, {"p50_ms": 1e3 * percentile(times, 50),
                              "p99_ms": 1e3 * percentile(times, 99)})
    return rec


def search_point(enc, n_sessions: int = 500, calls: int = 100, method: str = DEFAULT_METHOD,
                 log: Callable[[str], None] = print) -> list[Record]:
    """p50 / p99 of ``index.search(conv, [question])`` (one new question per call, each
    call a different text), and of its two shares: encoding the question alone, and
    scoring (the read path on the encoded question)."""
    from ..retrieve import QueryBatch, resolve
    from ..retrieve.engine import score

    idx, cid = search_index(n_sessions, enc)
    dev = str(enc.device)
    questions = [f"what did I say about the {w} in session {i}?"
                 for i, w in zip(range(calls + 3), ["garden", "trip", "dog", "budget",
                                                    "concert", "recipe"] * (calls + 3))]
    for q in questions[:3]:  # warm-up: model, tokenizer, graph caches
        idx.search(cid, [q], k=10, method=method, encoder=enc, device=dev)
    view = idx.view()
    p, _ = resolve(view, method)
    size = {"sessions": n_sessions, "method": method,
            "threads": torch.get_num_threads()}
    e2e, encode, scoring = [], [], []
    for q in questions[3:]:
        t0 = time.perf_counter()
        idx.search(cid, [q], k=10, method=method, encoder=enc, device=dev)
        e2e.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        emb = enc.encode([q], progress=False)
        encode.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        batch = QueryBatch(emb.float(), torch.zeros(1, dtype=torch.long),
                           view.lexical.encode_queries([q]))
        score(view, batch, p, dev)
        scoring.append(time.perf_counter() - t0)
    recs = [_percentiles("end to end", e2e, size, "encode + signals + fusion + rank + "
                         "evidence turns"),
            _percentiles("encode", encode, size, f"{enc.describe()['model']}, one question"),
            _percentiles("scoring", scoring, size, "tokenise + signals + fusion")]
    for r in recs:
        log(f"  search {r.impl:10s} p50 {r.extra['p50_ms']:8.2f} ms  "
            f"p99 {r.extra['p99_ms']:8.2f} ms")
    return recs
