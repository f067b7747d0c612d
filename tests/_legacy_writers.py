"""Writers of the older folder formats (1, 2 and 3), for the tests of the one legacy
reader: what earlier versions of memgas_gpu wrote, laid out here from
docs/index-format.md's description of them (a version-2 snapshot behind a pointer, a
version-1 folder, a version-3 durable memory with its checkpoint files and a log of
format-1 records)."""
from __future__ import annotations

import json
import struct
import uuid
import zlib
from pathlib import Path

import torch


def _crc(x: torch.Tensor) -> int:
    return zlib.crc32(x.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def packed(index) -> tuple[dict, dict]:
    """The whole-index manifest and tensors a version-1/2 save wrote."""
    view = index.snapshot()
    t = view.tables
    tensors = {"conv_offsets": view.conv_offsets, "row_slot": view.row_slot,
               "gran": view.gran.float(), "q_emb": index.q_emb.float(), "q_conv": index.q_conv}
    for name, x in t.dense.items():
        tensors[name] = x.float()
    if t.digest is not None:
        tensors["slot_digest"] = t.digest
    if view.turn_ptr is not None:
        tensors["turn_ptr"] = view.turn_ptr
    if view.turns is not None:
        tensors["turns"] = view.turns.float()
    if view.turn_text is not None:
        tensors["turn_text.bytes"] = view.turn_text.data
        tensors["turn_text.offsets"] = view.turn_text.offsets
    if view.lexical is not None:
        tensors.update(view.lexical.tensors("lexical."))
    keys = sorted(index.saved_graph_keys(view))
    for key in keys:
        from memgas_gpu.retrieve.params import GraphParams

        ip, ix = view.graph(GraphParams.from_key(key, view.params))
        tensors[f"graph.{key}.indptr"], tensors[f"graph.{key}.indices"] = ip, ix
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    lex = view.lexical
    manifest = {
        "format": "memgas_gpu.index", "version": 2, "params": vars(view.params),
        "graphs": keys, "tables": sorted(t.dense), "signal_modules": {},
        "config": view.config, "lexical": lex.describe() if lex is not None else None,
        "conversations": [{"id": c.id, "session_ids": c.session_ids,
                           "session_dates": c.session_dates,
                           **({"session_metadata": c.session_metadata}
                              if c.session_metadata else {})} for c in view.conversations],
        "questions": [{"id": q.id, "text": q.text, "type": q.type, "date": q.date,
                       "answer": q.answer, "evidence_session_ids": list(q.evidence_session_ids),
                       "evidence_turn_ids": list(q.evidence_turn_ids),
                       "is_abstention": q.is_abstention} for q in index.questions],
        "tensor_crc32": {k: _crc(v) for k, v in tensors.items()},
    }
    return manifest, tensors


def write_v2(index, folder) -> Path:
    """A version-2 folder: a pointer naming one complete version ``v-<hex>/``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    manifest, tensors = packed(index)
    name = f"v-{uuid.uuid4().hex}"
    (folder / name).mkdir(parents=True)
    save_file(tensors, str(folder / name / "tensors.safetensors"),
              metadata={"format": "memgas_gpu.index"})
    raw = json.dumps(manifest).encode()
    (folder / name / "manifest.json").write_bytes(raw)
    (folder / "manifest.json").write_text(json.dumps(
        {"format": "memgas_gpu.index", "version": 2, "current": name,
         "manifest_crc32": zlib.crc32(raw)}))
    return folder


def write_v1(index, folder) -> Path:
    """A version-1 folder: the manifest and the tensors at its top."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True)
    manifest, tensors = packed(index)
    manifest["version"] = 1
    save_file(tensors, str(folder / "tensors.safetensors"))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _v1_log(wal: Path, first: int, payloads: list) -> None:
    """A log file of format 1: records ``length | CRC-32 of (LSN + payload) | LSN |
    payload`` from LSN ``first``."""
    wal.mkdir(parents=True, exist_ok=True)
    head = struct.pack("<8sIQ", b"MGAS-WAL", 1, first)
    out = [head, struct.pack("<I", zlib.crc32(head))]
    for k, p in enumerate(payloads):
        lsn = struct.pack("<Q", first + k)
        out += [struct.pack("<II", len(p), zlib.crc32(p, zlib.crc32(lsn))), lsn, p]
    (wal / f"{first:020d}.log").write_bytes(b"".join(out))


def v1_record(op) -> bytes:
    """A format-1 record (one operation) of an ``AddOp`` / ``RemoveOp`` / ``ForgetOp``."""
    from safetensors.torch import save

    from memgas_gpu.memory.writes import AddOp, RemoveOp

    if isinstance(op, AddOp):
        e, s = op.encoded, op.session
        t = {"row": e.row.float(), "turns": e.turns.float(),
             **{f"dense.{k}": v.float() for k, v in e.dense.items()}}
        meta = {"op": "add", "conversation": op.conversation_id,
                "session": {"id": s.id, "date": s.date, "turns": list(s.turns),
                            "first_lengths": []},
                "summary": op.summary, "keywords": op.keywords, "metadata": op.metadata or {}}
    elif isinstance(op, RemoveOp):
        t, meta = {}, {"op": "remove", "conversation": op.conversation_id,
                       "session": op.session_id}
    else:
        t, meta = {}, {"op": "forget", "conversation": op.conversation_id}
    return save(t, metadata={"record": json.dumps(meta)})


def write_v3(index, folder, lsn: int = 0, records: list = ()) -> Path:
    """A version-3 durable folder: a checkpoint of ``index`` covering LSN ``lsn`` (one
    store chunk, a file per conversation, the questions' file, a checkpoint manifest,
    the pointer) and a format-1 log holding ``records`` (payloads) from ``lsn + 1``."""
    from memgas_gpu.storage import commit, pack

    folder = Path(folder)
    (folder / "data").mkdir(parents=True)
    inp = index.commit_input()
    t = inp.tables

    def save(kind, blob):
        name = f"data/{kind}-{uuid.uuid4().hex}.safetensors"
        (folder / name).write_bytes(blob)
        return {"file": name, "crc": zlib.crc32(blob)}

    n_terms = t.n_terms if t.lexical_base is not None else 0
    chunk = save("store", commit._chunk_blob(t, 0, t.n_slots, 0, n_terms, torch.float32))
    chunk.update(slots=[0, t.n_slots], terms=[0, n_terms])
    segs = []
    for s in inp.segments:
        e = save("seg", commit._segment_blob(s, inp.graph_keys))
        e["id"] = s.meta.id
        segs.append(e)
    q = inp.questions
    qt = {"q_emb": q["q_emb"]}
    if q["terms"] is not None:
        qt.update({"lexical.q.indptr": q["terms"].indptr, "lexical.q.indices": q["terms"].indices,
                   "lexical.q.tf": q["terms"].tf})
    base = save("base", pack.tensor_blob(qt))
    m = dict(inp.header, format="memgas_gpu.index", version=3, lsn=lsn,
             generation=int(t.generation), graphs=sorted(inp.graph_keys),
             dim=int(t.gran.shape[-1]), questions=q["records"],
             question_conversations=q["conversations"], base=base, chunks=[chunk],
             segments=segs)
    raw = json.dumps(m).encode()
    name = f"ckpt-{uuid.uuid4().hex}.json"
    (folder / name).write_bytes(raw)
    (folder / "manifest.json").write_text(json.dumps(
        {"format": "memgas_gpu.index", "version": 3, "current": name,
         "manifest_crc32": zlib.crc32(raw)}))
    _v1_log(folder / "wal", lsn + 1, list(records))
    (folder / "wal" / ".lock").write_text("")
    return folder
