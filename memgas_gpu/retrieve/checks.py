"""Validation of an index folder's manifest and tensors before a :class:`MemoryIndex`
is made of them (``docs/index-format.md``, ``docs/failure.md``).

Every inconsistency (a missing or mistyped key, a shape, offset or index out of
range, a NaN embedding) raises :class:`IndexFormatError` naming the file and the
field, so a corrupted or hand-edited index fails with one line instead of a traceback
or, worse, a silent wrong ranking.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from ..errors import MemgasError

__all__ = ["IndexFormatError", "check_manifest", "check_tensors", "EMBEDDINGS"]

#: tensors holding embeddings: refused when they hold NaN or inf ("hybrid" is the
#: name "concat" had in indexes written before 0.2)
EMBEDDINGS = ("gran", "concat", "hybrid", "q_emb", "turns")
_PARAMS = {"m": int, "skip_sessions": int, "rule": str, "topk": int}
_QUESTION = {"id": str, "text": str, "type": str, "date": str, "answer": str,
             "evidence_session_ids": list, "is_abstention": bool}
_LEXICAL_GROUPS = ("S", "T", "U", "K", "q")


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


def check_manifest(where: str, m: Any) -> None:
    """Types and keys of a full (not pointer) manifest; ``where`` names the file."""
    if not isinstance(m, dict):
        raise IndexFormatError(f"{where}: expected a JSON object, got {type(m).__name__}")
    params = _want(where, m, "params", dict, "params")
    for k, v in params.items():
        if k not in _PARAMS:
            raise IndexFormatError(f"{where}: field 'params.{k}': unknown setting (known: "
                                   f"{', '.join(_PARAMS)})")
        _want(where, params, k, _PARAMS[k], f"params.{k}")
        if _PARAMS[k] is int and v < 0:
            raise IndexFormatError(f"{where}: field 'params.{k}': negative ({v})")
    _strings(where, _want(where, m, "graphs", list, "graphs"), "graphs")
    _want(where, m, "config", dict, "config")
    for c, conv in enumerate(_want(where, m, "conversations", list, "conversations")):
        f = f"conversations[{c}]"
        _want(where, conv, "id", str, f"{f}.id")
        ids = _want(where, conv, "session_ids", list, f"{f}.session_ids")
        dates = _want(where, conv, "session_dates", list, f"{f}.session_dates")
        _strings(where, ids, f"{f}.session_ids")
        _strings(where, dates, f"{f}.session_dates")
        if len(ids) != len(dates):
            raise IndexFormatError(f"{where}: field '{f}.session_dates': {len(dates)} dates "
                                   f"for {len(ids)} sessions")
    for i, q in enumerate(_want(where, m, "questions", list, "questions")):
        for k, typ in _QUESTION.items():
            _want(where, q, k, typ, f"questions[{i}].{k}")
        _strings(where, q["evidence_session_ids"], f"questions[{i}].evidence_session_ids")
        if "evidence_turn_ids" in q:  # optional: indexes written before turn evidence
            _want(where, q, "evidence_turn_ids", list, f"questions[{i}].evidence_turn_ids")
            _strings(where, q["evidence_turn_ids"], f"questions[{i}].evidence_turn_ids")
    lex = m.get("lexical")
    if lex is not None:
        _want(where, m, "lexical", dict, "lexical")
        _want(where, lex, "tokenizer", dict, "lexical.tokenizer")


def _tensor(where: str, t: dict, name: str, ndim: int, *, floating: bool = False,
            shape: Optional[tuple] = None) -> Tensor:
    if name not in t:
        raise IndexFormatError(f"{where}: tensor {name!r}: missing")
    x = t[name]
    if x.dim() != ndim:
        raise IndexFormatError(f"{where}: tensor {name!r}: expected {ndim} dimensions, got "
                               f"shape {list(x.shape)}")
    if floating != x.dtype.is_floating_point or (not floating and x.dtype == torch.bool):
        raise IndexFormatError(f"{where}: tensor {name!r}: unexpected dtype {x.dtype}")
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


def check_tensors(where: str, t: dict, m: dict) -> None:
    """Shapes, dtypes, offsets and indices of the tensors against manifest ``m``."""
    n_conv, n_q = len(m["conversations"]), len(m["questions"])
    offsets = _tensor(where, t, "conv_offsets", 1, shape=(n_conv + 1,))
    row_slot = _tensor(where, t, "row_slot", 1)
    n_rows = row_slot.numel()
    _pointers(where, "conv_offsets", offsets, n_rows)
    sizes = (offsets[1:] - offsets[:-1]).tolist()
    for c, conv in enumerate(m["conversations"]):
        if sizes[c] != len(conv["session_ids"]):
            raise IndexFormatError(f"{where}: conversation {c} ({conv['id']!r}) has "
                                   f"{len(conv['session_ids'])} session ids but "
                                   f"{sizes[c]} rows in 'conv_offsets'")
    gran = _tensor(where, t, "gran", 3, floating=True, shape=(None, 4, None))
    n_slots, dim = gran.shape[0], gran.shape[2]
    _in_range(where, "row_slot", row_slot, 0, n_slots)
    for name in ("concat", "hybrid"):
        if name in t:
            _tensor(where, t, name, 2, floating=True, shape=(n_slots, dim))
    _tensor(where, t, "q_emb", 2, floating=True, shape=(n_q, dim))
    q_conv = _tensor(where, t, "q_conv", 1, shape=(n_q,))
    _in_range(where, "q_conv", q_conv, 0, n_conv)
    if "turns" in t or "turn_ptr" in t:
        turns = _tensor(where, t, "turns", 2, floating=True, shape=(None, dim))
        ptr = _tensor(where, t, "turn_ptr", 1, shape=(n_slots + 1,))
        _pointers(where, "turn_ptr", ptr, turns.shape[0])
    if "turn_text.bytes" in t or "turn_text.offsets" in t:
        tb = _tensor(where, t, "turn_text.bytes", 1)
        _pointers(where, "turn_text.offsets", _tensor(where, t, "turn_text.offsets", 1),
                  tb.numel())
    for g in m["graphs"]:
        _csr(where, t, f"graph.{g}", 4 * n_rows, 4 * n_rows)
    if m.get("lexical"):
        vb = _tensor(where, t, "lexical.vocab.bytes", 1)
        vo = _tensor(where, t, "lexical.vocab.offsets", 1)
        _pointers(where, "lexical.vocab.offsets", vo, vb.numel())
        n_terms = vo.numel() - 1
        for g in _LEXICAL_GROUPS:
            rows = n_q if g == "q" else None
            _csr(where, t, f"lexical.{g}", rows, n_terms)
            tf = _tensor(where, t, f"lexical.{g}.tf", 1, floating=True)
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
    for name in EMBEDDINGS:
        if name not in t:
            continue
        # a norm that overflows float32 (|x| ~ 1e19) would make NaN similarities too
        norms = torch.linalg.vector_norm(t[name].float(), dim=-1)
        if not bool(torch.isfinite(norms).all()):
            bad = int((~torch.isfinite(norms)).sum())
            raise IndexFormatError(f"{where}: tensor {name!r}: {bad} embedding(s) hold NaN "
                                   "or inf, or overflow (a corrupted file or a bad encoder "
                                   "output); rebuild the index")

