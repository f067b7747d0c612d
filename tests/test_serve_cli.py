"""``memgas serve`` as a process: the one URL line, keys from the environment, SIGTERM /
SIGINT closing the memory (its checkpoint), the refusal to listen remotely without
keys, and the README's serving example run against a real server."""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import memgas_gpu as mg
from memgas_gpu.cli.main import cli
from memgas_gpu.retrieve import MemoryIndex

from _serve import assert_same, sessions_of

ROOT = Path(__file__).resolve().parents[1]
KEY = "alice-key-0123456789abcdef"


@pytest.fixture(scope="module")
def bert(tiny_bert):
    return tiny_bert


def start(args, cwd, env=None, timeout=120.0):
    """``memgas serve ARGS`` in a process; ``(process, URL)`` once its line is out. Its
    stderr (the access log grows with every request) goes to an unnamed temporary file,
    never to a pipe nobody reads while the server runs."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    err = tempfile.TemporaryFile("w+")
    p = subprocess.Popen([sys.executable, "-m", "memgas_gpu.cli", "serve", *args], cwd=cwd,
                         env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    p.err_file = err
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    if not ready:
        p.kill()
        p.wait()
        raise AssertionError(f"no URL line within {timeout} s: {_stderr(p)[-2000:]}")
    line = p.stdout.readline()
    if not line:
        p.wait()
        raise AssertionError(f"the server ended: {_stderr(p)[-2000:]}")
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+\n", line), line
    return p, line.strip()


def _stderr(p) -> str:
    p.err_file.seek(0)
    text = p.err_file.read()
    p.err_file.close()
    return text


def stop(p, sig=signal.SIGTERM) -> tuple[str, str]:
    p.send_signal(sig)
    out, _ = p.communicate(timeout=120)
    err = _stderr(p)
    assert p.returncode == 0, err[-3000:]
    return out, err


def test_a_server_process_serves_until_sigterm_then_closes_the_memory(tmp_path, bert):
    folder = tmp_path / "mem"
    env = dict(os.environ, MEMGAS_API_KEYS=json.dumps({KEY: "alice"}))
    p, url = start([str(folder), "--port", "0", "--encoder", bert, "--max-wait-ms", "2"],
                   tmp_path, env)
    try:
        c = mg.Client(url, key=KEY)
        for s, md in sessions_of(1):
            c.add_session("c1", s, metadata=md)
        got = c.search("c1", ["When is the violin recital?"], k=3)
        with pytest.raises(mg.MemgasError, match="401"):
            mg.Client(url).conversations
    finally:
        out, err = stop(p)
    assert out == ""  # the URL line was the only one
    assert KEY not in err and "Traceback" not in err
    assert "1 key(s), 1 tenant(s)" in err
    with MemoryIndex.open(folder) as mem:  # the writer lock was released
        assert mem.recovery["replayed"] == 0  # closed: checkpointed, nothing to replay
        assert [m.id for m in mem.conversations] == ["alice/c1"]
        want = mem.search("alice/c1", ["When is the violin recital?"], k=3)
    assert_same(got, [type(w)("c1", w.session_ids, w.scores, w.evidence) for w in want])


def test_sigint_closes_the_memory_too(tmp_path, bert):
    p, url = start([str(tmp_path / "m"), "--port", "0", "--encoder", bert,
                    "--max-batch-size", "1"], tmp_path)
    mg.Client(url).add_session("x", sessions_of(0)[0][0])
    stop(p, signal.SIGINT)
    with MemoryIndex.open(tmp_path / "m") as mem:
        assert mem.recovery["replayed"] == 0 and mem.sessions("x")[0]["id"] == "s0"


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "example.invalid"])
def test_no_remote_listening_without_keys(tmp_path, host, monkeypatch):
    monkeypatch.delenv("MEMGAS_API_KEYS", raising=False)
    r = CliRunner().invoke(cli, ["serve", str(tmp_path / "m"), "--host", host])
    assert r.exit_code == 2 and "without keys" in r.output and "allow-remote" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "m").exists()  # refused before anything was opened


def test_bad_keys_and_flags_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMGAS_API_KEYS", json.dumps({"short": "alice"}))
    r = CliRunner().invoke(cli, ["serve", str(tmp_path / "m")])
    assert r.exit_code == 2 and "MEMGAS_API_KEYS: entry 1 (tenant 'alice')" in r.output
    assert "short" not in r.output.replace("shorter", "")
    monkeypatch.delenv("MEMGAS_API_KEYS")
    r = CliRunner().invoke(cli, ["serve", str(tmp_path / "m"), "--replicas", "3"])
    assert r.exit_code == 2 and "--ray" in r.output
    r = CliRunner().invoke(cli, ["serve", str(tmp_path / "m"), "--keys", str(tmp_path / "no")])
    assert r.exit_code == 2 and "cannot read the keys file" in r.output
    assert not (tmp_path / "m").exists()


# ------------------------------------------------------------------ the README's example
def _readme_blocks():
    from test_readme import section

    return section("Serve a memory over HTTP")


def test_readme_serving_example_runs_against_a_real_server(tmp_path, bert):
    """The README's three blocks, as written, against ``memgas serve memory/`` started
    with ``--port 0`` and a tiny encoder (its URL in place of the README's)."""
    start_block, curl_block, client_block = _readme_blocks()
    argv = start_block.code.split("#")[0].split()
    assert argv[:2] == ["memgas", "serve"]
    p, url = start(argv[2:] + ["--port", "0", "--encoder", bert], tmp_path)
    readme_url = "http://127.0.0.1:8000"
    assert readme_url in curl_block.code and readme_url in client_block.code
    try:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c",
                            curl_block.code.replace(readme_url, url)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        dec, docs, at = json.JSONDecoder(), [], 0
        while at < len(r.stdout):
            doc, at = dec.raw_decode(r.stdout, at)
            docs.append(doc)
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(client_block.code.replace(readme_url, url), "README", "exec"), {})
    finally:
        stop(p)
    added, searched = docs
    assert added == {"conversation_id": "user-1",
                     "added": [{"id": "s1", "date": "2024-05-01", "turns": 1}]}
    with MemoryIndex.open(tmp_path / "memory") as mem:
        want = mem.search("user-1", ["Who teaches me the violin?"], k=3)  # both sessions now
        assert [s["id"] for s in mem.sessions("user-1")] == ["s1", "s2"]
        assert buf.getvalue().strip() == str(
            mem.search("user-1", ["Who visits from Lisbon?"], k=3)[0].session_ids)
    assert searched["results"][0]["session_ids"] == ["s1"]  # asked before s2 was added
    assert "s1" in want[0].session_ids


def test_importing_the_package_and_the_client_pulls_no_web_stack_and_no_torch():
    code = ("import sys, memgas_gpu, memgas_gpu.cli.main, memgas_gpu.serve; memgas_gpu.Client; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'starlette', 'uvicorn', 'ray', 'httpx'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
