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
* **Sharing**: each slot carries a digest of its content (:func:`session_digest`: id,
  turns, summary and keywords), so a session added again, by this or another
  conversation, with the same content reuses its slot, and one with other texts under
  the same id never does.
* **Removal** drops a slot's reference count; a slot no conversation uses is garbage
  until :meth:`SessionStore.compacted` copies the live slots into new buffers (the old
  ones stay valid for readers of older snapshots) and drops the vocabulary terms that
  only garbage used.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..granularity import expand_ranges
from ..ops.csr import join_pointers
from .texts import TextTable

__all__ = ["Growable", "StoreTables", "LazyTables", "concat_tables", "SessionStore",
           "COMPACT_MIN_GARBAGE", "DIGEST_BYTES", "session_digest", "has_unused_terms",
           "without_unused_terms"]

#: garbage slots (sessions no conversation holds any more) below which the store is never
#: compacted; above it, when they outnumber half the slots
COMPACT_MIN_GARBAGE = 64
#: bytes of a slot's content digest (an all-zero digest: content unknown, never shared)
DIGEST_BYTES = 16


def session_digest(session, summary: str, keywords: str) -> bytes:
    """The content identity of a stored session: its id, turns, summary and keywords
    (every text the store derives a table from; the date is the conversation's, not
    the slot's).  Each field is length-prefixed, so no two contents collide by
    concatenation."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES, person=b"memgas-slot-v1")
    for part in (session.id, *session.turns, "", summary, keywords):
        raw = part.encode("utf-8")
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    h.update(len(session.turns).to_bytes(8, "little"))
    out = h.digest()
    return out if any(out) else b"\x01" + out[1:]  # all-zero means "unknown"


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
        digest: ``[n_slots, DIGEST_BYTES]`` uint8 content digest of each slot
            (:func:`session_digest`; zeros: unknown), or None.
        generation: the store's slot numbering (a compaction renumbers: a new
            generation).
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
    digest: Optional[Tensor] = None
    generation: int = 0

    @property
    def n_slots(self) -> int:
        return int(self.gran.shape[0])

    @property
    def dim(self) -> int:
        return int(self.gran.shape[-1])

    @property
    def dense_names(self) -> list:
        return sorted(self.dense)

    lazy = False

    def take(self, slots: Tensor) -> "StoreTables":
        """The tables of ``slots`` only, in that order (slot ``slots[i]`` becomes ``i``):
        the one way slots are renumbered (a canonical view, a compaction)."""
        slots = slots.to(torch.int64)
        turns = turn_ptr = text = None
        if self.turn_ptr is not None:
            _, tid = expand_ranges(self.turn_ptr, slots)
            turn_ptr = _counts_ptr(self.turn_ptr, slots)
            turns = self.turns[tid] if self.turns is not None else None
            text = self.turn_text.take(tid) if self.turn_text is not None else None
        docs = ptr = None
        if self.lexical_docs is not None:
            docs, ptr = {}, {}
            for g, m in self.lexical_docs.items():
                p = self.lexical_ptr[g]
                _, ids = expand_ranges(p, slots)
                docs[g], ptr[g] = m.rows(ids), _counts_ptr(p, slots)
        return StoreTables(self.gran[slots], {k: v[slots] for k, v in self.dense.items()},
                           turns, turn_ptr, text, docs, ptr, self.lexical_base, self.n_terms,
                           self.digest[slots] if self.digest is not None else None,
                           self.generation)

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


def _counts_ptr(ptr: Tensor, slots: Tensor) -> Tensor:
    """Pointers ``[len(slots) + 1]`` of the ranges ``ptr[s]:ptr[s+1]`` of ``slots``,
    laid end to end."""
    cnt = ptr[slots + 1] - ptr[slots]
    return torch.cat([torch.zeros(1, dtype=torch.int64), cnt.cumsum(0)])


def _used_terms(t: StoreTables) -> Optional[Tensor]:
    """``[n_terms]`` bool: the terms a document of ``t`` or a question uses (None without
    lexical data)."""
    if t.lexical_base is None or t.lexical_docs is None:
        return None
    used = torch.zeros(t.n_terms, dtype=torch.bool)
    for m in (*t.lexical_docs.values(), t.lexical_base.queries):
        ids = m.indices
        used[ids[ids < t.n_terms]] = True
    return used


def has_unused_terms(t: StoreTables) -> bool:
    """Whether ``t``'s vocabulary holds terms no document or question uses (removed
    sessions' terms, until a compaction)."""
    used = _used_terms(t)
    return used is not None and not bool(used.all())


def without_unused_terms(t: StoreTables) -> StoreTables:
    """``t`` with a vocabulary of only the terms its documents or the index's questions
    use (term ids renumbered in order, so rows stay sorted); the same tables when no
    term is unused."""
    from ..lexical import LexicalIndex, TermMatrix
    from ..lexical.tokenize import Vocabulary

    used = _used_terms(t)
    if used is None or bool(used.all()):
        return t
    base = t.lexical_base
    keep = torch.nonzero(used).squeeze(1)
    new_id = torch.full((len(base.vocab),), -1, dtype=torch.int64)
    new_id[keep] = torch.arange(keep.numel())
    terms = base.vocab.terms
    vocab = Vocabulary(terms[i] for i in keep.tolist())

    def renum(m):
        return TermMatrix(m.indptr, new_id[m.indices], m.tf)

    docs = {g: renum(m) for g, m in t.lexical_docs.items()}
    lex = LexicalIndex(base.tokenizer, vocab, docs, dict(t.lexical_ptr), renum(base.queries))
    return replace(t, lexical_docs=docs, lexical_base=lex, n_terms=len(vocab))


class SessionStore:
    """The writer's side of the distinct-session tables (see the module docstring).

    Built from packed tables (as :meth:`MemoryIndex.build` or a loaded folder gives
    them); every mutation happens under the index's write lock.
    """

    def __init__(self, gran: Tensor, dense: dict, turns: Optional[Tensor],
                 turn_ptr: Optional[Tensor], turn_text: Optional[TextTable],
                 lexical=None, digest: Optional[Tensor] = None, generation: int = 0,
                 base=None, commit_refs=None) -> None:
        #: the commit's chunks (:class:`~memgas_gpu.memory.chunks.ChunkedStore`) holding
        #: slots ``[0, base.n_slots)``, read when needed; the buffers hold the slots
        #: appended since (None: the buffers hold every slot)
        self.base = base
        self.base_n = base.n_slots if base is not None else 0
        #: the reference counts of the commit the store was read from (a
        #: :class:`~memgas_gpu.storage.refs.RefTree`; None: counted at the first write)
        self.commit_refs = commit_refs if commit_refs is not None else \
            getattr(base, "refs", None)
        self.generation = generation
        self.gran = Growable(gran)
        self.digest = Growable(digest if digest is not None else
                               torch.zeros(gran.shape[0], DIGEST_BYTES, dtype=torch.uint8))
        self.dense = {k: Growable(v) for k, v in dense.items()}
        self.turns = Growable(turns) if turns is not None else None
        self.turn_ptr = Growable(turn_ptr) if turn_ptr is not None else None
        self.turn_text = _GrowableText(turn_text) if turn_text is not None else None
        self.lexical = lexical
        self.terms = ({g: _GrowableTerms(lexical.docs[g], lexical.doc_ptr[g])
                       for g in lexical.docs} if lexical is not None else None)
        self._refs: Optional[list] = None
        self._by_digest: Optional[dict] = None
        self._journal: list = []  # (slot, None: ref | dropped digest: unref) since mark()
        self.garbage = 0

    def __getstate__(self) -> dict:
        """A copy (Ray tasks, ``copy.deepcopy``) counts its references at its first
        write, over the conversations it holds in RAM (not through the commit's files)."""
        d = dict(self.__dict__)
        d["commit_refs"] = None
        if isinstance(self._refs, _CommitRefs):
            d.update(_refs=None, _by_digest=None, _journal=[], garbage=0)
        return d

    @classmethod
    def lazy(cls, base, generation: int) -> "SessionStore":
        """A store over a commit's chunks (:mod:`.chunks`), every buffer empty."""
        d = base.dim
        return cls(torch.zeros(0, 4, d), {k: torch.zeros(0, d) for k in base.dense_names},
                   torch.zeros(0, d) if base.has_turns else None,
                   torch.zeros(1, dtype=torch.int64) if base.has_turn_ptr else None,
                   TextTable(torch.zeros(1, dtype=torch.uint8),
                             torch.zeros(1, dtype=torch.int64)) if base.has_text else None,
                   None, torch.zeros(0, DIGEST_BYTES, dtype=torch.uint8), generation,
                   base=base)

    @property
    def n_slots(self) -> int:
        return self.base_n + self.gran.n

    def slot_digest(self, slot: int) -> bytes:
        """The content digest of one slot."""
        if slot < self.base_n:
            c = self.base.chunk_of(slot)
            return bytes(self.base.chunk(c).digest[slot - self.base.starts[c]].tolist())
        return self.digest.buf[slot - self.base_n].numpy().tobytes()

    def tables(self):
        """The snapshot to publish with the next state."""
        tail = self._tail_tables()
        if self.base is None:
            return tail
        return LazyTables(self.base, tail, self.generation)

    def _tail_tables(self) -> StoreTables:
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
            len(self.lexical.vocab) if self.lexical is not None else 0, self.digest.value(),
            self.generation)

    # ------------------------------------------------------------------ references
    def track(self, state) -> None:
        """Count the rows referring to each slot and index the live slots by content
        digest (once, at the first write: an index that is only read never pays for
        it).  A memory opened on a folder whose commit keeps the counts reads the count
        of a slot the first time a write needs it (:class:`_CommitRefs`); one whose
        commit does not (written before they were kept) reads every conversation's
        segment then, one at a time, keeping none of them."""
        if self._refs is not None:
            return
        tree = self.commit_refs
        if tree is not None and self.n_slots == tree.n_slots:  # nothing appended since
            self._refs = _CommitRefs(self, tree)
            self._by_digest = {}
            self.garbage = tree.n_slots - tree.live
            return
        segments = state.iter_segments() if hasattr(state, "iter_segments") else state
        rows = [seg.slots for seg in segments]
        refs = (torch.bincount(torch.cat(rows), minlength=self.n_slots).tolist() if rows
                else [0] * self.n_slots)
        self._refs = refs
        self._by_digest = {}
        parts = list(self.base.digests()) if self.base is not None else []
        parts.append((self.base_n, self.digest.value()))
        for first, digests in parts:
            if digests is None:
                continue
            for k, d in enumerate(digests.numpy()):
                slot = first + k
                if refs[slot] > 0 and d.any():
                    self._by_digest.setdefault(d.tobytes(), slot)
        self.garbage = sum(1 for r in refs if r == 0)

    def find(self, digest: bytes) -> Optional[int]:
        """The live slot holding a session of this content digest
        (:func:`session_digest`), or None."""
        refs = self._refs
        if isinstance(refs, _CommitRefs):
            for slot in refs.slots_of(digest):  # the commit's (one leaf read)
                if refs[slot] > 0:
                    return slot
        slot = self._by_digest.get(digest)
        return slot if slot is not None and refs[slot] > 0 else None

    def ref(self, slot: int) -> None:
        self._refs[slot] += 1
        self._journal.append((slot, None))

    def unref(self, slot: int) -> None:
        """One row less refers to ``slot`` (a slot no row refers to is garbage).

        Raises:
            IndexFormatError: no row referred to it (a commit whose reference counts
                disagree with its conversations; nothing changed).
        """
        if self._refs[slot] <= 0:
            if isinstance(self._refs, _CommitRefs):
                raise self._refs.tree.disagrees(slot)
            raise RuntimeError(f"slot {slot}: no reference to drop")
        self._refs[slot] -= 1
        dropped = False
        if self._refs[slot] == 0:
            self.garbage += 1
            d = self.slot_digest(slot)
            if self._by_digest.get(d) == slot:
                del self._by_digest[d]
                dropped = True
        self._journal.append((slot, dropped))

    def _growables(self) -> list:
        out = [self.gran, self.digest, *self.dense.values()]
        for g in (self.turns, self.turn_ptr):
            if g is not None:
                out.append(g)
        if self.turn_text is not None:
            out += [self.turn_text.data, self.turn_text.offsets]
        for t in (self.terms or {}).values():
            out += [t.indptr, t.indices, t.tf, t.doc_ptr]
        return out

    def mark(self) -> tuple:
        """Where every buffer and the vocabulary end now, and the references as they are
        (:meth:`rollback` returns to it; one write at a time: the writer's lock)."""
        self._journal = []
        return (tuple(g.n for g in self._growables()),
                len(self.lexical.vocab) if self.lexical is not None else 0, self.n_slots)

    def rollback(self, mark: tuple) -> None:
        """Forget the slots appended, the terms added and the references taken or
        dropped since :meth:`mark` (a write that failed: no published state refers to
        them)."""
        for slot, dropped in reversed(self._journal):
            if dropped is None:  # a reference taken
                self._refs[slot] -= 1
                continue
            if self._refs[slot] == 0:
                self.garbage -= 1
            self._refs[slot] += 1
            if dropped:
                self._by_digest[self.slot_digest(slot)] = slot
        self._journal = []
        sizes, n_terms, n_slots = mark
        for g, n in zip(self._growables(), sizes):
            g.n = n
        if self.lexical is not None:
            self.lexical.vocab.truncate(n_terms)
        if self._refs is not None:
            del self._refs[n_slots:]
            self._by_digest = {d: s for d, s in self._by_digest.items() if s < n_slots}

    def refs(self) -> list:
        """Rows referring to each slot (a copy; ``[]`` before the first write)."""
        return list(self._refs or ())

    # ------------------------------------------------------------------ append
    def append(self, row: Tensor, dense: dict, turns: Tensor,
               turn_texts: Sequence[str], lexical_docs: Optional[dict],
               digest: bytes) -> int:
        """Add one distinct session (``dense``: a ``[d]`` row of every dense table,
        ``lexical_docs``: a TermMatrix of every document set, ``digest``: its
        :func:`session_digest`); returns its slot (referenced once)."""
        slot = self.n_slots
        self.gran.append(row.unsqueeze(0))
        self.digest.append(torch.frombuffer(bytearray(digest), dtype=torch.uint8)[None])
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
            self._refs.append(1)
            self._by_digest.setdefault(digest, slot)
        return slot

    # ------------------------------------------------------------------ compaction
    def wants_compaction(self) -> bool:
        """More garbage than live slots (and enough to be worth a copy): compacting then
        costs O(1) amortized per removal."""
        return (self._refs is not None
                and self.garbage > max(COMPACT_MIN_GARBAGE, self.n_slots // 2))

    def compacted(self, refs: Tensor) -> tuple["SessionStore", Tensor]:
        """A new store with the live slots only (old snapshots keep the old buffers) and
        a vocabulary of the terms they and the questions use, and ``[old n_slots]`` new
        slot of each old slot (-1 for garbage).  ``refs``: ``[n_slots]`` rows referring
        to each slot, counted over every conversation (not the store's counts, which a
        commit may have kept wrong)."""
        keep = torch.nonzero(refs > 0).squeeze(1)
        remap = torch.full((self.n_slots,), -1, dtype=torch.long)
        remap[keep] = torch.arange(keep.numel())
        t = self.tables().take(keep)
        t = without_unused_terms(t)
        lex = t.lexical_index() if t.lexical_base is not None else None
        new = SessionStore(t.gran, t.dense, t.turns, t.turn_ptr, t.turn_text, lex, t.digest,
                           self.generation + 1)
        new._refs = refs[keep].tolist()
        digests = new.digest.value().numpy()
        new._by_digest = {}
        for k in range(new.n_slots):  # every live slot's digest (the commit's too)
            if digests[k].any():
                new._by_digest.setdefault(digests[k].tobytes(), k)
        new.garbage = 0
        return new, remap


class _CommitRefs:
    """The reference counts of a store opened on a folder whose commit keeps them
    (:mod:`memgas_gpu.storage.refs`): a slot's count is read from the commit the first
    time it is needed, kept with the counts changed since (as a list of counts is
    indexed, appended to and cut back)."""

    def __init__(self, store: SessionStore, tree) -> None:
        self.store = store
        self.tree = tree
        self.known: dict = {}  # slot -> count, of the slots read or changed
        self.n = store.n_slots

    def __getitem__(self, slot: int) -> int:
        got = self.known.get(slot)
        if got is None:
            got = (self.tree.count(slot, self.store.slot_digest(slot))
                   if slot < self.tree.n_slots else 0)
            self.known[slot] = got
        return got

    def __setitem__(self, slot: int, count: int) -> None:
        self.known[slot] = count

    def append(self, count: int) -> None:
        self.known[self.n] = count
        self.n += 1

    def __delitem__(self, cut: slice) -> None:  # del refs[n:]
        for s in [s for s in self.known if s >= cut.start]:
            del self.known[s]
        self.n = cut.start

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(self.tolist())

    def slots_of(self, digest: bytes) -> list:
        """The commit's live slots of content ``digest`` (their counts kept)."""
        out = []
        for slot, (d, count) in self.tree.leaf_of_digest(digest).items():
            if d == digest:
                self.known.setdefault(slot, count)
                out.append(slot)
        return sorted(out)

    def tolist(self) -> list:
        """Every slot's count (the commit's every leaf read)."""
        out = [0] * self.n
        for slot, count in self.tree.counts().items():
            out[slot] = count
        for slot, count in self.known.items():
            out[slot] = count
        return out


def concat_tables(parts: list, like: StoreTables) -> StoreTables:
    """Tables of several slot sets laid end to end (``like``: whose vocabulary and
    generation the result keeps)."""
    gran = torch.cat([p.gran for p in parts])
    dense = {k: torch.cat([p.dense[k] for p in parts]) for k in parts[0].dense}
    digest = torch.cat([p.digest for p in parts]) if parts[0].digest is not None else None
    turn_ptr = join_pointers([p.turn_ptr for p in parts]) if parts[0].turn_ptr is not None \
        else None
    turns = torch.cat([p.turns for p in parts]) if parts[0].turns is not None else None
    text = None
    if parts[0].turn_text is not None:
        datas, offs = [], []
        for p in parts:
            end = int(p.turn_text.offsets[-1])
            datas.append(p.turn_text.data[:end])
            offs.append(p.turn_text.offsets)
        data = torch.cat(datas)
        text = TextTable(data if data.numel() else torch.zeros(1, dtype=torch.uint8),
                         join_pointers(offs))
    return StoreTables(gran, dense, turns, turn_ptr, text, None, None, like.lexical_base,
                       like.n_terms, digest, like.generation)


@dataclass(frozen=True)
class LazyTables:
    """A store snapshot over a commit's chunks (slots ``[0, base.n_slots)``) and the
    slots appended since (``tail``, in RAM): see :mod:`.chunks`.  Reads take
    rows (:meth:`take`); the whole-table attributes (``gran``, ``dense``, ...) read
    every chunk (a save, a compaction)."""

    base: object  # a memgas_gpu.memory.chunks.ChunkedStore
    tail: StoreTables
    generation: int = 0

    @property
    def n_slots(self) -> int:
        return self.base.n_slots + self.tail.n_slots

    @property
    def dim(self) -> int:
        return self.base.dim

    @property
    def dense_names(self) -> list:
        return sorted(self.tail.dense)

    lexical_base = None
    lexical_docs = None
    lexical_ptr = None
    n_terms = 0
    lazy = True

    def take(self, slots: Tensor) -> StoreTables:
        """The tables of ``slots`` only, in that order (slot ``slots[i]`` becomes ``i``),
        read from the chunks that hold them."""
        slots = torch.as_tensor(slots, dtype=torch.int64).reshape(-1)
        n0 = self.base.n_slots
        parts, order = [], []
        if slots.numel():
            base = slots < n0
            idx = torch.nonzero(base).squeeze(1)
            if idx.numel():
                bs = slots[idx]
                # the chunk of each slot (as ChunkedStore.chunk_of, for all at once)
                chunk = torch.searchsorted(torch.tensor(self.base.starts), bs, right=True) - 1
                for c in torch.unique(chunk).tolist():
                    sel = idx[chunk == c]
                    local = slots[sel] - self.base.starts[c]
                    parts.append(self.base.chunk(c).take(local))
                    order.append(sel)
            tidx = torch.nonzero(~base).squeeze(1)
            if tidx.numel():
                parts.append(self.tail.take(slots[tidx] - n0))
                order.append(tidx)
        if not parts:
            return self.tail.take(torch.zeros(0, dtype=torch.int64))
        whole = concat_tables(parts, self.tail) if len(parts) > 1 else \
            StoreTables(parts[0].gran, parts[0].dense, parts[0].turns, parts[0].turn_ptr,
                        parts[0].turn_text, None, None, None, 0, parts[0].digest,
                        self.generation)
        at = torch.cat(order)
        if torch.equal(at, torch.arange(slots.numel())):
            return _with_generation(whole, self.generation)
        inv = torch.empty_like(at)
        inv[at] = torch.arange(at.numel())
        return _with_generation(whole.take(inv), self.generation)

    def _all(self) -> StoreTables:
        return self.take(torch.arange(self.n_slots))

    # whole tables (every chunk read): what a save or a compaction needs
    @property
    def gran(self) -> Tensor:
        return self._all().gran

    @property
    def dense(self) -> dict:
        return self._all().dense

    @property
    def digest(self) -> Optional[Tensor]:
        return self._all().digest

    @property
    def turns(self):
        return self._all().turns

    @property
    def turn_ptr(self):
        return self._all().turn_ptr

    @property
    def turn_text(self):
        return self._all().turn_text

    @property
    def concat(self):
        return self.dense.get("concat")

    def lexical_index(self):
        return None


def _with_generation(t: StoreTables, generation: int) -> StoreTables:
    return t if t.generation == generation else replace(t, generation=generation)
