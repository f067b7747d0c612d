"""``memgas expand DATA --llm-model M --out DIR_OR_PREFIX``: LLM summaries and keywords.

Also holds the endpoint options shared with ``memgas answer`` and ``memgas qa-eval``.
"""
from __future__ import annotations

import functools
import os

import click

from ._common import (FiniteFloat, PathArg, check_out_dir, check_out_file, dataset_options,
                      info, load, quiet_option)


def _base_url(ctx, param, value):
    """``--base-url`` checked when the command line is read (an http(s) URL), naming the
    option; the same rule as :class:`memgas_gpu.llm.LLMConfig`, whose error named
    neither."""
    if value is None:
        return None
    from urllib.parse import urlsplit

    if urlsplit(value).scheme not in ("http", "https"):
        from ..llm.config import public_url

        shown = public_url(value)  # never a password in a message, even in a URL that
        if "@" in shown:           # has no scheme for public_url to find its credentials
            shown = "…@" + shown.rsplit("@", 1)[1]
        raise click.BadParameter(f"{shown!r}: must start with http:// or https://",
                                 param=param)
    return value


def _nonempty(ctx, param, value):
    if value is not None and not value.strip():
        raise click.BadParameter("an empty value", param=param)
    return value


def llm_options(model_flag: str = "--llm-model", required: bool = True):
    """Endpoint options; the model option is ``model_flag`` (stored as ``llm_model``)."""
    def deco(f):
        @click.option(model_flag, "llm_model", default=None, metavar="MODEL",
                      help="Chat model name [default: $MEMGAS_LLM_MODEL]"
                           + ("." if required else "; none: no LLM judge."))
        @click.option("--base-url", default=None, metavar="URL", callback=_base_url,
                      help="OpenAI-compatible server, e.g. http://localhost:8000/v1 "
                           "[default: $MEMGAS_LLM_BASE_URL, $OPENAI_BASE_URL, OpenAI].")
        @click.option("--api-key-env", default=None, metavar="VAR",
                      help="Environment variable holding the API key [default: "
                           "MEMGAS_LLM_API_KEY, then OPENAI_API_KEY]. Keys are never "
                           "taken on the command line.")
        @click.option("--concurrency", type=click.IntRange(1), default=8, show_default=True,
                      help="Requests in flight at most.")
        @click.option("--timeout", type=FiniteFloat(0, min_open=True), default=120.0,
                      show_default=True, help="Seconds per request attempt.")
        @click.option("--max-retries", type=click.IntRange(0), default=6, show_default=True,
                      help="Retries after 429, 5xx, timeouts and connection errors.")
        @click.option("--max-tokens", type=click.IntRange(1), default=500, show_default=True,
                      help="Completion length limit.")
        @click.option("--max-response-mb", type=FiniteFloat(0, min_open=True), default=16.0,
                      show_default=True, help="Largest response body accepted (MiB).")
        @click.option("--cache", "cache_path", type=PathArg(dir_okay=False), default=None,
                      help="SQLite response cache (resume / free reruns) [default: "
                           "$MEMGAS_LLM_CACHE or ~/.cache/memgas_gpu/llm_cache.sqlite].")
        @click.option("--no-cache", is_flag=True, help="Do not read or write the cache.")
        @functools.wraps(f)
        def wrapper(*a, **k):
            return f(*a, **k)
        return wrapper
    return deco


_LLM_KEYS = ("llm_model", "base_url", "api_key_env", "concurrency", "timeout", "max_retries",
             "max_tokens", "max_response_mb", "cache_path", "no_cache")


def pop_llm_options(opts: dict) -> dict:
    """Remove the :func:`llm_options` values from a command's kwargs."""
    return {k: opts.pop(k) for k in _LLM_KEYS}


def make_client(llm: dict, model=None):
    """A :class:`~memgas_gpu.llm.ChatClient` from :func:`llm_options` values."""
    from ..llm import ChatClient, LLMConfig, LLMConfigError, ResponseCache, default_cache_path

    key = None
    if llm["api_key_env"]:
        key = os.environ.get(llm["api_key_env"])
        if not key:
            raise LLMConfigError(f"environment variable {llm['api_key_env']} is not set "
                                 "(--api-key-env)")
    cfg = LLMConfig.from_env(model=model or llm["llm_model"], base_url=llm["base_url"],
                             api_key=key, concurrency=llm["concurrency"],
                             timeout=llm["timeout"], max_retries=llm["max_retries"],
                             max_tokens=llm["max_tokens"],
                             max_response_bytes=max(1, int(llm["max_response_mb"] * 2**20)))
    cache = None if llm["no_cache"] else ResponseCache(llm["cache_path"] or
                                                       default_cache_path())
    return ChatClient(cfg, cache)


def report_client(client) -> None:
    """One stderr line of request, cache and token counts."""
    s = client.stats
    rate = s.responses / s.seconds if s.seconds else 0.0
    info(f"llm {client.config.model}: {s.responses} responses ({rate:.1f}/s), "
         f"{s.cache_hits} cache hits, {s.retries} retries, tokens in/out "
         f"{s.prompt_tokens}/{s.completion_tokens}")


@click.command("expand")
@click.argument("data", type=PathArg(exists=True, dir_okay=False))
@click.option("--out", required=True, metavar="DIR_OR_PREFIX", callback=_nonempty,
              help="A folder (existing or ending in /) gets summary_level.jsonl and "
                   "keyword_level.jsonl; otherwise PREFIX-summary_level.jsonl and "
                   "PREFIX-keyword_level.jsonl.")
@click.option("--dialogue", type=click.Choice(("auto", "user-ai", "user-user")),
              default="auto", show_default=True,
              help="Prompt wording: user-user for LoCoMo, user-AI assistant otherwise.")
@dataset_options
@llm_options()
@quiet_option
def expand(data, out, dialogue, fmt, empty_sessions, user_only, conversations,
           exclude_conversations, **opts) -> None:
    """Summarize and extract keywords of every distinct session of DATA with an LLM.

    The files feed `memgas index --summaries FILE --keywords FILE`. Responses are
    cached: a killed run resumes, a rerun sends nothing.
    """
    from ..llm import LLMSource, dialogue_style, expansion_paths, write_expansion_files

    if out.endswith(("/", os.sep)) and not os.path.exists(out):
        check_out_dir(out)  # a new folder: made in an existing one
    else:
        for path in expansion_paths(out):
            check_out_file(path)
    llm = pop_llm_options(opts)
    client = make_client(llm)
    ds = load(data, fmt, empty_sessions, user_only, conversations, exclude_conversations)
    style = dialogue_style(ds) if dialogue == "auto" else dialogue
    n = len(ds.distinct_sessions())
    info(f"expanding {n} distinct sessions of {len(ds)} conversations "
         f"({style} prompts) with {client.config.model}")
    try:
        paths = write_expansion_files(ds, LLMSource(client, style), out)
    finally:
        report_client(client)
        client.close()
    for p in paths:
        click.echo(f"wrote {p}")
