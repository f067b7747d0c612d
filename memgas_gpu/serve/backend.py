"""What the HTTP app asks of a memory, as coroutines: :class:`LocalBackend` (one memory
in this process, searches through a :class:`~memgas_gpu.serve.batcher.Batcher`) — the
Ray Serve shards (:mod:`memgas_gpu.serve.ray_serve`) offer the same methods.

Ids here are the memory's (tenant-qualified, :mod:`.tenants`); the app qualifies and
strips them.  Unknown ids raise :class:`NotFound`, a session id already taken
:class:`Conflict`; bad arguments TypeError / ValueError.
"""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

__all__ = ["LocalBackend", "MemoryCalls", "NotFound", "Conflict", "search_kwargs"]


class NotFound(KeyError):
    """``what`` is ``"conversation"`` or ``"session"``."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class Conflict(ValueError):
    """A write the memory's state refuses (a session id taken, a conversation that holds
    evaluation questions)."""


class MemoryCalls:
    """The memory operations of the API on one memory, as blocking calls (the app runs
    them in a thread pool; a Ray Serve shard calls them directly)."""

    def __init__(self, memory, encoder=None) -> None:
        self.memory = memory
        self.encoder = encoder  # None: the memory's own

    def _conversation(self, cid: str):
        try:
            return self.memory.sessions(cid)
        except KeyError:
            raise NotFound("conversation") from None

    def add_sessions(self, cid: str, items: list) -> list:
        """Add the parsed sessions ``items`` (:func:`.protocol.parse_sessions`) as one
        write of the memory (``add_sessions``): every one is checked, and all are added
        or none (a session id already in the conversation refuses the whole batch, also
        when another batch took it meanwhile, and a crash leaves all or none)."""
        sessions = [it["session"] for it in items]
        try:
            self.memory.add_sessions(cid, sessions,
                                     summaries=[it["summary"] for it in items],
                                     keywords=[it["keywords"] for it in items],
                                     metadata=[it["metadata"] for it in items],
                                     encoder=self.encoder)
        except ValueError as e:
            have = {x["id"] for x in self._safe_sessions(cid)}
            taken = [s.id for s in sessions if s.id in have]
            if taken:
                raise Conflict(f"already has a session {taken[0]!r}; nothing of this "
                               "request was added") from None
            raise
        return [{"id": s.id, "date": s.date, "turns": len(s.turns)} for s in sessions]

    def _safe_sessions(self, cid: str) -> list:
        try:
            return self.memory.sessions(cid)
        except KeyError:
            return []

    def remove_session(self, cid: str, sid: str) -> None:
        if not any(s["id"] == sid for s in self._conversation(cid)):
            raise NotFound("session")
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
        """``[(id, session ids, session dates)]`` of every conversation."""
        return [(c.id, list(c.session_ids), list(c.session_dates))
                for c in self.memory.conversations]

    def sessions(self, cid: str) -> list:
        return self._conversation(cid)

    def get_session(self, cid: str, sid: str) -> dict:
        self._conversation(cid)
        try:
            return self.memory.get_session(cid, sid)
        except KeyError:
            raise NotFound("session") from None


class LocalBackend:
    """One memory in this process: writes and listings in a thread pool, searches
    through ``batcher`` (its ``asearch``: no thread waits for a batch).

    Args:
        memory: the :class:`~memgas_gpu.MemoryIndex` (opened on its folder by
            ``memgas serve``).
        batcher: a :class:`~memgas_gpu.serve.Batcher` on it.
        threads: the pool's size (blocking memory calls at once).
        encoder: the encoder of new sessions (default: the memory's own; the batcher
            has its own for queries).
    """

    def __init__(self, memory, batcher, threads: int = 8, encoder=None) -> None:
        self.memory, self.batcher = memory, batcher
        self.calls = MemoryCalls(memory, encoder)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="memgas-io")

    async def _run(self, fn, *args):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    async def add_sessions(self, cid: str, items: list) -> list:
        return await self._run(self.calls.add_sessions, cid, items)

    async def remove_session(self, cid: str, sid: str) -> None:
        await self._run(self.calls.remove_session, cid, sid)

    async def forget(self, cid: str) -> None:
        await self._run(self.calls.forget, cid)

    async def conversations(self) -> list:
        return await self._run(self.calls.conversations)

    async def sessions(self, cid: str) -> list:
        return await self._run(self.calls.sessions, cid)

    async def get_session(self, cid: str, sid: str) -> dict:
        return await self._run(self.calls.get_session, cid, sid)

    def check_search(self, args: dict) -> None:
        """Refuse bad search arguments (TypeError / ValueError) before any is queued."""
        self.batcher.request(**search_kwargs(args))

    async def search(self, args: dict) -> list:
        """``args``: :func:`.protocol.parse_search`'s, ids qualified."""
        return await self.batcher.asearch(**search_kwargs(args))

    async def stats(self) -> dict:
        s = self.batcher.stats()
        s["conversations"] = self.memory.n_conversations
        return s

    async def close(self) -> None:
        """Answer the queued searches, finish the writes, close the memory (its last
        checkpoint, on a memory opened on a folder)."""
        await self._run(self.batcher.close)
        self._pool.shutdown(wait=True)
        self.memory.close()


def search_kwargs(args: dict) -> dict:
    """The keyword arguments of ``MemoryIndex.search`` from
    :func:`.protocol.parse_search`'s (its ``settings`` merged in)."""
    a = dict(args)
    settings = a.pop("settings", None) or {}
    clash = [k for k in settings if k in a or k in ("encoder", "device")]
    if clash:
        raise ValueError(f"settings.{clash[0]} is not a read-path setting (give it as a "
                         "field of the search itself)")
    return {**a, **settings}
