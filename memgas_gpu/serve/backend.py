"""What the HTTP app asks of a memory, as coroutines: :class:`LocalBackend` (one memory
in this process, searches through a :class:`~memgas_gpu.serve.batcher.Batcher`) — the
Ray Serve shards (:mod:`memgas_gpu.serve.ray_serve`) offer the same methods.

Ids here are the memory's (tenant-qualified, :mod:`.tenants`); the app qualifies and
strips them.  Unknown ids raise :class:`~.protocol.NotFound`, a session id already
taken :class:`~.protocol.Conflict`; bad arguments TypeError / ValueError
(:func:`.protocol.error_of` is the one table from these to answers).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from .protocol import Conflict, NotFound

__all__ = ["LocalBackend", "MemoryCalls", "NotFound", "Conflict", "COMPACT_AFTER_S"]

log = logging.getLogger("memgas_gpu.serve")

#: seconds after a removal (a session removed or replaced, a conversation forgotten)
#: before the server compacts the memory, so that no file of its folder keeps the
#: removed text (``memgas serve --compact-after``)
COMPACT_AFTER_S = 60.0


def _dates(dates) -> tuple:
    known = [d for d in dates if d]
    return (known[0], known[-1]) if known else (None, None)


class MemoryCalls:
    """The memory operations of the API on one memory, as blocking calls (the app runs
    them in a thread pool; a Ray Serve shard calls them directly)."""

    def __init__(self, memory, encoder=None) -> None:
        self.memory = memory
        self.encoder = encoder  # None: the memory's own

    def _conversation(self, cid: str) -> list:
        try:
            return self.memory.sessions(cid)
        except KeyError:
            raise NotFound("conversation") from None

    def add_sessions(self, cid: str, items: list) -> list:
        """Add ``items`` (:class:`~.protocol.SessionIn` models) as one write of the
        memory (``add_sessions``): every one is checked, and all are added or none (a
        session id already in the conversation refuses the whole batch, also when
        another batch took it meanwhile, and a crash leaves all or none)."""
        sessions = [it.session() for it in items]
        try:
            self.memory.add_sessions(cid, sessions,
                                     summaries=[it.summary for it in items],
                                     keywords=[it.keywords for it in items],
                                     metadata=[it.metadata for it in items],
                                     encoder=self.encoder)
        except ValueError:
            have = {x["id"] for x in self._safe_sessions(cid)}
            taken = [s.id for s in sessions if s.id in have]
            if taken:
                raise Conflict(f"already has a session {taken[0]!r}; nothing of this "
                               "request was added") from None
            raise
        return [{"id": s.id, "date": s.date, "turns": len(s.turns)} for s in sessions]

    def replace_session(self, cid: str, item) -> dict:
        """The session of ``item.id`` replaced by ``item`` in its place (one write)."""
        s = item.session()
        self._session(cid, s.id)
        try:
            self.memory.replace_session(cid, s, summary=item.summary,
                                        keywords=item.keywords, metadata=item.metadata,
                                        encoder=self.encoder)
        except KeyError:  # removed meanwhile
            raise NotFound("session") from None
        return {"id": s.id, "date": s.date, "turns": len(s.turns)}

    def _safe_sessions(self, cid: str) -> list:
        try:
            return self.memory.sessions(cid)
        except KeyError:
            return []

    def _session(self, cid: str, sid: str) -> None:
        if not any(s["id"] == sid for s in self._conversation(cid)):
            raise NotFound("session")

    def remove_session(self, cid: str, sid: str) -> None:
        self._session(cid, sid)
        try:
            self.memory.remove_session(cid, sid)
        except KeyError:  # removed meanwhile
            raise NotFound("session") from None

    def forget(self, cid: str) -> None:
        self._conversation(cid)
        try:
            self.memory.forget_conversation(cid)
        except KeyError:
            raise NotFound("conversation") from None
        except ValueError as e:  # it holds a dataset's evaluation questions
            raise Conflict(str(e)) from None

    def conversations(self) -> list:
        """``[(id, sessions, first date, last date)]`` of every conversation (dates:
        the first and the last known session date in the conversation's order, None
        when no session has one)."""
        return [(c.id, len(c.session_ids), *_dates(c.session_dates))
                for c in self.memory.conversations]

    def conversation(self, cid: str) -> tuple:
        """``(sessions, first date, last date)`` of one conversation."""
        got = self._conversation(cid)
        return (len(got), *_dates([s["date"] for s in got]))

    def sessions(self, cid: str) -> list:
        return self._conversation(cid)

    def get_session(self, cid: str, sid: str) -> dict:
        self._conversation(cid)
        try:
            return self.memory.get_session(cid, sid)
        except KeyError:
            raise NotFound("session") from None

    def ready(self) -> dict:
        """What the memory holds: conversations, sessions, and the bytes its log grew
        since the last checkpoint (0 for a memory without a folder).  The counts come
        from a folder's directory: a probe reads no conversation."""
        stats = getattr(self.memory, "storage_stats", None)
        grown = stats()["log_bytes_since_checkpoint"] if stats is not None else 0
        return {"conversations": self.memory.n_conversations,
                "sessions": self.memory.n_rows, "log_bytes": grown}

    def compact(self) -> int:
        return self.memory.compact()


class LocalBackend:
    """One memory in this process: writes and listings in a thread pool, searches
    through ``batcher`` (its ``asearch_request``: no thread waits for a batch, and
    tenants share the batches fairly).

    Args:
        memory: the :class:`~memgas_gpu.MemoryIndex` (opened on its folder by
            ``memgas serve``).
        batcher: a :class:`~memgas_gpu.serve.Batcher` on it.
        threads: the pool's size (blocking memory calls at once).
        encoder: the encoder of new sessions (default: the memory's own; the batcher
            has its own for queries).
        compact_after_s: seconds after a removal (a session removed or replaced, a
            conversation forgotten) before the memory is compacted, so that no file of
            its folder keeps the removed sessions (:data:`COMPACT_AFTER_S`; 0: at once;
            None: only on ``POST /v1/compact`` and by the memory's own rule).  Removals
            meanwhile share the one compaction; a pending one runs at :meth:`close`.
    """

    def __init__(self, memory, batcher, threads: int = 8, encoder=None,
                 compact_after_s: Optional[float] = COMPACT_AFTER_S) -> None:
        if compact_after_s is not None and not compact_after_s >= 0:
            raise ValueError(f"compact_after_s must be >= 0 or None, got {compact_after_s!r}")
        self.memory, self.batcher = memory, batcher
        self.calls = MemoryCalls(memory, encoder)
        self.compact_after_s = compact_after_s
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="memgas-io")
        self._pending = None  # the scheduled compaction's timer handle
        self._lock = threading.Lock()

    async def _run(self, fn, *args):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    # ------------------------------------------------------------------ writes
    async def add_sessions(self, cid: str, items: list) -> list:
        return await self._run(self.calls.add_sessions, cid, items)

    async def replace_session(self, cid: str, item) -> dict:
        out = await self._run(self.calls.replace_session, cid, item)
        self._removed()
        return out

    async def remove_session(self, cid: str, sid: str) -> None:
        await self._run(self.calls.remove_session, cid, sid)
        self._removed()

    async def forget(self, cid: str) -> None:
        await self._run(self.calls.forget, cid)
        self._removed()

    async def compact(self) -> int:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
        return await self._run(self.calls.compact)

    def _removed(self) -> None:
        """A removal happened: compact within ``compact_after_s`` (one pending
        compaction at a time)."""
        if self.compact_after_s is None:
            return
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._pending is not None:
                return
            self._pending = loop.call_later(
                self.compact_after_s, lambda: loop.create_task(self._scheduled()))

    async def _scheduled(self) -> None:
        with self._lock:
            self._pending = None
        try:
            dropped = await self._run(self.calls.compact)
        except Exception as e:  # noqa: BLE001 - a full disk: the next removal retries
            log.warning("memgas serve: the compaction after a removal failed (%s: %s); "
                        "the next removal or POST /v1/compact tries again",
                        type(e).__name__, e)
        else:
            log.info("memgas serve: compacted after a removal (%d sessions dropped)",
                     dropped)

    # ------------------------------------------------------------------ reads
    async def conversations(self) -> list:
        return await self._run(self.calls.conversations)

    async def conversation(self, cid: str) -> tuple:
        return await self._run(self.calls.conversation, cid)

    async def sessions(self, cid: str) -> list:
        return await self._run(self.calls.sessions, cid)

    async def get_session(self, cid: str, sid: str) -> dict:
        return await self._run(self.calls.get_session, cid, sid)

    def request(self, conversation_id, questions: list, kwargs: dict):
        """The checked search request (TypeError / ValueError naming the bad argument)
        of :meth:`~.protocol.SearchIn.kwargs`, ids qualified: the one check of a
        search, before anything is queued."""
        return self.batcher.request(conversation_id, questions, **kwargs)

    async def search(self, request, tenant: Optional[str] = None) -> list:
        """The results of a :meth:`request`, answered in the batches on behalf of
        ``tenant``."""
        return await self.batcher.asearch_request(request, tenant=tenant)

    async def ready(self) -> dict:
        return await self._run(self.calls.ready)

    async def stats(self) -> dict:
        s = self.batcher.stats()
        s["conversations"] = self.memory.n_conversations
        return s

    async def close(self) -> None:
        """Answer the queued searches, finish the writes, run a pending compaction,
        close the memory (its last checkpoint, on a memory opened on a folder)."""
        await self._run(self.batcher.close)
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
            try:
                await self._run(self.calls.compact)
            except Exception as e:  # noqa: BLE001 - closing goes on
                log.warning("memgas serve: the compaction at close failed (%s: %s)",
                            type(e).__name__, e)
        self._pool.shutdown(wait=True)
        self.memory.close()
