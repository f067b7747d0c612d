"""Save / load a :class:`MemoryIndex`: safetensors + a versioned JSON manifest.

See ``docs/index-format.md``. No pickle anywhere: tensors go to one safetensors
file, everything else (conversation and question metadata, build configuration)
to ``manifest.json``.  The folder is written to a temporary sibling and renamed,
so a reader never sees half an index.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Union

import torch

from ..data.model import Question
from ..errors import MemgasError
from .._io import atomic_dir
from .index import ConversationMeta, GraphParams, MemoryIndex

__all__ = ["save_index", "load_index", "FORMAT_VERSION", "IndexFormatError"]

FORMAT_NAME = "memgas_gpu.index"
FORMAT_VERSION = 1


class IndexFormatError(MemgasError):
    """An index folder that this version cannot read."""


def save_index(index: MemoryIndex, path: Union[str, os.PathLike],
               dtype: torch.dtype = torch.float32) -> Path:
    """Write ``index`` to the folder ``path`` (replaced atomically if it exists)."""
    from safetensors.torch import save_file

    path = Path(path)
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
    with atomic_dir(path) as tmp:
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()},
                  str(tmp / "tensors.safetensors"), metadata={"format": FORMAT_NAME})
        with open(tmp / "manifest.json", "w", encoding="utf-8") as f:
            json.dump(manifest, f, ensure_ascii=False, indent=1, allow_nan=False)
    return path


def load_index(path: Union[str, os.PathLike]) -> MemoryIndex:
    """Read an index folder written by :func:`save_index`."""
    from safetensors.torch import load_file

    path = Path(path)
    mf = path / "manifest.json"
    if not mf.exists():
        raise IndexFormatError(f"{path}: not an index folder (no manifest.json)")
    try:
        manifest = json.loads(mf.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise IndexFormatError(f"{mf}: invalid JSON ({e.msg})") from None
    if manifest.get("format") != FORMAT_NAME:
        raise IndexFormatError(f"{mf}: not a memgas_gpu index (format "
                               f"{manifest.get('format')!r})")
    version = manifest.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise IndexFormatError(
            f"{mf}: index format version {version} is newer than this memgas_gpu reads "
            f"({FORMAT_VERSION}); upgrade memgas_gpu (pip install -U memgas_gpu)")
    t = load_file(str(path / "tensors.safetensors"))
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
