"""Validation of what every reader reads (a commit, an older folder, a log record's
session) before a :class:`MemoryIndex` is made of it (``docs/index-format.md``,
``docs/failure.md``): one set of checks over the *parts* of a memory —
:func:`check_header` (settings and records), :func:`check_conversations`,
:func:`check_questions`, :func:`check_store` (the session store's tensors),
:func:`check_segments` (each conversation's slots, dates and graphs) — run by
:func:`check_parts` on every path that reads a folder, and by ``save`` on what it is
about to write.

Every inconsistency (a missing or mistyped key, a value out of range, an unknown graph
or tokenizer, an exact dtype, a shape, offset or index out of range, text that is not
UTF-8, a NaN embedding, contents that differ from the checksums written with them)
raises :class:`IndexFormatError` naming the file and the field, so a corrupted or
hand-edited index fails with one line instead of a traceback or, worse, a silent wrong
ranking.  Every check is a few vectorised tensor operations or one pass of C code
(UTF-8 decoding, CRC-32) over a tensor: no Python loop over the elements.
"""
from __future__ import annotations

import codecs
import re
from typing import Any, Optional

import torch
from torch import Tensor

from ..encode.record import EncoderRecordError, check_encoder_record
from ..errors import MemgasError
from ..lexical.tokenize import Tokenizer
from ..retrieve.params import MAX_SETTING, GraphParams
from ..retrieve.signals import MODULE_NAME, RESERVED_TABLES
from ..retrieve.filters import check_metadata
from ..memory.store import DIGEST_BYTES

__all__ = ["IndexFormatError", "want", "check_parts", "check_header", "check_conversations",
           "check_questions", "check_store", "check_segments", "EMBEDDINGS", "MAX_SETTING"]

#: tensors holding embeddings: refused when they hold NaN or inf
EMBEDDINGS = ("gran", "concat", "q_emb", "turns")
_GRAPH_NAME = re.compile(r"gmm|topk[1-9][0-9]{0,6}")
#: fields of the manifest's ``config`` that are objects when present
_CONFIG_OBJECTS = ("expansion", "build", "encoding", "timings", "dataset", "encoder",
                   "lexical")
_QUESTION = {"id": str, "text": str, "type": str, "date": str, "answer": str,
             "evidence_session_ids": list, "is_abstention": bool}
_LEXICAL_GROUPS = ("S", "T", "U", "K", "q")
_INTS = (torch.int64,)
_BYTES = (torch.uint8,)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class IndexFormatError(MemgasError):
    """An index folder that this version cannot read (corrupted, edited or newer)."""


def _type_name(typ) -> str:
    return {dict: "an object", list: "a list", str: "a string", int: "an integer",
            bool: "true or false"}.get(typ, typ.__name__)


def _want(where: str, obj: Any, key: str, typ, field: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise IndexFormatError(f"{where}: field {field!r}: missing")
    value = obj[key]
    ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
    if not ok:
        raise IndexFormatError(f"{where}: field {field!r}: expected {_type_name(typ)}, got "
                               f"{type(value).__name__}")
    return value


def _strings(where: str, value: list, field: str) -> None:
    for i, s in enumerate(value):
        if not isinstance(s, str):
            raise IndexFormatError(f"{where}: field '{field}[{i}]': expected a string, got "
                                   f"{type(s).__name__}")


def _unique(where: str, values: list, field: str, what: str) -> None:
    if len(set(values)) != len(values):
        seen = set()
        dup = next(v for v in values if v in seen or seen.add(v))
        raise IndexFormatError(f"{where}: field {field!r}: {what} {dup[:80]!r} appears twice")


def _check_params(where: str, params: dict) -> None:
    """The manifest's ``params`` against :class:`GraphParams`' field specs (JSON types:
    an integer is not a float, a string is not a number)."""
    specs = GraphParams.specs()
    for k, v in params.items():
        if k not in specs:
            raise IndexFormatError(f"{where}: field 'params.{k}': unknown setting (known: "
                                   f"{', '.join(specs)})")
        spec = specs[k]
        _want(where, params, k, str if spec.kind == "choice" else int, f"params.{k}")
        if spec.kind == "choice" and v not in spec.choices:
            raise IndexFormatError(f"{where}: field 'params.{k}': {v[:40]!r} is not one of "
                                   f"{', '.join(spec.choices)}")
        if spec.kind == "int" and not spec.lo <= v <= spec.hi:
            raise IndexFormatError(f"{where}: field 'params.{k}': {str(v)[:40]} is outside "
                                   f"[{spec.lo}, {spec.hi}]")


def check_header(where: str, m: Any) -> None:
    """Types, ranges and keys of a memory's settings and records: ``params``,
    ``graphs``, ``config`` (the encoder record included), ``signal_modules``,
    ``tables``, ``lexical``; ``where`` names the file."""
    if not isinstance(m, dict):
        raise IndexFormatError(f"{where}: expected a JSON object, got {type(m).__name__}")
    _check_params(where, _want(where, m, "params", dict, "params"))
    graphs = _want(where, m, "graphs", list, "graphs")
    _strings(where, graphs, "graphs")
    for i, g in enumerate(graphs):
        if not _GRAPH_NAME.fullmatch(g):
            raise IndexFormatError(f"{where}: field 'graphs[{i}]': {g[:40]!r} is not a graph "
                                   "name ('gmm' or 'topk' and a number)")
    _unique(where, graphs, "graphs", "graph")
    config = _want(where, m, "config", dict, "config")
    for k in _CONFIG_OBJECTS:  # records the code reads by field
        if k in config and config[k] is not None:
            _want(where, config, k, dict, f"config.{k}")
    exp = config.get("expansion") or {}
    for k in ("summaries", "keywords"):
        if exp.get(k) is not None and not isinstance(exp[k], (dict, str)):
            raise IndexFormatError(f"{where}: field 'config.expansion.{k}': expected an "
                                   f"object or a string, got {type(exp[k]).__name__}")
    try:
        check_encoder_record(config)
    except EncoderRecordError as e:
        raise IndexFormatError(f"{where}: {e}") from None
    mods = m.get("signal_modules")
    if mods is not None:  # optional: the modules of custom signals
        _want(where, m, "signal_modules", dict, "signal_modules")
        for k, v in mods.items():
            if not isinstance(v, str) or not MODULE_NAME.fullmatch(v) or not _NAME.fullmatch(k):
                raise IndexFormatError(f"{where}: field 'signal_modules.{k[:40]}': expected "
                                       "a module name (dotted identifiers)")
    if m.get("tables") is not None:  # dense tables of signals with a text of their own
        _names(where, _want(where, m, "tables", list, "tables"), "tables")
    lex = m.get("lexical")
    if lex is not None:
        _want(where, m, "lexical", dict, "lexical")
        if "granularities" in lex:
            keys = _want(where, lex, "granularities", list, "lexical.granularities")
            _names(where, keys, "lexical.granularities")
            if not set(_LEXICAL_GROUPS[:-1]) <= set(keys):
                raise IndexFormatError(f"{where}: field 'lexical.granularities': must hold "
                                       f"{', '.join(_LEXICAL_GROUPS[:-1])}")
        tok = _want(where, lex, "tokenizer", dict, "lexical.tokenizer")
        try:
            Tokenizer.check_config(tok)
        except ValueError as e:
            field, _, what = str(e).partition(": ")
            raise IndexFormatError(f"{where}: field 'lexical.tokenizer.{field}': {what}") \
                from None


def check_conversations(where: str, convs: Any, field: str = "conversations") -> None:
    """Each conversation's record ``{"id", "session_ids", "session_dates",
    "session_metadata"}``: strings, equal lengths, valid metadata, unique ids."""
    if not isinstance(convs, list):
        raise IndexFormatError(f"{where}: field {field!r}: expected a list")
    for c, conv in enumerate(convs):
        f = f"{field}[{c}]"
        _want(where, conv, "id", str, f"{f}.id")
        ids = _want(where, conv, "session_ids", list, f"{f}.session_ids")
        dates = _want(where, conv, "session_dates", list, f"{f}.session_dates")
        _strings(where, ids, f"{f}.session_ids")
        _strings(where, dates, f"{f}.session_dates")
        if len(ids) != len(dates):
            raise IndexFormatError(f"{where}: field '{f}.session_dates': {len(dates)} dates "
                                   f"for {len(ids)} sessions")
        md = conv.get("session_metadata")
        if md is not None:
            _want(where, conv, "session_metadata", list, f"{f}.session_metadata")
            if len(md) != len(ids):
                raise IndexFormatError(f"{where}: field '{f}.session_metadata': {len(md)} "
                                       f"entries for {len(ids)} sessions")
            for j, x in enumerate(md):
                try:
                    check_metadata(x, f"{f}.session_metadata[{j}]")
                except (TypeError, ValueError) as e:
                    raise IndexFormatError(f"{where}: field {e}") from None
        _unique(where, ids, f"{f}.session_ids", "session id")
    _unique(where, [c["id"] for c in convs], field, "conversation id")


def check_questions(where: str, records: Any, conversations: Any, conv_ids) -> None:
    """The dataset's questions: each record's fields, and the conversation each asks
    about (one of ``conv_ids``)."""
    if not isinstance(records, list):
        raise IndexFormatError(f"{where}: field 'questions': expected a list")
    for i, q in enumerate(records):
        for k, typ in _QUESTION.items():
            _want(where, q, k, typ, f"questions[{i}].{k}")
        _strings(where, q["evidence_session_ids"], f"questions[{i}].evidence_session_ids")
        if "evidence_turn_ids" in q:  # optional: indexes written before turn evidence
            _want(where, q, "evidence_turn_ids", list, f"questions[{i}].evidence_turn_ids")
            _strings(where, q["evidence_turn_ids"], f"questions[{i}].evidence_turn_ids")
    if not isinstance(conversations, list) or len(conversations) != len(records):
        raise IndexFormatError(f"{where}: field 'question_conversations': expected one "
                               "conversation id per question")
    known = conv_ids if isinstance(conv_ids, _Known) else set(conv_ids)
    for i, c in enumerate(conversations):
        if c not in known:
            raise IndexFormatError(f"{where}: field 'question_conversations[{i}]': "
                                   f"{str(c)[:80]!r} is not a conversation of the index")


def _finite(where: str, name: str, x: Tensor) -> None:
    # a norm that overflows float32 (|x| ~ 1e19) would make NaN similarities too
    if not x.numel():
        return
    norms = torch.linalg.vector_norm(x.float(), dim=-1)
    if not bool(torch.isfinite(norms).all()):
        bad = int((~torch.isfinite(norms)).sum())
        raise IndexFormatError(f"{where}: tensor {name!r}: {bad} embedding(s) hold NaN or "
                               "inf, or overflow (a corrupted file or a bad encoder output); "
                               "rebuild the index")


def _terms(where: str, name: str, indptr: Tensor, indices: Tensor, tf: Tensor,
           n_rows: Optional[int], n_terms: int) -> None:
    t = {f"{name}.indptr": indptr, f"{name}.indices": indices}
    _csr(where, t, name, n_rows, n_terms)
    _tensor(where, {f"{name}.tf": tf}, f"{name}.tf", 1, _FLOATS)
    if tf.numel() != indices.numel():
        raise IndexFormatError(f"{where}: tensor '{name}.tf': {tf.numel()} counts for "
                               f"{indices.numel()} terms")
    if not bool(torch.isfinite(tf).all()) or bool((tf < 0).any()):
        raise IndexFormatError(f"{where}: tensor '{name}.tf': negative, NaN or inf term "
                               "counts")


def check_store(where: str, s: dict, header: dict) -> tuple[int, int, int]:
    """The session store's tensors (``gran``, the dense tables, digests, turn pointers,
    embeddings and texts, lexical documents and vocabulary) against the header;
    returns ``(slots, dim, vocabulary terms)``."""
    t = {"gran": s.get("gran")} if s.get("gran") is not None else {}
    gran = _tensor(where, t, "gran", 3, _FLOATS, shape=(None, 4, None))
    n_slots, dim = gran.shape[0], gran.shape[2]
    if header.get("dim") is not None and header["dim"] != dim:
        raise IndexFormatError(f"{where}: field 'dim': {header['dim']}, the embeddings have "
                               f"{dim}")
    tables = header.get("tables")
    dense = s.get("dense") or {}
    if tables is not None and sorted(tables) != sorted(dense):
        raise IndexFormatError(f"{where}: field 'tables': {sorted(tables)}, the store holds "
                               f"{sorted(dense)}")
    for name, x in dense.items():
        _tensor(where, {name: x}, name, 2, _FLOATS, shape=(n_slots, dim))
        _finite(where, name, x)
    _finite(where, "gran", gran)
    if s.get("digest") is not None:
        _tensor(where, {"slot_digest": s["digest"]}, "slot_digest", 2, _BYTES,
                shape=(n_slots, DIGEST_BYTES))
    if s.get("turn_ptr") is not None:
        ptr = _tensor(where, {"turn_ptr": s["turn_ptr"]}, "turn_ptr", 1,
                      shape=(n_slots + 1,))
        _pointers(where, "turn_ptr", ptr)
        n_turns = int(ptr[-1])
        if s.get("turns") is not None:
            _tensor(where, {"turns": s["turns"]}, "turns", 2, _FLOATS, shape=(n_turns, dim))
            _finite(where, "turns", s["turns"])
        if s.get("turn_text") is not None:
            tt = s["turn_text"]
            _texts(where, {"turn_text.bytes": tt.data, "turn_text.offsets": tt.offsets},
                   "turn_text", n_turns)
    elif s.get("turns") is not None or s.get("turn_text") is not None:
        raise IndexFormatError(f"{where}: tensor 'turn_ptr': missing")
    n_terms = 0
    lex = s.get("lexical")
    if (lex is None) != (header.get("lexical") is None):
        raise IndexFormatError(f"{where}: field 'lexical': the header and the store disagree "
                               "on lexical documents")
    if lex is not None:
        docs, ptrs, vocab_bytes, vocab_offsets = lex
        _texts(where, {"vocab.bytes": vocab_bytes, "vocab.offsets": vocab_offsets}, "vocab",
               None)
        n_terms = vocab_offsets.numel() - 1
        want = header["lexical"].get("granularities") or list(_LEXICAL_GROUPS[:-1])
        if sorted(want) != sorted(docs):
            raise IndexFormatError(f"{where}: field 'lexical.granularities': {sorted(want)}, "
                                   f"the store holds {sorted(docs)}")
        for g, (indptr, indices, tf) in docs.items():
            _terms(where, f"lexical.{g}", indptr, indices, tf, None, n_terms)
            ptr = _tensor(where, {"p": ptrs[g]}, "p", 1, shape=(n_slots + 1,))
            _pointers(where, f"lexical.{g}.doc_ptr", ptr, indptr.numel() - 1)
    return n_slots, dim, n_terms


def check_segments(where: str, segments: list, n_slots: int, graphs: list) -> None:
    """Each conversation's slots (``[n]`` int64 into the store), parsed dates (``[n]``
    float64) and association graphs (one per name of ``graphs``: CSR over its ``4n``
    nodes)."""
    check_conversations(where, [m for m, *_ in segments])
    for c, (meta, slots, days, g) in enumerate(segments):
        w = f"{where}: conversation {meta['id'][:80]!r}"
        n = len(meta["session_ids"])
        _tensor(w, {"slots": slots}, "slots", 1, shape=(n,))
        _in_range(w, "slots", slots, 0, n_slots)
        if days is not None:
            _tensor(w, {"days": days}, "days", 1, (torch.float64,), shape=(n,))
        missing = set(graphs) - set(g)
        if missing:
            raise IndexFormatError(f"{w}: graph {sorted(missing)[0]!r}: missing")
        for k, (ip, ix) in g.items():
            if ix is None:
                raise IndexFormatError(f"{w}: tensor 'graph.{k}.indices': missing")
            _csr(w, {f"graph.{k}.indptr": ip, f"graph.{k}.indices": ix}, f"graph.{k}",
                 4 * n, 4 * n)


def check_parts(where: str, parts) -> None:
    """Every check above over what a reader read (a
    :class:`~memgas_gpu.storage.commit.Parts`): settings, the store, each conversation,
    the questions and their tensors.

    Raises:
        IndexFormatError: the first inconsistency, one line naming ``where`` and the
            field.
    """
    h = parts.header
    check_header(where, h)
    if isinstance(parts.store, dict):
        n_slots, dim, n_terms = check_store(where, parts.store, h)
    else:  # chunks read when needed, each checked then
        n_slots, dim, n_terms = parts.store.n_slots, parts.store.dim, 0
        tables = h.get("tables")
        if tables is not None and sorted(tables) != parts.store.dense_names:
            raise IndexFormatError(f"{where}: field 'tables': {sorted(tables)}, the store "
                                   f"holds {parts.store.dense_names}")
    q = parts.questions
    if isinstance(parts.segments, list):
        check_segments(where, parts.segments, n_slots, h["graphs"])
        known = [m["id"] for m, *_ in parts.segments]
    else:  # a directory read lazily: each segment is checked when it is read
        known = _Known(parts.segments)
    check_questions(where, q.get("records"), q.get("conversations"), known)
    n_q = len(q["records"])
    q_emb = _tensor(where, {"q_emb": q.get("q_emb")} if q.get("q_emb") is not None else {},
                    "q_emb", 2, _FLOATS, shape=(n_q, dim))
    _finite(where, "q_emb", q_emb)
    terms = q.get("terms")
    if (terms is None) != (h.get("lexical") is None):
        raise IndexFormatError(f"{where}: tensor 'lexical.q.indptr': the questions' terms "
                               "and the store's lexical documents disagree")
    if terms is not None:
        _terms(where, "lexical.q", *terms, n_q, n_terms)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class _Known:
    """The conversation ids of a directory read lazily (one leaf read per lookup)."""

    def __init__(self, directory) -> None:
        self.directory = directory

    def __contains__(self, cid) -> bool:
        return isinstance(cid, str) and self.directory.entry(cid) is not None


def _names(where: str, names: list, field: str) -> None:
    """Table or document-set names: distinct identifiers, none of the index's own."""
    for i, x in enumerate(names):
        if not isinstance(x, str) or not _NAME.fullmatch(x) or x in RESERVED_TABLES \
                or x == "q":
            raise IndexFormatError(f"{where}: field '{field}[{i}]': expected a name of at "
                                   "most 64 letters, digits or '_', not one of the index's "
                                   "own tensors")
    if len(set(names)) != len(names):
        raise IndexFormatError(f"{where}: field '{field}': a name appears twice")


def _tensor(where: str, t: dict, name: str, ndim: int, dtypes: tuple = _INTS,
            shape: Optional[tuple] = None) -> Tensor:
    if name not in t:
        raise IndexFormatError(f"{where}: tensor {name!r}: missing")
    x = t[name]
    if x.dim() != ndim:
        raise IndexFormatError(f"{where}: tensor {name!r}: expected {ndim} dimensions, got "
                               f"shape {list(x.shape)}")
    if x.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise IndexFormatError(f"{where}: tensor {name!r}: dtype "
                               f"{str(x.dtype).replace('torch.', '')}, expected {want}")
    if shape is not None:
        for i, (got, want) in enumerate(zip(x.shape, shape)):
            if want is not None and got != want:
                raise IndexFormatError(f"{where}: tensor {name!r}: dimension {i} is {got}, "
                                       f"expected {want} (shape {list(x.shape)})")
    return x


def _in_range(where: str, name: str, x: Tensor, lo: int, hi: int) -> None:
    if x.numel() and (int(x.min()) < lo or int(x.max()) >= hi):
        raise IndexFormatError(f"{where}: tensor {name!r}: values outside [{lo}, {hi})")


def _pointers(where: str, name: str, x: Tensor, end: Optional[int] = None) -> None:
    """``x`` starts at 0, never decreases and (if given) ends at ``end``."""
    if x.numel() == 0 or int(x[0]) != 0 or bool((x[1:] < x[:-1]).any()) or \
            (end is not None and int(x[-1]) != end):
        tail = "" if end is None else f" ending at {end}"
        raise IndexFormatError(f"{where}: tensor {name!r}: not non-decreasing offsets from 0"
                               f"{tail}")


def _csr(where: str, t: dict, pre: str, n_rows: Optional[int], n_cols: int) -> None:
    indptr = _tensor(where, t, f"{pre}.indptr", 1,
                     shape=(None if n_rows is None else n_rows + 1,))
    indices = _tensor(where, t, f"{pre}.indices", 1)
    _pointers(where, f"{pre}.indptr", indptr, indices.numel())
    _in_range(where, f"{pre}.indices", indices, 0, n_cols)


def _texts(where: str, t: dict, pre: str, n: Optional[int]) -> None:
    """A packed string table (``PRE.bytes`` uint8, ``PRE.offsets`` int64) of ``n``
    strings (if given): offsets from 0 to the end of the bytes (an empty table may keep
    one pad byte), every string valid UTF-8 and cut at character boundaries."""
    data = _tensor(where, t, f"{pre}.bytes", 1, _BYTES)
    off = _tensor(where, t, f"{pre}.offsets", 1, shape=(None if n is None else n + 1,))
    # TextTable.from_strings keeps one pad byte when every string is empty
    pad = data.numel() == 1 and off.numel() > 0 and int(off[-1]) == 0
    end = 0 if pad else data.numel()
    _pointers(where, f"{pre}.offsets", off, end)
    raw = data[:end].numpy()
    try:
        codecs.utf_8_decode(raw, "surrogatepass", True)
    except UnicodeDecodeError as e:
        raise IndexFormatError(f"{where}: tensor '{pre}.bytes': not UTF-8 text at byte "
                               f"{e.start} ({e.reason})") from None
    starts = off[:-1][off[:-1] < end]
    if bool(((data[starts] & 0xC0) == 0x80).any()):
        raise IndexFormatError(f"{where}: tensor '{pre}.offsets': a string starts inside a "
                               "UTF-8 character")

def want(where: str, obj, key: str, typ):
    """The field ``key`` of the JSON object ``obj`` (read at ``where``), of type ``typ``
    (a bool is not an int); IndexFormatError naming the field otherwise."""
    if not isinstance(obj, dict) or key not in obj:
        raise IndexFormatError(f"{where}: field {key!r}: missing")
    v = obj[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise IndexFormatError(f"{where}: field {key!r}: expected {typ.__name__}, got "
                               f"{type(v).__name__}")
    return v
