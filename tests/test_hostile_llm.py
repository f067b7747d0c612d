"""A misbehaving chat server (issue 17, item 8): the key never shows in any encoding,
URL credentials are never printed, answers never carry the key, bodies are capped."""
from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import pytest

from memgas_gpu.bench.timing import PeakMemory
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
        self.calls = getattr(self, "calls", 0) + 1
        if mode == "custom":  # self.reply = (status, body, {header: value})
            status, body, headers = self.reply
            raw = body.encode()
            h.send_response(status)
            for k, v in {"Content-Type": "application/json",
                         "Content-Length": str(len(raw)), **headers}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(raw)
            return
        if mode == "retry_nan" and self.calls == 1:
            h.send_response(429)
            h.send_header("Retry-After", "nan")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
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
        elif mode == "hex":
            body = '{"error": "invalid key ' + KEY.encode().hex() + '"}'
        elif mode == "split":  # the key wrapped over two lines of the body
            body = "invalid key: " + KEY[:17] + "\n" + KEY[17:]
        elif mode in ("bearer_answer", "surrogate", "retry_nan"):
            status = 200
            content = {"surrogate": "caf\udfff and \ud800", "retry_nan": "ok",
                       "bearer_answer": "header: " + base64.b64encode(
                           f"Bearer {KEY}".encode()).decode()}[mode]
            body = json.dumps({"choices": [{"message": {"content": content}}]})
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


@pytest.mark.parametrize("mode", ["json_escaped", "cut", "forms", "hex", "split"])
def test_the_key_never_shows_in_errors(server, mode):
    server.mode = mode
    with pytest.raises(LLMRequestError) as e:
        _client(server).map([ChatRequest.user("hi")])
    msg = str(e.value)
    assert "HTTP 400" in msg and "***" in msg
    for piece in (KEY[:8], KEY[-8:], "ABCDEFGH", quote(KEY, safe="")[:12],
                  base64.b64encode(KEY.encode()).decode()[:12], KEY.encode().hex()[:16],
                  KEY.encode().hex()[-16:], KEY[10:17], KEY[17:25]):
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
    with PeakMemory() as peak, \
            pytest.raises(LLMRequestError, match="larger than max_response_bytes=1048576"):
        _client(server, max_response_bytes=1 << 20).map([ChatRequest.user("hi")])
    assert peak.host < 32 << 20  # the 64 MiB body was never held


# ---- round 3: items 14 and 25, Retry-After: nan ------------------------------------------
def _b64_pieces(text: bytes) -> list:
    """Every 12-character piece of ``text``'s base64 that encodes only key bytes."""
    enc = base64.b64encode(text).decode()
    lead = text.index(KEY.encode())
    first, last = -(-8 * lead // 6), 8 * (lead + len(KEY)) // 6
    return [enc[i:i + 12] for i in range(first, last - 12, 6)]


def test_a_base64_bearer_key_in_an_answer_is_removed_before_caching(server, tmp_path):
    from memgas_gpu.llm import ResponseCache

    server.mode = "bearer_answer"
    cache = ResponseCache(tmp_path / "c.sqlite")
    client = ChatClient(_client(server).config, cache=cache, progress=False)
    (text,) = client.map([ChatRequest.user("hi")])
    cache.close()
    stored = (tmp_path / "c.sqlite").read_bytes()
    assert "***" in text
    for piece in _b64_pieces(f"Bearer {KEY}".encode()):
        assert piece not in text and piece.encode() not in stored, (piece, text)


def test_a_lone_surrogate_answer_is_replaced_not_a_crash(server, tmp_path):
    """Item 14: '\\ud800' from the server failed with UnicodeEncodeError in the cache
    (and, without one, in the output files)."""
    from memgas_gpu.llm import ResponseCache

    server.mode = "surrogate"
    cache = ResponseCache(tmp_path / "c.sqlite")
    client = ChatClient(_client(server).config, cache=cache, progress=False)
    (text,) = client.map([ChatRequest.user("hi")])
    assert text == "caf\ufffd and \ufffd"
    assert cache.get(client.key(ChatRequest.user("hi"))).text == text
    cache.close()
    (text,) = _client(server).map([ChatRequest.user("hi")])  # no cache
    (tmp_path / "out.txt").write_text(text, encoding="utf-8")


def test_retry_after_nan_waits_the_backoff(server, caplog):
    """'Retry-After: nan' logged "retry in nan s" and did not wait."""
    import logging
    import time

    server.mode = "retry_nan"
    client = _client(server)
    client = ChatClient(LLMConfig(**{**client.config.__dict__, "max_retries": 2,
                                     "backoff": 0.2}), cache=None, progress=False)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="memgas_gpu.llm"):
        assert client.map([ChatRequest.user("hi")]) == ["ok"]
    waited = time.monotonic() - t0
    (line,) = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert "nan" not in line and "HTTP 429" in line, line
    delay = float(line.split(" in ")[-1].split()[0])
    assert 0.1 <= delay < 0.2 + 1e-9 and waited >= 0.1  # the backoff, with jitter


# ---- round 4: usage counts that are not counts, keys in escapes and entities ------------
def _answer(content: str, usage=None) -> str:
    body = {"choices": [{"message": {"content": content}}]}
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body)


@pytest.mark.parametrize("count,kept", [
    (10**30, 0), (2**63, 0), (2**53 + 1, 0), (-1, 0), (1.5, 0), ("12", 0), (True, 0),
    (None, 0), ([3], 0), (2**53, 2**53), (7.0, 7), (7, 7)])
def test_usage_counts_that_are_not_counts_are_unknown(server, tmp_path, count, kept):
    """10**30 completion tokens went into SQLite as an OverflowError (a traceback from
    `memgas expand`); the answer must still be cached and returned."""
    from memgas_gpu.llm import ResponseCache

    server.mode = "custom"
    server.reply = (200, _answer("fine", {"prompt_tokens": count,
                                          "completion_tokens": count}), {})
    cache = ResponseCache(tmp_path / "c.sqlite")
    client = ChatClient(_client(server).config, cache=cache, progress=False)
    assert client.map([ChatRequest.user("hi")]) == ["fine"]
    assert (client.stats.prompt_tokens, client.stats.completion_tokens) == (kept, kept)
    hit = cache.get(client.key(ChatRequest.user("hi")))
    assert (hit.text, hit.prompt_tokens, hit.completion_tokens) == ("fine", kept, kept)
    cache.close()


def test_the_cache_bounds_counts_it_is_given_and_reads(tmp_path):
    import sqlite3

    from memgas_gpu.llm import ResponseCache
    from memgas_gpu.llm.cache import CachedResponse

    path = tmp_path / "c.sqlite"
    with ResponseCache(path) as cache:
        cache.put("k1", "m", CachedResponse("one", 10**30, -2))   # from a library caller
        cache.put("k2", "m", CachedResponse("two", 5, 6))
        assert cache.get("k1") == CachedResponse("one", 0, 0)
    with sqlite3.connect(path) as db:  # another writer's row: text and a huge real
        db.execute("UPDATE responses SET prompt_tokens='lots', completion_tokens=1e300 "
                   "WHERE key='k2'")
    with ResponseCache(path) as cache:
        got = cache.get("k2")
    assert got == CachedResponse("two", 0, 0)
    assert type(got.prompt_tokens) is int and type(got.completion_tokens) is int


def _forms(key: str) -> dict:
    """The key as a server may write it: escapes, character references, invisible
    characters between its letters (built here, independently of the redaction)."""
    return {
        "json_u_first": "\\u%04x" % ord(key[0]) + key[1:],
        "json_u_all": "".join(f"\\u{ord(c):04x}" for c in key),
        "json_u_upper": "".join(f"\\u{ord(c):04X}" for c in key),
        "html_dec": "".join(f"&#{ord(c)};" for c in key),
        "html_hex": "".join(f"&#x{ord(c):x};" for c in key),
        "html_hex_upper_x": "".join(f"&#X{ord(c):X};" for c in key),
        "html_one": key.replace("/", "&#x2F;"),
        "html_named": key.replace("/", "&sol;").replace("+", "&plus;"),
        "html_nested": f"&amp;#{ord(key[0])};" + key[1:],
        "url_default_safe": quote(key),
        **{f"zw_{ord(z):04x}": z.join([key[:10], key[10:20], key[20:]])
           for z in "\u200b\u200c\u200d\u2060\ufeff"},
        "zw_every_letter": "\u200b".join(key),
        "zw_escaped": key[:10] + "\\u200b" + key[10:30] + "&#8203;" + key[30:],
        "mixed": "\\u%04x" % ord(key[0]) + key[1:5] + "&#x%x;\u200d" % ord(key[5])
                 + key[6:],
    }


@pytest.mark.parametrize("form", sorted(_forms(KEY)))
def test_redact_finds_the_key_in_escapes_entities_and_invisible_splits(form):
    from memgas_gpu.llm.config import redact

    text = f'{{"error": "invalid key <{_forms(KEY)[form]}> (check it)"}}'
    assert redact(text, KEY) == '{"error": "invalid key <***> (check it)"}'


def test_a_short_secret_is_redacted_only_as_a_whole_token():
    from memgas_gpu.llm.config import redact

    text = "key ab; abc (ab) xab ab-c a&#98; \\u0061b zab\u200b"
    assert redact(text, "ab") == "key ***; abc (***) xab ab-c *** *** zab\u200b"


@pytest.mark.parametrize("kw,env", [
    ({"api_key": "q7!"}, {}),
    ({"base_url": "http://alice:z9@127.0.0.1:1/v1"}, {}),
    ({"base_url": "http://alice:%7A%39@127.0.0.1:1/v1"}, {}),   # "z9", URL-escaped
    ({}, {"OPENAI_API_KEY": "q7!"}),
])
def test_a_key_or_password_too_short_to_redact_is_refused(monkeypatch, kw, env):
    from memgas_gpu.llm import LLMConfigError

    for v in ("MEMGAS_LLM_API_KEY", "OPENAI_API_KEY", "MEMGAS_LLM_BASE_URL"):
        monkeypatch.delenv(v, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(LLMConfigError, match="shorter than 4 characters") as e:
        LLMConfig.from_env(model="m", **kw)
    assert "q7!" not in str(e.value) and "z9" not in str(e.value)
    LLMConfig.from_env(model="m", base_url="http://al:long-enough@h/v1", api_key="abcd")


@pytest.mark.parametrize("form", ["json_u_all", "html_dec", "html_hex", "zw_200b",
                                  "zw_feff", "mixed"])
def test_an_escaped_key_never_shows_in_errors_or_answers(server, form):
    written = _forms(KEY)[form]
    server.mode = "custom"
    server.reply = (401, '{"error": "invalid key ' + written + ' (check it)"}', {})
    with pytest.raises(LLMRequestError) as e:
        _client(server).map([ChatRequest.user("hi")])
    assert "invalid key *** (check it)" in str(e.value), str(e.value)
    server.reply = (200, _answer(f"your key is {written} ok"), {})
    assert _client(server).map([ChatRequest.user("hi")]) == ["your key is *** ok"]


def test_a_key_echoed_in_a_response_header_never_reaches_the_debug_log(server, caplog):
    """httpcore logs every response's headers at DEBUG: a server echoing the
    Authorization header there put the key into the application's logs."""
    import logging

    server.mode = "custom"
    server.reply = (401, '{"error": "denied"}', {"X-Echo-Authorization": f"Bearer {KEY}"})
    with caplog.at_level(logging.DEBUG, logger="httpcore"), \
            caplog.at_level(logging.DEBUG, logger="httpx"), \
            pytest.raises(LLMRequestError, match="HTTP 401"):
        _client(server).map([ChatRequest.user("hi")])
    assert "X-Echo-Authorization" in caplog.text  # the header line was logged ...
    for piece in (KEY, KEY[:8], KEY[-8:], KEY[10:17]):
        assert piece not in caplog.text  # ... without the key


def test_decoding_works_in_bounded_windows_and_finds_a_key_across_their_edges():
    """A body full of character references is decoded window by window, in bounded
    memory (this 4 MiB at once takes ~33 MB; 16 MiB of invisible characters took 3 GB
    before), and a key written across a window's edge is still found whole."""
    from memgas_gpu.llm import config
    from memgas_gpu.llm.config import redact

    written = _forms(KEY)["html_dec"]  # ~200 characters
    filler = "&#65;"
    n = (4 << 20) // len(filler)
    edge = config._WINDOW - 100  # the key starts in one window and ends in the next
    pad = edge - (edge // len(filler)) * len(filler)
    head = filler * (edge // len(filler)) + "x" * pad
    text = written + " " + head[len(written) + 1:] + written + filler * n + written
    assert text.index(written, 1) < config._WINDOW < text.index(written, 1) + len(written)
    expected = text.replace(written, "***")
    with PeakMemory() as peak:
        out = redact(text, KEY)
    assert out == expected
    # bounded: tens of MB in a long test process (the text and its copies are 4 MB
    # each), where decoding it at once took GBs
    assert peak.host < 96 << 20, peak.host
