"""A fake OpenAI-compatible chat-completions server for tests (127.0.0.1, ephemeral port).

Answers are deterministic and rule-based on the last message:

* summary prompt → ``"Summary: <first line of the dialogue>"``
* keyword prompt → the dialogue's distinct capitalised words joined by ``"; "``
* filter prompt → the history lines sharing a word (4+ letters) with the question
* answer prompt → ``"answer-<8 hex of sha256(prompt)>"``
* judge prompt → ``"yes"``, or ``"no"`` when the model response contains ``WRONG``
* GAM relation prompt → ``{"relation": "coreference", "confidence": 0.9}`` when the two
  topics share a capitalised word, else ``{"relation": "unrelated", "confidence": 0.8}``
* anything else → ``"echo-<8 hex>"``

Faults are queued with :meth:`FakeOpenAI.inject` and consumed by the next requests in
arrival order: ``"429"`` (with ``Retry-After``), ``"500"``, ``"slow"`` (sleeps, then
answers normally), ``"drop"`` (closes the connection without answering),
``"malformed"`` (200 with a truncated JSON body), ``"no_choices"`` (200 without
``choices``), ``"400"`` and ``"401_echo"`` (a 401 whose body echoes the
``Authorization`` header, to test redaction).

``hold_after=N`` lets N requests through; every later one waits until :meth:`release`
and is then dropped unanswered (to kill a client mid-run). Counters: ``requests`` (received),
``completed`` (answered 200 with a valid body), ``max_in_flight``, ``prompts``.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

__all__ = ["FakeOpenAI", "rule_answer"]


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _dialogue(prompt: str) -> str:
    body = prompt.split("\n\n", 1)[-1]
    return body.rsplit("\n\nYour answer:", 1)[0].strip()


def rule_answer(prompt: str) -> str:
    """The deterministic answer to one prompt (see the module doc)."""
    if "Please summarize the following dialogue" in prompt:
        return "Summary: " + _dialogue(prompt).splitlines()[0][:80]
    if "extract the most relevant keywords" in prompt:
        words = re.findall(r"\b[A-Z][a-z]{2,}\b", _dialogue(prompt))
        return "; ".join(dict.fromkeys(words)) or "none"
    if "Filter the History Dialogs" in prompt:
        question = prompt.rsplit("Question:", 1)[1].split("\n")[0]
        qwords = {w.lower() for w in re.findall(r"[A-Za-z]{4,}", question)}
        history = prompt.split("History Dialogs:", 1)[1].rsplit("Question Date:", 1)[0]
        keep = [ln for ln in history.splitlines()
                if qwords & {w.lower() for w in re.findall(r"[A-Za-z]{4,}", ln)}]
        return "\n".join(keep) or "(nothing relevant)"
    if "generate one concise, coherent and helpful response" in prompt:
        return "answer-" + _h(prompt)
    if "Classify the relation of topic B to topic A" in prompt:
        a, b = prompt.split("Topic A:\n", 1)[1].split("\n\nTopic B:\n", 1)
        names = lambda t: set(re.findall(r"\b[A-Z][a-z]{2,}\b", t))  # noqa: E731
        shared = names(a) & names(b)
        return json.dumps({"relation": "coreference" if shared else "unrelated",
                           "confidence": 0.9 if shared else 0.8})
    if "yes or no only" in prompt:
        response = prompt.rsplit("Model response:", 1)[-1]
        return "no" if "WRONG" in response else "yes"
    return "echo-" + _h(prompt)


class FakeOpenAI:
    """The server; use as a context manager (``with FakeOpenAI() as srv: srv.base_url``).

    Args:
        delay: seconds every request waits before answering (to observe concurrency).
        hold_after: answer this many requests, then hold the rest until :meth:`release`.
    """

    def __init__(self, delay: float = 0.0, hold_after: Optional[int] = None) -> None:
        self.delay = delay
        self.hold_after = hold_after
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._faults: list[tuple[str, dict]] = []
        self.requests = 0
        self._admitted = 0
        self.completed = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.prompts: list[str] = []
        self.payloads: list[dict] = []
        self.auth: list[Optional[str]] = []
        self._httpd: Optional[ThreadingHTTPServer] = None

    # --- control ----------------------------------------------------------------------
    def inject(self, kind: str, count: int = 1, **kw) -> None:
        """Queue ``count`` faults of ``kind`` for the next requests (see module doc)."""
        with self._lock:
            self._faults += [(kind, kw)] * count

    def release(self) -> None:
        """Let held requests go (and stop holding)."""
        self.hold_after = None
        self._released.set()

    def reset_counts(self) -> None:
        with self._lock:
            self.requests = self.completed = self.max_in_flight = 0
            self.prompts.clear()
            self.payloads.clear()
            self.auth.clear()

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> "FakeOpenAI":
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):  # noqa: N802
                srv._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                         daemon=True).start()
        return self

    def stop(self) -> None:
        self._released.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "FakeOpenAI":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- one request --------------------------------------------------------------------
    def _send(self, h, status: int, body: str, headers: Optional[dict] = None) -> None:
        data = body.encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def _handle(self, h) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length)
        if not h.path.endswith("/chat/completions"):
            self._send(h, 404, json.dumps({"error": {"message": f"no route {h.path}"}}))
            return
        with self._lock:
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            fault = self._faults.pop(0) if self._faults else None
            hold = self.hold_after is not None and self._admitted >= self.hold_after
            self._admitted += not hold
        try:
            if hold:  # wait for release(), then hang up without answering
                self._released.wait(timeout=60)
                h.close_connection = True
                return
            if self.delay:
                time.sleep(self.delay)
            self._respond(h, raw, fault)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with self._lock:
                self.in_flight -= 1

    def _respond(self, h, raw: bytes, fault) -> None:
        kind, kw = fault if fault else (None, {})
        auth = h.headers.get("Authorization")
        if kind == "429":
            self._send(h, 429, json.dumps({"error": {"message": "rate limited"}}),
                       {"Retry-After": str(kw.get("retry_after", 0))})
            return
        if kind == "500":
            self._send(h, 500, "internal server error")
            return
        if kind == "400":
            self._send(h, 400, json.dumps({"error": {"message": "context length exceeded "
                                                     "for this model"}}))
            return
        if kind == "401_echo":
            self._send(h, 401, json.dumps({"error": {"message": f"invalid key {auth}"}}))
            return
        if kind == "drop":
            h.close_connection = True
            h.connection.shutdown(2)
            return
        if kind == "slow":
            time.sleep(kw.get("seconds", 2.0))
        payload = json.loads(raw)
        prompt = payload["messages"][-1]["content"]
        if kind == "malformed":
            self._send(h, 200, '{"id": "x", "choices": [{"message": {"content": "trunc')
            return
        if kind == "no_choices":
            self._send(h, 200, json.dumps({"id": "x", "object": "chat.completion"}))
            return
        text = rule_answer(prompt)
        body = json.dumps({
            "id": "chatcmpl-" + _h(prompt), "object": "chat.completion",
            "model": payload.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": len(prompt.split()),
                      "completion_tokens": len(text.split()),
                      "total_tokens": len(prompt.split()) + len(text.split())}})
        with self._lock:
            self.prompts.append(prompt)
            self.payloads.append(payload)
            self.auth.append(auth)
        self._send(h, 200, body)
        with self._lock:
            self.completed += 1
