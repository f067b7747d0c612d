"""The distinct-session store of a memory index: every table keyed by session *slot*,
grown by amortized appends and published as immutable snapshots.

A slot holds one distinct session (a session shared by many LongMemEval haystacks is
stored once): its S/T/U/K embeddings (``gran``), the dense tables of signals with a text
of their own (``concat``, ...), its turns' embeddings and texts, and its lexical
documents (one set per granularity and per lexical signal with a text of its own).
Conversations (segments, :mod:`.segments`) refer to slots; the store does not know them.

* **Appends** write past the end of buffers with spare capacity (:class:`Growable`: the
  capacity grows by half when full), so adding a session costs O(that session), not
  O(every session stored).
* **Snapshots** (:class:`StoreTables`) are views ``buffer[:n]`` taken when a write is
  published: a later append writes past ``n`` (or into a new, larger buffer), so a
  reader holding a snapshot never sees a half-written row.
* **Removal** drops a slot's reference count; a slot no conversation uses is garbage
  until :meth:`SessionStore.compacted` copies the live slots into new buffers (the old
  ones stay valid for readers of older snapshots).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..granularity import expand_ranges
from .texts import TextTable

__all__ = ["Growable", "StoreTables", "SessionStore", "gather_lexical", "COMPACT_MIN_GARBAGE"]

#: garbage slots (sessions no conversation holds any more) below which the store is never
#: compacted; above it, when they outnumber half the slots
COMPACT_MIN_GARBAGE = 64


class Growable:
    """A tensor grown along dim 0 by amortized appends (a buffer with spare capacity).

    Only the writer calls :meth:`append`; readers take :meth:`value` (a view of the
    rows written so far) once and keep it.
    """

    def __init__(self, init: Tensor) -> None:
        self.buf = init
        self.n = int(init.shape[0])

    def value(self) -> Tensor:
        return self.buf[:self.n]

    def append(self, x: Tensor) -> None:
        k = int(x.shape[0])
        need = self.n + k
        if need > self.buf.shape[0]:
            cap = max(need, self.buf.shape[0] + self.buf.shape[0] // 2 + 16)
            new = self.buf.new_empty((cap, *self.buf.shape[1:]))
            new[:self.n] = self.buf[:self.n]
            self.buf = new  # readers of older snapshots keep the old buffer
        if k:
            self.buf[self.n:need] = x.to(device=self.buf.device, dtype=self.buf.dtype)
        self.n = need


class _GrowableText:
    """A :class:`TextTable` grown by amortized appends."""

    def __init__(self, table: TextTable) -> None:
        end = int(table.offsets[-1])
        self.data = Growable(table.data[:end])
        self.offsets = Growable(table.offsets)

    def value(self) -> TextTable:
        data = self.data.value()
        return TextTable(data if data.numel() else torch.zeros(1, dtype=torch.uint8),
                         self.offsets.value())

    def append(self, texts: Sequence[str]) -> None:
        new = TextTable.from_strings(texts)
        end = int(self.offsets.buf[self.offsets.n - 1])
        self.data.append(new.data[:int(new.offsets[-1])])
        self.offsets.append(new.offsets[1:] + end)


class _GrowableTerms:
    """A :class:`~memgas_gpu.lexical.TermMatrix` with per-slot document pointers, grown
    by amortized appends."""

    def __init__(self, docs, doc_ptr: Tensor) -> None:
        self.indptr = Growable(docs.indptr)
        self.indices = Growable(docs.indices)
        self.tf = Growable(docs.tf)
        self.doc_ptr = Growable(doc_ptr)

    def value(self):
        from ..lexical import TermMatrix

        return (TermMatrix(self.indptr.value(), self.indices.value(), self.tf.value()),
                self.doc_ptr.value())

    def append(self, m) -> None:
        """Documents ``m`` (a TermMatrix) of one new slot."""
        nnz = int(self.indptr.buf[self.indptr.n - 1])
        n_docs = int(self.doc_ptr.buf[self.doc_ptr.n - 1])
        self.indices.append(m.indices)
        self.tf.append(m.tf)
        self.indptr.append(m.indptr[1:] + nnz)
        self.doc_ptr.append(torch.tensor([n_docs + m.n_rows], dtype=torch.int64))


@dataclass(frozen=True)
class StoreTables:
    """An immutable snapshot of the store's tables (views of the buffers).

    Attributes:
        gran: ``[n_slots, 4, d]`` S, T, U, K embeddings.
        dense: table name → ``[n_slots, d]`` (``"concat"``, and the tables of registered
            dense signals with a text of their own).
        turns: ``[n_turns, d]`` or None; turn_ptr: ``[n_slots + 1]`` or None.
        turn_text: :class:`TextTable` aligned with ``turn_ptr``, or None.
        lexical_docs, lexical_ptr: per granularity the documents
            (:class:`~memgas_gpu.lexical.TermMatrix`) and ``[n_slots + 1]`` document
            pointers, or None without lexical data.
        lexical_base: the :class:`~memgas_gpu.lexical.LexicalIndex` whose tokenizer,
            vocabulary and question terms are shared (its documents are not read).
        n_terms: vocabulary size when the snapshot was taken (terms added later belong
            to no document of this snapshot).
    """

    gran: Tensor
    dense: dict
    turns: Optional[Tensor]
    turn_ptr: Optional[Tensor]
    turn_text: Optional[TextTable]
    lexical_docs: Optional[dict]
    lexical_ptr: Optional[dict]
    lexical_base: object
    n_terms: int

    @property
    def n_slots(self) -> int:
        return int(self.gran.shape[0])

    @property
    def concat(self) -> Optional[Tensor]:
        return self.dense.get("concat")

    def lexical_index(self):
        """A fresh :class:`~memgas_gpu.lexical.LexicalIndex` over this snapshot (its own,
        empty derived caches), or None."""
        if self.lexical_base is None:
            return None
        from ..lexical import LexicalIndex

        base = self.lexical_base
        return LexicalIndex(base.tokenizer, base.vocab, dict(self.lexical_docs),
                            dict(self.lexical_ptr), base.queries, n_terms=self.n_terms)


class SessionStore:
    """The writer's side of the distinct-session tables (see the module docstring).

    Built from packed tables (as :meth:`MemoryIndex.build` or a loaded folder gives
    them); every mutation happens under the index's write lock.
    """

    def __init__(self, gran: Tensor, dense: dict, turns: Optional[Tensor],
                 turn_ptr: Optional[Tensor], turn_text: Optional[TextTable],
                 lexical=None) -> None:
        self.gran = Growable(gran)
        self.dense = {k: Growable(v) for k, v in dense.items()}
        self.turns = Growable(turns) if turns is not None else None
        self.turn_ptr = Growable(turn_ptr) if turn_ptr is not None else None
        self.turn_text = _GrowableText(turn_text) if turn_text is not None else None
        self.lexical = lexical
        self.terms = ({g: _GrowableTerms(lexical.docs[g], lexical.doc_ptr[g])
                       for g in lexical.docs} if lexical is not None else None)
        self._refs: Optional[list] = None
        self._by_id: Optional[dict] = None
        self.garbage = 0

    @property
    def n_slots(self) -> int:
        return self.gran.n

    def tables(self) -> StoreTables:
        """The snapshot to publish with the next state."""
        docs = ptr = None
        if self.terms is not None:
            docs, ptr = {}, {}
            for g, t in self.terms.items():
                docs[g], ptr[g] = t.value()
        return StoreTables(
            self.gran.value(), {k: v.value() for k, v in self.dense.items()},
            self.turns.value() if self.turns else None,
            self.turn_ptr.value() if self.turn_ptr else None,
            self.turn_text.value() if self.turn_text else None, docs, ptr, self.lexical,
            len(self.lexical.vocab) if self.lexical is not None else 0)

    # ------------------------------------------------------------------ references
    def track(self, segments) -> None:
        """Count the rows referring to each slot and index slots by session id (once,
        at the first write: an index that is only read never pays for it)."""
        if self._refs is not None:
            return
        refs = [0] * self.n_slots
        by_id: dict = {}
        for seg in segments:
            for sid, slot in zip(seg.session_ids, seg.slots.tolist()):
                refs[slot] += 1
                by_id.setdefault(sid, set()).add(slot)
        self._refs, self._by_id = refs, by_id
        self.garbage = sum(1 for r in refs if r == 0)

    def find(self, session, tables: StoreTables) -> Optional[int]:
        """The live slot holding the same session (id and turn texts), or None (also
        when the index keeps no turn texts to compare)."""
        if tables.turn_text is None or tables.turn_ptr is None:
            return None
        for slot in sorted(self._by_id.get(session.id, ())):
            if self._refs[slot] <= 0:
                continue
            a, b = int(tables.turn_ptr[slot]), int(tables.turn_ptr[slot + 1])
            if b - a == len(session.turns) and \
                    tables.turn_text.strings(range(a, b)) == list(session.turns):
                return slot
        return None

    def ref(self, slot: int, session_id: str) -> None:
        self._refs[slot] += 1
        self._by_id.setdefault(session_id, set()).add(slot)

    def unref(self, slot: int, session_id: str) -> None:
        self._refs[slot] -= 1
        if self._refs[slot] == 0:
            self.garbage += 1
            ids = self._by_id.get(session_id)
            if ids is not None:
                ids.discard(slot)
                if not ids:
                    del self._by_id[session_id]

    # ------------------------------------------------------------------ append
    def append(self, row: Tensor, dense: dict, turns: Tensor,
               turn_texts: Sequence[str], lexical_docs: Optional[dict],
               session_id: str) -> int:
        """Add one distinct session (``dense``: a ``[d]`` row of every dense table,
        ``lexical_docs``: a TermMatrix of every document set); returns its slot
        (referenced once)."""
        slot = self.n_slots
        self.gran.append(row.unsqueeze(0))
        for k, g in self.dense.items():
            g.append(dense[k].reshape(1, -1))
        if self.turns is not None:
            self.turns.append(turns)
        if self.turn_ptr is not None:
            last = int(self.turn_ptr.buf[self.turn_ptr.n - 1])
            self.turn_ptr.append(torch.tensor([last + len(turn_texts)], dtype=torch.int64))
        if self.turn_text is not None:
            self.turn_text.append(turn_texts)
        if self.terms is not None:
            for g, m in lexical_docs.items():
                self.terms[g].append(m)
        if self._refs is not None:
            self._refs.append(0)
            self.ref(slot, session_id)
        return slot

    # ------------------------------------------------------------------ compaction
    def wants_compaction(self) -> bool:
        """More garbage than live slots (and enough to be worth a copy): compacting then
        costs O(1) amortized per removal."""
        return (self._refs is not None
                and self.garbage > max(COMPACT_MIN_GARBAGE, self.n_slots // 2))

    def compacted(self) -> tuple["SessionStore", Tensor]:
        """A new store with the live slots only (old snapshots keep the old buffers),
        and ``[old n_slots]`` new slot of each old slot (-1 for garbage)."""
        live = torch.tensor([r > 0 for r in self._refs], dtype=torch.bool)
        keep = torch.nonzero(live).squeeze(1)
        remap = torch.full((self.n_slots,), -1, dtype=torch.long)
        remap[keep] = torch.arange(keep.numel())
        t = self.tables()
        turns = turn_ptr = text = None
        if t.turn_ptr is not None:
            _, tid = expand_ranges(t.turn_ptr, keep)
            cnt = t.turn_ptr[keep + 1] - t.turn_ptr[keep]
            turn_ptr = torch.cat([torch.zeros(1, dtype=torch.int64), cnt.cumsum(0)])
            if t.turns is not None:
                turns = t.turns[tid]
            if t.turn_text is not None:
                text = t.turn_text.take(tid)
        lex = None
        if self.lexical is not None:
            lex = gather_lexical(t, keep)
        new = SessionStore(t.gran[keep], {k: v[keep] for k, v in t.dense.items()},
                           turns, turn_ptr, text, lex)
        new._refs = [self._refs[i] for i in keep.tolist()]
        new._by_id = {}
        for sid, slots in self._by_id.items():
            got = {int(remap[s]) for s in slots if int(remap[s]) >= 0}
            if got:
                new._by_id[sid] = got
        return new, remap


def gather_lexical(t: StoreTables, slots: Tensor):
    """A :class:`~memgas_gpu.lexical.LexicalIndex` with the documents of ``slots`` only
    (slot ``slots[i]`` becomes ``i``), sharing the vocabulary and question terms."""
    from ..lexical import LexicalIndex

    docs, ptr = {}, {}
    for g in t.lexical_docs:
        p = t.lexical_ptr[g]
        _, ids = expand_ranges(p, slots)
        docs[g] = t.lexical_docs[g].rows(ids)
        cnt = p[slots + 1] - p[slots]
        ptr[g] = torch.cat([torch.zeros(1, dtype=torch.int64), cnt.cumsum(0)])
    base = t.lexical_base
    return LexicalIndex(base.tokenizer, base.vocab, docs, ptr, base.queries,
                        n_terms=t.n_terms)
