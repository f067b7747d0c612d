"""Benchmark points of encoding, index save/load and the end-to-end index of a dataset.

* encoding: :meth:`Encoder.encode` (tokenised once, sorted by length, token-budget
  batches) vs the reference's fixed batches of 64 texts in input order, each batch
  tokenised by the Hugging Face tokenizer with ``padding=True`` (same model, same
  dtype: only the batching differs). Rates count real (non-padding) tokens.
* index save/load: :meth:`MemoryIndex.save` / :meth:`MemoryIndex.load` (safetensors
  + JSON manifest) vs ``torch.save`` / ``torch.load(weights_only=True)`` of the same tensors and
  metadata, in GB/s of the bytes on disk. Loads follow saves, so files are read from
  the page cache: this measures deserialisation, not the disk.
* end-to-end: load a synthetic LongMemEval-format file, :meth:`MemoryIndex.build`
  (expand, encode distinct texts once, graph of all haystacks) and retrieve every
  question, vs the reference way: ``json.load``, then a Python loop per question that
  expands, encodes (fixed-64) and links its own haystack (scikit-learn GMM per node)
  and ranks with igraph PPR.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from .limits import encode_cost
from .timing import PeakMemory, Record, measure, sync

__all__ = ["encode_point", "fixed64_encode", "io_point", "make_index", "index_point",
           "make_encoder"]

Log = Callable[[str], None]


def make_encoder(kind: str, device, tmp: str):
    """``"tiny"`` (random 2-layer BERT), ``"base"`` (random BERT-base, Contriever's size)
    or ``"minilm"`` (the bundled all-MiniLM-L6-v2); all offline."""
    from ..encode import Encoder
    from ..encode.tiny import make_random_bert

    if kind == "minilm":
        return Encoder(device=device)
    if kind not in ("tiny", "base"):
        raise ValueError(f"unknown encoder kind {kind!r} (tiny, base, minilm)")
    path = make_random_bert(os.path.join(tmp, f"bert_{kind}"), base=kind == "base")
    return Encoder(path, device=device, normalize=False)


def fixed64_encode(enc, texts: list[str]) -> int:
    """The reference's encoding: batches of 64 in input order, HF tokenizer per batch,
    mean pooling; returns the real tokens processed."""
    real = 0
    with torch.inference_mode():
        for i in range(0, len(texts), 64):
            b = enc.tokenizer(texts[i:i + 64], padding=True, truncation=True,
                              max_length=enc.max_length, return_tensors="pt")
            ids = b["input_ids"].to(enc.device)
            mask = b["attention_mask"].to(enc.device)
            enc._forward(ids, mask)
            real += int(b["attention_mask"].sum())
    sync(enc.device)
    return real


def encode_point(enc, texts: list[str], *, rounds: int = 1, reference: bool = True,
                 log: Log = print) -> list[Record]:
    """Encoding throughput (real tokens/s), ours vs fixed-64."""
    tok = enc.tokenize(texts)
    lengths = [len(w) for i in range(len(tok)) for w in tok.windows[i]]
    real = sum(lengths)
    cfg = enc.model.config
    flops = encode_cost(lengths, cfg.num_hidden_layers, cfg.hidden_size,
                        cfg.intermediate_size)
    plan = enc.plan(tok)
    padded = sum(len(b) * max(tok.max_len(i) for i in b) for b in plan)
    size = {"texts": len(texts)}
    model = f"{cfg.num_hidden_layers}x{cfg.hidden_size}"
    warm = texts[:64]
    enc.encode(warm, progress=False)
    rec = measure(lambda: enc.encode(texts, progress=False), stage="encode", impl="ours",
                  size=size, work=real, unit="tokens", rounds=rounds, warmup=0,
                  device=enc.device,
                  extra={"flops": flops, "bytes": 0.0, "padding_efficiency": real / padded,
                         "model": model, "dtype": str(enc.dtype).replace("torch.", ""),
                         "token_budget": enc.token_budget})
    recs = [rec]
    if reference:
        fixed64_encode(enc, warm)
        got = {}
        ref = measure(lambda: got.setdefault("real", fixed64_encode(enc, texts)),
                      stage="encode", impl="reference", size=size, work=real, unit="tokens",
                      rounds=rounds, warmup=0, device=enc.device,
                      note="fixed batches of 64, input order",
                      extra={"model": model})
        if got.get("real") != real:
            ref.note += f" (counted {got.get('real')} real tokens)"
        recs.append(ref)
    return recs


def make_index(n_conv: int, n_sessions: int, dim: int, degree: int = 20, seed: int = 0):
    """A :class:`MemoryIndex` of random tensors (every session distinct) for I/O timing."""
    from ..data.model import Question
    from ..memory.index import MemoryIndex
    from ..memory.meta import ConversationMeta
    from ..retrieve.params import GraphParams

    g = torch.Generator().manual_seed(seed)
    rows = n_conv * n_sessions
    n = rows * 4
    indptr = torch.arange(0, n * degree + 1, degree, dtype=torch.long)
    # edges within each conversation (block-diagonal, as every association graph)
    per = 4 * n_sessions
    start = (torch.arange(n) // per * per).repeat_interleave(degree)
    indices = start + torch.randint(0, max(1, per), (n * degree,), generator=g)
    convs = [ConversationMeta(f"c{c}", [f"s{c}_{i}" for i in range(n_sessions)],
                              ["2023/05/20 (Sat) 02:21"] * n_sessions) for c in range(n_conv)]
    qs = [Question(id=f"q{c}", text="what did I say about the garden?", type="single-session-user",
                   date="2023/06/01 (Thu) 10:00", answer="tomatoes",
                   evidence_session_ids=(f"s{c}_0",), is_abstention=False)
          for c in range(n_conv)]
    return MemoryIndex(
        conversations=convs, questions=qs,
        conv_offsets=torch.arange(0, rows + 1, n_sessions, dtype=torch.long),
        row_slot=torch.arange(rows), gran=torch.randn(rows, 4, dim, generator=g),
        concat=torch.randn(rows, dim, generator=g), q_emb=torch.randn(n_conv, dim, generator=g),
        q_conv=torch.arange(n_conv), graphs={"gmm": (indptr, indices)}, params=GraphParams(),
        config={"encoder": {"model": "random"}})


def _folder_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() \
        else p.stat().st_size


def _touch(tensors) -> None:
    """Read every byte of the tensors (a lazily mapped file is then really loaded)."""
    for t in tensors:
        if t is not None and t.numel():
            t.sum()


def _index_tensors(idx) -> list:
    from ..memory.meta import GraphParams

    v = idx.snapshot()
    return [v.conv_offsets, v.row_slot, v.gran, v.concat, idx.q_emb, idx.q_conv,
            *[x for k in sorted(idx.saved_graph_keys(v))
              for x in v.graph(GraphParams.from_key(k, v.params))]]


def io_point(n_conv: int, n_sessions: int, dim: int, tmp: str, *, rounds: int = 3,
             reference: bool = True, log: Log = print) -> list[Record]:
    """Save and load GB/s of an index of ``n_conv`` x ``n_sessions`` sessions."""
    from ..retrieve import MemoryIndex

    idx = make_index(n_conv, n_sessions, dim)
    size = {"haystacks": n_conv, "sessions": n_sessions, "dim": dim}
    base = Path(tmp)
    ours = base / "index_ours"
    idx.save(ours)
    nbytes = _folder_bytes(ours)
    note = "load + a read of every tensor; page cache (load follows save)"
    recs = [measure(lambda: idx.save(ours), stage="io_save", impl="ours", size=size,
                    work=nbytes, unit="bytes", rounds=rounds, warmup=0,
                    note="safetensors + manifest.json, atomic folder"),
            measure(lambda: _touch(_index_tensors(MemoryIndex.load(ours))), stage="io_load", impl="ours", size=size,
                    work=nbytes, unit="bytes", rounds=rounds, warmup=0, note=note)]
    if reference:
        ref = base / "index_ref.pt"
        # plain containers only, so the reference loads with weights_only=True (the
        # project never unpickles arbitrary objects)
        obj = {"tensors": _index_tensors(idx),
               "conversations": [vars(c) for c in idx.conversations],
               "questions": [dict(vars(q), evidence_session_ids=list(q.evidence_session_ids))
                             for q in idx.questions],
               "config": json.loads(json.dumps(idx.config))}
        torch.save(obj, ref)
        rb = _folder_bytes(ref)
        recs.append(measure(lambda: torch.save(obj, ref), stage="io_save", impl="reference",
                            size=size, work=rb, unit="bytes", rounds=rounds, warmup=0,
                            note="torch.save (pickle)"))
        def load_ref():
            _touch(torch.load(ref, weights_only=True)["tensors"])

        recs.append(measure(load_ref, stage="io_load",
                            impl="reference", size=size, work=rb, unit="bytes", rounds=rounds,
                            warmup=0, note="torch.load(weights_only=True) + a read of every tensor; page cache"))
        ref.unlink()
    shutil.rmtree(ours, ignore_errors=True)
    return recs


def index_point(path: str, enc, *, device=None, ref_questions: int = 4,
                full_haystacks: Optional[int] = None, reference: bool = True,
                log: Log = print) -> list[Record]:
    """End-to-end index + retrieval of the LongMemEval-format file ``path``."""
    from ..data import load_dataset
    from ..retrieve import MemoryIndex

    dev = str(device or enc.device)
    seen = _EncodeLog(enc)  # the texts handed to the encoder (counted after the timing)
    t0 = time.perf_counter()
    with PeakMemory(device or enc.device) as peak:
        ds = load_dataset(path)
        t_load = time.perf_counter() - t0
        idx = MemoryIndex.build(ds, seen, device=dev, concat=False, progress=False)
        t1 = time.perf_counter()
        idx.retrieve(method="memgas", device=dev)
        sync(dev)
        t_ret = time.perf_counter() - t1
    total = time.perf_counter() - t0
    C = len(ds)
    N = int(idx.n_rows // max(1, C))
    size = {"haystacks": C, "sessions": N}
    tm = dict(idx.config.get("timings", {}), load_s=t_load, retrieve_s=t_ret)
    enc_stats = idx.config["encoding"]["sessions_and_texts"]
    extra = {"breakdown_s": tm, "distinct_texts": enc_stats["distinct"],
             "texts": enc_stats["texts"], "questions": len(ds.questions),
             "session_slots": sum(len(c.sessions) for c in ds),
             "distinct_sessions": len(ds.distinct_sessions()),
             "texts_encoded": len(seen.texts), "tokens_encoded": seen.tokens()}
    note = "load + build (expand, encode, graph) + retrieve all questions"
    if full_haystacks and full_haystacks != C:
        extra["full_seconds"] = total * full_haystacks / C
        extra["full_haystacks"] = full_haystacks
        note += f"; full_seconds extrapolated x {full_haystacks}/{C} haystacks"
    rec = Record("index", "ours", size, [total], idx.n_rows, "sessions", "", note,
                 peak.host, peak.device, extra)
    recs = [rec]
    if reference:
        try:
            recs.append(_reference_index(path, ds, enc, ref_questions, size, idx.n_rows))
        except ImportError as e:
            log(f"index reference skipped: {e}")
    return recs


class _EncodeLog:
    """An encoder that remembers every text it encodes (all else is delegated)."""

    def __init__(self, enc) -> None:
        self._enc = enc
        self.texts: list = []

    def __getattr__(self, name):
        return getattr(self._enc, name)

    def encode(self, texts, *args, **kwargs):
        self.texts.extend(texts)
        return self._enc.encode(texts, *args, **kwargs)

    def tokens(self) -> Optional[int]:
        """Real tokens the model processed for the logged texts (None if unknown)."""
        count = getattr(self._enc, "count_tokens", None)
        if count is None or not self.texts:
            return None if count is None else 0
        return int(sum(count(self.texts)))


def _reference_index(path, ds, enc, ref_questions: int, size: dict, n_rows: int) -> Record:
    from ..data.model import Dataset
    from ..expand import expand_dataset
    from ..reference import reference_build_graph, reference_session_scores

    def emb(texts):
        if not texts:
            return np.zeros((0, enc.dim), dtype=np.float32)
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), 64):
                b = enc.tokenizer(texts[i:i + 64], padding=True, truncation=True,
                                  max_length=enc.max_length, return_tensors="pt")
                out.append(enc._forward(b["input_ids"].to(enc.device),
                                        b["attention_mask"].to(enc.device)).float().cpu())
        return torch.cat(out).numpy()

    t0 = time.perf_counter()
    with open(path, encoding="utf-8") as f:
        json.load(f)
    t_load = time.perf_counter() - t0
    C = len(ds)
    k = min(C, max(1, ref_questions))
    t0 = time.perf_counter()
    for conv in list(ds)[:k]:
        one = Dataset([conv], format=ds.format, source=ds.source)
        exp = expand_dataset(one)
        N = len(conv.sessions)
        s = emb([x.text for x in conv.sessions])
        turns = [emb(list(x.turns)) for x in conv.sessions]
        t = np.stack([tt.mean(0) if len(tt) else np.zeros(s.shape[1], np.float32)
                      for tt in turns])
        u, kw = emb(list(exp.summaries[conv.id])), emb(list(exp.keywords[conv.id]))
        nodes = np.stack([s, t, u, kw], axis=1).reshape(N * 4, -1)
        sess = np.repeat(np.arange(N), 4)
        graph = reference_build_graph(nodes, sess)
        q = emb([x.text for x in conv.questions])
        if len(q):
            sc = reference_session_scores(q, nodes, sess, np.tile(np.arange(4), N), graph, N)
            np.argsort(-sc, axis=1)
    loop = (time.perf_counter() - t0) * C / k
    note = ("json.load + Python loop per question (expand, fixed-64 encode, sklearn GMM "
            "per node, igraph PPR)" + ("" if k == C else f", loop extrapolated from {k} of "
                                       f"{C} questions"))
    return Record("index", "reference", size, [t_load + loop], n_rows, "sessions", "", note)
