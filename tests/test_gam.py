"""GAM on small hand-made conversations: boundaries, consolidation, TAN, drill-down."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from memgas_gpu.data.model import Conversation, Dataset, Question, Session, first_lengths, \
    pair_messages
from memgas_gpu.gam import GamIndex, GamParams, add_boundary_noise, build_events, segment
from memgas_gpu.gam.boundary import scan_starts
from memgas_gpu.gam.topics import high_posterior

sys.path.insert(0, str(Path(__file__).parent))
from _gam_fake import FakeEncoder  # noqa: E402

COOK = ["[ann]: pasta tomato sauce garlic basil dinner",
        "[bob]: garlic pasta sauce sounds great tomato",
        "[ann]: basil tomato garlic pasta sauce recipe",
        "[bob]: recipe pasta garlic tomato basil sauce"]
HIKE = ["[ann]: mountain trail hiking boots summit",
        "[bob]: summit trail mountain boots hiking view",
        "[ann]: hiking mountain summit trail boots map",
        "[bob]: boots trail summit mountain hiking rain"]
MUSIC = ["[ann]: guitar concert band drums song",
         "[bob]: concert song guitar band drums stage",
         "[ann]: drums band song guitar concert ticket",
         "[bob]: band guitar drums concert song night"]


def _session(sid, msgs):
    return Session(sid, "", pair_messages(msgs), first_lengths(msgs))


def _ds(sessions, questions=()):
    return Dataset([Conversation("c", [_session(f"s{i}", m) for i, m in enumerate(sessions)],
                                 list(questions))])


def _reference_starts(forced, cand, tokens, min_events, cap):
    """The boundary rule written as the plain per-event loop."""
    out, buf, buf_tok = [], 0, 0
    for i in range(len(forced)):
        b = i == 0 or forced[i] or (cand[i] and buf >= min_events) or \
            (buf > 0 and buf_tok + tokens[i] > cap)
        if b:
            buf, buf_tok = 0, 0
        out.append(b)
        buf += 1
        buf_tok += tokens[i]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_scan_matches_the_per_event_rule(seed):
    rng = np.random.default_rng(seed)
    E = 200
    forced = rng.random(E) < 0.05
    forced[0] = True
    cand = rng.random(E) < 0.3
    tokens = rng.integers(1, 60, E)
    for me, cap in ((1, math.inf), (3, 200), (5, 90), (2, 30)):
        got = scan_starts(forced, cand, tokens, min_events=me, max_tokens=cap)
        assert got.tolist() == _reference_starts(forced, cand, tokens, me, cap)


def test_semantic_boundary_at_the_topic_shift():
    ds = _ds([COOK + HIKE, MUSIC])
    ev = build_events(ds, FakeEncoder())
    starts = segment(ev.emb, ev.tokens, ev.session_start, "semantic", window=3, theta=0.6,
                     min_events=2)
    assert torch.nonzero(starts).flatten().tolist() == [0, 4, 8]
    # the same events with a tiny buffer cap: every event that overflows starts a topic
    capped = segment(ev.emb, ev.tokens, ev.session_start, "semantic", window=3, theta=0.6,
                     min_events=2, max_tokens=18)
    assert torch.nonzero(capped).flatten().tolist() == [0, 2, 4, 6, 8, 10]


def test_fixed_segmentations():
    ds = _ds([COOK + HIKE[:3], MUSIC])
    ev = build_events(ds, FakeEncoder())
    seg = lambda s: torch.nonzero(segment(ev.emb, ev.tokens, ev.session_start, s)  # noqa
                                  ).flatten().tolist()
    assert seg("session") == [0, 7]
    assert seg("turns3") == [0, 3, 6, 7, 10]
    assert seg("event") == list(range(11))
    # tokens: each message has 8 or 9 tokens (words + 2): two fit in 18, three do not
    assert seg("tokens18") == [0, 2, 4, 6, 7, 9]
    with pytest.raises(ValueError, match="unknown segmentation"):
        seg("tokens0")


def test_boundary_noise_moves_boundaries_within_sessions():
    ds = _ds([COOK + HIKE + MUSIC, COOK])
    ev = build_events(ds, FakeEncoder())
    starts = segment(ev.emb, ev.tokens, ev.session_start, "turns3")
    assert torch.equal(add_boundary_noise(starts, ev.session_start, 0.0), starts)
    noisy = add_boundary_noise(starts, ev.session_start, 1.0, seed=3)
    assert int(noisy.sum()) == int(starts.sum())
    assert bool(noisy[ev.session_start].all())
    assert not torch.equal(noisy, starts)


def test_consolidation_topics_and_raw_embeddings():
    ds = _ds([COOK + HIKE, MUSIC])
    enc = FakeEncoder()
    idx = GamIndex.build(ds, enc, GamParams(theta=0.6, min_events=2, min_earlier=1))
    tp = idx.topics
    assert tp.event_ptr.tolist() == [0, 4, 8, 12]
    x = torch.nn.functional.normalize(enc.encode(COOK), dim=-1).numpy().sum(0)
    np.testing.assert_allclose(tp.raw_emb[0].numpy(), x / np.linalg.norm(x), atol=1e-6)
    for k, msgs in enumerate((COOK, HIKE, MUSIC)):  # extractive: sentences of the topic
        assert tp.summaries[k] and all(line in "\n".join(msgs)
                                       for line in tp.summaries[k].splitlines())


def test_high_posterior_is_the_two_gaussian_posterior():
    x = torch.tensor([[0.6, 0.5, 0.45, 0.4, 0.35]])
    acc = torch.tensor([[True, True, False, False, False]])
    post = high_posterior(x, torch.ones_like(acc), acc)[0].double()
    hi, lo = np.array([0.6, 0.5]), np.array([0.45, 0.4, 0.35])

    def pdf(v, m, s2):
        return np.exp(-(v - m) ** 2 / (2 * s2)) / np.sqrt(2 * np.pi * s2)
    v = x[0].numpy().astype(np.float64)
    p1 = 0.4 * pdf(v, hi.mean(), hi.var() + 1e-6)
    p0 = 0.6 * pdf(v, lo.mean(), lo.var() + 1e-6)
    want = p1 / (p1 + p0)
    assert 0.01 < want[2] < 0.99  # overlapping components: the weights matter
    np.testing.assert_allclose(post.numpy(), want, rtol=1e-4, atol=1e-6)


TOPICS = [COOK, HIKE, MUSIC,
          ["[ann]: garlic sauce tomato pasta again tonight",
           "[bob]: pasta tomato garlic sauce basil again"]]


def _tan_index(**kw):
    q = Question("q0", "which basil recipe did ann cook", evidence_turn_ids=("s0:2",))
    ds = _ds(TOPICS, [q])
    return GamIndex.build(ds, FakeEncoder(), GamParams(segmentation="session", min_earlier=2,
                                                       **kw))


def test_tan_links_the_returning_topic():
    idx = _tan_index()
    edges = set(zip(idx.topics.src.tolist(), idx.topics.dst.tolist()))
    assert (3, 0) in edges and (3, 1) not in edges and (3, 2) not in edges
    assert idx.topics.relation == ["semantic"] * len(edges)


def test_drill_down_follows_anchors_and_their_neighbours():
    idx = _tan_index(anchors=1, mfr=False)
    cand = lambda tr: set(torch.nonzero(tr.scores[0] > 1e5).flatten().tolist())  # noqa
    assert cand(idx.retrieve()) == set(range(4)) | {12, 13}  # anchor COOK + TAN neighbour
    no_tan = idx.retrieve(params=idx.params.replace(tan=False))
    assert cand(no_tan) == set(range(4))
    tr = idx.retrieve()
    assert tr.turn_ids[0][int(tr.rankings[0, 0])] == "s0:2"  # the best-matching event
    # without the EPG the anchor topic's events come in their order
    no_epg = idx.retrieve(params=idx.params.replace(epg=False))
    assert no_epg.rankings[0, :4].tolist() == [0, 1, 2, 3]


def test_role_and_time_factors():
    msgs = ["[ann]: we went hiking", "[bob]: we went hiking",
            "[ann]: hiking trip yesterday", "[ann]: hiking trip fun"]
    qs = [Question("q0", "where did bob go hiking"), Question("q1", "when was the hiking trip")]
    ds = _ds([msgs], qs)
    idx = GamIndex.build(ds, FakeEncoder(), GamParams(segmentation="session"))
    with_f = idx.retrieve()
    without = idx.retrieve(params=idx.params.replace(mfr=False))
    # the role factor multiplies bob's events' exp(score) by beta_role, not ann's
    gain = (with_f.scores[0] - without.scores[0]).tolist()
    assert math.isclose(gain[1], math.log(1.4) + math.log(1.2), rel_tol=1e-5)
    assert math.isclose(gain[0], math.log(1.2), rel_tol=1e-5)
    # the time anchor ("yesterday") is favoured for a temporal question
    assert float(with_f.scores[1, 2] - without.scores[1, 2]) > \
        float(with_f.scores[1, 3] - without.scores[1, 3])


class _SameQuestionEncoder(FakeEncoder):
    """FakeEncoder, but every question of :func:`test_time_factor_only_for_temporal_questions`
    gets one embedding: the questions then differ in their wording only."""

    QUESTIONS = ("When was the hiking trip?", "Where was the hiking trip?",
                 "How long was the hiking trip?")

    def encode(self, texts, progress=None):
        return super().encode(["the hiking trip" if t in self.QUESTIONS else t
                               for t in texts], progress)


def test_time_factor_only_for_temporal_questions():
    """docs/gam.md: s_i = ... + ln(beta_time)·[temporal question ∧ time anchor] + ...
    With one embedding for three questions and no BM25 (alpha=0), relevance, topics and
    the other factors are the same for all three; so the temporal questions ("When ...",
    "How long ...") score each time-anchored event exactly ln(beta_time) above the
    non-temporal one ("Where ..."), and the other events the same; against the scores
    without the factors (mfr=False), the non-temporal question gains only ln(beta_conf)
    (every event is in the one anchor topic, reach 1) on every event."""
    msgs = ["[ann]: we went hiking in the hills",      # no time anchor
            "[bob]: the hiking trip was yesterday",     # "yesterday"
            "[ann]: hiking in the rain was fun",        # no time anchor
            "[bob]: we hiked there on saturday"]       # "saturday"
    anchored = [0.0, 1.0, 0.0, 1.0]
    qs = [Question(f"q{i}", t) for i, t in enumerate(_SameQuestionEncoder.QUESTIONS)]
    beta_time, beta_conf = 3.0, 1.5
    idx = GamIndex.build(_ds([msgs], qs), _SameQuestionEncoder(),
                         GamParams(segmentation="session", alpha=0.0, beta_time=beta_time,
                                   beta_conf=beta_conf))
    assert idx.events.time_anchor.tolist() == [bool(a) for a in anchored]
    s = idx.retrieve().scores.double()
    off = idx.retrieve(params=idx.params.replace(mfr=False)).scores.double()
    assert bool(torch.isfinite(s).all())
    bonus = torch.tensor(anchored, dtype=torch.float64) * math.log(beta_time)
    for temporal in (0, 2):  # "When ...", "How long ..."
        torch.testing.assert_close(s[temporal] - s[1], bonus, rtol=0, atol=1e-8)
        torch.testing.assert_close(s[temporal] - off[temporal],  # reach is float32
                                   bonus + math.log(beta_conf), rtol=0, atol=1e-6)
    torch.testing.assert_close(s[1] - off[1], torch.full((4,), math.log(beta_conf),
                                                         dtype=torch.float64),
                               rtol=0, atol=1e-6)


def test_offline_summaries_only_equal_expand(locomo_list_path):
    import memgas_gpu as mg
    from memgas_gpu.expand.offline import OfflineExtractor

    texts = [s.text for s in mg.load_dataset(locomo_list_path)[1].sessions]
    ex = OfflineExtractor()
    assert ex.summaries(texts) == ex.expand(texts)[0]


def test_question_edges_and_neighbour_max_by_hand():
    from memgas_gpu.gam.retrieve import neighbour_max, question_edges

    # edges of conversation 0: (0,1), (1,2); of conversation 2: (0,1); none in 1
    edge_conv = torch.tensor([0, 0, 2])
    qrow, edge = question_edges(torch.tensor([2, 0, 1, 0]), edge_conv, 3)
    assert list(zip(qrow.tolist(), edge.tolist())) == [(0, 2), (1, 0), (1, 1), (3, 0), (3, 1)]
    a = torch.tensor([0, 1, 0])[edge]
    b = torch.tensor([1, 2, 1])[edge]
    v = torch.tensor([[5.0, 1.0, 0.0], [1.0, 2.0, 3.0], [9.0, 9.0, 9.0], [0.0, 0.0, 7.0]])
    m = neighbour_max(v, qrow, a, b)
    assert m[1].tolist() == [2.0, 3.0, 2.0]  # path 0-1-2
    assert m[0].tolist() == [1.0, 5.0, -math.inf]
    assert m[2].tolist() == [-math.inf] * 3  # conversation 1 has no edges
    assert m[3].tolist() == [0.0, 7.0, 0.0]


# --- GAM on the engine's plumbing ------------------------------------------------------
def test_gam_fusion_is_the_engine_z_normalisation():
    """GAM's ``z(dense) + alpha z(bm25)`` is the engine's ``norm="z"`` (one function,
    ops.normalise_signals): equal to scipy's z-score with the sample standard deviation,
    and, bit for bit, to the engine's read path with uniform weights (x 2)."""
    from scipy import stats

    from memgas_gpu.gam.retrieve import zfuse
    from memgas_gpu.retrieve.engine import ReadParams, read_path

    g = torch.Generator().manual_seed(0)
    dense = torch.rand(5, 9, generator=g) * 2 - 1
    lex = torch.rand(5, 9, generator=g) * 10
    lex[1] = 0.0  # a question sharing no term with its conversation: constant row
    n = torch.tensor([9, 6, 5, 2, 1])
    valid = torch.arange(9)[None, :] < n[:, None]
    got = zfuse(dense, lex, valid, 0.7)

    def z(x):
        x = x.double().numpy()
        return np.zeros_like(x) if x.size < 2 or x.std() == 0 else stats.zscore(x, ddof=1)

    for q in range(5):
        k = int(n[q])
        want = z(dense[q, :k]) + 0.7 * z(lex[q, :k])
        np.testing.assert_allclose(got[q, :k].numpy(), want, rtol=0, atol=1e-12)
        assert bool(torch.isinf(got[q, k:]).all())
    p = ReadParams(signals=("dense_S", "bm25_S"), norm="z", router="uniform", fusion="sum")
    eng = read_path(torch.stack([dense, lex], 1), valid, p, node_of_signal=[0, 0])
    assert torch.equal((2 * eng)[valid], zfuse(dense, lex, valid, 1.0)[valid])


def _brute_top_m(keys, start, stop, rows, m):
    """Plain loop: similarities with numpy, candidates by a stable sort (earlier first)."""
    k = keys.numpy()
    out = []
    for r, a, b in zip(rows.tolist(), start.tolist(), stop.tolist()):
        sims = k[a:b] @ k[r] if b > a else np.zeros(0)
        order = np.argsort(-sims, kind="stable")[:m]
        out.append(([float(sims[j]) for j in order], [a + int(j) for j in order]))
    return out


def test_candidate_search_is_the_brute_force_top_m():
    from memgas_gpu.ops import range_top_m

    g = torch.Generator().manual_seed(1)
    keys = torch.randint(-2, 3, (40, 6), generator=g).double()  # exact dots, many ties
    keys[17] = keys[5]  # an exact duplicate: its ties go to the earlier row
    rows = torch.arange(40)
    start = torch.tensor([0] * 12 + [12] * 20 + [32] * 8)  # three conversations
    stop = rows.clone()
    stop[33] = 32  # an empty range
    for m in (1, 4, 30):
        want = _brute_top_m(keys, start, stop, rows, m)
        for exact in (True, False):
            sims, index, valid = range_top_m(keys, keys, start, stop, m, exact=exact,
                                             max_elements=64)  # several chunks
            for r, (ws, wi) in enumerate(want):
                k = len(wi)
                assert sims[r, :k].tolist() == ws and index[r, :k].tolist() == wi
                assert valid[r].tolist() == [True] * k + [False] * (m - k)
                assert bool(torch.isinf(sims[r, k:]).all()) and not index[r, k:].any()
    # exact mode: a row searched alone gets the bits of the batched search
    x = torch.nn.functional.normalize(torch.randn(30, 16, generator=g), dim=-1)
    st, sp = torch.zeros(30, dtype=torch.long), torch.arange(30)
    batch = range_top_m(x, x, st, sp, 5)
    for r in (3, 17, 29):
        one = range_top_m(x[r:r + 1], x, st[r:r + 1], sp[r:r + 1], 5)
        assert torch.equal(one[0][0], batch[0][r]) and torch.equal(one[1][0], batch[1][r])
    # a NaN similarity is no candidate
    x[4] = float("nan")
    sims, index, valid = range_top_m(x[10:11], x, st[:1], sp[10:11], 20)
    assert 4 not in index[0, valid[0]].tolist() and int(valid.sum()) == 9


def test_query_layout_by_hand():
    from memgas_gpu.ops import query_layout

    lay = query_layout(torch.tensor([0, 3, 3, 7]), torch.tensor([2, 0, 1, 2]))
    assert lay.n.tolist() == [4, 3, 0, 4] and lay.start.tolist() == [3, 0, 3, 3]
    assert lay.n_max == 4
    assert lay.rows.tolist() == [[3, 4, 5, 6], [0, 1, 2, 0], [0, 0, 0, 0], [3, 4, 5, 6]]
    assert lay.valid.sum(1).tolist() == [4, 3, 0, 4]


def test_role_factor_names_speakers_like_the_speaker_cue():
    """One parser (data/speakers.py): a capitalised prefix names exactly one speaker
    ("Mel" for Melanie), a possessive names its owner, a first-person question names
    'user'."""
    from memgas_gpu.data.speakers import named_speakers

    msgs = ["[Melanie]: I painted a lake at sunset", "[Caroline]: the lake painting is lovely",
            "[Melanie]: sunset colours at the lake", "[Caroline]: painting lakes is calming"]
    qs = [Question("q0", "What did Mel paint?"), Question("q1", "What is Caroline's view?"),
          Question("q2", "what did mel paint?")]  # lower case: no prefix rule
    idx = GamIndex.build(_ds([msgs], qs), FakeEncoder(), GamParams(segmentation="session"))
    gain = idx.retrieve().scores - idx.retrieve(params=idx.params.replace(mfr=False)).scores
    role = math.log(1.4)
    conf = math.log(1.2)  # the one topic is the anchor: reach confidence 1
    for q, named in ((0, [0, 2]), (1, [1, 3]), (2, [])):
        want = [conf + (role if e in named else 0.0) for e in range(4)]
        np.testing.assert_allclose(gain[q].numpy(), want, rtol=1e-6)
    assert named_speakers("What did I buy last week?", ["user", "assistant"],
                          first_person="user") == [True, False]
    assert named_speakers("What did I buy last week?", ["user", "assistant"]) == [False, False]
    assert named_speakers("What did Zoë plant?", ["Zoë", "Max"]) == [True, False]


@pytest.mark.parametrize("field,value", [
    ("theta", float("nan")), ("noise", float("nan")), ("noise", 1.5), ("alpha", float("inf")),
    ("window", 0), ("anchors", -1), ("anchors", 2.5), ("tan_m", True), ("beta_role", 0.0),
    ("conf_min", -0.1), ("epg_window", 0), ("tan", 1), ("segmentation", "windows")])
def test_settings_are_checked_when_made(field, value):
    with pytest.raises(ValueError, match=field if field != "segmentation" else "segmentation"):
        GamParams(**{field: value})
    with pytest.raises(ValueError):
        GamParams().replace(**{field: value})


def test_event_bm25_equals_bm25s_per_conversation():
    """flat_bm25 scores every event of the question's conversation with that
    conversation's statistics, as a bm25s index of the conversation would."""
    bm25s = pytest.importorskip("bm25s")
    from memgas_gpu.lexical.terms import INDEX_STOPWORDS
    from memgas_gpu.lexical.tokenize import Tokenizer

    qs = [Question("q0", "which garlic pasta recipe"), Question("q1", "mountain boots rain")]
    ds = Dataset([Conversation("a", [_session("s0", COOK + HIKE)], qs[:1]),
                  Conversation("b", [_session("s0", HIKE + MUSIC[:2])], qs[1:])])
    idx = GamIndex.build(ds, FakeEncoder(), GamParams(segmentation="session"))
    tr = idx.retrieve(method="flat_bm25")
    tok = Tokenizer(stopwords=INDEX_STOPWORDS)
    for q, msgs in ((0, COOK + HIKE), (1, HIKE + MUSIC[:2])):
        r = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
        r.index([tok.tokens(m) for m in msgs], show_progress=False)
        known = [t for t in tok.tokens(qs[q].text) if t in r.vocab_dict]
        np.testing.assert_allclose(tr.scores[q, :len(msgs)].numpy(), r.get_scores(known),
                                   rtol=1e-5, atol=1e-6)


def test_read_refuses_unknown_methods_questions_and_settings():
    idx = _tan_index()
    with pytest.raises(ValueError, match="unknown GAM read method 'gam_no_tan'"):
        idx.retrieve(method="gam_no_tan")  # an ablation is 'gam' with preset(...)'s params
    with pytest.raises(ValueError, match=r"question indices must lie in \[0, 1\)"):
        idx.retrieve([1])
    with pytest.raises(ValueError, match="params must be GamParams"):
        idx.retrieve(params={"anchors": 2})


def test_build_refuses_nan_embeddings_and_negative_token_counts():
    class Broken(FakeEncoder):
        def __init__(self, nan_word=None, tokens=None):
            self.nan_word, self.tokens = nan_word, tokens

        def encode(self, texts, progress=None):
            out = super().encode(texts)
            out[[self.nan_word is not None and self.nan_word in t for t in texts]] = \
                float("nan")
            return out

        def count_tokens(self, texts):
            return self.tokens(texts) if self.tokens else super().count_tokens(texts)

    ds = _ds([COOK, HIKE])
    with pytest.raises(ValueError, match=r"embedding 5 \(c s1:1\) has NaN"):
        GamIndex.build(ds, Broken(nan_word="view"), GamParams())
    with pytest.raises(ValueError, match=r"token count 2 \(c s0:2\) must be an integer >= 0"):
        GamIndex.build(ds, Broken(tokens=lambda t: [3, 3, -1] + [3] * (len(t) - 3)))
