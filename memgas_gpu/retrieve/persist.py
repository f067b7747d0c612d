"""Save / load a :class:`MemoryIndex`: safetensors + a versioned JSON manifest.

See ``docs/index-format.md``. No pickle anywhere: tensors go to one safetensors
file, everything else (conversation and question metadata, build configuration)
to ``manifest.json``.  The folder layout and its atomic replacement are
:mod:`.layout`'s; the validation of what is read, :mod:`.checks`'.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import torch

from ..data.model import Question
from .checks import IndexFormatError, check_manifest, check_tensors
from .index import ConversationMeta, GraphParams, MemoryIndex
from .layout import FORMAT_NAME, FORMAT_VERSION, read_index_dir, write_index_dir

__all__ = ["save_index", "load_index", "FORMAT_VERSION", "IndexFormatError"]


def save_index(index: MemoryIndex, path: Union[str, os.PathLike],
               dtype: torch.dtype = torch.float32) -> Path:
    """Write ``index`` to the folder ``path``; an index already there is replaced
    atomically (readers see the old or the new one, never none; see :mod:`.layout`).

    Raises:
        IndexFormatError: ``path`` is a file, or a folder that is not an index.
    """
    tensors = {
        "conv_offsets": index.conv_offsets, "row_slot": index.row_slot,
        "gran": index.gran.to(dtype), "q_emb": index.q_emb.to(dtype), "q_conv": index.q_conv,
    }
    if index.hybrid is not None:
        tensors["hybrid"] = index.hybrid.to(dtype)
    if getattr(index, "turns", None) is not None:
        tensors["turns"] = index.turns.to(dtype)
        tensors["turn_ptr"] = index.turn_ptr
    lexical = getattr(index, "lexical", None)
    if lexical is not None:
        tensors.update(lexical.tensors("lexical."))
    for key, (indptr, indices) in index.graphs.items():
        tensors[f"graph.{key}.indptr"] = indptr
        tensors[f"graph.{key}.indices"] = indices
    manifest = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION,
        "params": vars(index.params), "graphs": sorted(index.graphs),
        "config": index.config,
        "lexical": lexical.describe() if lexical is not None else None,
        "conversations": [{"id": c.id, "session_ids": c.session_ids,
                           "session_dates": c.session_dates} for c in index.conversations],
        "questions": [{"id": q.id, "text": q.text, "type": q.type, "date": q.date,
                       "answer": q.answer, "evidence_session_ids": list(q.evidence_session_ids),
                       "is_abstention": q.is_abstention} for q in index.questions],
    }
    return write_index_dir(Path(path), tensors, manifest)


def load_index(path: Union[str, os.PathLike]) -> MemoryIndex:
    """Read an index folder written by :func:`save_index` (version 1 or 2).

    Raises:
        IndexFormatError: a corrupted, edited, incomplete or newer index (one line
            naming the file and the field), embeddings holding NaN or inf included.
    """
    mf, manifest, t = read_index_dir(Path(path))
    check_manifest(str(mf), manifest)
    check_tensors(str(mf.with_name("tensors.safetensors")), t, manifest)
    try:
        return _make(manifest, t)
    except (KeyError, TypeError, ValueError, IndexError) as e:  # checks missed something
        raise IndexFormatError(f"{mf}: inconsistent index ({type(e).__name__}: {e})") \
            from None


def _make(manifest: dict, t: dict) -> MemoryIndex:
    graphs = {k: (t[f"graph.{k}.indptr"], t[f"graph.{k}.indices"]) for k in manifest["graphs"]}
    convs = [ConversationMeta(c["id"], c["session_ids"], c["session_dates"])
             for c in manifest["conversations"]]
    questions = [Question(id=q["id"], text=q["text"], type=q["type"], date=q["date"],
                          answer=q["answer"],
                          evidence_session_ids=tuple(q["evidence_session_ids"]),
                          is_abstention=q["is_abstention"]) for q in manifest["questions"]]
    lexical = None
    if manifest.get("lexical"):
        from ..lexical import LexicalIndex

        lexical = LexicalIndex.from_tensors(t, manifest["lexical"]["tokenizer"], "lexical.")
    return MemoryIndex(conversations=convs, questions=questions,
                       conv_offsets=t["conv_offsets"], row_slot=t["row_slot"],
                       gran=t["gran"].float(), hybrid=t["hybrid"].float() if "hybrid" in t
                       else None, q_emb=t["q_emb"].float(), q_conv=t["q_conv"],
                       graphs=graphs, params=GraphParams(**manifest["params"]),
                       config=manifest["config"], lexical=lexical,
                       turns=t["turns"].float() if "turns" in t else None,
                       turn_ptr=t.get("turn_ptr"))
