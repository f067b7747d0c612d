"""Many searches at once: ``search_many`` answers each request as its own ``search``
would (oracle: the single searches), over sets of conversations never read together,
with mixed methods, k, evidence, filters and unknown conversations; a batch's BM25
postings are joined from each conversation's own; the first search of a long
conversation parses no date.
"""
from __future__ import annotations

import random
from unittest import mock

import pytest
import torch

from memgas_gpu import Dataset, Session
from memgas_gpu.retrieve import MemoryIndex
from memgas_gpu.retrieve.search import SearchRequest

pytest.importorskip("Stemmer")

from _memory_model import DATES, POOL, tiny_encoder  # noqa: E402

QUESTIONS = ["What breed is Rex, the puppy?", "When is the violin recital?",
             "What did Clara bake in May 2023?", "Where did Ben hike?"]


@pytest.fixture(scope="module")
def memory():
    enc = tiny_encoder()
    mem = MemoryIndex.build(Dataset([]), enc, device="cpu", progress=False)
    rng = random.Random(0)
    for c in range(12):
        for j, p in enumerate(rng.sample(range(len(POOL)), 5)):
            s = POOL[p]
            if s.id in (mem.conversations[-1].session_ids if mem.conversations and
                        mem.conversations[-1].id == f"c{c}" else ()):
                continue
            mem.add_session(f"c{c}", Session(s.id, DATES[j % len(DATES)], s.turns),
                            encoder=enc, summary=f"summary {c} {j}",
                            metadata={"tag": "a" if j % 2 else "b"})
    return mem, enc


def _requests(rng, n):
    out = []
    for _ in range(n):
        c = f"c{rng.randrange(14)}"  # c12, c13: unknown conversations
        kw = rng.choice([{}, {"method": "memgas"}, {"method": "bm25"},
                         {"settings": {"speaker_gamma": 0.0}},
                         {"metadata": {"tag": "a"}}, {"after": "2023-06-01"}])
        out.append(SearchRequest(c, rng.sample(QUESTIONS, rng.randint(1, 2)),
                                 k=rng.randint(1, 6), evidence=rng.randint(0, 2), **kw))
    return out


def test_search_many_answers_each_request_as_its_own_search(memory):
    mem, enc = memory
    rng = random.Random(1)
    for trial in range(4):
        mem.clear_cache() if trial == 2 else None  # and once from nothing cached
        reqs = _requests(rng, 10)
        got = mem.search_many(reqs, encoder=enc, device="cpu")
        for r, answers in zip(reqs, got):
            want = mem.search(r.conversation_id, r.queries, k=r.k, method=r.method,
                              evidence=r.evidence, after=r.after, metadata=r.metadata,
                              encoder=enc, device="cpu", **r.settings)
            for a, b in zip(answers, want):
                assert a.session_ids == b.session_ids, (r, a, b)
                assert a.scores == pytest.approx(b.scores, rel=1e-5, abs=1e-6)
                assert [[t for t, _, _ in ev] for ev in a.evidence] == \
                    [[t for t, _, _ in ev] for ev in b.evidence]


def test_each_distinct_question_is_encoded_once_and_answered_in_its_place(memory):
    """Ten requests repeating four question texts: the encoder sees the four once, and
    each request gets the answer of its own question (oracle: single searches)."""
    mem, enc = memory
    reqs = [SearchRequest(f"c{i % 5}", [QUESTIONS[(3 * i) % 4]], k=3) for i in range(10)]
    seen = []
    real = type(enc).encode

    def spy(self, texts, **kw):
        seen.extend([texts] if isinstance(texts, str) else list(texts))
        return real(self, texts, **kw)

    with mock.patch.object(type(enc), "encode", spy):
        got = mem.search_many(reqs, encoder=enc, device="cpu")
    assert sorted(seen) == sorted(set(QUESTIONS))
    for r, (a,) in zip(reqs, got):
        (b,) = mem.search(r.conversation_id, r.queries, k=3, encoder=enc, device="cpu")
        assert a.session_ids == b.session_ids, r
        assert a.scores == pytest.approx(b.scores, rel=1e-5, abs=1e-6)


def test_a_bad_request_is_refused_before_anything_is_encoded(memory):
    mem, enc = memory
    with mock.patch.object(type(enc), "encode", side_effect=AssertionError("encoded")):
        with pytest.raises(ValueError, match="k must be"):
            mem.search_many([SearchRequest("c0", ["fine"]), SearchRequest("c1", ["x"], k=0)],
                            encoder=enc)


def test_batch_postings_are_each_conversations_joined(memory):
    """The BM25 postings of a view over several conversations equal the postings built
    over all of them at once (the corpus of each is its own)."""
    from memgas_gpu.lexical import BM25Params, lexical_postings

    mem, _ = memory
    view = mem.view([f"c{c}" for c in (3, 7, 1, 10)])
    p = BM25Params()
    for g in ("S", "T", "U", "K"):
        a = view.postings(g, p, torch.device("cpu"))
        b = lexical_postings(view, g, p, "cpu", cache=False)
        assert torch.equal(a.post.col_key, b.post.col_key), g
        assert torch.equal(a.post.col_ptr, b.post.col_ptr), g
        assert torch.equal(a.post.doc, b.post.doc), g
        assert torch.equal(a.post.score, b.post.score), g
        assert torch.equal(a.doc_session, b.doc_session), g


def test_the_first_search_of_a_long_conversation_parses_no_date():
    """Session dates are parsed when the sessions are written: a search (time cue on)
    of a 500-session conversation whose views were never built reads them as days."""
    enc = tiny_encoder()
    sessions = [Session(f"s{i}", f"{1 + i % 28} May, 2023",
                        (f"[Ana]: note {i} about the garden and the dog",)) for i in range(500)]
    from memgas_gpu import Conversation

    mem = MemoryIndex.build(Dataset([Conversation("long", sessions)]), enc, device="cpu",
                            progress=False)
    mem.clear_cache()
    boom = mock.Mock(side_effect=AssertionError("a session date was parsed at read time"))
    with mock.patch("memgas_gpu.retrieve.cues.dates.session_days", boom), \
            mock.patch("memgas_gpu.retrieve.cues.time.parse_date", boom), \
            mock.patch("memgas_gpu.retrieve.cues.dates.parse_date", boom):
        got = mem.search("long", ["What did I note on 7 May, 2023?"], k=5, encoder=enc,
                         device="cpu")
    assert boom.call_count == 0 and len(got[0].session_ids) == 5
