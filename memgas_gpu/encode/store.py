"""Content-addressed, resumable, deduplicated embedding store.

Layout of a store folder::

    manifest.json              # format, version, fingerprint, dim, dtype, shard list
    shard-000000.safetensors   # tensor "embeddings" [rows, dim]; metadata "keys": JSON list
    shard-000001.safetensors
    ...

A text's key is ``blake2b(fingerprint + "\\0" + text)`` (128 bits, hex), so every
distinct text is encoded once per embedding function, across every call and every
conversation that contains it (LongMemEval haystacks share most sessions).

Crash safety: a shard is written to a temporary file, fsynced and renamed into
place; only then is the manifest rewritten (temporary file + ``os.replace``). A
shard absent from the manifest is ignored (and overwritten later), so a killed run
loses at most the shard in progress.

Bit-identical resume: missing texts are planned in one deterministic order, by
``(-token length, key)`` (see :func:`~memgas_gpu.encode.batching.plan_batches`),
and shards end on batch boundaries. After a crash, the texts still missing are a
suffix of the original plan that starts on a batch boundary, so the resumed run
forms the very same batches and produces the same bits for every key (on CPU with
the same thread count; on CUDA as long as no out-of-memory split changes a batch).

One writer at a time per folder; any number of readers. Writing holds an exclusive
``fcntl`` lock on ``writer.lock`` in the folder (where ``fcntl`` exists): a second store
that needs to write meanwhile, in this or another process, gets a :class:`StoreError`
at once. Before writing, a store re-reads the manifest and takes up the shards another
writer committed since it was opened, so writers that take turns lose nothing.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch

from .._io import atomic_write
from ..errors import MemgasError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, the manifest is still re-read
    fcntl = None

__all__ = ["EmbeddingStore", "StoreError", "text_key", "FORMAT", "VERSION", "DEFAULT_DTYPE"]

FORMAT = "memgas-embedding-store"
VERSION = 1
LOCK_FILE = "writer.lock"
_NP = {"float16": np.float16, "float32": np.float32}
#: on-disk dtype of a new store: float32 keeps the embeddings those of a build without a
#: store (to float32 rounding), and so its association graph
DEFAULT_DTYPE = "float32"
_ST = {"F16": np.float16, "F32": np.float32}


class StoreError(MemgasError, ValueError):
    """A store folder that does not match the requested store (fingerprint, version, dtype)."""


def text_key(fingerprint: str, text: str) -> str:
    """Content key of ``text`` under an embedding function: 32 hex digits of blake2b."""
    h = hashlib.blake2b(digest_size=16)
    h.update(fingerprint.encode("utf-8"))
    h.update(b"\x00")
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _stored_dtype(path: Path) -> Optional[str]:
    """The ``dtype`` a store manifest records (None: no manifest, or none readable; the
    full check comes when the store opens it)."""
    try:
        dtype = json.loads(path.read_text(encoding="utf-8")).get("dtype")
    except (OSError, ValueError, AttributeError):
        return None
    return dtype if dtype in _NP else None


def _read_shard(path: Path) -> tuple[np.memmap, list[str]]:
    """Memory-map a shard's ``embeddings`` and read its keys (safetensors layout)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    info = header["embeddings"]
    keys = json.loads(header["__metadata__"]["keys"])
    start = 8 + n + info["data_offsets"][0]
    shape = tuple(info["shape"])
    if shape[0] == 0:
        return np.zeros(shape, _ST[info["dtype"]]), keys
    mm = np.memmap(path, dtype=_ST[info["dtype"]], mode="r", offset=start, shape=shape)
    if len(keys) != shape[0]:
        raise StoreError(f"{path}: {len(keys)} keys for {shape[0]} rows")
    return mm, keys


class EmbeddingStore:
    """Deduplicated embeddings on disk, keyed by content.

    Args:
        dir: store folder (created if missing).
        fingerprint: the embedding function's identity (``Encoder.fingerprint``).
            Opening a folder written under another fingerprint raises
            :class:`StoreError`.
        dtype: on-disk dtype, ``"float32"`` or ``"float16"`` (half the disk, but the
            rounding changes the embeddings a build reads back, and so may change a
            few association edges: README, "Native kernels and scale-out").  ``None``
            (default): the dtype of the store already in ``dir``, else ``"float32"``.
            Reads return float32 either way.
        shard_size: minimum rows per shard; a shard ends at the first batch
            boundary at or after it (default 8192).

    Attributes:
        n_requested: texts passed to the last :meth:`encode` call.
        n_distinct: distinct texts among them.
        n_encoded: texts actually encoded by that call (distinct and not stored).
    """

    def __init__(self, dir: Union[str, os.PathLike], fingerprint: str,
                 dtype: Optional[str] = None, shard_size: int = 8192) -> None:
        if dtype is not None and dtype not in _NP:
            raise ValueError(f"dtype must be 'float32' or 'float16', got {dtype!r}")
        if shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {shard_size}")
        self.dir = Path(dir)
        if dtype is None:
            dtype = _stored_dtype(self.dir / "manifest.json") or DEFAULT_DTYPE
        self.fingerprint = str(fingerprint)
        self.dtype = dtype
        self.shard_size = int(shard_size)
        self.n_requested = self.n_distinct = self.n_encoded = 0
        self.dim: Optional[int] = None
        self._manifest: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint,
            "dim": None, "dtype": dtype, "encoder": None, "shards": [],
        }
        self._maps: list[np.ndarray] = []
        self._index: dict[str, tuple[int, int]] = {}
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "manifest.json"
        if path.exists():
            self._open(path)

    # ------------------------------------------------------------------ open
    def _open(self, path: Path) -> None:
        man = self._read_manifest(path)
        self._manifest = man
        self.dim = man.get("dim")
        for entry in man["shards"]:
            self._attach(entry["file"])

    def _read_manifest(self, path: Path) -> dict:
        try:
            man = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise StoreError(f"{path}: unreadable manifest ({e})") from None
        if man.get("format") != FORMAT:
            raise StoreError(f"{path}: not an embedding store (format {man.get('format')!r})")
        if int(man.get("version", 0)) > VERSION:
            raise StoreError(
                f"{path}: format version {man['version']} is newer than this memgas_gpu "
                f"supports ({VERSION}); upgrade memgas_gpu")
        if man.get("fingerprint") != self.fingerprint:
            raise StoreError(
                f"{path}: store was written by another embedding function "
                f"(fingerprint {man.get('fingerprint')!r}, requested {self.fingerprint!r}); "
                "use another folder or the matching encoder")
        if man.get("dtype") != self.dtype:
            raise StoreError(f"{path}: store dtype is {man.get('dtype')!r}, requested {self.dtype!r}")
        return man

    @contextlib.contextmanager
    def _writing(self):
        """Hold the folder's writer lock, then catch up with the manifest on disk."""
        with open(self.dir / LOCK_FILE, "a+b") as lock:
            if fcntl is not None:
                try:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise StoreError(
                        f"{self.dir}: another store is writing to this folder (it holds "
                        f"{LOCK_FILE}); one writer at a time: wait for it to finish, or use "
                        "another folder") from None
                except OSError:  # pragma: no cover - no locks on this file system
                    pass
            self._refresh()
            yield

    def _refresh(self) -> None:
        """Take up the shards another writer committed since this store read the manifest."""
        path = self.dir / "manifest.json"
        if not path.exists():
            return
        man = self._read_manifest(path)
        mine = self.shards
        theirs = [e["file"] for e in man["shards"]]
        if theirs == mine:
            return
        if theirs[:len(mine)] != mine:
            raise StoreError(f"{path}: the shard list changed under this store (it had "
                             f"{len(mine)} shards, the folder now lists {len(theirs)}, not "
                             "starting with them); reopen the store")
        self._manifest = man
        self.dim = man.get("dim")
        for name in theirs[len(mine):]:
            self._attach(name)

    def _attach(self, name: str) -> None:
        mm, keys = _read_shard(self.dir / name)
        s = len(self._maps)
        self._maps.append(mm)
        for row, k in enumerate(keys):
            self._index.setdefault(k, (s, row))

    # ----------------------------------------------------------------- read
    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: str) -> bool:
        return key in self._index

    @property
    def shards(self) -> list[str]:
        """Committed shard file names, in commit order."""
        return [e["file"] for e in self._manifest["shards"]]

    def key(self, text: str) -> str:
        """Content key of ``text`` in this store (see :func:`text_key`)."""
        return text_key(self.fingerprint, text)

    def keys_for(self, texts: Sequence[str]) -> list[str]:
        """Content keys of ``texts``."""
        return [text_key(self.fingerprint, t) for t in texts]

    def get(self, keys: Sequence[str]) -> torch.Tensor:
        """Stored embeddings of ``keys`` as a float32 tensor ``[len(keys), dim]``.

        Raises:
            KeyError: some keys are not stored.
        """
        missing = [k for k in keys if k not in self._index]
        if missing:
            raise KeyError(f"{len(missing)} of {len(keys)} keys are not in {self.dir} (first: {missing[0]})")
        out = np.empty((len(keys), self.dim or 0), dtype=np.float32)
        if not keys:
            return torch.from_numpy(out)
        loc = np.array([self._index[k] for k in keys], dtype=np.int64)
        for s in np.unique(loc[:, 0]):
            sel = np.nonzero(loc[:, 0] == s)[0]
            out[sel] = self._maps[s][loc[sel, 1]]
        return torch.from_numpy(out)

    def lookup(self, texts: Sequence[str]) -> torch.Tensor:
        """Stored embeddings of ``texts`` (float32 ``[len(texts), dim]``); KeyError if any is missing."""
        return self.get(self.keys_for(texts))

    # ---------------------------------------------------------------- write
    def _commit(self, keys: list[str], embs: list[torch.Tensor], encoder: Any) -> None:
        from safetensors.torch import save

        mat = torch.cat([e.float().cpu() for e in embs]).to(getattr(torch, self.dtype)).contiguous()
        if self.dim is None:
            self.dim = int(mat.shape[1])
        elif mat.shape[1] != self.dim:
            raise StoreError(f"{self.dir}: embedding dim {mat.shape[1]} != store dim {self.dim}")
        name = f"shard-{len(self._manifest['shards']):06d}.safetensors"
        blob = save({"embeddings": mat}, metadata={"keys": json.dumps(keys)})
        with atomic_write(self.dir / name, "wb") as f:  # temp + fsync + os.replace
            f.write(blob)
        _fsync_dir(self.dir)
        man = dict(self._manifest, dim=self.dim,
                   shards=self._manifest["shards"] + [{"file": name, "rows": len(keys)}])
        if man.get("encoder") is None and hasattr(encoder, "describe"):
            man["encoder"] = encoder.describe()
        with atomic_write(self.dir / "manifest.json", "w", encoding="utf-8") as f:
            json.dump(man, f, indent=1, allow_nan=False)
        _fsync_dir(self.dir)
        self._manifest = man
        self._attach(name)

    def encode(
        self,
        encoder: Any,
        texts: Sequence[str],
        progress: Optional[bool] = True,
        *,
        token_budget: Optional[int] = None,
        batch_size: Optional[int] = None,
        on_commit: Optional[Callable[[int, int], None]] = None,
    ) -> torch.Tensor:
        """Embeddings of ``texts``, encoding only the distinct texts not yet stored.

        Args:
            encoder: an :class:`~memgas_gpu.encode.Encoder` whose ``fingerprint``
                equals the store's.
            texts: texts in any order, repeats allowed.
            progress: progress over the texts being encoded: a tqdm bar on a terminal,
                plain lines in a log (:mod:`memgas_gpu.progress`); False: none.
            token_budget: padded tokens per batch (``None``: the encoder's default).
                Keep it fixed across a resume for bit-identical results.
            batch_size: maximum rows per batch.
            on_commit: called as ``on_commit(shard_index, rows)`` after each shard is
                durably committed (progress reporting; tests inject crashes here).

        Returns:
            float32 tensor ``[len(texts), dim]`` in input order, read back from the
            store (so values carry the store's dtype rounding).
        """
        if encoder.fingerprint != self.fingerprint:
            raise StoreError(
                f"{self.dir}: encoder fingerprint {encoder.fingerprint!r} differs from the store's "
                f"{self.fingerprint!r}")
        texts = [texts] if isinstance(texts, str) else list(texts)
        keys = self.keys_for(texts)
        first: dict[str, str] = {}
        for k, t in zip(keys, texts):
            first.setdefault(k, t)
        missing = [k for k in first if k not in self._index]
        self.n_requested, self.n_distinct, self.n_encoded = len(texts), len(first), len(missing)
        if missing:
            with self._writing():
                missing = [k for k in missing if k not in self._index]
                self.n_encoded = len(missing)
                self._encode_missing(encoder, first, missing, token_budget, batch_size,
                                     progress, on_commit)
        if self.dim is None:
            self.dim = int(encoder.dim)
        return self.get(keys)

    def _encode_missing(self, encoder, first, missing, token_budget, batch_size, progress,
                        on_commit) -> None:
        if missing:
            tok = encoder.tokenize([first[k] for k in missing])
            plan = encoder.plan(tok, sort_keys=missing, token_budget=token_budget, batch_size=batch_size)
            buf_keys: list[str] = []
            buf: list[torch.Tensor] = []
            for items, emb in encoder.encode_batches(tok, plan, token_budget=token_budget, progress=progress):
                buf_keys.extend(missing[i] for i in items)
                buf.append(emb)
                if len(buf_keys) >= self.shard_size:
                    self._commit(buf_keys, buf, encoder)
                    if on_commit is not None:
                        on_commit(len(self._maps) - 1, len(buf_keys))
                    buf_keys, buf = [], []
            if buf_keys:
                self._commit(buf_keys, buf, encoder)
                if on_commit is not None:
                    on_commit(len(self._maps) - 1, len(buf_keys))

    @property
    def dedup_ratio(self) -> float:
        """``n_requested / n_distinct`` of the last :meth:`encode` call (1.0 if none)."""
        return self.n_requested / self.n_distinct if self.n_distinct else 1.0

    def __repr__(self) -> str:
        return (f"EmbeddingStore({str(self.dir)!r}, rows={len(self)}, dim={self.dim}, "
                f"dtype={self.dtype}, shards={len(self._maps)})")
