"""A misbehaving chat server (issue 17, item 8): the key never shows in any encoding,
URL credentials are never printed, answers never carry the key, bodies are capped."""
from __future__ import annotations

import base64
import json
import resource
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import pytest

from memgas_gpu.llm import ChatClient, ChatRequest, LLMConfig, LLMRequestError

KEY = "sk-test/ABCDEFGHIJKLMNOP+qrstuvwxyz0123456789"


class _Server:
    def __init__(self) -> None:
        self.mode = "ok"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def handle(self, h) -> None:
        mode = self.mode
        if mode == "huge":  # 64 MiB streamed without a length, in 1 MiB writes
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.end_headers()
            chunk = b" " * (1 << 20)
            try:
                for _ in range(64):
                    h.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        status, body = 400, ""
        if mode == "json_escaped":
            body = '{"error": "bad key ' + KEY.replace("/", "\\/") + '"}'  # JSON: \/
        elif mode == "cut":  # the key straddles the 300-character snippet limit
            body = "x" * 280 + " " + KEY
        elif mode == "forms":
            body = " ".join([quote(KEY, safe=""), base64.b64encode(KEY.encode()).decode()])
        elif mode == "echo_answer":
            status = 200
            body = json.dumps({"choices": [{"message": {"content": f"your key is {KEY}"}}]})
        raw = body.encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def _client(server, base=None, **kw) -> ChatClient:
    cfg = LLMConfig(model="m", base_url=base or f"http://127.0.0.1:{server.port}/v1",
                    api_key=KEY, max_retries=0, timeout=30, **kw)
    return ChatClient(cfg, cache=None, progress=False)


@pytest.mark.parametrize("mode", ["json_escaped", "cut", "forms"])
def test_the_key_never_shows_in_errors(server, mode):
    server.mode = mode
    with pytest.raises(LLMRequestError) as e:
        _client(server).map([ChatRequest.user("hi")])
    msg = str(e.value)
    assert "HTTP 400" in msg and "***" in msg
    for piece in (KEY[:8], KEY[-8:], "ABCDEFGH", quote(KEY, safe="")[:12],
                  base64.b64encode(KEY.encode()).decode()[:12]):
        assert piece not in msg, (mode, msg)


def test_url_credentials_are_never_printed(server):
    server.mode = "json_escaped"
    base = f"http://alice:pa55w0rd-xyz@127.0.0.1:{server.port}/v1"
    with pytest.raises(LLMRequestError) as e:
        _client(server, base=base).map([ChatRequest.user("hi")])
    assert "pa55w0rd-xyz" not in str(e.value) and "alice" not in str(e.value)
    assert f"127.0.0.1:{server.port}" in str(e.value)


def test_a_key_echoed_in_an_answer_is_removed_before_caching(server, tmp_path):
    from memgas_gpu.llm import ResponseCache

    server.mode = "echo_answer"
    cache = ResponseCache(tmp_path / "c.sqlite")
    client = ChatClient(_client(server).config, cache=cache, progress=False)
    (text,) = client.map([ChatRequest.user("hi")])
    assert text == "your key is ***"
    cache.close()
    assert KEY.encode() not in (tmp_path / "c.sqlite").read_bytes()


def test_a_huge_response_is_refused_in_bounded_memory(server):
    server.mode = "huge"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(LLMRequestError, match="larger than max_response_bytes=1048576"):
        _client(server, max_response_bytes=1 << 20).map([ChatRequest.user("hi")])
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert grown < 32 << 20  # the 64 MiB body was never held
