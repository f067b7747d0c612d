"""EmbeddingStore: dedup counts, crash + resume bit-identity, manifest checks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from safetensors import safe_open

from memgas_gpu.encode import EmbeddingStore, Encoder, StoreError, text_key
from memgas_gpu.encode.tiny import make_random_bert



class Crash(RuntimeError):
    pass


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return Encoder(make_random_bert(str(tmp_path_factory.mktemp("tiny_bert"))), device="cpu")


@pytest.fixture
def rows_forwarded(tiny, monkeypatch):
    """Count rows that reach the model."""
    seen = []
    orig = type(tiny)._forward

    def counting(self, ids, mask):
        seen.append(ids.shape[0])
        return orig(self, ids, mask)

    monkeypatch.setattr(type(tiny), "_forward", counting)
    return seen


def session_text(messages) -> str:
    rendered = [f"[{m['role']}]: {m['content']}" for m in messages]
    return "\n".join("\n".join(rendered[i : i + 2]) for i in range(0, len(rendered), 2))


def locomo_turns(path: Path, limit: int) -> list[str]:
    conv = json.loads(path.read_text())[0]["conversation"]
    msgs = [f"[{m['speaker']}]: {m['text']}" for s in range(1, 40) for m in conv.get(f"session_{s}", [])]
    return ["\n".join(msgs[i : i + 2]) for i in range(0, len(msgs), 2)][:limit]


def stored_vectors(folder: Path) -> dict[str, torch.Tensor]:
    """key -> stored vector, read with the safetensors reference reader."""
    man = json.loads((folder / "manifest.json").read_text())
    out = {}
    for e in man["shards"]:
        with safe_open(str(folder / e["file"]), framework="pt") as f:
            keys = json.loads(f.metadata()["keys"])
        mat = load_file(str(folder / e["file"]))["embeddings"]
        out.update(zip(keys, mat))
    return out


def test_dedup_longmemeval_sample(tiny, tmp_path, rows_forwarded, lme_sample_path):
    data = json.loads(lme_sample_path.read_text())
    texts, ids = [], []
    for inst in data:
        for sid, sess in zip(inst["haystack_session_ids"], inst["haystack_sessions"]):
            ids.append(sid.removeprefix("answer_"))
            texts.append(session_text(sess))
    assert len(data) == 40 and len(texts) == 760 and len(set(ids)) == 19
    store = EmbeddingStore(tmp_path / "s", tiny.fingerprint, shard_size=8)
    emb = store.encode(tiny, texts, progress=False)
    assert (store.n_requested, store.n_distinct, store.n_encoded) == (760, 19, 19)
    assert sum(rows_forwarded) == 19 and store.dedup_ratio == 40.0
    assert emb.shape == (760, tiny.dim) and emb.dtype == torch.float32
    first = {}
    for i, sid in enumerate(ids):
        j = first.setdefault(sid, i)
        assert torch.equal(emb[i], emb[j])
    # a second call (another process would do the same) encodes nothing
    again = EmbeddingStore(tmp_path / "s", tiny.fingerprint).encode(tiny, texts[::-1], progress=False)
    assert sum(rows_forwarded) == 19 and torch.equal(again, emb.flip(0))
    # stored values are the encoder's own (float32 by default: no rounding)
    want = tiny.encode([texts[0]], progress=False)[0]
    torch.testing.assert_close(emb[0], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_crash_and_resume_is_bit_identical(tiny, tmp_path, rows_forwarded, dtype,
                                           locomo_list_path):
    texts = locomo_turns(locomo_list_path, 120)
    texts = texts + texts[:30] + [""]  # repeats and an empty string
    kw = dict(token_budget=384)
    one = EmbeddingStore(tmp_path / "one", tiny.fingerprint, dtype=dtype, shard_size=10)
    ref = one.encode(tiny, texts, progress=False, **kw)
    n_total = sum(rows_forwarded)
    assert n_total == one.n_distinct == 121 and len(one.shards) > 4

    committed = []

    def crash_after_3(shard, rows):
        committed.append(rows)
        if len(committed) == 3:
            raise Crash("killed")

    rows_forwarded.clear()
    s = EmbeddingStore(tmp_path / "two", tiny.fingerprint, dtype=dtype, shard_size=10)
    with pytest.raises(Crash):
        s.encode(tiny, texts, progress=False, on_commit=crash_after_3, **kw)
    done = sum(committed)
    assert len(s) == done and 0 < done < 121
    rows_forwarded.clear()
    resumed = EmbeddingStore(tmp_path / "two", tiny.fingerprint, dtype=dtype, shard_size=10)
    assert len(resumed) == done
    out = resumed.encode(tiny, texts, progress=False, **kw)
    assert resumed.n_encoded == 121 - done and sum(rows_forwarded) == 121 - done  # no re-encoding
    assert torch.equal(out, ref)  # returned tensor: bit-identical
    a, b = stored_vectors(tmp_path / "one"), stored_vectors(tmp_path / "two")
    assert a.keys() == b.keys() and len(a) == 121
    assert all(torch.equal(a[k], b[k]) for k in a)  # per-key stored vectors: bit-identical
    assert torch.equal(resumed.lookup(texts[:5]), ref[:5])


def test_manifest_checks(tiny, tmp_path):
    folder = tmp_path / "s"
    s = EmbeddingStore(folder, tiny.fingerprint)
    s.encode(tiny, ["a", "b", "a"], progress=False)
    man = json.loads((folder / "manifest.json").read_text())
    assert man["fingerprint"] == tiny.fingerprint and man["dim"] == tiny.dim
    assert man["dtype"] == "float32" and man["version"] == 1 and man["encoder"]["pooling"] == "mean"
    with pytest.raises(StoreError, match="fingerprint"):
        EmbeddingStore(folder, "another-encoder")
    with pytest.raises(StoreError, match="dtype"):
        EmbeddingStore(folder, tiny.fingerprint, dtype="float16")
    half = EmbeddingStore(tmp_path / "h", tiny.fingerprint, dtype="float16")
    half.encode(tiny, ["a"], progress=False)
    assert EmbeddingStore(tmp_path / "h", tiny.fingerprint).dtype == "float16"  # the folder's
    with pytest.raises(StoreError, match="fingerprint"):
        EmbeddingStore(tmp_path / "t", "another-encoder").encode(tiny, ["a"], progress=False)
    (folder / "manifest.json").write_text(json.dumps(dict(man, version=99)))
    with pytest.raises(StoreError, match="newer"):
        EmbeddingStore(folder, tiny.fingerprint)


def test_orphan_shard_is_ignored_and_overwritten(tiny, tmp_path):
    folder = tmp_path / "s"
    s = EmbeddingStore(folder, tiny.fingerprint, shard_size=1)
    s.encode(tiny, ["one"], progress=False)
    (folder / "shard-000001.safetensors").write_bytes(b"half-written garbage")  # crash before manifest
    s2 = EmbeddingStore(folder, tiny.fingerprint, shard_size=1)
    assert len(s2) == 1
    out = s2.encode(tiny, ["one", "two"], progress=False)
    assert s2.n_encoded == 1 and s2.shards == ["shard-000000.safetensors", "shard-000001.safetensors"]
    assert torch.equal(EmbeddingStore(folder, tiny.fingerprint).lookup(["one", "two"]), out)


def test_get_lookup_and_empty(tiny, tmp_path):
    s = EmbeddingStore(tmp_path / "s", tiny.fingerprint, dtype="float32")
    assert s.encode(tiny, [], progress=False).shape == (0, tiny.dim)
    out = s.encode(tiny, ["x", "y"], progress=False)
    torch.testing.assert_close(out, tiny.encode(["x", "y"]), atol=1e-6, rtol=1e-6)
    assert torch.equal(s.get([s.key("y")]), out[1:])
    assert text_key(tiny.fingerprint, "y") == s.key("y") and s.key("y") in s
    with pytest.raises(KeyError, match="1 of 2"):
        s.lookup(["x", "never stored"])
    assert s.get([]).shape == (0, tiny.dim)
