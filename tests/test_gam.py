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
    no_tan = idx.retrieve(params=idx.params.with_(tan=False))
    assert cand(no_tan) == set(range(4))
    tr = idx.retrieve()
    assert tr.turn_ids[0][int(tr.rankings[0, 0])] == "s0:2"  # the best-matching event
    # without the EPG the anchor topic's events come in their order
    no_epg = idx.retrieve(params=idx.params.with_(epg=False))
    assert no_epg.rankings[0, :4].tolist() == [0, 1, 2, 3]


def test_role_and_time_factors():
    msgs = ["[ann]: we went hiking", "[bob]: we went hiking",
            "[ann]: hiking trip yesterday", "[ann]: hiking trip fun"]
    qs = [Question("q0", "where did bob go hiking"), Question("q1", "when was the hiking trip")]
    ds = _ds([msgs], qs)
    idx = GamIndex.build(ds, FakeEncoder(), GamParams(segmentation="session"))
    with_f = idx.retrieve()
    without = idx.retrieve(params=idx.params.with_(mfr=False))
    # the role factor multiplies bob's events' exp(score) by beta_role, not ann's
    gain = (with_f.scores[0] - without.scores[0]).tolist()
    assert math.isclose(gain[1], math.log(1.4) + math.log(1.2), rel_tol=1e-5)
    assert math.isclose(gain[0], math.log(1.2), rel_tol=1e-5)
    # the time anchor ("yesterday") is favoured for a temporal question
    assert float(with_f.scores[1, 2] - without.scores[1, 2]) > \
        float(with_f.scores[1, 3] - without.scores[1, 3])


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
