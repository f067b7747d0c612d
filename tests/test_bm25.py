"""BM25 as sparse products: tokenizer and scores equal bm25s; batched == per-query loop."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from memgas_gpu.lexical import (STOPWORDS, TermMatrix, Tokenizer, Vocabulary, bm25_dense,
                                bm25_scores, bm25_weights)

bm25s = pytest.importorskip("bm25s")
Stemmer = pytest.importorskip("Stemmer")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DOCS = [
    "The cat sat on the mat.", "A dog chased the cat around the garden!",
    "Cats and dogs: running, jumping, sleeping.", "Caroline went to the LGBTQ support group.",
    "Melanie painted a sunrise over the lake last year.", "", "mat mat mat cat",
    "the the the",  # only stopwords: an empty document
]
QUERIES = ["cat on a mat", "Who painted the lake?", "dogs running", "support group Caroline",
           "zebra", "", "cat cat dog"]


def _matrices(docs, queries, tok):
    vocab = Vocabulary()
    d = TermMatrix.from_ids([vocab.encode(t) for t in tok(docs)])
    q = TermMatrix.from_ids([vocab.encode(t, grow=False) for t in tok(queries)])
    return d, q, vocab


def _bm25s_scores(doc_tokens, query_tokens, method, k1=1.5, b=0.75):
    r = bm25s.BM25(method=method, k1=k1, b=b)
    r.index(doc_tokens, show_progress=False)
    out = []
    for q in query_tokens:
        known = [t for t in q if t in r.vocab_dict]
        out.append(r.get_scores(known) if known else np.zeros(len(doc_tokens)))
    return np.stack(out)


def test_stopword_lists_match_bm25s():
    from bm25s.stopwords import STOPWORDS_EN, STOPWORDS_EN_PLUS

    assert set(STOPWORDS["en"]) == set(STOPWORDS_EN)
    assert set(STOPWORDS["en_plus"]) == set(STOPWORDS_EN_PLUS)


@pytest.mark.parametrize("stopwords", ["en", "en_plus", None])
def test_tokenizer_matches_bm25s(locomo_list_path, stopwords):
    from memgas_gpu import load_dataset

    conv = load_dataset(locomo_list_path).get("conv-30")
    texts = [t for s in conv.sessions[:4] for t in s.turns] + [q.text for q in conv.questions]
    ref = bm25s.tokenize(texts, stopwords=stopwords or [], stemmer=Stemmer.Stemmer("english"),
                         return_ids=False, show_progress=False, allow_empty=True)
    ours = Tokenizer(stopwords=stopwords)(texts)
    assert ours == [[t for t in r if t] for r in ref]


def test_tokenizer_options():
    assert Tokenizer()("The cats were running!") == ["cat", "were", "run"]
    assert Tokenizer(stemmer=None)("The cats were running!") == ["cats", "were", "running"]
    assert Tokenizer(stopwords="en_plus")("The cats were running!") == ["cat", "run"]
    assert Tokenizer(lower=False, stemmer=None, stopwords=None)("The Cat") == ["The", "Cat"]
    assert Tokenizer(stopwords=["cat"], stemmer=None)("a cat sat") == ["sat"]
    assert Tokenizer.from_config(Tokenizer(stopwords="en_plus").describe()).describe() == \
        Tokenizer(stopwords="en_plus").describe()
    with pytest.raises(ValueError, match="unknown stopword list"):
        Tokenizer(stopwords="klingon")


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire"])
@pytest.mark.parametrize("k1,b", [(1.5, 0.75), (0.9, 0.4), (2.0, 1.0)])
def test_scores_equal_bm25s(method, k1, b):
    tok = Tokenizer()
    d, q, vocab = _matrices(DOCS, QUERIES, tok)
    ours = bm25_dense(d.indptr, d.indices, d.tf, q.indptr, q.indices, q.tf, n_terms=len(vocab),
                      k1=k1, b=b, method=method, dtype=torch.float64)
    ref = _bm25s_scores(tok(DOCS), tok(QUERIES), method, k1, b)
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_scores_equal_bm25s_on_locomo_turns(locomo_list_path):
    """A real corpus: every turn of conv-30 against every question."""
    from memgas_gpu import load_dataset

    conv = load_dataset(locomo_list_path).get("conv-30")
    docs = [t for s in conv.sessions for t in s.turns]
    queries = [x.text for x in conv.questions]
    tok = Tokenizer()
    d, q, vocab = _matrices(docs, queries, tok)
    ours = bm25_dense(d.indptr, d.indices, d.tf, q.indptr, q.indices, q.tf, n_terms=len(vocab),
                      dtype=torch.float64)
    ref = _bm25s_scores(tok(docs), tok(queries), "lucene")
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5, atol=1e-5)
    assert (ours > 0).any(1).float().mean() > 0.9  # most questions match something


@pytest.mark.parametrize("device", DEVICES)
def test_batched_groups_equal_per_group_loop(device):
    """Two corpora scored in one product == each corpus and each query on its own."""
    tok = Tokenizer()
    corpora = [DOCS[:5], DOCS[3:] + ["a cat and a dog on the mat"]]
    queries = [QUERIES[:4], QUERIES[2:]]
    vocab = Vocabulary()
    d = TermMatrix.from_ids([vocab.encode(t) for c in corpora for t in tok(c)])
    q = TermMatrix.from_ids([vocab.encode(t, grow=False) for qs in queries for t in tok(qs)])
    dg = torch.tensor([g for g, c in enumerate(corpora) for _ in c])
    qg = torch.tensor([g for g, qs in enumerate(queries) for _ in qs])
    dev = torch.device(device)
    W, key = bm25_weights(d.indptr.to(dev), d.indices.to(dev), d.tf.to(dev), dg.to(dev),
                          len(vocab), dtype=torch.float64)
    S = bm25_scores(W, key, len(vocab), q.indptr.to(dev), q.indices.to(dev), q.tf.to(dev),
                    qg.to(dev)).to_dense().cpu()
    qi = 0
    for g, (c, qs) in enumerate(zip(corpora, queries)):
        cols = (dg == g).nonzero().squeeze(1)
        for text in qs:  # one query at a time against its own corpus only
            dm, qm, v2 = _matrices(c, [text], tok)
            one = bm25_dense(dm.indptr, dm.indices, dm.tf, qm.indptr, qm.indices, qm.tf,
                             n_terms=len(v2), dtype=torch.float64)[0]
            torch.testing.assert_close(S[qi, cols], one, rtol=1e-6, atol=1e-6)
            assert S[qi, (dg != g)].abs().sum() == 0  # never scored across corpora
            qi += 1


def test_empty_inputs():
    z = torch.zeros(1, dtype=torch.long)
    e = torch.zeros(0, dtype=torch.long)
    out = bm25_dense(z, e, e.float(), torch.zeros(3, dtype=torch.long), e, e.float(), n_terms=5)
    assert out.shape == (2, 0)
    tok = Tokenizer()
    d, q, vocab = _matrices(DOCS, ["", "zebra"], tok)
    out = bm25_dense(d.indptr, d.indices, d.tf, q.indptr, q.indices, q.tf, n_terms=len(vocab))
    assert out.shape == (2, len(DOCS)) and out.abs().sum() == 0
    with pytest.raises(ValueError, match="unknown BM25 method"):
        bm25_weights(d.indptr, d.indices, d.tf, torch.zeros(len(DOCS), dtype=torch.long),
                     len(vocab), method="bm25+")


def test_term_matrix_rows():
    m = TermMatrix.from_ids([[1, 1, 2], [], [3], [2, 0]])
    r = m.rows(torch.tensor([3, 0, 1, 3]))
    assert r.indptr.tolist() == [0, 2, 4, 4, 6]
    assert r.indices.tolist() == [0, 2, 1, 2, 0, 2]
    assert r.tf.tolist() == [1, 1, 2, 1, 1, 1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_equals_cpu(locomo_list_path):
    from memgas_gpu import load_dataset

    conv = load_dataset(locomo_list_path).get("conv-41")
    docs = [t for s in conv.sessions for t in s.turns]
    d, q, vocab = _matrices(docs, [x.text for x in conv.questions], Tokenizer())
    cpu = bm25_dense(d.indptr, d.indices, d.tf, q.indptr, q.indices, q.tf, n_terms=len(vocab))
    gpu = bm25_dense(d.indptr.cuda(), d.indices.cuda(), d.tf.cuda(), q.indptr.cuda(),
                     q.indices.cuda(), q.tf.cuda(), n_terms=len(vocab))
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-5)


def test_tokenizer_pickles():
    """Indexes travel to Ray workers: the tokenizer (PyStemmer inside) must pickle."""
    import pickle

    t = pickle.loads(pickle.dumps(Tokenizer(stopwords="en_plus")))
    assert t("The cats were running") == ["cat", "run"]
