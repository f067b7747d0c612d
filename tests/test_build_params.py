"""BuildParams: the write path's one settings object, checked when used, stored with the
index and read back after a save and a load."""
from __future__ import annotations

import pytest
import torch

from memgas_gpu import Conversation, Dataset, load_dataset
from memgas_gpu.retrieve import BuildParams, MemoryIndex, SettingsError


@pytest.fixture(scope="module")
def small(locomo_list_path):
    c = load_dataset(locomo_list_path)[0]
    return Dataset([Conversation(c.id, c.sessions[:7], c.questions[:5], c.source_summaries)])


def test_settings_object_and_keywords_build_the_same_index(small, minilm, tmp_path):
    p = BuildParams(summaries="source", m=12, skip_sessions=2, concat=False,
                    keep_turns=False)
    a = MemoryIndex.build(small, minilm, p, device="cpu", progress=False)
    b = MemoryIndex.build(small, minilm, summaries="source", m=12, skip_sessions=2,
                          concat=False, keep_turns=False, device="cpu", progress=False)
    assert a.params.m == 12 and a.params.skip_sessions == 2
    assert a.snapshot().concat is None and a.snapshot().turns is None
    assert torch.equal(a.snapshot().graphs["gmm"][1], b.snapshot().graphs["gmm"][1])
    assert a.config["build"] == b.config["build"] == p.describe()
    a.save(tmp_path / "ix")
    back = MemoryIndex.load(tmp_path / "ix")
    assert back.build_params == BuildParams(summaries="source", m=12, skip_sessions=2,
                                            concat=False, keep_turns=False)
    # a setting replaces the object's: one name, one default
    c = MemoryIndex.build(small, minilm, p, skip_sessions=5, device="cpu", progress=False)
    assert c.params.skip_sessions == 5 and c.params.m == 12


@pytest.mark.parametrize("bad, match", [
    (dict(m=0), "m must be an integer from 1 to"), (dict(m=2.5), "m must be"),
    (dict(skip_sessions=-1), "skip_sessions"), (dict(concat="yes"), "concat"),
    (dict(summaries=None), "summaries"), (dict(keep_text=1), "keep_text")])
def test_bad_settings_are_named(bad, match):
    with pytest.raises(SettingsError, match=match):
        BuildParams().replace(**bad)


def test_unknown_setting_is_refused_before_any_work(small):
    class Untouchable:  # an encoder that must never be called
        def encode(self, *a, **k):
            raise AssertionError("encoded before the settings were checked")

    with pytest.raises(SettingsError, match="unknown setting.*'mm'"):
        MemoryIndex.build(small, Untouchable(), mm=3)
    with pytest.raises(SettingsError, match="m must be"):
        MemoryIndex.build(small, Untouchable(), m=0)


def test_default_method_runs_on_whatever_the_index_stores(small, minilm):
    """memgas_hybrid's signals="auto" keeps the signals whose data the index stores: an
    index without lexical data and turn embeddings still answers the default search."""
    bare = MemoryIndex.build(small, minilm, summaries="source", lexical=False,
                             keep_turns=False, device="cpu", progress=False)
    r = bare.retrieve()  # DEFAULT_METHOD
    rule = r.params["signals_rule"]
    assert r.params["signals"] == "dense_U" and "bm25_S" in rule["reason"]
    assert "lexical=False" in rule["reason"]
    hit = bare.search(small[0].id, [small[0].questions[0].text], k=3, encoder=minilm)[0]
    assert len(hit.session_ids) == 3
    none = MemoryIndex.build(small, minilm, summaries="offline", lexical=False,
                             keep_turns=False, device="cpu", progress=False)
    assert none.retrieve().params["signals"] == "dense_S+dense_T+dense_U+dense_K"
