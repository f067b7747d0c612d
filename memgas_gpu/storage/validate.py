"""Validation of an index folder's manifest and tensors before a :class:`MemoryIndex`
is made of them (``docs/index-format.md``, ``docs/failure.md``), on load and, before
anything is written, on save.

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
import zlib
from concurrent.futures import ThreadPoolExecutor
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

__all__ = ["IndexFormatError", "check_manifest", "check_tensors", "tensor_checksums",
           "EMBEDDINGS", "MAX_SETTING"]

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


def check_manifest(where: str, m: Any) -> None:
    """Types, ranges and keys of a full (not pointer) manifest; ``where`` names the
    file."""
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
    convs = _want(where, m, "conversations", list, "conversations")
    for c, conv in enumerate(convs):
        f = f"conversations[{c}]"
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
    _unique(where, [c["id"] for c in convs], "conversations", "conversation id")
    for i, q in enumerate(_want(where, m, "questions", list, "questions")):
        for k, typ in _QUESTION.items():
            _want(where, q, k, typ, f"questions[{i}].{k}")
        _strings(where, q["evidence_session_ids"], f"questions[{i}].evidence_session_ids")
        if "evidence_turn_ids" in q:  # optional: indexes written before turn evidence
            _want(where, q, "evidence_turn_ids", list, f"questions[{i}].evidence_turn_ids")
            _strings(where, q["evidence_turn_ids"], f"questions[{i}].evidence_turn_ids")
    mods = m.get("signal_modules")
    if mods is not None:  # optional: the modules of custom signals
        _want(where, m, "signal_modules", dict, "signal_modules")
        for k, v in mods.items():
            if not isinstance(v, str) or not MODULE_NAME.fullmatch(v) or not _NAME.fullmatch(k):
                raise IndexFormatError(f"{where}: field 'signal_modules.{k[:40]}': expected "
                                       "a module name (dotted identifiers)")
    if "tables" in m:  # dense tables of signals with a text of their own ("concat", ...)
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
    sums = m.get("tensor_crc32")
    if sums is not None:
        _want(where, m, "tensor_crc32", dict, "tensor_crc32")
        for k, v in sums.items():
            if type(v) is not int or not 0 <= v < 1 << 32:
                raise IndexFormatError(f"{where}: field 'tensor_crc32.{k[:80]}': expected "
                                       "an integer from 0 to 2**32 - 1")


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


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


def _crc32(x: Tensor) -> int:
    flat = x.detach().contiguous().reshape(-1).view(torch.uint8)
    return zlib.crc32(flat.numpy())  # releases the GIL: threads overlap


def tensor_checksums(tensors: dict) -> dict:
    """``{name: CRC-32 of the tensor's bytes}`` (recorded in the manifest on save,
    compared on load: a file changed or damaged after it was written is refused),
    computed on a few threads."""
    names = sorted(tensors, key=lambda k: -tensors[k].numel() * tensors[k].element_size())
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(names, pool.map(lambda k: _crc32(tensors[k]), names)))


def check_tensors(where: str, t: dict, m: dict, checksums: bool = True) -> None:
    """Dtypes, shapes, offsets, indices and texts of the tensors against manifest ``m``
    (checked by :func:`check_manifest`), then, with ``checksums``, their contents against
    the manifest's ``tensor_crc32`` (when it has them)."""
    n_conv, n_q = len(m["conversations"]), len(m["questions"])
    offsets = _tensor(where, t, "conv_offsets", 1, shape=(n_conv + 1,))
    row_slot = _tensor(where, t, "row_slot", 1)
    n_rows = row_slot.numel()
    _pointers(where, "conv_offsets", offsets, n_rows)
    sizes = (offsets[1:] - offsets[:-1]).tolist()
    for c, conv in enumerate(m["conversations"]):
        if sizes[c] != len(conv["session_ids"]):
            raise IndexFormatError(f"{where}: conversation {c} ({conv['id'][:80]!r}) has "
                                   f"{len(conv['session_ids'])} session ids but "
                                   f"{sizes[c]} rows in 'conv_offsets'")
    gran = _tensor(where, t, "gran", 3, _FLOATS, shape=(None, 4, None))
    n_slots, dim = gran.shape[0], gran.shape[2]
    _in_range(where, "row_slot", row_slot, 0, n_slots)
    tables = m.get("tables", ["concat"] if "concat" in t else [])
    for name in tables:
        _tensor(where, t, name, 2, _FLOATS, shape=(n_slots, dim))
    if "slot_digest" in t:  # content digest of each slot (absent before it was recorded)
        _tensor(where, t, "slot_digest", 2, _BYTES, shape=(n_slots, DIGEST_BYTES))
    _tensor(where, t, "q_emb", 2, _FLOATS, shape=(n_q, dim))
    q_conv = _tensor(where, t, "q_conv", 1, shape=(n_q,))
    _in_range(where, "q_conv", q_conv, 0, n_conv)
    n_turns = None
    if any(k in t for k in ("turn_ptr", "turns", "turn_text.bytes", "turn_text.offsets")):
        # turn_ptr alone: an index built with keep_turns=False and keep_text=False
        ptr = _tensor(where, t, "turn_ptr", 1, shape=(n_slots + 1,))
        _pointers(where, "turn_ptr", ptr)
        n_turns = int(ptr[-1])
        if "turns" in t:
            _tensor(where, t, "turns", 2, _FLOATS, shape=(n_turns, dim))
        if "turn_text.bytes" in t or "turn_text.offsets" in t:
            _texts(where, t, "turn_text", n_turns)
    for g in m["graphs"]:
        _csr(where, t, f"graph.{g}", 4 * n_rows, 4 * n_rows)
    if m.get("lexical"):
        _texts(where, t, "lexical.vocab", None)
        n_terms = t["lexical.vocab.offsets"].numel() - 1
        groups = [*m["lexical"].get("granularities", _LEXICAL_GROUPS[:-1]), "q"]
        for g in groups:
            rows = n_q if g == "q" else None
            _csr(where, t, f"lexical.{g}", rows, n_terms)
            tf = _tensor(where, t, f"lexical.{g}.tf", 1, _FLOATS)
            if not bool(torch.isfinite(tf).all()) or bool((tf < 0).any()):
                raise IndexFormatError(f"{where}: tensor 'lexical.{g}.tf': negative, NaN or "
                                       "inf term counts")
            if tf.numel() != t[f"lexical.{g}.indices"].numel():
                raise IndexFormatError(f"{where}: tensor 'lexical.{g}.tf': "
                                       f"{tf.numel()} counts for "
                                       f"{t[f'lexical.{g}.indices'].numel()} terms")
            if g != "q":
                ptr = _tensor(where, t, f"lexical.{g}.doc_ptr", 1, shape=(n_slots + 1,))
                _pointers(where, f"lexical.{g}.doc_ptr", ptr,
                          t[f"lexical.{g}.indptr"].numel() - 1)
    for name in (*EMBEDDINGS, *tables):
        if name not in t:
            continue
        # a norm that overflows float32 (|x| ~ 1e19) would make NaN similarities too
        norms = torch.linalg.vector_norm(t[name].float(), dim=-1)
        if not bool(torch.isfinite(norms).all()):
            bad = int((~torch.isfinite(norms)).sum())
            raise IndexFormatError(f"{where}: tensor {name!r}: {bad} embedding(s) hold NaN "
                                   "or inf, or overflow (a corrupted file or a bad encoder "
                                   "output); rebuild the index")
    want = m.get("tensor_crc32") if checksums else None
    if want is not None:
        missing = sorted(set(want) ^ set(t))
        if missing:
            raise IndexFormatError(f"{where}: tensor {missing[0][:80]!r}: "
                                   f"{'missing' if missing[0] in want else 'not listed'} "
                                   "in the manifest's checksums (the file was changed after "
                                   "it was written)")
        got = tensor_checksums(t)
        for name in sorted(t):
            if got[name] != want[name]:
                raise IndexFormatError(f"{where}: tensor {name!r}: its contents differ from "
                                       "the CRC-32 checksum written with them (the file was "
                                       "changed or damaged after it was written); rebuild "
                                       "or restore the index")
