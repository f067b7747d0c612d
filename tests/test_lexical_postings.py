"""Precomputed BM25 postings (issue 14): lexical_signals == bm25s per conversation to
1e-5 for every granularity and method, new queries with query_conversation, and the
cache on the lexical index rebuilt when the layout changes, and a foreign LexicalIndex
keeping its own cache."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from memgas_gpu.lexical import (BM25Params, LexicalIndex, Tokenizer, bm25_gather,
                                bm25_postings, bm25_scores, bm25_weights)
from memgas_gpu.lexical import lexical_signals as _lexical_signals
from memgas_gpu.retrieve.signals import lexical_specs

NAMES = ("bm25_S", "bm25_Tmax", "bm25_Tmean", "bm25_U", "bm25_K")


def lexical_signals(view, questions=None, names=NAMES, queries=None, query_conversation=None,
                    **kw):
    """The signals of the fake view's questions (or of new ``queries``)."""
    if queries is None:
        qi = torch.arange(len(view.questions)) if questions is None else questions
        queries, query_conversation = view.lexical.queries.rows(qi), view.q_conv[qi]
    return _lexical_signals(view, queries, query_conversation, lexical_specs(names), **kw)

bm25s = pytest.importorskip("bm25s")

WORDS = ("apple banana cherry dog eagle falcon garden harbor island jungle kettle lemon "
         "mountain night ocean piano quartz river sunset tiger umbrella violin window "
         "yellow zebra").split()


@dataclass
class _Session:
    text: str
    turns: list


def _text(g, n):
    return " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (n,), generator=g))


def _fake_index(row_slot, conv_offsets, q_conv, seed=0):
    g = torch.Generator().manual_seed(seed)
    n_slots = int(max(row_slot)) + 1
    sessions = []
    for s in range(n_slots):
        turns = [_text(g, int(torch.randint(2, 9, (1,), generator=g)))
                 for _ in range(int(torch.randint(1, 5, (1,), generator=g)))]
        if s == 3:
            turns = []  # a session without turns
        sessions.append(_Session(" ".join(turns) or _text(g, 3), turns))
    summaries = [_text(g, 5) for _ in range(n_slots)]
    keywords = [_text(g, 3) for _ in range(n_slots)]
    questions = [_text(g, 4) + " zzzunknown" for _ in q_conv]
    lex = LexicalIndex.build(sessions, summaries, keywords, questions,
                             Tokenizer(stopwords=None, stemmer=None))
    idx = SimpleNamespace(lexical=lex, row_slot=torch.tensor(row_slot),
                          conv_offsets=torch.tensor(conv_offsets), q_conv=torch.tensor(q_conv),
                          questions=questions, n_conversations=len(conv_offsets) - 1)
    return idx, sessions, summaries, keywords


def _bm25s(corpus_tokens, query_tokens, method, k1, b):
    r = bm25s.BM25(method=method, k1=k1, b=b)
    r.index(corpus_tokens, show_progress=False)
    q = [t for t in query_tokens if t in r.vocab_dict]
    return r.get_scores(q) if q else np.zeros(len(corpus_tokens))


def _expected(idx, sessions, summaries, keywords, conv, qtext, p):
    """Every signal of one question against its conversation, the bm25s way."""
    tok = idx.lexical.tokenizer
    a, b = int(idx.conv_offsets[conv]), int(idx.conv_offsets[conv + 1])
    slots = idx.row_slot[a:b].tolist()
    qt = tok.tokens(qtext)
    run = lambda docs: _bm25s([tok.tokens(d) for d in docs], qt, p.method, p.k1, p.b)  # noqa
    turns = [t for s in slots for t in sessions[s].turns]
    owner = np.repeat(np.arange(len(slots)), [len(sessions[s].turns) for s in slots])
    ts = run(turns) if turns else np.zeros(0)
    tmax, tsum = np.zeros(len(slots)), np.zeros(len(slots))
    np.maximum.at(tmax, owner, ts)
    np.add.at(tsum, owner, ts)
    n_turns = np.maximum(1, np.bincount(owner, minlength=len(slots)))
    return {"bm25_S": run([sessions[s].text for s in slots]), "bm25_Tmax": tmax,
            "bm25_Tmean": tsum / n_turns, "bm25_U": run([summaries[s] for s in slots]),
            "bm25_K": run([keywords[s] for s in slots])}


def _check(idx, sessions, summaries, keywords, got, convs, texts, p):
    for i, (c, text) in enumerate(zip(convs, texts)):
        want = _expected(idx, sessions, summaries, keywords, c, text, p)
        n = len(want["bm25_S"])
        for name, w in want.items():
            row = got[name][i].numpy()
            np.testing.assert_allclose(row[:n], w, rtol=1e-5, atol=1e-5, err_msg=name)
            assert not row[n:].any()  # padding stays 0


LAYOUT = dict(row_slot=[0, 1, 2, 3, 2, 4, 5, 0, 6, 7, 8, 1],  # slots shared (dedup)
              conv_offsets=[0, 4, 7, 12], q_conv=[0, 0, 1, 2, 2, 1])


@pytest.mark.parametrize("p", [BM25Params(), BM25Params(method="robertson"),
                               BM25Params(method="atire", k1=1.2, b=0.5)])
def test_signals_equal_bm25s_per_conversation(p):
    idx, *texts = _fake_index(**LAYOUT)
    got = lexical_signals(idx, params=p, device="cpu")
    _check(idx, *texts, got, LAYOUT["q_conv"], idx.questions, p)
    sub = lexical_signals(idx, questions=torch.tensor([5, 0]), params=p, device="cpu")
    _check(idx, *texts, sub, [1, 0], [idx.questions[5], idx.questions[0]], p)


def test_new_queries_with_query_conversation():
    idx, *texts = _fake_index(**LAYOUT)
    new = ["river tiger tiger ocean", "nothing matches here", "apple zebra window"]
    convs = [2, 0, 1]
    got = lexical_signals(idx, device="cpu", queries=idx.lexical.encode_queries(new),
                          query_conversation=torch.tensor(convs))
    _check(idx, *texts, got, convs, new, BM25Params())
    assert got["bm25_S"].shape == (3, 5)
    with pytest.raises(ValueError, match="2 entries but queries has 1 rows"):
        lexical_signals(idx, queries=idx.lexical.encode_queries(new[:1]),
                        query_conversation=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="out of range"):
        lexical_signals(idx, queries=idx.lexical.encode_queries(new[:1]),
                        query_conversation=torch.tensor([3]))


def test_postings_cached_and_rebuilt_when_the_layout_changes():
    idx, *texts = _fake_index(**LAYOUT)
    lexical_signals(idx, names=("bm25_S",), device="cpu")
    cache = dict(idx.lexical.score_cache)
    assert len(cache) == 1
    lexical_signals(idx, names=("bm25_S",), device="cpu")
    assert all(idx.lexical.score_cache[k] is v for k, v in cache.items())  # reused
    # remove session 5 (slot 4) from conversation 1: the postings are rebuilt
    idx.row_slot = torch.tensor([0, 1, 2, 3, 2, 5, 0, 6, 7, 8, 1])
    idx.conv_offsets = torch.tensor([0, 4, 6, 11])
    got = lexical_signals(idx, device="cpu")
    _check(idx, *texts, got, LAYOUT["q_conv"], idx.questions, BM25Params())
    # another LexicalIndex of the same sessions (lexical=): its own cache, same scores
    other, *_ = _fake_index(**dict(LAYOUT, row_slot=idx.row_slot.tolist(),
                                   conv_offsets=idx.conv_offsets.tolist()))
    mine = dict(idx.lexical.score_cache)
    via = lexical_signals(idx, device="cpu", lexical=other.lexical)
    assert other.lexical.score_cache and not other.lexical.score_cache.keys() - mine.keys()
    assert idx.lexical.score_cache.keys() == mine.keys()
    assert all(idx.lexical.score_cache[k] is v for k, v in mine.items())  # untouched
    assert all(other.lexical.score_cache[k] is not mine[k] for k in other.lexical.score_cache)
    for name, v in via.items():
        assert torch.equal(v, got[name])


def test_gather_equals_sparse_product():
    g = torch.Generator().manual_seed(3)
    V, n_docs = 40, 90
    lens = torch.randint(0, 8, (n_docs,), generator=g)
    rows = [torch.unique(torch.randint(0, V, (int(k),), generator=g)) for k in lens]
    indptr = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
    indices = torch.cat(rows)
    tf = torch.randint(1, 4, (indices.numel(),), generator=g).float()
    group = torch.arange(n_docs) // 30
    q_indptr, q_indices = torch.tensor([0, 3, 3, 6]), torch.tensor([1, 5, 39, 2, 2, 7])
    q_tf, q_group = torch.tensor([1.0, 2.0, 1.0, 1.0, 3.0, 1.0]), torch.tensor([0, 1, 2])
    W, key = bm25_weights(indptr, indices, tf, group, V, dtype=torch.float64)
    want = bm25_scores(W, key, V, q_indptr, q_indices, q_tf, q_group).to_dense()
    post = bm25_postings(indptr, indices, tf, group, V, dtype=torch.float64)
    q, d, v = bm25_gather(post, q_indptr, q_indices, q_tf, q_group)
    got = torch.zeros(3, n_docs, dtype=torch.float64).index_put_((q, d), v, accumulate=True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert (d // 30 == q_group[q]).all()  # in-group postings only
