"""The online API on real LoCoMo: ``search`` for new question texts, ``add_session`` and
``remove_session`` against a rebuild, conversation isolation, the encoder record."""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from memgas_gpu import Conversation, Dataset, Question, load_dataset
from _views import question_signals
from memgas_gpu.retrieve import EncoderMismatchError, MemoryIndex, retrieve

pytest.importorskip("Stemmer")

METHODS = ("memgas", "no_gmm", "memgas_hybrid", "bm25", "session")


@pytest.fixture(scope="module")
def store(tmp_path_factory, minilm):
    from memgas_gpu.encode import EmbeddingStore

    return EmbeddingStore(tmp_path_factory.mktemp("store"), minilm.fingerprint)


@pytest.fixture(scope="module")
def small(locomo_list_path):
    """conv-30's first 10 and conv-26's first 8 sessions, with their questions."""
    ds = load_dataset(locomo_list_path)

    def cut(c, n):
        return Conversation(c.id, c.sessions[:n], c.questions, c.source_summaries)

    return Dataset([cut(ds.get("conv-30"), 10), cut(ds.get("conv-26"), 8)], format=ds.format)


class _Keywords:
    """Keyword texts fixed per session (offline keywords depend on the corpus, so a
    rebuild over fewer sessions would extract different ones)."""

    name = "fixed"

    def __init__(self, ds):
        from memgas_gpu.expand import expand_dataset

        exp = expand_dataset(ds, summaries="source")
        self.by_key = {s.key: k for c in ds for s, k in zip(c.sessions, exp.keywords[c.id])}

    def config(self):
        return {}

    def generate(self, kind, sessions, conversations):
        return [self.by_key[s.key] for s in sessions]


@pytest.fixture(scope="module")
def keywords(small):
    return _Keywords(small)


def _build(ds, minilm, store, keywords):
    idx = MemoryIndex.build(ds, minilm, summaries="source", keywords=keywords, store=store,
                            device="cpu", progress=False)
    idx.snapshot().graph(idx.params.__class__(rule="topk", topk=5))
    return idx


def _same_index(a: MemoryIndex, b: MemoryIndex, atol: float = 0.0):
    """Equal indexes: exactly, or embeddings within ``atol`` (the added session is
    encoded in another batch than in the rebuild: float32 differences of ~1e-5)."""
    assert [c.session_ids for c in a.conversations] == [c.session_ids for c in b.conversations]
    ia, ib = a, b
    a, b = a.snapshot(), b.snapshot()
    assert torch.equal(a.conv_offsets, b.conv_offsets)
    for key in ("gmm", "topk5"):
        assert torch.equal(a.graphs[key][0], b.graphs[key][0]), key
        assert torch.equal(a.graphs[key][1], b.graphs[key][1]), key
    assert torch.equal(a.row_slot, b.row_slot) and torch.equal(a.turn_ptr, b.turn_ptr)
    for x, y in ((a.gran, b.gran), (a.turns, b.turns), (a.concat, b.concat)):
        torch.testing.assert_close(x, y, rtol=0, atol=atol)
    assert a.turn_text.strings(range(len(a.turn_text))) == \
        b.turn_text.strings(range(len(b.turn_text)))
    names = ("bm25_S", "bm25_Tmax", "bm25_Tmean", "bm25_U", "bm25_K")
    sa = question_signals(ia, names, device="cpu")
    sb = question_signals(ib, names, device="cpu")
    for n in names:
        torch.testing.assert_close(sa[n], sb[n], rtol=0, atol=1e-6)
    for m in METHODS:
        ra, rb = retrieve(ia, method=m, device="cpu"), retrieve(ib, method=m, device="cpu")
        if atol == 0:
            assert torch.equal(ra.rankings, rb.rankings), m
            continue
        ok = ~torch.isinf(rb.scores)
        torch.testing.assert_close(ra.scores[ok], rb.scores[ok], rtol=0, atol=1e-3)
        same = (ra.rankings == rb.rankings).all(1).float().mean().item()
        assert same >= 0.98, (m, same)  # near-ties may swap under 1e-5 noise


def test_remove_session_equals_rebuild(small, minilm, store, keywords):
    idx = _build(small, minilm, store, keywords)
    c = small[0]
    idx.remove_session(c.id, c.sessions[6].id)  # after skip_sessions: edges change
    idx.remove_session(c.id, c.sessions[1].id)  # before: every later position moves
    keep = [s for i, s in enumerate(c.sessions) if i not in (1, 6)]
    ref = _build(Dataset([Conversation(c.id, keep, c.questions, c.source_summaries), small[1]],
                         format=small.format), minilm, store, keywords)
    _same_index(idx, ref)
    with pytest.raises(KeyError, match="no session"):
        idx.remove_session(c.id, c.sessions[1].id)
    with pytest.raises(KeyError, match="no conversation"):
        idx.remove_session("conv-404", "session_1")


def test_add_session_equals_rebuild_with_new_question_terms(small, minilm, store, keywords):
    """A question whose terms first appear in the added session matches it, as after a
    rebuild (the question terms are not frozen at build time)."""
    from memgas_gpu.lexical import Tokenizer
    from memgas_gpu.lexical.terms import INDEX_STOPWORDS

    c = small[1]
    new = c.sessions[-1]
    tok = Tokenizer(stopwords=INDEX_STOPWORDS)
    seen = {t for conv in small for s in conv.sessions if s is not new for t in tok(s.text)}
    words = [w for w in new.text.replace("\n", " ").split()
             if tok(w) and all(t not in seen for t in tok(w))]
    assert words, "the added session has no word of its own"
    # only terms that first appear in the added session: unknown to the grown index's
    # vocabulary when its questions were encoded
    probe = Question("probe", " ".join(words[:6]), type="probe",
                     evidence_session_ids=(new.id,))
    head = Conversation(c.id, c.sessions[:-1], c.questions + [probe], c.source_summaries)
    full = Conversation(c.id, c.sessions, c.questions + [probe], c.source_summaries)
    grown = _build(Dataset([small[0], head], format=small.format), minilm, store, keywords)
    ref = _build(Dataset([small[0], full], format=small.format), minilm, store, keywords)
    grown.add_session(c.id, new, summary=c.source_summaries[new.id],
                      keywords=keywords.by_key[new.key])
    _same_index(grown, ref, atol=1e-4)
    r = retrieve(grown, method="bm25", device="cpu", questions=[len(grown.questions) - 1])
    assert r.rankings[0, 0].item() == len(c.sessions) - 1
    with pytest.raises(ValueError, match="already has a session"):
        grown.add_session(c.id, new)


def test_search_ranks_like_retrieve_and_isolates_conversations(small, minilm, store, keywords):
    idx = _build(small, minilm, store, keywords)
    for m in METHODS:
        r = retrieve(idx, method=m, device="cpu")
        for ci, c in enumerate(small):
            qi = [i for i in range(len(idx.questions)) if int(idx.q_conv[i]) == ci][:25]
            res = idx.search(c.id, [idx.questions[i].text for i in qi], k=5, method=m,
                             encoder=minilm, device="cpu")
            ids = idx.conversations[ci].session_ids
            for j, i in enumerate(qi):
                want = [ids[t] for t in r.rankings[i, :5].tolist()]
                assert res[j].session_ids == want, (m, c.id, i)
                assert all(s in ids for s in res[j].session_ids)
    # one batched call over both conversations; every answer stays in its conversation
    q = ["What did Gina open?", "Where did Caroline go?"]
    both = idx.search([small[0].id, small[1].id], q, k=3, encoder=minilm, device="cpu")
    assert set(both[0].session_ids) <= set(idx.conversations[0].session_ids)
    assert set(both[1].session_ids) <= set(idx.conversations[1].session_ids)
    ev = both[0].evidence[0]
    assert len(ev) == 3 and ev[0][2] >= ev[1][2] >= ev[2][2]
    sid = both[0].session_ids[0]
    sess = {s.id: s for s in small[0].sessions}[sid]
    assert ev[0][1] == sess.turns[ev[0][0]]
    # a conversation the memory does not hold has no memories (mem0's unknown user)
    mixed = idx.search([small[0].id, "conv-404"], q[:2], encoder=minilm)
    assert [r.conversation_id for r in mixed] == [small[0].id, "conv-404"]
    assert mixed[0].session_ids == idx.search(small[0].id, q[:1], encoder=minilm)[0].session_ids
    assert mixed[1].session_ids == mixed[1].scores == mixed[1].evidence == []
    with pytest.raises(TypeError, match="list of strings"):
        idx.search(small[0].id, "one string", encoder=minilm)


def test_search_reloads_the_recorded_encoder_and_refuses_another(small, minilm, store,
                                                                  keywords, tmp_path):
    from memgas_gpu.encode import Encoder

    idx = _build(small, minilm, store, keywords)
    idx.save(tmp_path / "ix")
    back = MemoryIndex.load(tmp_path / "ix")
    q = ["When did Jon lose his job?"]
    a = idx.search(small[0].id, q, encoder=minilm, device="cpu")[0]
    b = back.search(small[0].id, q, device="cpu")[0]  # encoder reloaded from the record
    assert a.session_ids == b.session_ids
    assert a.scores == pytest.approx(b.scores, abs=1e-5)
    other = Encoder(device="cpu", max_length=64)
    with pytest.raises(EncoderMismatchError, match="differs from the one this index"):
        back.search(small[0].id, q, encoder=other)
    res = CliRunner().invoke(_cli(), ["search", str(tmp_path / "ix"), "--conversation",
                                      small[0].id, "--k", "2", "--json", q[0]])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["session_ids"] == b.session_ids[:2] and out["query"] == q[0]
    res = CliRunner().invoke(_cli(), ["search", str(tmp_path / "ix"), "--conversation",
                                      "conv-404", q[0]])
    assert res.exit_code == 2 and "no conversation" in res.output


def _cli():
    from memgas_gpu.cli.main import cli

    return cli
