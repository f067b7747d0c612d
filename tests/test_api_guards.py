"""Python API arguments refused up front with one clear message: an encoder given as a
name, a device torch does not have, a storage dtype given as a string, question
indices that are not integers or out of range."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memgas_gpu.retrieve import MemoryIndex


@pytest.fixture(scope="module")
def small_index(tmp_path_factory):
    from memgas_gpu import Dataset
    from memgas_gpu.data.model import Conversation, Question, Session
    from memgas_gpu.encode import Encoder
    from memgas_gpu.encode.tiny import make_random_bert
    from memgas_gpu.retrieve import MemoryIndex

    root = tmp_path_factory.mktemp("api_guards")
    enc = Encoder(make_random_bert(str(root / "bert")), device="cpu", max_length=32)
    sessions = [Session.from_messages(f"s{i}", f"2023-01-0{i + 1}", [
        {"role": "user", "content": f"my cat number {i} likes fish"},
        {"role": "assistant", "content": "noted"}]) for i in range(3)]
    qs = [Question(f"q{i}", f"what does cat {i} like?", evidence_session_ids=(f"s{i}",))
          for i in range(3)]
    idx = MemoryIndex.build(Dataset([Conversation("c", sessions, qs)]), enc, device="cpu",
                            progress=False, m=2, skip_sessions=0)
    return idx, enc


def _new_session():
    from memgas_gpu.data.model import Session

    return Session.from_messages("s9", "2023-02-01", [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("name", ["bert-base-uncased", Path("/models/bert")])
def test_an_encoder_given_as_a_name_is_refused_saying_what_to_pass(small_index, name):
    from memgas_gpu.retrieve import MemoryIndex

    idx, _ = small_index
    rows, convs = idx.n_rows, [c.session_ids for c in idx.conversations]
    want = rf"Encoder object.*mg\.Encoder\('{name}'\)"
    with pytest.raises(TypeError, match=want):
        idx.add_session("c", _new_session(), encoder=name)
    assert idx.n_rows == rows and [c.session_ids for c in idx.conversations] == convs
    with pytest.raises(TypeError, match=want):
        idx.search("c", ["cat"], encoder=name, device="cpu")
    with pytest.raises(TypeError, match=want):
        MemoryIndex.build(None, encoder=name)  # before the dataset is even looked at


def test_cuda_on_a_cpu_only_torch_is_refused_clearly(small_index, monkeypatch):
    from memgas_gpu import Encoder
    from memgas_gpu.errors import MemgasError

    idx, enc = small_index
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    want = "device 'cuda': CUDA is not available in this torch build"
    calls = {"search": lambda: idx.search("c", ["cat"], encoder=enc, device="cuda"),
             "retrieve": lambda: idx.retrieve(device="cuda"),
             "Encoder": lambda: Encoder(device="cuda")}
    for name, call in calls.items():
        with pytest.raises(MemgasError, match=want):
            call()
    with pytest.raises(ValueError, match="'gpu' is not a device"):
        idx.retrieve(device="gpu")


def test_save_takes_a_dtype_or_its_name_and_refuses_anything_else(small_index, tmp_path):
    import _format4 as f4
    from safetensors.torch import load

    idx, _ = small_index
    idx.save(tmp_path / "by_name", dtype="float16")
    idx.save(tmp_path / "by_dtype", dtype=torch.float16)

    def tensors(folder):
        r = f4.root(folder)
        out = {f"q.{k}": v for k, v in load(f4.blob(folder, r["questions"])).items()}
        for i, c in enumerate(f4.chunks(folder)):
            out.update({f"{i}.{k}": v for k, v in load(f4.blob(folder, c["ref"])).items()})
        return out

    a, b = tensors(tmp_path / "by_name"), tensors(tmp_path / "by_dtype")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert a["q.q_emb"].dtype == torch.float16 and a["0.gran"].dtype == torch.float16
    back = MemoryIndex.load(tmp_path / "by_name")  # read back as float32
    assert back.q_emb.dtype == torch.float32
    for bad in ("fp8", "float64", torch.int8, torch.float64, 16):
        with pytest.raises(TypeError, match="dtype must be torch.float32, torch.float16"):
            idx.save(tmp_path / "bad", dtype=bad)
        assert not (tmp_path / "bad").exists()


def test_question_indices_must_be_integers_in_range(small_index):
    import numpy as np

    idx, _ = small_index
    n = len(idx.questions)
    want = rf"questions must be integer indices into index.questions \(0 to {n - 1}\)"
    for bad in (["a"], [0.0], [True], "01", [1, None], torch.tensor([0.0])):
        with pytest.raises(TypeError, match=want):
            idx.retrieve(questions=bad, device="cpu")
    for bad in ([2**63], [-1], [n], [0, -(2**70)], torch.tensor([n])):
        with pytest.raises(IndexError, match=want + ".*out of range"):
            idx.retrieve(questions=bad, device="cpu")
    ref = idx.retrieve(questions=[2, 0], device="cpu")
    for same in (np.array([2, 0]), torch.tensor([2, 0], dtype=torch.int32), (2, 0)):
        got = idx.retrieve(questions=same, device="cpu")
        assert got.question_index.tolist() == [2, 0]
        assert torch.equal(got.rankings, ref.rankings)
