"""Endpoint settings for OpenAI-compatible chat servers (OpenAI, vLLM, llama.cpp).

Every setting comes from an argument or, when that is None, from the environment:

================  ==========================================================
model             ``MEMGAS_LLM_MODEL`` (required)
base_url          ``MEMGAS_LLM_BASE_URL``, ``OPENAI_BASE_URL``, else OpenAI's
api_key           ``MEMGAS_LLM_API_KEY``, ``OPENAI_API_KEY`` (optional for local servers)
================  ==========================================================

The key is kept out of ``repr``, :meth:`LLMConfig.describe` and every message, and so
are the base URL's credentials.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field, fields
from typing import Optional
from urllib.parse import urlsplit, urlunsplit

from ..errors import MemgasError

__all__ = ["DEFAULT_BASE_URL", "LLMConfig", "LLMError", "LLMConfigError", "redact",
           "secret_forms", "public_url", "url_secrets", "url_auth", "MAX_RESPONSE_BYTES"]

#: default cap on one response body (a chat completion is a few kB)
MAX_RESPONSE_BYTES = 16 << 20

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class LLMError(MemgasError):
    """Base class of the LLM stages' errors."""


class LLMConfigError(LLMError):
    """A missing or invalid endpoint setting."""


def _strip_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _base64_cores(raw: bytes) -> set[str]:
    """The characters that encode ``raw`` inside any longer base64 text (``Bearer KEY``,
    ``user:KEY``): one string per alignment of ``raw`` in the 3-byte groups, standard
    and URL-safe alphabets."""
    import base64

    cores = set()
    for lead in range(3):
        enc = base64.b64encode(bytes(lead) + raw + bytes(2)).decode()
        core = enc[-(-8 * lead // 6):8 * (lead + len(raw)) // 6]  # only raw's bits
        cores |= {core, core.replace("+", "-").replace("/", "_")}
    return cores


def secret_forms(secret: Optional[str]) -> list[str]:
    """``secret`` as a server may echo it: raw, JSON-escaped (``\\/`` too),
    URL-quoted, HTML-escaped, hex (either case) and base64 (alone or inside a longer
    encoded text such as ``Bearer KEY``, either alphabet); longest first."""
    import base64
    import html
    import json
    from urllib.parse import quote, quote_plus

    if not secret or len(secret) < 4:
        return []
    raw = secret.encode()
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret)[1:-1].replace("/", "\\/"),
             json.dumps(secret, ensure_ascii=False)[1:-1], quote(secret, safe=""),
             quote_plus(secret), html.escape(secret), repr(secret)[1:-1],
             base64.b64encode(raw).decode().rstrip("="), raw.hex(), raw.hex().upper(),
             *_base64_cores(raw)}
    return sorted(forms, key=len, reverse=True)


@functools.lru_cache(maxsize=8)
def _secret_pattern(secret: str) -> Optional["re.Pattern"]:
    """Every form of ``secret``, each allowed to be split by whitespace or an escaped
    line break (a key wrapped over two lines of a body)."""
    forms = secret_forms(secret)
    if not forms:
        return None
    gap = r"(?:\s|\\[nrt])*"
    return re.compile("|".join(gap.join(map(re.escape, f)) for f in forms))


def redact(text: str, secret: Optional[str]) -> str:
    """``text`` with every occurrence of ``secret``, in any of its
    :func:`secret_forms` and even split by whitespace, replaced by ``***``."""
    pattern = _secret_pattern(secret) if secret else None
    return pattern.sub("***", text) if pattern is not None else text


def url_secrets(url: str) -> list[str]:
    """The password and user name of ``url`` (``https://user:pass@host``), if any, as
    written and URL-decoded."""
    from urllib.parse import unquote

    parts = urlsplit(url)
    out = []
    for x in (parts.password, parts.username):
        for form in (x, unquote(x) if x else x):
            if form and form not in out:
                out.append(form)
    return out


def url_auth(url: str) -> Optional[tuple[str, str]]:
    """The (user, password) of ``url``'s credentials, URL-decoded, for HTTP basic auth;
    None without any."""
    from urllib.parse import unquote

    parts = urlsplit(url)
    if not (parts.username or parts.password):
        return None
    return unquote(parts.username or ""), unquote(parts.password or "")


def public_url(url: str) -> str:
    """``url`` without its credentials (safe to print)."""
    return _strip_userinfo(url)


@dataclass(frozen=True)
class LLMConfig:
    """One endpoint and how to talk to it.

    Attributes:
        model: model name sent with every request.
        base_url: server root; ``http://host:8000``, ``http://host:8000/v1`` and the full
            ``.../chat/completions`` URL all work.
        api_key: bearer token (never shown; optional for local servers).
        temperature: sampling temperature (default 0, as in the paper).
        max_tokens: completion length limit per request (default 500, the reference's).
        concurrency: requests in flight at most (default 8).
        timeout: seconds per attempt, connection to last byte (default 120).
        max_retries: further attempts after a 429, a 5xx, a timeout or a connection error
            (default 6).
        backoff: first retry delay in seconds; doubles per attempt, with jitter
            (default 1.0). A ``Retry-After`` header overrides it.
        backoff_max: longest delay between attempts (default 60).
        seed: optional ``seed`` parameter (sent only when set).
        max_response_bytes: a larger response body stops the request with an error
            (default 16 MiB), so a misbehaving server cannot exhaust memory.
    """

    model: str
    base_url: str = DEFAULT_BASE_URL
    api_key: Optional[str] = field(default=None, repr=False, compare=False)
    temperature: float = 0.0
    max_tokens: int = 500
    concurrency: int = 8
    timeout: float = 120.0
    max_retries: int = 6
    backoff: float = 1.0
    backoff_max: float = 60.0
    seed: Optional[int] = None
    max_response_bytes: int = MAX_RESPONSE_BYTES

    def __post_init__(self) -> None:
        if not self.model:
            raise LLMConfigError("no LLM model: pass a model name (--llm-model) or set "
                                 "MEMGAS_LLM_MODEL")
        if urlsplit(self.base_url).scheme not in ("http", "https"):
            raise LLMConfigError(f"LLM base URL must start with http:// or https://, got "
                                 f"{_strip_userinfo(self.base_url)!r}")
        if self.concurrency < 1:
            raise LLMConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        import math

        if not (isinstance(self.timeout, (int, float)) and math.isfinite(self.timeout)) or \
                self.timeout <= 0 or self.max_retries < 0 or self.max_tokens < 1:
            raise LLMConfigError("timeout must be a finite number > 0, max_retries >= 0 and "
                                 "max_tokens >= 1")
        if self.max_response_bytes < 1:
            raise LLMConfigError(f"max_response_bytes must be >= 1, got "
                                 f"{self.max_response_bytes}")

    def __repr__(self) -> str:
        # the generated repr would show the base URL's credentials
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        shown["base_url"] = _strip_userinfo(self.base_url)
        return f"LLMConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @classmethod
    def from_env(cls, model: Optional[str] = None, base_url: Optional[str] = None,
                 api_key: Optional[str] = None, **kwargs) -> "LLMConfig":
        """Settings from the arguments, falling back to the environment (see module doc).

        Args:
            model: model name, else ``MEMGAS_LLM_MODEL``.
            base_url: server URL, else ``MEMGAS_LLM_BASE_URL`` / ``OPENAI_BASE_URL`` /
                OpenAI's.
            api_key: key, else ``MEMGAS_LLM_API_KEY`` / ``OPENAI_API_KEY``.
            **kwargs: the other :class:`LLMConfig` fields (None values are ignored).

        Raises:
            LLMConfigError: no model, or an invalid setting.
        """
        env = os.environ
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return cls(
            model=model or env.get("MEMGAS_LLM_MODEL", ""),
            base_url=(base_url or env.get("MEMGAS_LLM_BASE_URL") or env.get("OPENAI_BASE_URL")
                      or DEFAULT_BASE_URL),
            api_key=api_key or env.get("MEMGAS_LLM_API_KEY") or env.get("OPENAI_API_KEY")
            or None,
            **kwargs)

    @property
    def endpoint(self) -> str:
        """The full ``/chat/completions`` URL."""
        url = self.base_url.rstrip("/")
        if url.endswith("/chat/completions"):
            return url
        if url.endswith("/v1"):
            return url + "/chat/completions"
        return url + "/v1/chat/completions"

    def params(self) -> dict:
        """Sampling parameters sent with every request (and part of the cache key)."""
        p = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.seed is not None:
            p["seed"] = self.seed
        return p

    def describe(self) -> dict:
        """What produced a result, for manifests and logs: never the key."""
        return {"model": self.model, "base_url": _strip_userinfo(self.base_url),
                **self.params()}
