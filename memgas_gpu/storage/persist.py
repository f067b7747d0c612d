"""Save / load a :class:`MemoryIndex`: safetensors + a versioned JSON manifest.

See ``docs/index-format.md`` and ``docs/failure.md``. No pickle anywhere: tensors go to
one safetensors file, everything else (conversation and question metadata, build
configuration, the tensors' CRC-32 checksums) to ``manifest.json``.  The folder's files,
their atomic replacement and the writers' lock are :mod:`.storage`'s; the validation of
what is read, and of what is about to be written, :mod:`.checks`'.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Optional, Union

import torch

from .._io import find_surrogate, json_loads, may_hold_surrogate
from ..data.model import Question
from .validate import IndexFormatError, check_manifest, check_tensors, tensor_checksums
from ..memory.meta import ConversationMeta
from ..retrieve.params import GraphParams
from ..retrieve.signals import custom_signal_modules, import_signal_modules
from .folder import (FORMAT_NAME, FORMAT_VERSION, LOCK_TIMEOUT, FolderVersion,
                      IndexConflictError, IndexLockError, check_lock_timeout, read_index_dir,
                      write_index_dir)
from ..memory.texts import TextTable

log = logging.getLogger(__name__)

__all__ = ["save_index", "load_index", "FORMAT_VERSION", "FolderVersion", "IndexFormatError",
           "IndexConflictError", "IndexLockError"]


def _tensors(index, view, dtype: torch.dtype) -> dict:
    """The tensors of a save: ``view`` (the index's snapshot) and the index's questions."""
    t = view.tables
    tensors = {
        "conv_offsets": view.conv_offsets, "row_slot": view.row_slot,
        "gran": view.gran.to(dtype), "q_emb": index.q_emb.to(dtype), "q_conv": index.q_conv,
    }
    for name, x in t.dense.items():
        tensors[name] = x.to(dtype)
    if t.digest is not None:
        tensors["slot_digest"] = t.digest
    if view.turn_ptr is not None:
        tensors["turn_ptr"] = view.turn_ptr
    if view.turns is not None:
        tensors["turns"] = view.turns.to(dtype)
    if view.turn_text is not None:
        tensors["turn_text.bytes"] = view.turn_text.data
        tensors["turn_text.offsets"] = view.turn_text.offsets
    if view.lexical is not None:
        tensors.update(view.lexical.tensors("lexical."))
    for key in sorted(index.saved_graph_keys(view)):
        indptr, indices = view.graph(GraphParams.from_key(key, view.params))
        tensors[f"graph.{key}.indptr"] = indptr
        tensors[f"graph.{key}.indices"] = indices
    return {k: v.detach().contiguous().cpu() for k, v in tensors.items()}


def _manifest(index, view, tensors: dict) -> dict:
    lexical = view.lexical
    return {
        "format": FORMAT_NAME, "version": FORMAT_VERSION,
        "params": vars(view.params), "graphs": sorted(index.saved_graph_keys(view)),
        "tables": sorted(view.tables.dense),
        # the modules of the custom signals, imported again by a load elsewhere
        "signal_modules": {**index.signal_modules, **custom_signal_modules()},
        "config": view.config,
        "lexical": lexical.describe() if lexical is not None else None,
        "conversations": [{"id": c.id, "session_ids": c.session_ids,
                           "session_dates": c.session_dates,
                           **({"session_metadata": c.session_metadata}
                              if c.session_metadata else {})}
                          for c in view.conversations],
        "questions": [{"id": q.id, "text": q.text, "type": q.type, "date": q.date,
                       "answer": q.answer, "evidence_session_ids": list(q.evidence_session_ids),
                       "evidence_turn_ids": list(q.evidence_turn_ids),
                       "is_abstention": q.is_abstention} for q in index.questions],
        "tensor_crc32": tensor_checksums(tensors),
    }


def _as_stored(path: Path, manifest: dict) -> tuple[str, dict]:
    """``manifest`` as JSON text and as a reader will get it back, or a one-line
    refusal."""
    try:
        # no indent: json's C encoder (indent selects the pure-Python one, 10x slower)
        text = json.dumps(manifest, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise IndexFormatError(f"{path}: the index cannot be saved: its metadata is not "
                               f"strict JSON ({' '.join(str(e).split())[:200]}); nothing "
                               "was written") from None
    bad = find_surrogate(manifest) if may_hold_surrogate(text) else None
    if bad is not None:
        raise IndexFormatError(f"{path}: the index cannot be saved: field {bad!r} holds a "
                               "lone UTF-16 surrogate (not valid Unicode text); nothing was "
                               "written")
    return text, json_loads(text)


def _expected(index, folder: str) -> Optional[str]:
    """The version ``index`` last saw ``folder`` at (loaded from or saved to), or None."""
    last = index.folder_version
    if last is not None and last.folder == folder:
        return last.version
    return index.folder_versions.get(folder)


def save_index(index, path: Union[str, os.PathLike], dtype: torch.dtype = torch.float32, *,
               force: bool = False, lock_timeout: float = LOCK_TIMEOUT) -> Path:
    """Write ``index`` to the folder ``path``; an index already there is replaced
    atomically (readers see the old or the new one, never none; see :mod:`.storage`).

    Nothing is written unless the new version passes every check a load makes, so a
    save never replaces a loadable index with one that does not load.  An index
    remembers the version of every folder it was loaded from or saved to
    (``index.folder_versions``; ``index.folder_version`` is the last one): saving it
    into one of them after another writer saved there is refused (optimistic
    concurrency), unless ``force``.  The saves of one index run one at a time
    (``index.saving()``), from taking the snapshot to recording the new version: a save
    that starts after another returned writes a state at least as new, and threads
    sharing an index never conflict with each other.

    Raises:
        IndexFormatError: ``path`` is a file or a folder that is not an index, or the
            index is not valid (one line naming the field; nothing written).
        IndexConflictError: another writer saved to ``path`` since ``index`` was loaded
            from or saved to it.
        IndexLockError: another writer held the folder's lock for ``lock_timeout`` s.
        OSError: writing failed (a full disk, say), naming ``path``; the previous version
            is still current.
        TypeError, ValueError: ``lock_timeout`` is not a finite number from 0.
    """
    check_lock_timeout(lock_timeout)
    path = Path(path)
    with index.saving():
        return _save(index, path, dtype, force, lock_timeout)


def _save(index, path: Path, dtype, force: bool, lock_timeout: float) -> Path:
    view = index.snapshot()  # one consistent state, whatever writers do meanwhile
    tensors = _tensors(index, view, dtype)
    manifest = _manifest(index, view, tensors)
    text, stored = _as_stored(path, manifest)
    what = f"{path} (not saved)"
    check_manifest(what, stored)
    check_tensors(what, tensors, stored, checksums=False)  # just computed from them
    expect = None if force else _expected(index, os.path.realpath(path))
    name = write_index_dir(path, tensors, text.encode(), expect=expect,
                           lock_timeout=lock_timeout)
    folder = os.path.realpath(path)
    # a new dict: a shallow copy of the index keeps what it knew
    index.folder_versions = {**index.folder_versions, folder: name}
    index.folder_version = FolderVersion(folder, name)
    return path


def load_index(path: Union[str, os.PathLike], cls=None):
    """Read an index folder written by :func:`save_index` (format version 1 or 2) as a
    ``cls`` (default :class:`~memgas_gpu.retrieve.MemoryIndex`); its
    ``folder_version`` names the folder and the version read (and ``folder_versions``
    maps that folder to that version).

    Raises:
        IndexFormatError: a corrupted, edited, incomplete or newer index (one line
            naming the file and the field), embeddings holding NaN or inf included.
    """
    mf, manifest, t, origin, changed = read_index_dir(Path(path))
    check_manifest(str(mf), manifest)
    if changed:
        raise IndexFormatError(f"{mf}: its contents differ from the CRC-32 checksum the "
                               "folder's pointer recorded when it was written (the file was "
                               "edited or damaged); rebuild or restore the index")
    check_tensors(str(mf.with_name("tensors.safetensors")), t, manifest)
    try:
        index = _make(manifest, t, cls)
    except (KeyError, TypeError, ValueError, IndexError) as e:  # checks missed something
        raise IndexFormatError(f"{mf}: inconsistent index ({type(e).__name__}: {e})") \
            from None
    index.folder_version = origin
    index.signal_modules = dict(manifest.get("signal_modules") or {})
    for line in import_signal_modules(index.signal_modules):
        log.warning("%s: %s", mf, line)
    index.folder_versions = {origin.folder: origin.version}
    return index


def _make(manifest: dict, t: dict, cls):
    if cls is None:
        from ..retrieve import MemoryIndex as cls
    graphs = {k: (t[f"graph.{k}.indptr"], t[f"graph.{k}.indices"]) for k in manifest["graphs"]}
    convs = [ConversationMeta(c["id"], c["session_ids"], c["session_dates"],
                              c.get("session_metadata"))
             for c in manifest["conversations"]]
    questions = [Question(id=q["id"], text=q["text"], type=q["type"], date=q["date"],
                          answer=q["answer"],
                          evidence_session_ids=tuple(q["evidence_session_ids"]),
                          evidence_turn_ids=tuple(q.get("evidence_turn_ids", ())),
                          is_abstention=q["is_abstention"]) for q in manifest["questions"]]
    lexical = None
    if manifest.get("lexical"):
        from ..lexical import LEXICAL_GRANULARITIES, LexicalIndex

        lexical = LexicalIndex.from_tensors(
            t, manifest["lexical"]["tokenizer"], "lexical.",
            keys=manifest["lexical"].get("granularities") or LEXICAL_GRANULARITIES)
    names = manifest.get("tables", ["concat"] if "concat" in t else [])
    text = (TextTable(t["turn_text.bytes"], t["turn_text.offsets"])
            if "turn_text.bytes" in t else None)
    return cls(conversations=convs, questions=questions,
               conv_offsets=t["conv_offsets"], row_slot=t["row_slot"],
               gran=t["gran"].float(), concat=None,
               tables={name: t[name].float() for name in names},
               q_emb=t["q_emb"].float(), q_conv=t["q_conv"],
               graphs=graphs, params=GraphParams(**manifest["params"]),
               config=manifest["config"], lexical=lexical,
               turns=t["turns"].float() if "turns" in t else None,
               turn_ptr=t.get("turn_ptr"), turn_text=text, digest=t.get("slot_digest"))
