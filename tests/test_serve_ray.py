"""``memgas serve --ray``: conversations sharded over Ray Serve replicas by a stable hash
of their tenant-qualified id; on a local Ray cluster with 2 replicas every answer equals
the one-process server's, and each shard folder holds exactly its conversations."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray.serve", reason='Ray Serve is not installed: pip install '
                                        '"memgas_gpu[serve-ray]"')

import memgas_gpu as mg  # noqa: E402
from memgas_gpu.retrieve import MemoryIndex  # noqa: E402
from memgas_gpu.serve.ray_serve import ShardLayoutError, check_layout, shard_of  # noqa: E402

from _serve import CONVERSATIONS, assert_same, populate, search_mix  # noqa: E402
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
    env = dict(os.environ, MEMGAS_API_KEYS=json.dumps(KEYS))
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
