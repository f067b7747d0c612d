"""``memgas serve FOLDER --ray --replicas N``: the conversations sharded over N Ray Serve
replicas, each holding its own memory in ``FOLDER/shard-i``.

The HTTP front (routes, keys, tenants, body bounds, metrics) is the same app as the
one-process server, in the ``memgas serve`` process; it sends each call to the replica
of its conversation: ``shard_of(tenant-qualified id, N)``, a stable hash, so a
conversation always lives on one replica and a restart finds it there
(``FOLDER/shards.json`` records N; a different ``--replicas`` is refused).  Each replica
serves its memory through the one-process server's backend
(:class:`~memgas_gpu.serve.backend.LocalBackend`): searches in its own
:class:`~memgas_gpu.serve.batcher.Batcher` (batch counters, the answer-each-alone rule
after a failed batch, fair sharing across tenants, large requests cut into pieces),
compaction after removals; ``max_ongoing_requests`` is raised to :data:`MAX_ONGOING`, so
that many calls reach the replica's batcher.

Needs ``pip install "memgas_gpu[serve-ray]"``; on a cluster, memgas_gpu must be
installed on every node and FOLDER be a path every node reaches.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import pickle
from pathlib import Path
from typing import Callable, Optional

from ray import serve

from ..errors import MemgasError
from .backend import COMPACT_AFTER_S, LocalBackend
from .batcher import check_request, recheck_request

__all__ = ["shard_of", "Shard", "RayBackend", "ray_backend", "check_layout", "LAYOUT_FILE"]

LAYOUT_FILE = "shards.json"

#: calls in flight at one replica at most (Ray Serve's default of 5 would cap every batch
#: at 5 requests, and would queue a flood in front of the replica's fair batcher)
MAX_ONGOING = 1024


class ShardLayoutError(MemgasError, ValueError):
    """A folder whose shards do not match ``--replicas``, or that is no sharded memory."""


def shard_of(memory_id: str, n: int) -> int:
    """The shard of the memory's conversation ``memory_id`` among ``n`` (BLAKE2b of its
    UTF-8 bytes: the same in every process and Python version)."""
    h = hashlib.blake2b(memory_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "big") % n


def check_layout(folder, n: int) -> list:
    """The shard folders of ``folder`` for ``n`` replicas; records ``n`` in a new one.

    Raises:
        ShardLayoutError: ``folder`` records another count, or holds a one-process
            memory.
    """
    folder = Path(folder)
    rec = folder / LAYOUT_FILE
    if rec.exists():
        try:
            have = json.loads(rec.read_text(encoding="utf-8"))
            count = int(have["shards"])
        except (ValueError, KeyError, TypeError, OSError):
            raise ShardLayoutError(f"{rec}: not a shard record") from None
        if count != n:
            raise ShardLayoutError(f"{folder} holds {count} shards; serve it with --replicas "
                                   f"{count} (conversations are placed by a hash of their "
                                   "id modulo the shard count)")
    elif folder.exists() and any(folder.iterdir()):
        raise ShardLayoutError(f"{folder} is not a sharded memory (no {LAYOUT_FILE}); serve "
                               "it without --ray, or give --ray a new folder")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        rec.write_text(json.dumps({"shards": n, "hash": "blake2b-64 mod shards"}) + "\n",
                       encoding="utf-8")
    return [str(folder / f"shard-{i}") for i in range(n)]


#: the backend calls a shard answers for one conversation (its id first) and for all
PER_CONVERSATION = ("add_sessions", "replace_session", "remove_session", "forget",
                    "conversation", "sessions", "get_session")
PER_SHARD = ("conversations", "ready", "compact", "stats")


def _as_data(e: BaseException) -> BaseException:
    """``e`` if it survives pickling (Ray sends it back to the front as it is, so the
    app answers it as the one-process server would), else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any failure to travel
        return RuntimeError(f"{type(e).__name__}: {e}")


def _answer(got: dict):
    if "error" in got:
        raise got["error"]
    return got["ok"]


@serve.deployment
class Shard:
    """One replica: the memory of one shard folder behind a
    :class:`~memgas_gpu.serve.backend.LocalBackend` (its writes, listings, compaction
    after removals, and its :class:`~memgas_gpu.serve.batcher.Batcher`: searches in
    shared batches, fair across tenants, large requests cut into pieces).  Every call
    answers ``{"ok": value}`` or ``{"error": exception}`` (Ray would wrap an exception
    raised here in its own)."""

    def __init__(self, folder: str, encoder: Optional[str], device: Optional[str],
                 max_batch_size: int, max_wait_ms: float,
                 compact_after_s: Optional[float] = COMPACT_AFTER_S) -> None:
        from ..retrieve import MemoryIndex
        from .batcher import Batcher

        enc = None
        if encoder is not None:
            from ..encode import Encoder

            enc = Encoder(encoder, device=device or "cpu")
        memory = MemoryIndex.open(folder, encoder=enc)
        memory.query_encoder(enc)
        batcher = Batcher(memory, max_batch_size, max_wait_ms, encoder=enc, device=device)
        self.backend = LocalBackend(memory, batcher, encoder=enc,
                                    compact_after_s=compact_after_s)

    async def call(self, name: str, *args) -> dict:
        """The backend's ``name`` (one of :data:`PER_CONVERSATION`, :data:`PER_SHARD`)
        with ``args``."""
        if name not in PER_CONVERSATION + PER_SHARD:
            return {"error": ValueError(f"no shard call {name!r}")}
        try:
            return {"ok": await getattr(self.backend, name)(*args)}
        except Exception as e:  # noqa: BLE001 - the front raises it
            return {"error": _as_data(e)}

    async def search(self, request, tenant=None) -> dict:
        """One request's results (``request``: a SearchRequest checked by the front, of
        this shard's conversations), answered in this replica's batches on behalf of
        ``tenant``."""
        try:
            return {"ok": await self.backend.search(request, tenant)}
        except Exception as e:  # noqa: BLE001 - the front raises it
            return {"error": _as_data(e)}

    async def close(self) -> bool:
        """Answer the queued searches, run a pending compaction, close the memory."""
        await self.backend.close()
        return True


class RayBackend:
    """The app's backend over shard handles (:class:`Shard` deployments, in order): the
    async methods of :class:`~memgas_gpu.serve.backend.LocalBackend`, each call sent to
    the shard of its conversation, or to every shard and the answers joined."""

    def __init__(self, handles: list, own_ray: bool = False, own_serve: bool = True) -> None:
        self.handles = handles
        self.n = len(handles)
        self.own_ray, self.own_serve = own_ray, own_serve

    async def _one(self, name: str, cid: str, *args):
        return _answer(await self.handles[shard_of(cid, self.n)].call.remote(name, cid, *args))

    async def _all(self, name: str) -> list:
        got = await asyncio.gather(*[h.call.remote(name) for h in self.handles])
        return [_answer(g) for g in got]

    # ------------------------------------------------------------------ one conversation
    async def add_sessions(self, cid, items):
        return await self._one("add_sessions", cid, items)

    async def replace_session(self, cid, item):
        return await self._one("replace_session", cid, item)

    async def remove_session(self, cid, sid):
        return await self._one("remove_session", cid, sid)

    async def forget(self, cid):
        return await self._one("forget", cid)

    async def conversation(self, cid):
        return await self._one("conversation", cid)

    async def sessions(self, cid):
        return await self._one("sessions", cid)

    async def get_session(self, cid, sid):
        return await self._one("get_session", cid, sid)

    # ------------------------------------------------------------------ every shard
    async def conversations(self):
        return [c for part in await self._all("conversations") for c in part]

    async def ready(self) -> dict:
        """Each shard's counts, summed."""
        out: dict = {}
        for part in await self._all("ready"):
            for k, v in part.items():
                out[k] = out.get(k, 0) + v
        return out

    async def compact(self) -> int:
        return sum(await self._all("compact"))

    async def stats(self) -> dict:
        parts = await self._all("stats")
        for i, p in enumerate(parts):
            p["shard"] = i
        return {"shards": list(parts), "conversations": sum(p["conversations"] for p in parts)}

    # ------------------------------------------------------------------ search
    def request(self, conversation_id, questions: list, kwargs: dict):
        """The checked search request (TypeError / ValueError naming the bad argument),
        as :meth:`LocalBackend.request <memgas_gpu.serve.backend.LocalBackend.request>`."""
        return check_request(conversation_id, questions, **kwargs)

    async def search(self, request, tenant=None) -> list:
        """The results of a :meth:`request`: its questions sent to their conversations'
        shards (one request per shard, answered there in the shard's fair batches on
        behalf of ``tenant``), the answers back in the questions' order."""
        req = recheck_request(request)
        by: dict = {}
        for j, c in enumerate(req.conversation_id):
            by.setdefault(shard_of(c, self.n), []).append(j)
        calls = {s: self.handles[s].search.remote(dataclasses.replace(
            req, conversation_id=[req.conversation_id[j] for j in js],
            queries=[req.queries[j] for j in js]), tenant) for s, js in by.items()}
        got = dict(zip(calls, await asyncio.gather(*calls.values())))
        out = [None] * len(req.queries)
        for s, js in by.items():
            for j, r in zip(js, _answer(got[s])):
                out[j] = r
        return out

    async def close(self) -> None:
        """Close every shard (its queued searches answered, its memory checkpointed),
        then Ray Serve."""
        try:
            await asyncio.gather(*[h.close.remote() for h in self.handles])
        finally:
            if self.own_serve:
                serve.shutdown()
            if self.own_ray:
                import ray

                ray.shutdown()


def ray_backend(opts, note: Callable[[str], None] = print) -> RayBackend:
    """Start (or join) Ray, deploy one :class:`Shard` per shard folder of
    ``opts.folder``, and return their backend."""
    import ray

    from ..distributed import init_ray

    folders = check_layout(opts.folder, opts.replicas)
    own = not ray.is_initialized()
    init_ray(opts.ray_address)
    cpus = float(ray.cluster_resources().get("CPU", 1.0))
    serve.start(proxy_location="Disabled")
    handles = []
    try:
        for i, f in enumerate(folders):
            app = Shard.options(
                name=f"memgas-shard-{i}",
                # calls beyond this many wait in Ray Serve's queue in front of the
                # replica, first come first served; within it the replica's Batcher
                # fills batches and shares them fairly across tenants
                max_ongoing_requests=max(MAX_ONGOING, 4 * opts.max_batch_size),
                ray_actor_options={"num_cpus": min(1.0, cpus / len(folders))},
            ).bind(f, opts.encoder, opts.device, opts.max_batch_size, opts.max_wait_ms,
                   getattr(opts, "compact_after_s", COMPACT_AFTER_S))
            handles.append(serve.run(app, name=f"memgas-shard-{i}", route_prefix=None))
    except BaseException:
        serve.shutdown()
        if own:
            ray.shutdown()
        raise
    note(f"memgas serve: {len(folders)} Ray Serve shard(s) of {opts.folder} ready")
    return RayBackend(handles, own_ray=own)
