"""Save / load a :class:`MemoryIndex`: safetensors + a versioned JSON manifest.

See ``docs/index-format.md``. No pickle anywhere: tensors go to one safetensors
file, everything else (conversation and question metadata, build configuration)
to ``manifest.json``.  The folder layout and its atomic replacement are
:mod:`.storage`'s; the validation of what is read, :mod:`.checks`'.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import torch

from ..data.model import Question
from .checks import IndexFormatError, check_manifest, check_tensors
from .storage import FORMAT_NAME, FORMAT_VERSION, read_index_dir, write_index_dir
from .meta import ConversationMeta, GraphParams
from .texts import TextTable

__all__ = ["save_index", "load_index", "FORMAT_VERSION", "IndexFormatError"]


def save_index(index, path: Union[str, os.PathLike],
               dtype: torch.dtype = torch.float32) -> Path:
    """Write ``index`` to the folder ``path``; an index already there is replaced
    atomically (readers see the old or the new one, never none; see :mod:`.storage`).

    Raises:
        IndexFormatError: ``path`` is a file, or a folder that is not an index.
    """
    tensors = {
        "conv_offsets": index.conv_offsets, "row_slot": index.row_slot,
        "gran": index.gran.to(dtype), "q_emb": index.q_emb.to(dtype), "q_conv": index.q_conv,
    }
    if index.concat is not None:
        tensors["concat"] = index.concat.to(dtype)
    if index.turn_ptr is not None:
        tensors["turn_ptr"] = index.turn_ptr
    if index.turns is not None:
        tensors["turns"] = index.turns.to(dtype)
    if index.turn_text is not None:
        tensors["turn_text.bytes"] = index.turn_text.data
        tensors["turn_text.offsets"] = index.turn_text.offsets
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
                       "evidence_turn_ids": list(q.evidence_turn_ids),
                       "is_abstention": q.is_abstention} for q in index.questions],
    }
    return write_index_dir(Path(path), {k: v.contiguous().cpu() for k, v in tensors.items()},
                           manifest)


def load_index(path: Union[str, os.PathLike], cls=None):
    """Read an index folder written by :func:`save_index` (format version 1 or 2) as a
    ``cls`` (default :class:`~memgas_gpu.retrieve.MemoryIndex`).

    Raises:
        IndexFormatError: a corrupted, edited, incomplete or newer index (one line
            naming the file and the field), embeddings holding NaN or inf included.
    """
    mf, manifest, t = read_index_dir(Path(path))
    check_manifest(str(mf), manifest)
    check_tensors(str(mf.with_name("tensors.safetensors")), t, manifest)
    try:
        return _make(manifest, t, cls)
    except (KeyError, TypeError, ValueError, IndexError) as e:  # checks missed something
        raise IndexFormatError(f"{mf}: inconsistent index ({type(e).__name__}: {e})") \
            from None


def _make(manifest: dict, t: dict, cls):
    if cls is None:
        from . import MemoryIndex as cls
    graphs = {k: (t[f"graph.{k}.indptr"], t[f"graph.{k}.indices"]) for k in manifest["graphs"]}
    convs = [ConversationMeta(c["id"], c["session_ids"], c["session_dates"])
             for c in manifest["conversations"]]
    questions = [Question(id=q["id"], text=q["text"], type=q["type"], date=q["date"],
                          answer=q["answer"],
                          evidence_session_ids=tuple(q["evidence_session_ids"]),
                          evidence_turn_ids=tuple(q.get("evidence_turn_ids", ())),
                          is_abstention=q["is_abstention"]) for q in manifest["questions"]]
    lexical = None
    if manifest.get("lexical"):
        from ..lexical import LexicalIndex

        lexical = LexicalIndex.from_tensors(t, manifest["lexical"]["tokenizer"], "lexical.")
    concat = t.get("concat", t.get("hybrid"))  # "hybrid": indexes written before 0.2
    text = (TextTable(t["turn_text.bytes"], t["turn_text.offsets"])
            if "turn_text.bytes" in t else None)
    return cls(conversations=convs, questions=questions,
               conv_offsets=t["conv_offsets"], row_slot=t["row_slot"],
               gran=t["gran"].float(), concat=concat.float() if concat is not None else None,
               q_emb=t["q_emb"].float(), q_conv=t["q_conv"],
               graphs=graphs, params=GraphParams(**manifest["params"]),
               config=manifest["config"], lexical=lexical,
               turns=t["turns"].float() if "turns" in t else None,
               turn_ptr=t.get("turn_ptr"), turn_text=text)
