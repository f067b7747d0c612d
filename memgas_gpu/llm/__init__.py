"""LLM stages over OpenAI-compatible endpoints: summaries/keywords, filter, answers, judge.

This module only re-exports; see the submodules. ``httpx`` is needed to send requests.
"""
from .answer import (RetrievedQuestion, answer_questions, load_hypotheses,
                     load_retrieval_log, write_hypotheses)
from .cache import CachedResponse, ResponseCache, default_cache_path, request_key
from .client import ChatClient, ChatRequest, ClientStats, LLMRequestError, run_sync
from .config import DEFAULT_BASE_URL, LLMConfig, LLMConfigError, LLMError
from .expand import LLMSource, dialogue_style, expansion_paths, write_expansion_files
from .judge import judge_answers, judge_prompt, parse_verdict, qa_items

__all__ = [
    "RetrievedQuestion", "answer_questions", "load_hypotheses", "load_retrieval_log",
    "write_hypotheses", "CachedResponse", "ResponseCache", "default_cache_path",
    "request_key", "ChatClient", "ChatRequest", "ClientStats", "LLMRequestError", "run_sync",
    "DEFAULT_BASE_URL", "LLMConfig", "LLMConfigError", "LLMError", "LLMSource",
    "dialogue_style", "expansion_paths", "write_expansion_files", "judge_answers",
    "judge_prompt", "parse_verdict", "qa_items",
]
