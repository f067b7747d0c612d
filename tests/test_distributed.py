"""Ray scale-out: identical index and rankings to the single-process run, and a
killed encoder worker does not change the result (local Ray, 2 CPU workers)."""
from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

ray = pytest.importorskip("ray")

from memgas_gpu import load_dataset  # noqa: E402
from memgas_gpu.distributed import (RayEncoder, build_index_ray, init_ray,  # noqa: E402
                                    retrieve_ray)
from memgas_gpu.encode import Encoder  # noqa: E402
from memgas_gpu.encode.tiny import make_random_bert  # noqa: E402
from memgas_gpu.eval import evaluate  # noqa: E402
from memgas_gpu.retrieve import MemoryIndex, retrieve  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def local_ray():
    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def tiny_model(tiny_bert):
    return tiny_bert


@pytest.fixture(scope="module")
def single(lme_sample_path, tiny_model):
    ds = load_dataset(lme_sample_path)
    return ds, MemoryIndex.build(ds, Encoder(tiny_model, device="cpu"), device="cpu",
                                 progress=False, lexical=False)


def test_ray_store_shards_equal_single_process(local_ray, single, tiny_model, tmp_path):
    from memgas_gpu.encode import EmbeddingStore

    ds, _ = single
    enc = Encoder(tiny_model, device="cpu")
    a = MemoryIndex.build(ds, enc, store=EmbeddingStore(tmp_path / "one", enc.fingerprint),
                          device="cpu", progress=False, lexical=False)
    b = build_index_ray(ds, {"model": tiny_model}, num_workers=2, device="cpu",
                        progress=False, lexical=False, store_dir=str(tmp_path / "ray"))
    assert torch.equal(a.snapshot().gran, b.snapshot().gran) and torch.equal(a.q_emb, b.q_emb)
    shards = sorted(p.name for p in (tmp_path / "one").glob("shard-*"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "ray").glob("shard-*"))
    for name in shards:  # the same batches, committed in the same order: same bytes
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "ray" / name).read_bytes()


def test_ray_index_and_rankings_equal_single_process(local_ray, single, tiny_model):
    ds, a = single
    b2 = build_index_ray(ds, {"model": tiny_model}, num_workers=2, device="cpu",
                         progress=False, lexical=False)
    assert torch.equal(a.snapshot().gran, b2.snapshot().gran) and torch.equal(a.q_emb, b2.q_emb)  # bit for bit
    assert torch.equal(a.snapshot().graphs["gmm"][0], b2.snapshot().graphs["gmm"][0])
    assert torch.equal(a.snapshot().graphs["gmm"][1], b2.snapshot().graphs["gmm"][1])
    for method in ("memgas", "session", "no_ppr"):
        ra = retrieve(a, method=method, device="cpu")
        rb = retrieve_ray(b2, method=method, num_tasks=2, device="cpu")
        assert torch.equal(ra.rankings, rb.rankings), method
        ea, eb = evaluate(a, ra), evaluate(b2, rb)
        assert ea.summary["all"] == eb.summary["all"], method


@pytest.mark.slow  # fault injection: ~20-27 s each on 2 cores
def test_killed_worker_is_retried(local_ray, single, tiny_model):
    ds, a = single
    small = 4096  # padded tokens per batch: enough batches to kill one mid-plan on any data
    enc = RayEncoder({"model": tiny_model, "token_budget": small}, num_workers=2)
    texts = [s.text for s in ds.distinct_sessions()] + [t for s in ds.distinct_sessions()
                                                        for t in s.turns]
    tok = enc.tokenize(texts)
    plan = enc.plan(tok)
    assert len(plan) > 4
    out = torch.empty(len(texts), enc.dim)
    for k, (items, emb) in enumerate(enc.encode_batches(tok, plan)):
        if k == 1:  # kill a worker while batches are queued on it
            ray.kill(enc.actors[0], no_restart=False)
        out[torch.tensor(items)] = emb
    enc.shutdown()
    expect = Encoder(tiny_model, device="cpu", token_budget=small).encode(texts)
    assert torch.equal(out, expect)


def test_cli_ray_flag(local_ray, lme_sample_path, tiny_model, tmp_path):
    from memgas_gpu.cli.main import cli

    r = CliRunner().invoke(cli, ["eval", str(lme_sample_path), "--encoder", tiny_model,
                                 "--ray", "--workers", "2", "--device", "cpu",
                                 "--method", "session"])
    assert r.exit_code == 0, r.output
    assert "== session (40 questions)" in r.output


def test_cli_without_ray_says_how_to_install(monkeypatch, lme_sample_path):
    from memgas_gpu.cli.main import cli
    from memgas_gpu.distributed import ray_backend

    def missing():
        raise ImportError(ray_backend.INSTALL_HINT)

    monkeypatch.setattr(ray_backend, "require_ray", missing)
    r = CliRunner().invoke(cli, ["index", str(lme_sample_path), "--out", "x", "--ray"])
    assert r.exit_code == 2
    assert 'pip install "memgas_gpu[ray]"' in r.output


@pytest.mark.slow  # fault injection: ~20-27 s each on 2 cores
def test_driver_restart_resumes_from_committed_shards(local_ray, single, tiny_model, tmp_path,
                                                     monkeypatch):
    """A driver killed after committing two shards: the rerun encodes only the rest
    and ends with the single-process result."""
    from memgas_gpu.encode import EmbeddingStore

    ds, _ = single
    enc = Encoder(tiny_model, device="cpu")
    full = MemoryIndex.build(ds, enc, store=EmbeddingStore(tmp_path / "one", enc.fingerprint,
                                                           shard_size=16),
                             device="cpu", progress=False, lexical=False)

    class Killed(Exception):
        pass

    commit = EmbeddingStore._commit
    calls = []

    def dying_commit(self, *a, **k):
        commit(self, *a, **k)
        calls.append(1)
        if len(calls) == 2:
            raise Killed  # the driver dies right after its second shard is durable

    store_dir = str(tmp_path / "ray")
    kw = dict(num_workers=2, device="cpu", progress=False, lexical=False, store_dir=store_dir)
    monkeypatch.setattr(EmbeddingStore, "_commit", dying_commit)
    monkeypatch.setattr(EmbeddingStore, "__init__", _small_shards(EmbeddingStore.__init__))
    with pytest.raises(Killed):
        build_index_ray(ds, {"model": tiny_model}, **kw)
    monkeypatch.setattr(EmbeddingStore, "_commit", commit)
    committed = len(EmbeddingStore(store_dir, enc.fingerprint))
    assert committed >= 32
    b = build_index_ray(ds, {"model": tiny_model}, **kw)
    total = full.config["encoding"]["sessions_and_texts"]["encoded"]
    assert b.config["encoding"]["sessions_and_texts"]["encoded"] == total - committed
    assert torch.equal(full.snapshot().gran, b.snapshot().gran) and torch.equal(full.q_emb, b.q_emb)
    assert torch.equal(retrieve(full, method="memgas", device="cpu").rankings,
                       retrieve(b, method="memgas", device="cpu").rankings)


def _small_shards(init):
    def wrapped(self, dir, fingerprint, dtype=None, shard_size=16):
        init(self, dir, fingerprint, dtype=dtype, shard_size=16)
    return wrapped
