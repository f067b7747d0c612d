"""Endpoint settings for OpenAI-compatible chat servers (OpenAI, vLLM, llama.cpp).

Every setting comes from an argument or, when that is None, from the environment:

================  ==========================================================
model             ``MEMGAS_LLM_MODEL`` (required)
base_url          ``MEMGAS_LLM_BASE_URL``, ``OPENAI_BASE_URL``, else OpenAI's
api_key           ``MEMGAS_LLM_API_KEY``, ``OPENAI_API_KEY`` (optional for local servers)
================  ==========================================================

The key is kept out of ``repr``, :meth:`LLMConfig.describe` and every message, and so
are the base URL's credentials; a key or URL password shorter than
:data:`MIN_SECRET_CHARS` characters is refused (it could not be redacted without
mangling ordinary text).
"""
from __future__ import annotations

import functools
import html.entities
import os
import re
from dataclasses import dataclass, field, fields
from typing import Optional
from urllib.parse import urlsplit, urlunsplit

from ..errors import MemgasError

__all__ = ["DEFAULT_BASE_URL", "LLMConfig", "LLMError", "LLMConfigError", "redact", "redact_all",
           "secret_forms", "public_url", "url_secrets", "url_auth", "MAX_RESPONSE_BYTES",
           "MIN_SECRET_CHARS"]

#: default cap on one response body (a chat completion is a few kB)
MAX_RESPONSE_BYTES = 16 << 20

#: the shortest secret redacted in every encoding (a shorter one: only as a whole token)
MIN_SECRET_CHARS = 4

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

    if not secret or len(secret) < MIN_SECRET_CHARS:
        return []
    raw = secret.encode()
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret)[1:-1].replace("/", "\\/"),
             json.dumps(secret, ensure_ascii=False)[1:-1], quote(secret, safe=""),
             quote_plus(secret), html.escape(secret), repr(secret)[1:-1],
             base64.b64encode(raw).decode().rstrip("="), raw.hex(), raw.hex().upper(),
             *_base64_cores(raw)}
    return sorted(forms, key=len, reverse=True)


#: invisible format characters that may split a key without showing (zero-width space,
#: joiners, word joiner, BOM, soft hyphen, direction marks)
_INVISIBLE = ("\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f"
              "\ufeff")
_HEX = "[0-9A-Fa-f]"
_ESCAPE = re.compile(
    rf"\\u([Dd][89ABab]{_HEX}{{2}})\\u([Dd][C-Fc-f]{_HEX}{{2}})"   # 1, 2: JSON surrogates
    rf"|\\u({_HEX}{{4}})|\\u\{{({_HEX}{{1,6}})\}}|\\x({_HEX}{{2}})"  # 3, 4, 5
    r"|\\([\\/\"'bfnrt])"                                           # 6: one-letter escapes
    r"|&#([0-9]{1,8});?|&#[xX]([0-9A-Fa-f]{1,6});?"                 # 7, 8: &#115; &#x73;
    r"|&([A-Za-z][A-Za-z0-9]{1,31};)"                               # 9: &sol; &amp;
    rf"|((?:%[89A-Fa-f]{_HEX})+)|%([0-7]{_HEX})"                    # 10, 11: URL escapes
    rf"|([{_INVISIBLE}]+)")                                         # 12: invisible
_INVISIBLE_RE = re.compile(f"[{_INVISIBLE}]")
_ONE_LETTER = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_DECODE_LEVELS = 4  # an escape inside an entity inside ...: decoded this many times


def _unescape(m: "re.Match") -> Optional[str]:
    """The text one :data:`_ESCAPE` match stands for (invisible characters dropped), or
    None when it is not a valid escape (kept as it is)."""
    g = m.groups()
    if g[0]:
        hi, lo = int(g[0], 16), int(g[1], 16)
        value = chr(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
    elif g[2] or g[3] or g[4] or g[7]:
        code = int(g[2] or g[3] or g[4] or g[7], 16)
        value = chr(code) if code <= 0x10FFFF else None
    elif g[5]:
        value = _ONE_LETTER.get(g[5], g[5])
    elif g[6]:
        code = int(g[6])
        value = chr(code) if code <= 0x10FFFF else None
    elif g[8]:
        value = html.entities.html5.get(g[8])
    elif g[9]:
        value = bytes.fromhex(g[9].replace("%", "")).decode("utf-8", errors="replace")
    elif g[10]:
        value = chr(int(g[10], 16))
    else:
        value = ""
    return None if value is None else _INVISIBLE_RE.sub("", value)


def _decode_once(text: str) -> tuple[str, tuple]:
    """``text`` with its escapes, entities and URL escapes decoded and invisible characters
    removed, and where each decoded token came from: four arrays (decoded start and end,
    original start and end), empty when nothing was decoded. Text between tokens maps
    character by character; any character of a token stands for its whole original span."""
    from array import array

    d_lo, d_hi, o_lo, o_hi = (array("q") for _ in range(4))
    shift = 0  # decoded position - original position, after the tokens so far

    def one(m: "re.Match") -> str:
        nonlocal shift
        value = _unescape(m)
        if value is None:
            return m.group(0)
        start, end = m.span()
        d_lo.append(start + shift)
        d_hi.append(start + shift + len(value))
        o_lo.append(start)
        o_hi.append(end)
        shift += len(value) - (end - start)
        return value

    decoded = _ESCAPE.sub(one, text)
    return decoded, (d_lo, d_hi, o_lo, o_hi) if d_lo else ()


def _map_back(tokens: tuple, a: int, b: int) -> tuple[int, int]:
    """The original span of the decoded span ``[a, b)`` (b > a)."""
    import bisect

    d_lo, d_hi, o_lo, o_hi = tokens

    def where(p: int) -> tuple[int, int]:
        i = bisect.bisect_right(d_lo, p) - 1
        if i < 0:
            return p, p + 1
        if p < d_hi[i]:
            return o_lo[i], o_hi[i]
        o = o_hi[i] + (p - d_hi[i])
        return o, o + 1

    return where(a)[0], where(b - 1)[1]


@functools.lru_cache(maxsize=8)
def _secret_pattern(secret: str) -> Optional["re.Pattern"]:
    """Every form of ``secret``, each allowed to be split by whitespace or an escaped
    line break (a key wrapped over two lines of a body); a secret shorter than
    :data:`MIN_SECRET_CHARS`: only itself, as a whole token."""
    if len(secret) < MIN_SECRET_CHARS:
        return re.compile(r"(?<![\w-])" + re.escape(secret) + r"(?![\w-])")
    forms = secret_forms(secret)
    gap = r"(?:\s|\\[nrt])*"
    return re.compile("|".join(gap.join(map(re.escape, f)) for f in forms))


# decoded in windows of this many characters, each with this much context either side,
# so that a 16 MiB body full of escapes needs tens of MB, not GB; a key is found where
# its written form (escapes, invisible characters and all) is at most the context long
_WINDOW, _CONTEXT = 1 << 18, 1 << 15


def _decoded_spans(text: str, patterns: list) -> list[tuple[int, int]]:
    """Spans of ``text`` that :func:`_decode_once` (repeated) turns into a match of one of
    ``patterns``."""
    spans: list[tuple[int, int]] = []
    if not _ESCAPE.search(text):
        return spans
    for w0 in range(0, len(text), _WINDOW):
        c0 = max(0, w0 - _CONTEXT)
        cur, levels = text[c0:w0 + _WINDOW + _CONTEXT], []
        for _ in range(_DECODE_LEVELS):
            cur, tokens = _decode_once(cur)
            if not tokens:
                break
            levels.append(tokens)
            for pattern in patterns:
                for m in pattern.finditer(cur):
                    a, b = m.span()
                    if b <= a:
                        continue
                    for tokens_k in reversed(levels):
                        a, b = _map_back(tokens_k, a, b)
                    if w0 <= c0 + a < w0 + _WINDOW:  # each window owns its starts
                        spans.append((c0 + a, c0 + b))
    return spans


def redact_all(text: str, secrets) -> str:
    """:func:`redact` for several secrets at once (``text`` is decoded once)."""
    patterns = [_secret_pattern(s) for s in dict.fromkeys(secrets) if s]
    if not patterns or not text:
        return text
    spans = [m.span() for pattern in patterns for m in pattern.finditer(text)
             if m.end() > m.start()]
    spans += _decoded_spans(text, patterns)
    if not spans:
        return text
    out, last = [], 0
    for a, b in sorted(spans):
        if a < last:  # overlaps the previous span: extend it
            last = max(last, b)
            continue
        out += [text[last:a], "***"]
        last = b
    out.append(text[last:])
    return "".join(out)


def redact(text: str, secret: Optional[str]) -> str:
    """``text`` with every occurrence of ``secret``, in any of its
    :func:`secret_forms` and even split by whitespace, replaced by ``***``.

    Also found when written with escapes (JSON ``\\u0073``, ``\\x73``, ``\\/``), HTML
    character references (``&#115;``, ``&#x73;``, ``&sol;``), URL escapes (``%73``), any
    mix of them, nested up to four times, or split by invisible characters (zero-width
    space, joiners, BOM): the whole written span is replaced, and the rest of ``text``
    is kept as written. A secret shorter than :data:`MIN_SECRET_CHARS` characters is
    replaced only where it stands as a whole token (not inside a longer word), as is or
    escaped: anything else would destroy ordinary text.
    """
    return redact_all(text, [secret])


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
        password = (url_auth(self.base_url) or ("", ""))[1]
        for what, secret in (("API key", self.api_key),
                             ("password in the LLM base URL", password)):
            if secret and len(secret) < MIN_SECRET_CHARS:
                # found anywhere, it could only be kept out of messages and answers by
                # mangling them (every "a" of a text, for a key "a")
                raise LLMConfigError(f"the {what} is shorter than {MIN_SECRET_CHARS} "
                                     "characters: too short to keep out of messages and "
                                     "answers; use a longer one (or none, for a server that "
                                     "needs none)")
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
