"""Summary/keyword sources on the LoCoMo and LongMemEval-format dev data."""
from __future__ import annotations

import json

import pytest

from memgas_gpu import DataFormatError, load_dataset
from memgas_gpu.expand import (OfflineExtractor, expand_dataset, reference_key,
                               resolve_source)
from memgas_gpu.expand.text import STOPWORDS, sentences


def test_offline_on_locomo(locomo_list_path):
    ds = load_dataset(locomo_list_path)
    e = expand_dataset(ds)
    assert e.config["summaries"]["name"] == "offline"
    for c in ds:
        assert len(e.summaries[c.id]) == len(e.keywords[c.id]) == len(c.sessions)
        for s, u, k in zip(c.sessions, e.summaries[c.id], e.keywords[c.id]):
            sents = set(sentences(s.text))
            # extractive: the summary is made of the session's own sentences, in order
            assert u and all(x in sents for x in sentences(u)), u
            assert len(u.split()) <= 60 + max(len(x.split()) for x in sents)
            kws = k.split("; ")
            assert 1 <= len(kws) <= 10 and len(set(kws)) == len(kws)
            low = s.text.lower()
            assert all(w in low for kw in kws for w in kw.split())
            assert not any(kw in STOPWORDS for kw in kws)
    # deterministic
    e2 = expand_dataset(ds)
    assert e2.summaries == e.summaries and e2.keywords == e.keywords


@pytest.mark.real_data
def test_offline_keywords_find_a_topic_of_real_locomo(locomo_list_path):
    ds = load_dataset(locomo_list_path)
    e = expand_dataset(ds)
    # a topic of LoCoMo conv-26's second session shows up in its keywords
    c = ds[0]
    i = [s.id for s in c.sessions].index("session_2")
    assert "adoption agencies" in e.keywords[c.id][i]


def test_shared_sessions_expanded_once(lme_sample_path):
    ds = load_dataset(lme_sample_path)
    calls = []

    class Counting:
        name = "counting"

        def config(self):
            return {}

        def generate(self, kind, sessions, conversations):
            calls.append((kind, len(sessions)))
            return [f"{kind}:{s.id}" for s in sessions]

    e = expand_dataset(ds, summaries=Counting(), keywords=Counting())
    assert calls == [("summary", 19), ("keywords", 19)]
    for c in ds:
        assert e.summaries[c.id] == [f"summary:{s.id}" for s in c.sessions]
    assert e.concat(ds[0])[0] == (f"summary:{ds[0].sessions[0].id} "
                                  f"keywords:{ds[0].sessions[0].id} {ds[0].sessions[0].text}")


def test_dataset_and_jsonl_sources(tmp_path, locomo_list_path):
    ds = load_dataset(locomo_list_path)
    e = expand_dataset(ds, summaries="source")
    raw = json.loads(locomo_list_path.read_text())
    assert e.summaries["conv-26"][0] == raw[0]["session_summary"]["session_1_summary"]
    assert e.summaries["conv-41"][-1] == raw[2]["session_summary"]["session_32_summary"]
    # reference-style keys for LoCoMo
    p = tmp_path / "kw.jsonl"
    with open(p, "w") as f:
        for c in ds:
            for s in c.sessions:
                f.write(json.dumps({reference_key(c.id, s.id): f"kw of {c.id} {s.id}"}) + "\n")
    e = expand_dataset(ds, summaries="source", keywords=str(p))
    assert e.keywords["conv-30"][3] == "kw of conv-30 session_4"
    assert e.config["keywords"] == {"name": "jsonl", "method": "jsonl", "path": str(p),
                                    "entries": 70}
    # a missing key is an error that names the file and the session
    lines = p.read_text().splitlines()
    p.write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(DataFormatError, match=r"kw\.jsonl.*session_32.*conv-41"):
        expand_dataset(ds, keywords=str(p))
    p.write_text('{"a": "b"}\nnot json\n')
    with pytest.raises(DataFormatError, match=r"kw\.jsonl: record line 2"):
        resolve_source(str(p))


def test_unknown_source():
    with pytest.raises(ValueError, match="unknown summary/keyword source"):
        resolve_source("gpt-9")


def test_offline_edge_cases():
    x = OfflineExtractor()
    u, k = x.expand(["", "[user]: ok", "[user]: Mount Rainier hiking trip planned for July."])
    assert u[0] == "" and k[0] == ""
    assert u[1] == "ok"
    assert "mount rainier" in k[2] or "rainier" in k[2]
