"""``memgas serve --ray``: conversations sharded over Ray Serve replicas by a stable hash
of their tenant-qualified id; the shards' backend, in this process over stand-in handles
(the calls and answers pickled as Ray sends them), answers every call as one memory
holding every conversation would (searches in each shard's fair batcher, large requests
too); on a local Ray cluster with 2 replicas every answer equals the one-process
server's, and each shard folder holds exactly its conversations."""
from __future__ import annotations

import asyncio
import inspect
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import types

import pytest

pytest.importorskip("ray.serve", reason='Ray Serve is not installed: pip install '
                                        '"memgas_gpu[serve-ray]"')

import memgas_gpu as mg  # noqa: E402
from memgas_gpu.retrieve import MemoryIndex  # noqa: E402
from memgas_gpu.serve.backend import MemoryCalls, NotFound  # noqa: E402
from memgas_gpu.serve.ray_serve import (RayBackend, Shard, ShardLayoutError,  # noqa: E402
                                        check_layout, shard_of)

from _serve import CONVERSATIONS, QUESTIONS, assert_same, populate, search_mix  # noqa: E402
from test_serve_batcher import add_twin_free, same, twin_free  # noqa: E402
from test_serve_cli import start, stop  # noqa: E402

KEYS = {"alice-key-0123456789abcdef": "alice", "bob-key-fedcba9876543210": "bob"}


def test_the_shard_of_an_id_is_stable_and_spread():
    # fixed values: a placement must not change between processes or versions
    assert [shard_of(f"alice/c{i}", 4) for i in range(8)] == [0, 1, 3, 1, 2, 0, 3, 2]
    got = subprocess.run([sys.executable, "-c", "from memgas_gpu.serve.ray_serve import "
                          "shard_of; print([shard_of(f'alice/c{i}', 4) for i in range(8)])"],
                         capture_output=True, text=True, env=dict(
                             os.environ, PYTHONHASHSEED="123",
                             PYTHONPATH=os.pathsep.join(sys.path)))
    assert got.stdout.strip() == str([shard_of(f"alice/c{i}", 4) for i in range(8)])
    assert {shard_of(f"c{i}", 2) for i in range(40)} == {0, 1}
    assert shard_of("alice/c1", 2) in (0, 1) and shard_of("", 1) == 0


def test_a_folder_keeps_its_shard_count(tmp_path):
    f = tmp_path / "sharded"
    assert check_layout(f, 2) == [str(f / "shard-0"), str(f / "shard-1")]
    assert check_layout(f, 2)
    with pytest.raises(ShardLayoutError, match="--replicas 2"):
        check_layout(f, 3)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "manifest.json").write_text("{}")
    with pytest.raises(ShardLayoutError, match="not a sharded memory"):
        check_layout(tmp_path / "plain", 2)


@pytest.mark.slow  # a local Ray cluster and Ray Serve: ~30 s on 2 cores
@pytest.mark.ray
def test_two_replicas_answer_as_the_one_process_server(tmp_path):
    from memgas_gpu.encode.tiny import make_random_bert

    bert = make_random_bert(str(tmp_path / "bert"))
    # Ray's session files (sockets: a short path) in a folder of this test's, not /tmp/ray
    ray_tmp = tempfile.mkdtemp(prefix="mgray-")
    try:
        _two_replicas(tmp_path, bert, dict(os.environ, MEMGAS_API_KEYS=json.dumps(KEYS),
                                           RAY_TMPDIR=ray_tmp))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _two_replicas(tmp_path, bert, env):
    one, one_url = start([str(tmp_path / "one"), "--port", "0", "--encoder", bert], tmp_path,
                         env)
    try:
        two, two_url = start([str(tmp_path / "two"), "--port", "0", "--encoder", bert,
                              "--ray", "--replicas", "2"], tmp_path, env, timeout=300)
    except BaseException:
        stop(one)
        raise
    try:
        for key in KEYS:
            a, b = mg.Client(one_url, key=key), mg.Client(two_url, key=key)
            populate(a)
            populate(b)
            b.add_session("bob/c1", mg.Session.from_messages("x", "2024-01-01", [
                {"role": "user", "content": "an id shaped like another tenant's"}]))
            b.remove_session("ana", "s1")
            a.add_session("bob/c1", mg.Session.from_messages("x", "2024-01-01", [
                {"role": "user", "content": "an id shaped like another tenant's"}]))
            a.remove_session("ana", "s1")
            assert sorted((m.id, m.session_ids) for m in a.conversations) == \
                sorted((m.id, m.session_ids) for m in b.conversations)
            for cid in CONVERSATIONS:
                assert a.sessions(cid) == b.sessions(cid)
            for cid, qs, kw in search_mix():
                assert_same(b.search(cid, qs, **kw), a.search(cid, qs, **kw))
            # more questions than a batch holds (64): cut into pieces on each shard
            big = [CONVERSATIONS[j % len(CONVERSATIONS)] for j in range(150)]
            qs = [f"{QUESTIONS[j % len(QUESTIONS)]} {j}" for j in range(150)]
            got, want = b.search(big, qs, k=3), a.search(big, qs, k=3)
            assert [r.conversation_id for r in got] == big
            for g, w in zip(got, want):  # twins' exact ties may come in either order
                assert len(g.scores) == len(w.scores)
                assert all(abs(x - y) <= 1e-4 for x, y in zip(g.scores, w.scores))
        b.forget_conversation("eli")
        with pytest.raises(KeyError):
            b.sessions("eli")
    finally:
        stop(two)
        stop(one)
    # each shard folder holds exactly the conversations its hash places there
    held = []
    for i in range(2):
        with MemoryIndex.open(tmp_path / "two" / f"shard-{i}") as m:
            ids = [c.id for c in m.conversations]
        assert all(shard_of(c, 2) == i for c in ids)
        held += ids
    assert sorted(held) == sorted([f"{t}/{c}" for t in ("alice", "bob")
                                   for c in CONVERSATIONS + ["bob/c1"]
                                   if (t, c) != ("bob", "eli")])


def test_the_ray_backend_offers_every_method_of_the_local_one():
    """The app holds either backend: the same public methods, async where the local
    one's are (a method added to LocalBackend and not here fails this test)."""
    from memgas_gpu.serve.backend import LocalBackend

    def api(cls) -> dict:
        return {n: inspect.iscoroutinefunction(f) for n, f in vars(cls).items()
                if not n.startswith("_") and callable(f)}

    assert api(RayBackend) == api(LocalBackend)


class _Handle:
    """What a Ray Serve handle offers the backend, over a :class:`Shard` in this
    process: ``handle.method.remote(*args)``, awaitable, its arguments and answer
    pickled both ways as Ray would send them."""

    def __init__(self, shard) -> None:
        self.shard = shard

    def __getattr__(self, name):
        fn = getattr(self.shard, name)

        async def go(*args):
            out = await fn(*pickle.loads(pickle.dumps(args)))
            return pickle.loads(pickle.dumps(out))

        return types.SimpleNamespace(remote=go)


def test_the_shards_backend_answers_as_one_memory(tmp_path):
    """Two shards (batches of 16 questions at most) against one memory holding every
    conversation: listings, searches (one id per question across both shards, a
    200-question request, several tenants at once), errors with their own types,
    writes, counters."""
    from memgas_gpu import Dataset
    from memgas_gpu.encode import Encoder
    from memgas_gpu.encode.tiny import make_random_bert

    bert = make_random_bert(str(tmp_path / "bert"))
    enc = Encoder(bert, device="cpu")
    cids = [f"{t}/{c}" for t in ("alice", "bob") for c in CONVERSATIONS]
    one = MemoryIndex.build(Dataset([]), enc, device="cpu", progress=False)
    add_twin_free(one, cids)
    folders = check_layout(tmp_path / "sharded", 2)
    sessions = twin_free(cids)
    for i, f in enumerate(folders):
        m = MemoryIndex.build(Dataset([]), enc, device="cpu", progress=False)
        for cid in cids:
            if shard_of(cid, 2) == i:
                m.add_sessions(cid, [x for x, _ in sessions[cid]],
                               metadata=[md for _, md in sessions[cid]])
        m.save(f)
        m.close()
    assert {shard_of(c, 2) for c in cids} == {0, 1}
    calls = MemoryCalls(one)

    async def main():
        shards = [Shard.func_or_class(f, bert, "cpu", 16, 5.0, None) for f in folders]
        b = RayBackend([_Handle(s) for s in shards], own_serve=False)
        try:
            assert sorted(await b.conversations()) == sorted(calls.conversations())
            for cid in cids:
                assert await b.conversation(cid) == calls.conversation(cid)
                assert await b.sessions(cid) == calls.sessions(cid)
                assert await b.get_session(cid, "s1") == calls.get_session(cid, "s1")
            with pytest.raises(NotFound) as e:
                await b.sessions("alice/nobody")
            assert e.value.what == "conversation"
            with pytest.raises(NotFound) as e:
                await b.get_session("alice/ana", "s99")
            assert e.value.what == "session"
            with pytest.raises(ValueError):
                b.request("alice/ana", ["q"], {"k": 0})
            # searches: the mix, one id per question over both shards, a large request
            asks = []
            for i, (cid, qs, kw) in enumerate(search_mix()):
                t = ("alice", "bob")[i % 2]
                cid = [f"{t}/{c}" for c in cid] if isinstance(cid, list) else f"{t}/{cid}"
                asks.append((cid, qs, kw, t))
            big = [cids[j % len(cids)] for j in range(200)]
            asks.append((big, [f"{QUESTIONS[j % 6]} {j}" for j in range(200)], {"k": 3}, "bob"))
            got = await asyncio.gather(*[b.search(b.request(c, qs, kw), t)
                                         for c, qs, kw, t in asks])
            for (c, qs, kw, _), res in zip(asks, got):
                same(res, one.search(c, qs, **kw))
            stats = await b.stats()
            assert [p["shard"] for p in stats["shards"]] == [0, 1]
            assert stats["conversations"] == len(cids)
            assert sum(p["questions"] for p in stats["shards"]) == \
                sum(len(qs) for _, qs, _, _ in asks)
            for p in stats["shards"]:
                assert p["max_batch_size"] == 16 and p["queue_depth"] == 0
                assert p["batch_sizes"][16] == p["batch_sizes"]["+Inf"] == p["batches"]
                assert p["errors"] == 0 and p["fair"]  # ^ the large request was cut
            ready = await b.ready()
            assert ready["conversations"] == len(cids)
            assert ready["sessions"] == sum(len(v) for v in sessions.values())
            # writes, each on its conversation's shard
            await b.remove_session("bob/ben", "s1")
            await b.forget("alice/dev")
            calls.remove_session("bob/ben", "s1")
            calls.forget("alice/dev")
            assert sorted(await b.conversations()) == sorted(calls.conversations())
            assert await b.sessions("bob/ben") == calls.sessions("bob/ben")
            assert isinstance(await b.compact(), int)
            same(await b.search(b.request("bob/ben", [QUESTIONS[0]], {}), None),
                 one.search("bob/ben", [QUESTIONS[0]]))
        finally:
            await asyncio.gather(*[s.close() for s in shards])

    asyncio.run(main())
    for i, f in enumerate(folders):  # closed: each folder holds its conversations
        with MemoryIndex.open(f) as m:
            assert sorted(c.id for c in m.conversations) == sorted(
                c for c in cids if shard_of(c, 2) == i and c != "alice/dev")
