"""The write-ahead log's records of a durable memory: one per acknowledged write.

A record is a safetensors blob (:func:`safetensors.torch.save`): its metadata holds the
operation as JSON (``{"op": "add" | "remove" | "forget", ...}``), its tensors the
embeddings an ``add`` stored (:class:`~memgas_gpu.memory.writes.Encoded`), so that a
replay links exactly what was acknowledged without the encoder.  No pickle: a record
is data.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from ..data.model import Session
from ..errors import MemgasError
from ..memory.writes import Encoded

__all__ = ["Record", "RecordError", "add_record", "remove_record", "forget_record",
           "decode"]

_OPS = ("add", "remove", "forget")


class RecordError(MemgasError):
    """A log record that is not one this version writes (damaged or foreign)."""


@dataclass(frozen=True)
class Record:
    """A decoded log record (``op`` and what it needs)."""

    op: str
    conversation_id: str
    session: Optional[Session] = None  # add
    summary: Optional[str] = None  # add
    keywords: Optional[str] = None  # add
    encoded: Optional[Encoded] = None  # add
    session_id: Optional[str] = None  # remove
    metadata: Optional[dict] = None  # add


def _blob(meta: dict, tensors: dict) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                metadata={"record": json.dumps(meta, ensure_ascii=False)})


def add_record(conversation_id: str, session: Session, summary: str, keywords: str,
               encoded: Encoded, metadata: Optional[dict] = None) -> bytes:
    t = {"row": encoded.row.float(), "turns": encoded.turns.float()}
    t.update({f"dense.{k}": v.float() for k, v in encoded.dense.items()})
    return _blob({"op": "add", "conversation": conversation_id,
                  "session": {"id": session.id, "date": session.date,
                              "turns": list(session.turns),
                              "first_lengths": list(session.first_lengths or ())},
                  "summary": summary, "keywords": keywords, "metadata": metadata or {}}, t)


def remove_record(conversation_id: str, session_id: str) -> bytes:
    return _blob({"op": "remove", "conversation": conversation_id,
                  "session": session_id}, {})


def forget_record(conversation_id: str) -> bytes:
    return _blob({"op": "forget", "conversation": conversation_id}, {})


def decode(payload: bytes, where: str) -> Record:
    """The :class:`Record` of ``payload`` (``where``: the log file and LSN, for errors).

    Raises:
        RecordError: not a record of this format (one line naming ``where``).
    """
    from safetensors.torch import load

    try:
        tensors = load(payload)
        meta = _metadata(payload)
        m = json.loads(meta["record"])
        op, conv = m["op"], m["conversation"]
        if op not in _OPS or not isinstance(conv, str):
            raise ValueError(f"operation {op!r}")
        if op == "remove":
            if not isinstance(m["session"], str):
                raise ValueError("session id")
            return Record(op, conv, session_id=m["session"])
        if op == "forget":
            return Record(op, conv)
        s = m["session"]
        if not (isinstance(s["id"], str) and isinstance(s["date"], str)
                and all(isinstance(t, str) for t in s["turns"])
                and isinstance(m["summary"], str) and isinstance(m["keywords"], str)):
            raise ValueError("session fields")
        session = Session(s["id"], s["date"], tuple(s["turns"]),
                          tuple(int(x) for x in s.get("first_lengths") or ()))
        dense = {k[len("dense."):]: v for k, v in tensors.items() if k.startswith("dense.")}
        enc = Encoded(tensors["row"], dense, tensors["turns"])
        md = m.get("metadata") or {}
        if not isinstance(md, dict):
            raise ValueError("metadata")
        return Record(op, conv, session, m["summary"], m["keywords"], enc, metadata=md)
    except (KeyError, TypeError, ValueError, json.JSONDecodeError, RuntimeError) as e:
        raise RecordError(f"{where}: not a memory log record ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:160]})") from None
    except Exception as e:  # safetensors' own errors
        raise RecordError(f"{where}: not a memory log record ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:160]})") from None


def _metadata(payload: bytes) -> dict:
    """The metadata of a safetensors blob (its JSON header's ``__metadata__``)."""
    n = int.from_bytes(payload[:8], "little")
    if n <= 0 or n > len(payload) - 8:
        raise ValueError("header size")
    header = json.loads(payload[8:8 + n].decode("utf-8"))
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or not isinstance(meta.get("record"), str):
        raise ValueError("no record metadata")
    return meta


def as_tensor_rows(encoded: Encoded) -> Encoded:
    """``encoded`` with float32 CPU tensors (what the store keeps)."""
    return Encoded(encoded.row.float().cpu(), {k: v.float().cpu() for k, v in
                                                encoded.dense.items()},
                   encoded.turns.float().cpu())

