"""The write-ahead log's records: one per acknowledged write of a memory.

A write is one or more operations (:mod:`memgas_gpu.memory.writes`: ``AddOp``,
``RemoveOp``, ``ForgetOp``, ``ReplaceOp``) applied together: ``add_session`` is one,
``add_sessions`` is several in one record, so a replay applies all of them or none.  A
record is a safetensors blob (:func:`safetensors.torch.save`): its metadata holds the
operations as JSON (``{"v": 2, "ops": [{"op": "add", ...}, ...]}``), its tensors the
embeddings each add stored (:class:`~memgas_gpu.memory.writes.Encoded`, under
``"<i>.row"``, ``"<i>.turns"``, ``"<i>.dense.<table>"``), so that a replay links exactly
what was acknowledged without the encoder.  Records of one operation written before
batches existed (``{"op": ...}``) are read too.  No pickle: a record is data, checked
when decoded (types, shapes, finite embeddings).
"""
from __future__ import annotations

import json

from ..data.model import Session
from ..errors import MemgasError
from ..memory.writes import AddOp, Encoded, ForgetOp, Op, RemoveOp, ReplaceOp

__all__ = ["RecordError", "encode", "decode"]

_VERSION = 2


class RecordError(MemgasError):
    """A log record that is not one this version writes (damaged or foreign)."""


def _op_json(i: int, op: Op, tensors: dict) -> dict:
    if isinstance(op, AddOp):
        e = op.encoded
        tensors[f"{i}.row"] = e.row.float()
        tensors[f"{i}.turns"] = e.turns.float()
        tensors.update({f"{i}.dense.{k}": v.float() for k, v in e.dense.items()})
        s = op.session
        return {"op": "replace" if isinstance(op, ReplaceOp) else "add",
                "conversation": op.conversation_id,
                "session": {"id": s.id, "date": s.date, "turns": list(s.turns),
                            "first_lengths": list(s.first_lengths or ())},
                "summary": op.summary, "keywords": op.keywords,
                "metadata": op.metadata or {}}
    if isinstance(op, RemoveOp):
        return {"op": "remove", "conversation": op.conversation_id, "session": op.session_id}
    if isinstance(op, ForgetOp):
        return {"op": "forget", "conversation": op.conversation_id}
    raise TypeError(f"not a memory operation: {type(op).__name__}")


def encode(ops) -> bytes:
    """The record of one write: the operations ``ops`` (one, or a batch) applied
    together."""
    from safetensors.torch import save

    tensors: dict = {}
    body = [_op_json(i, op, tensors) for i, op in enumerate(ops)]
    return save({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                metadata={"record": json.dumps({"v": _VERSION, "ops": body},
                                               ensure_ascii=False)})


def _str(x, what: str) -> str:
    if not isinstance(x, str):
        raise ValueError(f"{what}: expected a string")
    return x


def _embeddings(tensors: dict, prefix: str, n_turns: int) -> Encoded:
    import torch

    row, turns = tensors[f"{prefix}row"], tensors[f"{prefix}turns"]
    dense = {k[len(prefix) + 6:]: v for k, v in tensors.items()
             if k.startswith(prefix + "dense.")}
    if row.dim() != 2 or row.shape[0] != 4:
        raise ValueError(f"embeddings of shape {tuple(row.shape)}, not [4, d]")
    d = row.shape[1]
    if tuple(turns.shape) != (n_turns, d):
        raise ValueError(f"turn embeddings of shape {tuple(turns.shape)}, not [{n_turns}, {d}]")
    for k, v in dense.items():
        if tuple(v.shape) != (d,):
            raise ValueError(f"table {k!r} of shape {tuple(v.shape)}, not [{d}]")
    for x in (row, turns, *dense.values()):
        if x.dtype != torch.float32:
            raise ValueError(f"embeddings of dtype {x.dtype}")
        if x.numel() and not bool(torch.isfinite(x).all()):
            raise ValueError("embeddings holding NaN or inf")
    return Encoded(row, dense, turns)


def _op(m: dict, tensors: dict, prefix: str) -> Op:
    from ..retrieve.filters import check_metadata

    op, conv = m["op"], _str(m["conversation"], "conversation")
    if op == "remove":
        return RemoveOp(conv, _str(m["session"], "session id"))
    if op == "forget":
        return ForgetOp(conv)
    if op not in ("add", "replace"):
        raise ValueError(f"operation {op!r}")
    s = m["session"]
    turns = s["turns"]
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise ValueError("session turns")
    session = Session(_str(s["id"], "session id"), _str(s["date"], "session date"),
                      tuple(turns), tuple(int(x) for x in s.get("first_lengths") or ()))
    enc = _embeddings(tensors, prefix, len(turns))
    md = check_metadata(m.get("metadata") or {}, "metadata")
    cls = ReplaceOp if op == "replace" else AddOp
    return cls(conv, session, _str(m["summary"], "summary"), _str(m["keywords"], "keywords"),
               enc, metadata=md)


def decode(payload: bytes, where: str) -> list:
    """The operations of a record (``where``: the log file and LSN, for errors).

    Raises:
        RecordError: not a record of this format (one line naming ``where``).
    """
    from safetensors.torch import load

    try:
        tensors = load(payload)
        m = json.loads(_metadata(payload)["record"])
        if not isinstance(m, dict):
            raise ValueError("not an object")
        if "ops" not in m:  # one operation, as written before batches existed
            return [_op(m, {k: v for k, v in tensors.items()}, "")]
        if m.get("v") != _VERSION or not isinstance(m["ops"], list) or not m["ops"]:
            raise ValueError(f"record version {m.get('v')!r}")
        return [_op(o, tensors, f"{i}.") for i, o in enumerate(m["ops"])]
    except (KeyError, TypeError, ValueError, AttributeError, json.JSONDecodeError,
            RuntimeError) as e:
        raise RecordError(f"{where}: not a memory log record ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:160]})") from None
    except Exception as e:  # noqa: BLE001 - safetensors' own errors
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
