"""The online writer gives the memory of the offline build of the same stream."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import memgas_gpu as mg
from memgas_gpu.data.model import Conversation, Dataset
from memgas_gpu.gam import GamIndex, GamParams, GamWriter, build_events

sys.path.insert(0, str(Path(__file__).parent))
from _gam_fake import FakeEncoder  # noqa: E402


@pytest.fixture(scope="module")
def two_convs(locomo_list_path):
    ds = mg.load_dataset(locomo_list_path)
    convs = [ds.get("conv-30"), ds.get("conv-26")]
    return Dataset([Conversation(c.id, c.sessions[:6], c.questions[:20]) for c in convs],
                   format=ds.format)


def _stream(ds, enc, params):
    w = GamWriter(enc.encode, params)
    for c in ds:
        for s in c.sessions:
            msgs = list(s.messages)
            emb = enc.encode(msgs)
            for m, e, t in zip(msgs, emb, enc.count_tokens(msgs)):
                w.add(c.id, s.id, m, e, t)
    w.flush()
    return w.index(ds, enc)


@pytest.mark.parametrize("seg,theta", [("semantic", 0.55), ("semantic", 0.7),
                                       ("tokens256", 0.0), ("turns3", 0.0),
                                       ("session", 0.0), ("event", 0.0)])
def test_streamed_equals_offline(two_convs, seg, theta):
    enc = FakeEncoder()
    p = GamParams(segmentation=seg, theta=theta, min_events=3, max_tokens=300)
    off = GamIndex.build(two_convs, enc, p)
    on = _stream(two_convs, enc, p)
    assert torch.equal(off.starts, on.starts)
    n_topics = int(off.starts.sum())
    assert 1 < n_topics < len(off.events) or seg == "event"
    assert torch.equal(off.topics.event_ptr, on.topics.event_ptr)
    assert off.topics.summaries == on.topics.summaries
    assert torch.equal(off.topics.key, on.topics.key)
    assert off.events.turn_ids == on.events.turn_ids
    assert off.topics.src.numel() > 0
    assert torch.equal(off.topics.src, on.topics.src)
    assert torch.equal(off.topics.dst, on.topics.dst)
    assert torch.equal(off.topics.conf, on.topics.conf)
    a, b = off.retrieve(), on.retrieve()
    assert torch.equal(a.rankings, b.rankings)


def test_writer_rejects_a_session_that_comes_back():
    enc = FakeEncoder()
    w = GamWriter(enc.encode)
    e = enc.encode(["[a]: x"])[0]
    w.add("c", "s1", "[a]: x", e, 3)
    w.add("c", "s2", "[a]: x", e, 3)
    with pytest.raises(ValueError, match="came back"):
        w.add("c", "s1", "[a]: x", e, 3)
    w.flush()
    with pytest.raises(ValueError, match="already closed"):
        w.add("d", "s1", "[a]: x", e, 3)
        w.add("c", "s3", "[a]: x", e, 3)
