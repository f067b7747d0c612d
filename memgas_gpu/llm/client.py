"""An async client for OpenAI-compatible ``/v1/chat/completions`` endpoints.

:class:`ChatClient` sends many requests at once with at most ``concurrency`` in flight,
retries 429s, 5xx answers, timeouts and connection errors with exponential backoff and
jitter (honouring ``Retry-After``), stores every response in a :class:`ResponseCache`
as it arrives, and shows a progress bar with requests/s, tokens in/out and cache hits.
:meth:`ChatClient.map` is the synchronous entry point; :meth:`ChatClient.amap` the
async one.

A 4xx answer (other than 429), a malformed body or one larger than
``max_response_bytes`` stops the batch with an :class:`LLMRequestError` naming the
request, the status and a snippet of the body.  The key (in any encoding a server may
echo it in) and the base URL's credentials are removed from every message (also from the
HTTP library's log lines; the credentials go as basic auth, never in the URL), and the
key from response texts before they are cached or returned.
Responses received before the error stay cached, so a rerun resumes.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union
from urllib.parse import urlsplit

from .._io import replace_surrogates
from ..progress import Progress
from .cache import CachedResponse, ResponseCache, request_key, usage_count
from .config import (MIN_SECRET_CHARS, LLMConfig, LLMError, public_url, redact_all,
                     url_auth, url_secrets)

__all__ = ["ChatClient", "ChatRequest", "ClientStats", "LLMRequestError", "run_sync"]

log = logging.getLogger("memgas_gpu.llm")
_SNIPPET = 300  # characters of a bad body quoted in errors
_RETRY_AFTER_MAX = 600.0


class LLMRequestError(LLMError):
    """A request failed for good: a 4xx, a malformed body, or retries exhausted."""


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion to make.

    Attributes:
        messages: ``[{"role": "user", "content": ...}, ...]``.
        label: a short name used in errors and logs (e.g. ``"summary of session 's3'"``).
        max_tokens: overrides the config's limit for this request.
    """

    messages: tuple
    label: str = "request"
    max_tokens: Optional[int] = None

    @classmethod
    def user(cls, prompt: str, label: str = "request",
             max_tokens: Optional[int] = None) -> "ChatRequest":
        """A request with one user message."""
        return cls(({"role": "user", "content": prompt},), label, max_tokens)


@dataclass
class ClientStats:
    """Counters of one client (cumulative over calls)."""

    requests: int = 0        # HTTP attempts that got an answer or failed
    responses: int = 0       # successful responses
    cache_hits: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = field(default=0.0)


def run_sync(coro):
    """Run a coroutine to completion from synchronous code (also inside a running loop,
    e.g. Jupyter, by using a worker thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def _httpx():
    try:
        import httpx
    except ImportError:
        raise ImportError("the LLM client needs httpx: pip install httpx") from None
    return httpx


def _retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds from a ``Retry-After`` header (delta seconds or an HTTP date)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:  # "nan" parses as a float and compares false with everything: ignored
        return None if math.isnan(seconds) else min(max(seconds, 0.0), _RETRY_AFTER_MAX)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return min(max(when - time.time(), 0.0), _RETRY_AFTER_MAX)


class _RedactLogs(logging.Filter):
    """Removes a client's secrets from the HTTP stack's log records: httpx logs every
    request's URL at INFO, httpcore the response headers at DEBUG (a server may echo the
    key there)."""

    def __init__(self, redact_fn) -> None:
        super().__init__()
        self._redact = redact_fn

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record is the logging module's to report
            return True
        clean = self._redact(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return True


# httpcore creates its loggers when it first opens a connection: named ahead (a filter
# set on a logger does not reach its children)
_HTTP_LOGGERS = ("httpx", "httpcore", "httpcore.connection", "httpcore.http11",
                 "httpcore.http2", "httpcore.proxy", "httpcore.socks")


def _http_loggers() -> list:
    """The loggers of the HTTP stack: the known ones and any other already created."""
    roots = ("httpx", "httpcore", "h11", "h2", "hpack")
    names = set(_HTTP_LOGGERS) | {n for n, lg in logging.root.manager.loggerDict.items()
                                  if n.split(".")[0] in roots
                                  and isinstance(lg, logging.Logger)}
    return [logging.getLogger(n) for n in sorted(names)]


class _TooLarge(Exception):
    def __init__(self, status: int, size: int) -> None:
        super().__init__(status, size)
        self.status, self.size = status, size


def _text(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")


def _decode(body: bytes, encoding: str, cap: int) -> bytes:
    """Decompress a gzip/deflate body, at most ``cap`` bytes of output."""
    import zlib

    if encoding not in ("gzip", "deflate", "x-gzip"):
        return body
    d = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header
    out = d.decompress(body, cap + 1)
    if len(out) > cap:
        raise _TooLarge(200, len(out))
    return out


class ChatClient:
    """Bounded-concurrency, retrying, caching chat-completions client.

    Args:
        config: the endpoint (see :class:`~memgas_gpu.llm.config.LLMConfig`).
        cache: a :class:`ResponseCache`, a path to one, or None for no cache.
        progress: report progress on stderr (a bar on a terminal, plain lines in a log:
            :mod:`memgas_gpu.progress`; ``--quiet`` silences it); False: none.

    Example:
        >>> client = ChatClient(LLMConfig.from_env(model="gpt-4o-mini"), cache="llm.sqlite")
        >>> texts = client.map([ChatRequest.user("Say hi")])  # doctest: +SKIP
    """

    def __init__(self, config: LLMConfig, cache: Union[ResponseCache, str, None] = None,
                 progress: bool = True) -> None:
        self.config = config
        self.cache = ResponseCache(cache) if isinstance(cache, (str, bytes)) or \
            hasattr(cache, "__fspath__") else cache
        self.progress = progress
        self.stats = ClientStats()

    def __repr__(self) -> str:
        return f"ChatClient({self.config!r}, cache={getattr(self.cache, 'path', None)})"

    def close(self) -> None:
        """Close the response cache (its content is already committed)."""
        if self.cache is not None:
            self.cache.close()

    # --- keys -----------------------------------------------------------------------
    def _params(self, req: ChatRequest) -> dict:
        p = self.config.params()
        if req.max_tokens is not None:
            p["max_tokens"] = req.max_tokens
        return p

    def key(self, req: ChatRequest) -> str:
        """The cache key of ``req`` under this client's model and parameters."""
        return request_key(self.config.model, req.messages, self._params(req))

    # --- public API -----------------------------------------------------------------
    def map(self, requests: Sequence[ChatRequest], desc: str = "llm") -> list[str]:
        """Synchronous :meth:`amap`."""
        return run_sync(self.amap(requests, desc))

    def complete(self, prompt: str, label: str = "request") -> str:
        """One user prompt → the response text (synchronous)."""
        return self.map([ChatRequest.user(prompt, label)], desc=label)[0]

    async def amap(self, requests: Sequence[ChatRequest], desc: str = "llm") -> list[str]:
        """Response texts for ``requests``, in order.

        Cached requests are answered from the cache; identical requests are sent once.
        On the first failure the remaining requests are cancelled and the error is
        raised (what was already answered stays cached).

        Raises:
            LLMRequestError: a request failed for good.
        """
        httpx = _httpx()
        results: list[Optional[str]] = [None] * len(requests)
        todo: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            k = self.key(req)
            if k in todo:
                todo[k].append(i)
                continue
            hit = self.cache.get(k) if self.cache is not None else None
            if hit is not None:
                results[i] = hit.text
                self.stats.cache_hits += 1
            else:
                todo[k] = [i]
        bar = Progress(len(requests), desc, unit="request", leave=False,
                       enabled=None if self.progress and requests else False,
                       initial=len(requests) - sum(map(len, todo.values())))
        self._bar_postfix(bar)
        if not todo:
            bar.close()
            return results  # type: ignore[return-value]
        sem = asyncio.Semaphore(self.config.concurrency)
        limits = httpx.Limits(max_connections=self.config.concurrency,
                              max_keepalive_connections=self.config.concurrency)
        t0 = time.perf_counter()
        # plain-http endpoints (local vLLM / llama.cpp) need no TLS context: skip loading
        # one; proxy variables (HTTPS_PROXY, NO_PROXY) apply except to this machine
        verify = self.config.endpoint.startswith("https://")
        local = urlsplit(self.config.endpoint).hostname in ("127.0.0.1", "localhost", "::1")
        # credentials in the URL go as basic auth, never in the URL httpx logs; the HTTP
        # stack's own log lines are redacted while this runs
        log_filter, loggers = _RedactLogs(self._redact), _http_loggers()
        for lg in loggers:
            lg.addFilter(log_filter)
        try:
            async with httpx.AsyncClient(limits=limits, timeout=None, trust_env=not local,
                                         verify=verify, auth=url_auth(self.config.endpoint)
                                         ) as http:
                tasks = [asyncio.ensure_future(self._one(http, sem, k, requests[idx[0]]))
                         for k, idx in todo.items()]
                try:
                    for fut in asyncio.as_completed(tasks):
                        k, text = await fut
                        for i in todo[k]:
                            results[i] = text
                        bar.update(len(todo[k]))
                        self._bar_postfix(bar)
                except BaseException:
                    for t in tasks:
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    raise
                finally:
                    self.stats.seconds += time.perf_counter() - t0
                    bar.close()
        finally:
            for lg in loggers:
                lg.removeFilter(log_filter)
        return results  # type: ignore[return-value]

    def _bar_postfix(self, bar) -> None:
        s = self.stats
        bar.set_postfix(f"hits={s.cache_hits} tok_in={s.prompt_tokens} "
                        f"tok_out={s.completion_tokens} retries={s.retries}")

    # --- one request ----------------------------------------------------------------
    async def _one(self, http, sem: asyncio.Semaphore, key: str,
                   req: ChatRequest) -> tuple[str, str]:
        async with sem:
            resp = await self._post(http, req)
        if self.cache is not None:
            self.cache.put(key, self.config.model, resp)
        self.stats.responses += 1
        self.stats.prompt_tokens += resp.prompt_tokens
        self.stats.completion_tokens += resp.completion_tokens
        return key, resp.text

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"}
        if self.config.api_key:
            h["Authorization"] = f"Bearer {self.config.api_key}"
        return h

    def _redact(self, text: str) -> str:
        # the config refuses a shorter key or password; a short user name is no secret
        secrets = [self.config.api_key, *url_secrets(self.config.base_url)]
        return redact_all(text, [s for s in secrets if s and len(s) >= MIN_SECRET_CHARS])

    def _error(self, req: ChatRequest, what: str) -> LLMRequestError:
        return LLMRequestError(self._redact(f"LLM request {req.label!r} to "
                                            f"{public_url(self.config.endpoint)}: {what}"))

    def _snippet(self, body: str) -> str:
        body = self._redact(" ".join(body.split()))  # before the cut: no partial key
        return repr(body[:_SNIPPET] + ("..." if len(body) > _SNIPPET else ""))

    async def _send(self, http, payload: dict):
        """POST ``payload``; (status, headers, body bytes), the body read up to the cap."""
        cap = self.config.max_response_bytes
        async with http.stream("POST", public_url(self.config.endpoint), json=payload,
                               headers=self._headers()) as r:
            size = r.headers.get("content-length", "")
            if size.isdigit() and int(size) > cap:
                raise _TooLarge(r.status_code, int(size))
            body = bytearray()
            async for chunk in r.aiter_raw():
                body += chunk
                if len(body) > cap:
                    raise _TooLarge(r.status_code, len(body))
            if r.headers.get("content-encoding", "identity") not in ("identity", ""):
                body = bytearray(_decode(bytes(body), r.headers["content-encoding"], cap))
            return r.status_code, r.headers, bytes(body)

    async def _post(self, http, req: ChatRequest) -> CachedResponse:
        httpx = _httpx()
        cfg = self.config
        payload = {"model": cfg.model, "messages": list(req.messages), **self._params(req)}
        attempt = 0
        while True:
            retry_after = None
            try:
                status, headers, body = await asyncio.wait_for(self._send(http, payload),
                                                               timeout=cfg.timeout)
            except (asyncio.TimeoutError, httpx.TimeoutException):
                reason = f"no answer within {cfg.timeout:g} s"
            except httpx.TransportError as e:
                reason = f"connection error ({type(e).__name__}: {e})"
            except _TooLarge as e:
                self.stats.requests += 1
                raise self._error(req, f"HTTP {e.status}: the response body is larger than "
                                       f"max_response_bytes={cfg.max_response_bytes} "
                                       f"({e.size}+ bytes)") from None
            else:
                self.stats.requests += 1
                if status == 429 or status >= 500:
                    reason = f"HTTP {status}"
                    retry_after = _retry_after(headers.get("retry-after"))
                elif status >= 400:
                    raise self._error(req, f"HTTP {status}: {self._snippet(_text(body))}")
                else:
                    return self._parse(req, status, body)
            attempt += 1
            if attempt > cfg.max_retries:
                raise self._error(req, f"{reason}; gave up after {attempt} attempts")
            delay = min(cfg.backoff * 2 ** (attempt - 1), cfg.backoff_max)
            delay *= 0.5 + random.random() / 2  # jitter: [delay/2, delay)
            if retry_after is not None:
                delay = max(delay, retry_after) if retry_after <= cfg.backoff_max \
                    else retry_after
            self.stats.retries += 1
            log.warning(self._redact(f"LLM request {req.label!r}: {reason}; retry "
                                     f"{attempt}/{cfg.max_retries} in {delay:.2f} s"))
            await asyncio.sleep(delay)

    def _parse(self, req: ChatRequest, status: int, body: bytes) -> CachedResponse:
        import json

        text = _text(body)
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise self._error(req, f"HTTP {status} but the body is not JSON: "
                                   f"{self._snippet(text)}") from None
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise self._error(req, "the response has no choices[0].message.content: "
                                   f"{self._snippet(text)}") from None
        if not isinstance(content, str):
            raise self._error(req, f"choices[0].message.content is {type(content).__name__}"
                                   f", not text: {self._snippet(text)}")
        usage = data.get("usage") if isinstance(data, dict) else None
        usage = usage if isinstance(usage, dict) else {}

        # a server that echoes the key into the answer must not get it into the cache
        # or the output files; a lone surrogate ("\ud800") could not be written there
        return CachedResponse(self._redact(replace_surrogates(content.strip())),
                              # a count that is not one (huge, negative, fractional): 0
                              usage_count(usage.get("prompt_tokens")),
                              usage_count(usage.get("completion_tokens")))
