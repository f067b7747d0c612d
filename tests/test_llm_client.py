"""The chat client against a real HTTP server on 127.0.0.1 (tests/_openai_server.py)."""
from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memgas_gpu.errors import MemgasError  # noqa: E402
from memgas_gpu.llm import (ChatClient, ChatRequest, LLMConfig, LLMConfigError,  # noqa: E402
                            LLMRequestError, ResponseCache, request_key)

sys.path.insert(0, str(Path(__file__).parent))
from _openai_server import FakeOpenAI, rule_answer  # noqa: E402

SECRET = "sk-test-SECRET-7f3a9c2e"


@pytest.fixture
def server():
    with FakeOpenAI() as srv:
        yield srv


def _client(srv, cache=None, **kw):
    kw.setdefault("backoff", 0.001)
    kw.setdefault("api_key", SECRET)
    return ChatClient(LLMConfig(model="fake-model", base_url=srv.base_url, **kw), cache=cache,
                      progress=False)


def _reqs(n, prefix="hello"):
    return [ChatRequest.user(f"{prefix} {i}", label=f"req {i}") for i in range(n)]


# --- configuration --------------------------------------------------------------------
def test_config_from_env_and_precedence(monkeypatch):
    for v in ("MEMGAS_LLM_MODEL", "MEMGAS_LLM_BASE_URL", "OPENAI_BASE_URL",
              "MEMGAS_LLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(LLMConfigError, match="MEMGAS_LLM_MODEL"):
        LLMConfig.from_env()
    monkeypatch.setenv("MEMGAS_LLM_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    cfg = LLMConfig.from_env()
    assert cfg.model == "env-model" and cfg.api_key == "sk-openai"
    assert cfg.endpoint == "https://api.openai.com/v1/chat/completions"
    monkeypatch.setenv("MEMGAS_LLM_API_KEY", "sk-memgas")
    monkeypatch.setenv("MEMGAS_LLM_BASE_URL", "http://localhost:8000")
    cfg = LLMConfig.from_env(model="opt-model", concurrency=3, timeout=None)
    assert (cfg.model, cfg.api_key, cfg.concurrency, cfg.timeout) == \
        ("opt-model", "sk-memgas", 3, 120.0)
    assert cfg.endpoint == "http://localhost:8000/v1/chat/completions"
    assert LLMConfig.from_env(api_key="sk-arg").api_key == "sk-arg"


@pytest.mark.parametrize("url,endpoint", [
    ("http://h:8080", "http://h:8080/v1/chat/completions"),            # llama.cpp server
    ("http://h:8000/v1/", "http://h:8000/v1/chat/completions"),        # vLLM
    ("http://h/v1/chat/completions", "http://h/v1/chat/completions"),
])
def test_endpoint_normalisation(url, endpoint):
    assert LLMConfig(model="m", base_url=url).endpoint == endpoint


def test_config_hides_key():
    cfg = LLMConfig(model="m", base_url="https://user:pw-4567@h/v1", api_key=SECRET)
    assert SECRET not in repr(cfg) and SECRET not in str(cfg.describe())
    assert "pw-4567" not in cfg.describe()["base_url"]
    assert "pw-4567" not in repr(cfg) and "https://h/v1" in repr(cfg)
    assert "pw-4567" not in repr(ChatClient(cfg, progress=False))
    assert cfg.describe()["temperature"] == 0.0
    with pytest.raises(LLMConfigError):
        LLMConfig(model="m", base_url="ftp://h")
    with pytest.raises(LLMConfigError):
        LLMConfig(model="m", concurrency=0)


def test_request_key_depends_on_model_messages_params():
    m = [{"role": "user", "content": "x"}]
    k = request_key("a", m, {"temperature": 0})
    assert k == request_key("a", list(m), {"temperature": 0})
    assert k != request_key("b", m, {"temperature": 0})
    assert k != request_key("a", [{"role": "user", "content": "y"}], {"temperature": 0})
    assert k != request_key("a", m, {"temperature": 0.5})


# --- protocol, retries, concurrency -------------------------------------------------
def test_answers_in_order_with_usage_and_temperature_zero(server):
    c = _client(server)
    reqs = _reqs(5)
    out = c.map(reqs)
    assert out == [rule_answer(r.messages[0]["content"]) for r in reqs]
    assert c.stats.responses == 5 and c.stats.prompt_tokens == 10
    assert c.stats.completion_tokens == 5
    p = server.payloads[0]
    assert p["model"] == "fake-model" and p["temperature"] == 0.0 and p["max_tokens"] == 500
    assert server.auth[0] == f"Bearer {SECRET}"


def test_identical_requests_sent_once(server):
    c = _client(server)
    out = c.map([ChatRequest.user("same")] * 4 + [ChatRequest.user("other")])
    assert out[:4] == [rule_answer("same")] * 4 and server.requests == 2


def test_retries_succeed_after_transient_faults(server, caplog):
    server.inject("429", 2, retry_after=0)
    server.inject("500")
    server.inject("drop")
    c = _client(server)
    with caplog.at_level(logging.WARNING, logger="memgas_gpu.llm"):
        out = c.map(_reqs(6))
    assert out == [rule_answer(f"hello {i}") for i in range(6)]
    assert c.stats.retries == 4 and server.completed == 6
    assert "HTTP 429" in caplog.text and "HTTP 500" in caplog.text
    assert "connection error" in caplog.text


def test_retry_after_is_honoured(server):
    server.inject("429", retry_after=1)
    c = _client(server)
    t0 = time.perf_counter()
    assert c.map(_reqs(1)) == [rule_answer("hello 0")]
    assert time.perf_counter() - t0 >= 0.95


def test_timeout_is_retried(server):
    server.inject("slow", seconds=3.0)
    c = _client(server, timeout=0.3)
    t0 = time.perf_counter()
    assert c.map(_reqs(1)) == [rule_answer("hello 0")]
    assert c.stats.retries == 1 and time.perf_counter() - t0 < 2.5


def test_gives_up_after_max_retries(server):
    server.inject("500", 10)
    c = _client(server, max_retries=2)
    with pytest.raises(LLMRequestError) as e:
        c.map(_reqs(1))
    msg = str(e.value)
    assert "'req 0'" in msg and "HTTP 500" in msg and "gave up after 3 attempts" in msg
    assert server.requests == 3 and isinstance(e.value, MemgasError)


def test_concurrency_bound_is_respected():
    with FakeOpenAI(delay=0.1) as srv:
        c = _client(srv, concurrency=3)
        c.map(_reqs(12))
        assert 2 <= srv.max_in_flight <= 3  # parallel, never above the bound
        srv.reset_counts()
        _client(srv, concurrency=1).map(_reqs(4, "solo"))
        assert srv.max_in_flight == 1


# --- bad responses ----------------------------------------------------------------------
@pytest.mark.parametrize("fault,match", [
    ("malformed", r"body is not JSON: '\{\"id\": \"x\", \"choices\""),
    ("no_choices", r"no choices\[0\]\.message\.content.*chat\.completion"),
    ("400", r"HTTP 400: .*context length exceeded"),
])
def test_clear_errors_on_bad_responses(server, fault, match):
    server.inject(fault)
    c = _client(server)
    with pytest.raises(LLMRequestError, match=match) as e:
        c.map([ChatRequest.user("x", label="summary of session 's7'")])
    assert "summary of session 's7'" in str(e.value)
    assert server.requests == 1  # not retried


def test_key_is_redacted_from_errors(server):
    server.inject("401_echo")
    with pytest.raises(LLMRequestError) as e:
        _client(server).map(_reqs(1))
    assert "HTTP 401" in str(e.value) and SECRET not in str(e.value) and "***" in str(e.value)


@pytest.mark.parametrize("userinfo,user,password", [
    ("alice:pa55w0rd-xyz", "alice", "pa55w0rd-xyz"),
    ("bob:p%40ss%3Aw0rd", "bob", "p@ss:w0rd"),        # URL-escaped: sent decoded
])
def test_url_credentials_authenticate_and_never_reach_a_log(server, caplog, userinfo,
                                                            user, password):
    """httpx logged "HTTP Request: POST http://user:pass@host/..." at INFO."""
    import base64

    raw = []  # what the HTTP stack itself logs, seen before any filter of the client's

    class Record(logging.Filter):
        def filter(self, record):
            raw.append(record.getMessage())
            return True

    seen = Record()
    loggers = [logging.getLogger(n) for n in ("httpx", "httpcore.connection",
                                              "httpcore.http11")]
    base = server.base_url.replace("http://", f"http://{userinfo}@")
    secret_bits = (password, userinfo.split(":")[1])
    server.inject("500")
    for lg in loggers:
        lg.addFilter(seen)
    try:
        with caplog.at_level(logging.DEBUG, logger="httpx"), \
                caplog.at_level(logging.DEBUG, logger="httpcore"), \
                caplog.at_level(logging.DEBUG, logger="memgas_gpu.llm"):
            client = ChatClient(LLMConfig(model="fake-model", base_url=base, backoff=0.001),
                                progress=False)
            assert client.map(_reqs(1)) == [rule_answer("hello 0")]
            server.inject("401_echo")  # echoes the Authorization header it got
            with pytest.raises(LLMRequestError) as e:
                client.map(_reqs(1, "again"))
    finally:
        for lg in loggers:
            lg.removeFilter(seen)
    expected = base64.b64encode(f"{user}:{password}".encode()).decode()
    assert server.auth == [f"Basic {expected}"]  # the server was authenticated
    assert "HTTP Request: POST http://127.0.0.1" in caplog.text and "HTTP 500" in caplog.text
    assert raw and "HTTP 401" in str(e.value) and "***" in str(e.value)
    for text in [caplog.text, *raw, str(e.value), repr(client)]:
        for bit in secret_bits:
            assert bit not in text, text


def test_failure_keeps_earlier_responses_cached(server, tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    c = _client(server, cache=cache, concurrency=1)
    c.map(_reqs(3))
    server.inject("400")
    with pytest.raises(LLMRequestError):
        c.map(_reqs(3, "second"))
    assert len(cache) == 3  # only the three answered requests


# --- cache ----------------------------------------------------------------------------
def test_cache_hits_on_rerun(server, tmp_path):
    path = tmp_path / "cache.sqlite"
    first = _client(server, cache=str(path)).map(_reqs(8))
    assert server.requests == 8
    server.reset_counts()
    c2 = _client(server, cache=ResponseCache(path))
    assert c2.map(_reqs(8)) == first
    assert server.requests == 0 and c2.stats.cache_hits == 8
    # another model or temperature is another key
    _client(server, cache=str(path), temperature=0.7).map(_reqs(2))
    assert server.requests == 2


def test_cache_rejects_a_non_database(tmp_path):
    bad = tmp_path / "x.sqlite"
    bad.write_bytes(b"not a database at all" * 100)
    with pytest.raises(MemgasError, match="cannot open the response cache"):
        ResponseCache(bad)


def test_resume_after_kill(tmp_path, lme_sample_path):
    """A `memgas expand` killed mid-run resumes: the rerun sends only missing requests."""
    cache = tmp_path / "cache.sqlite"
    with FakeOpenAI(hold_after=7) as srv:
        env = dict(os.environ, OPENAI_API_KEY=SECRET)
        cmd = [sys.executable, "-c", "from memgas_gpu.cli import main; main()", "expand",
               str(lme_sample_path), "--llm-model", "fake", "--base-url", srv.base_url,
               "--cache", str(cache), "--out", str(tmp_path / "x"), "--concurrency", "2"]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            deadline = time.time() + 30
            rows = 0
            while time.time() < deadline:
                if cache.exists():
                    with sqlite3.connect(cache) as db:
                        try:
                            rows = db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
                        except sqlite3.OperationalError:
                            rows = 0
                if rows == 7 and srv.requests > 7:
                    break
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.05)
            assert rows == 7
        finally:
            proc.kill()
            proc.wait()
        srv.release()
        assert not (tmp_path / "x-summary_level.jsonl").exists()
        srv.reset_counts()
        from click.testing import CliRunner

        from memgas_gpu.cli.main import cli
        res = CliRunner().invoke(cli, cmd[3:], env={"OPENAI_API_KEY": SECRET})
        assert res.exit_code == 0, res.output
        assert srv.requests == 38 - 7 == len(ResponseCache(cache)) - 7
        assert (tmp_path / "x-summary_level.jsonl").exists()
