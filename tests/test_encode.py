"""Encoder: pooling, token-budget batching, long texts, ergonomics, fingerprint."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from memgas_gpu.encode import Encoder, plan_batches, split_windows
from memgas_gpu.encode.tiny import make_random_bert

ROOT = Path(__file__).resolve().parents[1]

TEXTS = [
    "hello world",
    "",
    "[Caroline]: I went to the LGBTQ support group yesterday and it was so powerful.",
    "short",
    "a somewhat longer sentence " * 7,
    "[Melanie]: Painting is a great outlet; I made a sunset last week.\n[Caroline]: Love it!",
    "x",
    "numbers 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
]


@pytest.fixture(scope="module")
def tiny_dir(tiny_bert):
    return tiny_bert


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return Encoder(tiny_dir, device="cpu")


def hand_encode(enc: Encoder, texts, pooling="mean", max_length=512):
    """Reference: HF tokenizer call + model, masked mean (or CLS) of last_hidden_state."""
    batch = enc.tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                          return_tensors="pt")
    with torch.no_grad():
        h = enc.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    if pooling == "cls":
        return h[:, 0]
    m = batch["attention_mask"].unsqueeze(-1).float()
    return (h * m).sum(1) / m.sum(1)


def test_mean_pooling_matches_hand_computation(tiny):
    assert tiny.normalize is False and tiny.pooling == "mean"  # Contriever semantics
    got = tiny.encode(TEXTS, progress=False)
    assert got.dtype == torch.float32 and got.shape == (len(TEXTS), tiny.dim)
    torch.testing.assert_close(got, hand_encode(tiny, TEXTS), atol=1e-5, rtol=1e-5)


def test_cls_pooling(tiny_dir):
    enc = Encoder(tiny_dir, pooling="cls", device="cpu")
    torch.testing.assert_close(enc.encode(TEXTS), hand_encode(enc, TEXTS, "cls"), atol=1e-5, rtol=1e-5)


def test_normalize_true_gives_unit_vectors(tiny_dir):
    enc = Encoder(tiny_dir, normalize=True, device="cpu")
    ref = torch.nn.functional.normalize(hand_encode(enc, TEXTS), dim=-1)
    torch.testing.assert_close(enc.encode(TEXTS), ref, atol=1e-5, rtol=1e-5)


def test_token_budget_batching_equals_one_at_a_time(tiny):
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat while my friend painted sunsets near the lake".split()
    texts = [" ".join(rng.choice(words, size=int(rng.integers(0, 90)))) for _ in range(30)]
    tok = tiny.tokenize(texts)
    plan = tiny.plan(tok, token_budget=512)
    assert len(plan) > 3 and sorted(i for b in plan for i in b) == list(range(len(texts)))
    for b in plan:
        width = max(tok.max_len(i) for i in b)
        assert len(b) == 1 or len(b) * width <= 512
    batched = tiny.encode(texts, token_budget=512)
    single = torch.stack([tiny.encode(t) for t in texts])
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)
    capped = tiny.encode(texts, batch_size=3)  # row cap as well as budget
    torch.testing.assert_close(capped, single, atol=1e-5, rtol=1e-5)


def test_empty_strings(tiny):
    ids = tiny.tokenize([""]).windows[0]
    assert ids == [tiny.tokenizer("")["input_ids"]]  # [CLS] [SEP], like the tokenizer
    got = tiny.encode(["", "hello", ""])
    torch.testing.assert_close(got[0], got[2])
    torch.testing.assert_close(got, hand_encode(tiny, ["", "hello", ""]), atol=1e-5, rtol=1e-5)
    assert tiny.encode("").shape == (tiny.dim,)


def test_long_texts_truncate_and_chunk_mean(tiny_dir):
    trunc = Encoder(tiny_dir, max_length=32, device="cpu")
    chunk = Encoder(tiny_dir, max_length=32, long_text="chunk_mean", device="cpu")
    chunk_ov = Encoder(tiny_dir, max_length=32, long_text="chunk_mean", chunk_stride=20, device="cpu")
    long = " ".join(f"word{i}" for i in range(60))
    texts = [long, "short text", ""]
    content = trunc.tokenizer(long, add_special_tokens=False)["input_ids"]
    assert len(content) > 90
    cls, sep = trunc.tokenizer("")["input_ids"]
    # truncate: the tokenizer's own truncation at max_length
    t = trunc.encode(texts)
    torch.testing.assert_close(t, hand_encode(trunc, texts, max_length=32), atol=1e-5, rtol=1e-5)
    assert trunc.count_tokens(long) == 32
    for enc, stride in ((chunk, 30), (chunk_ov, 20)):
        wins = split_windows(content, 30, stride)
        assert all(len(w) <= 30 for w in wins) and wins[-1][-1] == content[-1]
        rows = [[cls] + w + [sep] for w in wins]
        with torch.no_grad():
            per = [enc.model(input_ids=torch.tensor([r])).last_hidden_state[0].mean(0) for r in rows]
        want = torch.stack(per).mean(0)
        got = enc.encode(texts, token_budget=64)  # the long item alone exceeds the budget
        torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[1:], t[1:], atol=1e-5, rtol=1e-5)  # short texts: same as truncate
        assert not torch.allclose(got[0], t[0], atol=1e-3)
        assert enc.count_tokens(long) == sum(len(r) for r in rows)
    # chunk_mean normalises after averaging the un-normalised windows
    norm = Encoder(tiny_dir, max_length=32, long_text="chunk_mean", normalize=True, device="cpu")
    torch.testing.assert_close(norm.encode(long), torch.nn.functional.normalize(chunk.encode(long), dim=0),
                               atol=1e-5, rtol=1e-5)


def test_ergonomics(tiny):
    with pytest.raises(TypeError, match="bogus.*normalize_embeddings|normalize_embeddings.*bogus"):
        tiny.encode(["a"], bogus=1, normalize_embeddings=True)
    v = tiny.encode("one string")
    assert v.shape == (tiny.dim,)
    assert tiny.encode([]).shape == (0, tiny.dim)
    arr = tiny.encode(["a", "b"], convert_to="numpy")
    assert isinstance(arr, np.ndarray) and arr.dtype == np.float32 and arr.shape == (2, tiny.dim)
    assert isinstance(tiny.encode(["a"], convert_to_numpy=True, show_progress_bar=False), np.ndarray)
    with pytest.raises(TypeError, match="texts\\[1\\]"):
        tiny.encode(["a", None])
    assert tiny.count_tokens(["", "hello world"]) == [2, 4]


def test_fingerprint(tiny_dir, tiny, tmp_path):
    fp = tiny.fingerprint
    assert fp == Encoder(tiny_dir, device="cpu").fingerprint
    moved = shutil.copytree(tiny_dir, tmp_path / "elsewhere")
    assert Encoder(str(moved), device="cpu").fingerprint == fp  # content, not path
    for kw in ({"pooling": "cls"}, {"max_length": 128}, {"long_text": "chunk_mean"},
               {"normalize": True}, {"dtype": "bfloat16"}):
        assert Encoder(tiny_dir, device="cpu", **kw).fingerprint != fp, kw
    other = make_random_bert(str(tmp_path / "other"), seed=1)
    assert Encoder(other, device="cpu").fingerprint != fp


def test_split_windows_and_plan_units():
    assert split_windows([], 4, 4) == [[]]
    assert split_windows([1, 2, 3, 4], 4, 4) == [[1, 2, 3, 4]]
    assert split_windows(list(range(10)), 4, 3) == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    from memgas_gpu.encode import Tokenized

    tok = Tokenized([[[0] * n] for n in (5, 9, 3, 9, 2)])
    assert plan_batches(tok, token_budget=20, slack=0) == [[1, 3], [0, 2, 4]]
    assert plan_batches(tok, sort_keys=["e", "d", "c", "b", "a"], token_budget=20, slack=0) == [[3, 1], [0, 2, 4]]
    assert plan_batches(tok, token_budget=20, max_rows=2, slack=0) == [[1, 3], [0, 2], [4]]
    # early end: item 2 (3 tokens) < 0.9 × 5 and the batch [0] already fills 5/20 of the budget
    assert plan_batches(tok, token_budget=20) == [[1, 3], [0], [2, 4]]
    # greedy prefix property: planning a suffix that starts on a batch boundary
    for kw in ({"slack": 0}, {}):
        full = plan_batches(tok, token_budget=18, **kw)
        rest = Tokenized([tok.windows[i] for i in (0, 2, 4)])
        assert [[[0, 2, 4][j] for j in b] for b in plan_batches(rest, token_budget=18, **kw)] == full[1:]


def locomo_messages(path: Path, n: int) -> list[str]:
    conv = json.loads(path.read_text())[0]["conversation"]
    msgs = []
    for s in range(1, 100):
        for m in conv.get(f"session_{s}", []):
            msgs.append(f"[{m['speaker']}]: {m['text']}")
    return msgs[:n]


@pytest.mark.real_data  # a paraphrase of LoCoMo conv-26's first message
def test_bundled_minilm_on_locomo(locomo_list_path):
    enc = Encoder(device="cpu")
    assert enc.normalize is True  # its modules.json lists a Normalize module
    msgs = locomo_messages(locomo_list_path, 40)
    emb = enc.encode(msgs)
    assert emb.shape == (40, 384)
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(40), atol=1e-5, rtol=0)
    sims = emb @ emb.T
    assert torch.equal(sims.argmax(1), torch.arange(40))
    # a paraphrase of message 0 ranks it above unrelated messages
    assert msgs[0].startswith("[Caroline]: Hey Mel!")
    q = enc.encode("[Caroline]: Hi Melanie, great to see you! How are you doing?")
    ranked = (emb @ q).argsort(descending=True).tolist()
    assert ranked.index(0) < 3
    # encoding is independent of batch composition (within float tolerance)
    torch.testing.assert_close(enc.encode(msgs[::-1], token_budget=300).flip(0), emb, atol=1e-5, rtol=1e-4)


def test_gpu_script_dry_run(capsys):
    spec = importlib.util.spec_from_file_location("gpu_encode", ROOT / "benchmarks" / "gpu_encode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--dry-run", "--n-texts", "64"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "dry run" in out


def test_oom_halves_the_batch(tiny_dir, monkeypatch):
    enc = Encoder(tiny_dir, device="cpu")
    texts = [f"text number {i} " * (i % 7 + 1) for i in range(24)]
    want = enc.encode(texts)
    orig, sizes = Encoder._forward, []

    def flaky(self, ids, mask):
        sizes.append(ids.shape[0])
        if ids.shape[0] > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return orig(self, ids, mask)

    monkeypatch.setattr(Encoder, "_forward", flaky)
    got = enc.encode(texts)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert enc._oom_cap is not None and max(sizes) > 4 and sizes[-1] <= 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(tiny_dir):
    texts = TEXTS + ["a longer text " * 80]
    cpu = Encoder(tiny_dir, device="cpu").encode(texts)
    fp32 = Encoder(tiny_dir, device="cuda", dtype="float32").encode(texts)
    assert fp32.device.type == "cpu" and fp32.dtype == torch.float32
    torch.testing.assert_close(fp32, cpu, atol=1e-4, rtol=1e-4)
    bf16 = Encoder(tiny_dir, device="cuda")
    assert bf16.dtype == torch.bfloat16
    cos = torch.nn.functional.cosine_similarity(bf16.encode(texts), cpu, dim=1)
    assert cos.min() > 0.99
