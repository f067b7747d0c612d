"""Tokenisation, long-text windows and token-budget batch planning.

The encoder works on *items* (one per input text). An item owns one or more
*windows*: token-id rows ready for the model, special tokens included. With
``long_text="truncate"`` every item has exactly one window (the text cut at
``max_length`` tokens, the tokenizer's own ``truncation=True`` result); with
``"chunk_mean"`` a long text owns several windows whose pooled embeddings are
averaged.

Batches are planned over items sorted by their longest window (descending, ties
by a caller-given key), packed greedily until ``rows × longest_row`` would exceed
the token budget. Greedy packing from a sorted list has a property the
:class:`~memgas_gpu.encode.store.EmbeddingStore` relies on: the plan of any
suffix that starts at a batch boundary equals the corresponding suffix of the
full plan, so a resumed run forms exactly the batches an uninterrupted run would.
"""
from __future__ import annotations

import concurrent.futures as cf
import copy
import itertools
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

__all__ = ["Tokenized", "TextTokenizer", "split_windows", "plan_batches", "pad_rows"]

#: Texts per tokenisation chunk handed to one worker thread.
TOKENIZE_CHUNK = 2048
#: with ``long_text="truncate"`` a text is first cut (at whitespace) after this many
#: characters per content token, so one huge message costs the work of its first
#: window, not of its whole length; a text that then yields too few tokens (mostly
#: whitespace, or one very long "word" that tokenises to [UNK]) is retried with a 4x
#: longer cut, up to ``MAX_CUT_GROWTH`` times the first
CHARS_PER_TOKEN = 16
MAX_CUT_GROWTH = 64
#: with ``"chunk_mean"`` a long text is tokenised in pieces of about this many
#: characters (cut at whitespace), so the tokenizer's memory is bounded per piece
PIECE_CHARS = 1 << 20


def cut_at_space(text: str, limit: int, look_back: int = 1000) -> int:
    """An end position ``<= limit`` at a whitespace character (so no word is cut), or
    ``limit`` if the last ``look_back`` characters before it hold none."""
    if len(text) <= limit:
        return len(text)
    for j in range(limit, max(limit - look_back, 0), -1):
        if text[j - 1].isspace():
            return j
    return limit


@dataclass
class Tokenized:
    """Token windows of a list of texts.

    Attributes:
        windows: per text, a list of token-id rows (special tokens included).
    """

    windows: list[list[list[int]]]

    def __len__(self) -> int:
        return len(self.windows)

    def max_len(self, i: int) -> int:
        """Length of the longest window of text ``i``."""
        return max(len(w) for w in self.windows[i])

    def n_tokens(self, i: int) -> int:
        """Real (non-padding) tokens of text ``i`` over all its windows."""
        return sum(len(w) for w in self.windows[i])


class TextTokenizer:
    """Thread-parallel fast tokenisation into model-ready windows.

    Wraps a private copy of the Hugging Face *fast* tokenizer's Rust backend with
    padding and truncation switched off (the shared object is never mutated, so
    several threads may call it). Texts are encoded without special tokens, then
    cut into windows and wrapped in the template's prefix/suffix special tokens
    (``[CLS] … [SEP]`` for BERT), found by probing the template once.

    Args:
        tokenizer: a ``transformers`` fast tokenizer (has ``backend_tokenizer``).
        max_length: tokens per window, special tokens included.
        long_text: ``"truncate"`` (keep the first window only) or ``"chunk_mean"``.
        chunk_stride: content tokens between the starts of consecutive windows
            (``None``: the window's content length, i.e. no overlap).
        workers: tokenisation threads (chunks of ``TOKENIZE_CHUNK`` texts).
    """

    def __init__(
        self,
        tokenizer: Any,
        max_length: int,
        long_text: str = "truncate",
        chunk_stride: Optional[int] = None,
        workers: int = 1,
    ) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TypeError("a fast (Rust-backed) tokenizer is required")
        self._backend = copy.deepcopy(backend)
        self._backend.no_padding()
        self._backend.no_truncation()
        probe = "hello world"
        plain = self._backend.encode(probe, add_special_tokens=False).ids
        full = self._backend.encode(probe, add_special_tokens=True).ids
        for i in range(len(full) - len(plain) + 1):
            if full[i : i + len(plain)] == plain:
                self.prefix, self.suffix = full[:i], full[i + len(plain) :]
                break
        else:  # pragma: no cover - exotic templates
            raise ValueError("cannot locate the content inside the tokenizer's template")
        self.max_length = int(max_length)
        self.content_len = self.max_length - len(self.prefix) - len(self.suffix)
        if self.content_len < 1:
            raise ValueError(f"max_length={max_length} leaves no room for content tokens")
        if long_text not in ("truncate", "chunk_mean"):
            raise ValueError(f"long_text must be 'truncate' or 'chunk_mean', got {long_text!r}")
        self.long_text = long_text
        self.stride = int(chunk_stride) if chunk_stride else self.content_len
        if not 0 < self.stride <= self.content_len:
            raise ValueError(f"chunk_stride must be in [1, {self.content_len}], got {chunk_stride}")
        self.workers = max(1, int(workers))
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else 0

    def _content_ids(self, texts: Sequence[str]) -> list[list[int]]:
        enc = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        chunks = [list(texts[i : i + TOKENIZE_CHUNK]) for i in range(0, len(texts), TOKENIZE_CHUNK)]

        def run(chunk: list[str]) -> list[list[int]]:
            return [e.ids for e in enc(chunk, add_special_tokens=False)]

        if self.workers == 1 or len(chunks) <= 1:
            parts = [run(c) for c in chunks]
        else:
            with cf.ThreadPoolExecutor(self.workers) as pool:
                parts = list(pool.map(run, chunks))
        return [ids for part in parts for ids in part]

    def __call__(self, texts: Sequence[str]) -> Tokenized:
        """Tokenise ``texts`` into windows (see class docstring)."""
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
        pre, suf = self.prefix, self.suffix
        out = []
        for ids in (self._truncated_ids(texts) if self.long_text == "truncate"
                    else self._all_ids(texts)):
            if self.long_text == "truncate":
                out.append([pre + ids[: self.content_len] + suf])
            else:
                out.append([pre + w + suf for w in split_windows(ids, self.content_len, self.stride)])
        return Tokenized(out)

    def _truncated_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Content ids of at least the first ``content_len`` tokens of each text (all of
        a shorter text), tokenising a bounded prefix of long texts."""
        cap = first = self.content_len * CHARS_PER_TOKEN
        cut = [t[: cut_at_space(t, cap)] for t in texts]
        ids = self._content_ids(cut)
        short = [i for i, t in enumerate(cut) if len(t) < len(texts[i])
                 and len(ids[i]) < self.content_len]
        while short and cap < first * MAX_CUT_GROWTH:  # mostly whitespace: a longer prefix
            cap *= 4
            for i in short:
                cut[i] = texts[i][: cut_at_space(texts[i], cap)]
            for i, x in zip(short, self._content_ids([cut[i] for i in short])):
                ids[i] = x
            short = [i for i in short if len(cut[i]) < len(texts[i])
                     and len(ids[i]) < self.content_len]
        return ids

    def _all_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Content ids of every text; a long one tokenised in whitespace-cut pieces."""
        ids = self._content_ids([t if len(t) <= PIECE_CHARS else "" for t in texts])
        for i, t in enumerate(texts):
            if len(t) > PIECE_CHARS:
                pieces, start = [], 0
                while start < len(t):
                    end = start + cut_at_space(t[start:start + PIECE_CHARS + 1], PIECE_CHARS)
                    pieces.append(t[start:end])
                    start = end
                ids[i] = [x for part in self._content_ids(pieces) for x in part]
        return ids


def split_windows(ids: Sequence[int], window: int, stride: int) -> list[list[int]]:
    """Cut ``ids`` into windows of at most ``window`` tokens, ``stride`` apart.

    Windows start at ``0, stride, 2·stride, …`` and stop once one reaches the end,
    so the last window may be shorter. An empty input gives one empty window.

    Examples:
        >>> split_windows(list(range(5)), 2, 2)
        [[0, 1], [2, 3], [4]]
        >>> split_windows(list(range(5)), 3, 2)
        [[0, 1, 2], [2, 3, 4]]
    """
    out = []
    start = 0
    while True:
        out.append(list(ids[start : start + window]))
        if start + window >= len(ids):
            return out
        start += stride


def plan_batches(
    tok: Tokenized,
    sort_keys: Optional[Sequence[Any]] = None,
    token_budget: int = 16384,
    max_rows: Optional[int] = None,
    slack: float = 0.9,
    min_fill: float = 0.25,
) -> list[list[int]]:
    """Group items into batches under a padded-token budget.

    Items are sorted by ``(-longest window, sort_keys[i])`` (``sort_keys`` defaults
    to the item index) and packed greedily: an item joins the current batch while
    ``(rows + its windows) × width <= token_budget`` and ``rows + its windows <=
    max_rows``, where ``width`` is the batch's first (longest) row. A batch also
    ends early, to limit padding, when the next item is shorter than ``slack ×
    width`` and the batch already fills ``min_fill`` of the budget. A batch always
    takes at least one item (an item alone may exceed the budget; the encoder then
    runs its windows in row chunks). Every rule looks only at the current batch,
    which gives the suffix property of the module docstring.

    Args:
        tok: the tokenized items.
        sort_keys: tie-breakers, one per item (e.g. content hashes for a plan that
            does not depend on input order).
        token_budget: maximum padded tokens per batch.
        max_rows: maximum rows (windows) per batch; ``None`` for no limit.
        slack: see above (0 disables early ends; default 0.9).
        min_fill: see above (default 0.25).

    Returns:
        Batches as lists of item indices, longest items first.
    """
    n = len(tok)
    keys = range(n) if sort_keys is None else sort_keys
    maxlen = [tok.max_len(i) for i in range(n)]
    order = sorted(range(n), key=lambda i: (-maxlen[i], keys[i]))
    cap = max_rows if max_rows else float("inf")
    batches: list[list[int]] = []
    cur: list[int] = []
    rows = width = 0
    for i in order:
        r = len(tok.windows[i])
        w = max(width, maxlen[i])
        if cur and ((rows + r) * w > token_budget or rows + r > cap
                    or (maxlen[i] < slack * w and rows * w >= min_fill * token_budget)):
            batches.append(cur)
            cur, rows, w = [], 0, maxlen[i]
        cur.append(i)
        rows += r
        width = w
    if cur:
        batches.append(cur)
    return batches


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, pin: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token rows to the longest one.

    Args:
        rows: token-id rows.
        pad_id: the tokenizer's padding id.
        pin: put the tensors in pinned (page-locked) memory for async copies.

    Returns:
        ``(input_ids, attention_mask)``, both ``int64`` of shape ``[len(rows), L]``.
    """
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    width = int(lengths.max()) if len(rows) else 0
    valid = np.arange(width) < lengths[:, None]
    ids_np = np.full((len(rows), width), pad_id, dtype=np.int64)
    ids_np[valid] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    ids, mask = torch.from_numpy(ids_np), torch.from_numpy(valid.astype(np.int64))
    if pin:
        ids, mask = ids.pin_memory(), mask.pin_memory()
    return ids, mask
