"""``memgas serve FOLDER --ray --replicas N``: the conversations sharded over N Ray Serve
replicas, each holding its own memory in ``FOLDER/shard-i``.

The HTTP front (routes, keys, tenants, body bounds, metrics) is the same app as the
one-process server, in the ``memgas serve`` process; it sends each call to the replica
of its conversation: ``shard_of(tenant-qualified id, N)``, a stable hash, so a
conversation always lives on one replica and a restart finds it there
(``FOLDER/shards.json`` records N; a different ``--replicas`` is refused).  Each replica
batches its searches with ``@serve.batch`` (``max_ongoing_requests`` is raised above the
batch size, or Ray Serve's default of 5 would cap every batch at 5).

Needs ``pip install "memgas_gpu[serve-ray]"``; on a cluster, memgas_gpu must be
installed on every node and FOLDER be a path every node reaches.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from pathlib import Path
from typing import Callable, Optional

from ray import serve

from ..errors import MemgasError
from .backend import Conflict, MemoryCalls, NotFound

__all__ = ["shard_of", "Shard", "RayBackend", "ray_backend", "check_layout", "LAYOUT_FILE"]

LAYOUT_FILE = "shards.json"


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


def _tagged(fn, *args):
    """``{"ok": fn(*args)}``, or the error as data (Ray would wrap it in its own)."""
    try:
        return {"ok": fn(*args)}
    except NotFound as e:
        return {"error": "not_found", "what": e.what}
    except Conflict as e:
        return {"error": "conflict", "message": str(e)}
    except TypeError as e:
        return {"error": "type", "message": str(e)}
    except ValueError as e:
        return {"error": "value", "message": str(e)}


def _untag(got: dict):
    if "ok" in got:
        return got["ok"]
    kind = got["error"]
    if kind == "not_found":
        raise NotFound(got["what"])
    raise {"conflict": Conflict, "type": TypeError, "value": ValueError}[kind](got["message"])


@serve.deployment
class Shard:
    """One replica: the memory of one shard folder, its writes, listings and batched
    searches."""

    def __init__(self, folder: str, encoder: Optional[str], device: Optional[str],
                 max_batch_size: int, max_wait_ms: float) -> None:
        from ..retrieve import MemoryIndex

        enc = None
        if encoder is not None:
            from ..encode import Encoder

            enc = Encoder(encoder, device=device or "cpu")
        self.memory = MemoryIndex.open(folder, encoder=enc)
        self.memory.query_encoder(enc)
        self.encoder, self.device = enc, device
        self.calls = MemoryCalls(self.memory, enc)
        self.batching = max_batch_size > 1
        self._batched.set_max_batch_size(max_batch_size)
        self._batched.set_batch_wait_timeout_s(max_wait_ms / 1e3)
        from .batcher import BATCH_BUCKETS

        self._buckets = BATCH_BUCKETS
        self._lock = threading.Lock()
        self.counts = {"batches": 0, "requests": 0, "questions": 0, "errors": 0}
        self.hist = [0] * (len(BATCH_BUCKETS) + 1)
        self.max_batch_size, self.max_wait_ms = max_batch_size, max_wait_ms

    async def _call(self, name: str, *args):
        return await asyncio.to_thread(_tagged, getattr(self.calls, name), *args)

    async def add_sessions(self, cid, items):
        return await self._call("add_sessions", cid, items)

    async def remove_session(self, cid, sid):
        return await self._call("remove_session", cid, sid)

    async def forget(self, cid):
        return await self._call("forget", cid)

    async def conversations(self):
        return await self._call("conversations")

    async def sessions(self, cid):
        return await self._call("sessions", cid)

    async def get_session(self, cid, sid):
        return await self._call("get_session", cid, sid)

    async def search(self, request):
        """One request's results (``request``: a SearchRequest, checked by the front)."""
        if not self.batching:
            return (await self._answer([request]))[0]
        return await self._batched(request)

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005,
                 batch_size_fn=lambda reqs: sum(len(r.queries) for r in reqs))
    async def _batched(self, requests: list) -> list:
        return await self._answer(requests)

    async def _answer(self, requests: list) -> list:
        def run():
            try:
                outs = self.memory.search_many(requests, encoder=self.encoder,
                                               device=self.device)
            except Exception:  # noqa: BLE001 - each request alone: only its own error
                outs = []
                for r in requests:
                    try:
                        outs.append(self.memory.search_many([r], encoder=self.encoder,
                                                            device=self.device)[0])
                    except Exception as e:  # noqa: BLE001
                        outs.append(e)
            n = sum(len(r.queries) for r in requests)
            b = next((j for j, hi in enumerate(self._buckets) if n <= hi), len(self._buckets))
            with self._lock:
                self.counts["batches"] += 1
                self.counts["requests"] += len(requests)
                self.counts["questions"] += n
                self.counts["errors"] += sum(isinstance(o, Exception) for o in outs)
                self.hist[b] += 1
            return outs

        outs = await asyncio.to_thread(run)
        return [{"error": "internal", "message": str(o)} if isinstance(o, Exception)
                else {"ok": o} for o in outs]

    async def stats(self) -> dict:
        with self._lock:
            c, hist = dict(self.counts), list(self.hist)
        c["mean_batch_size"] = c["questions"] / c["batches"] if c["batches"] else 0.0
        cum, run = {}, 0
        for hi, n in zip([*self._buckets, "+Inf"], hist):
            run += n
            cum[hi] = run
        c["batch_sizes"] = cum
        c["max_batch_size"], c["max_wait_ms"] = self.max_batch_size, self.max_wait_ms
        c["queue_depth"] = 0  # Ray Serve queues before the replica; see its own metrics
        c["conversations"] = self.memory.n_conversations
        return c

    async def close(self) -> bool:
        await asyncio.to_thread(self.memory.close)
        return True


class RayBackend:
    """The app's backend over shard handles (:class:`Shard` deployments, in order)."""

    def __init__(self, handles: list, own_ray: bool = False) -> None:
        self.handles = handles
        self.n = len(handles)
        self.own_ray = own_ray

    def _h(self, cid: str):
        return self.handles[shard_of(cid, self.n)]

    async def add_sessions(self, cid, items):
        return _untag(await self._h(cid).add_sessions.remote(cid, items))

    async def remove_session(self, cid, sid):
        return _untag(await self._h(cid).remove_session.remote(cid, sid))

    async def forget(self, cid):
        return _untag(await self._h(cid).forget.remote(cid))

    async def sessions(self, cid):
        return _untag(await self._h(cid).sessions.remote(cid))

    async def get_session(self, cid, sid):
        return _untag(await self._h(cid).get_session.remote(cid, sid))

    async def conversations(self):
        parts = await asyncio.gather(*[h.conversations.remote() for h in self.handles])
        return [c for p in parts for c in _untag(p)]

    def check_search(self, args: dict) -> None:
        from .backend import search_kwargs
        from .batcher import check_request

        check_request(**search_kwargs(args))

    async def search(self, args: dict) -> list:
        """Each question to its conversation's shard (one call per shard), the answers
        back in the questions' order."""
        from ..retrieve.search import SearchRequest
        from .backend import search_kwargs
        from .batcher import check_request

        req = check_request(**search_kwargs(args))
        by: dict = {}
        for j, c in enumerate(req.conversation_id):
            by.setdefault(shard_of(c, self.n), []).append(j)
        calls = {}
        for s, js in by.items():
            sub = SearchRequest([req.conversation_id[j] for j in js],
                                [req.queries[j] for j in js], req.k, req.method, req.evidence,
                                req.question_date, req.after, req.before, req.metadata,
                                dict(req.settings))
            calls[s] = self.handles[s].search.remote(sub)
        got = dict(zip(calls, await asyncio.gather(*calls.values())))
        out = [None] * len(req.queries)
        for s, js in by.items():
            res = got[s]
            if "ok" not in res:
                raise RuntimeError(f"shard {s}: {res.get('message')}")
            for j, r in zip(js, res["ok"]):
                out[j] = r
        return out

    async def stats(self) -> dict:
        parts = await asyncio.gather(*[h.stats.remote() for h in self.handles])
        for i, p in enumerate(parts):
            p["shard"] = i
        return {"shards": list(parts), "conversations": sum(p["conversations"] for p in parts)}

    async def close(self) -> None:
        """Close every shard's memory (its checkpoint), then Ray Serve."""
        try:
            await asyncio.gather(*[h.close.remote() for h in self.handles])
        finally:
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
                # a batch fills only with this many requests in flight at the replica
                max_ongoing_requests=max(8, 2 * opts.max_batch_size),
                ray_actor_options={"num_cpus": min(1.0, cpus / len(folders))},
            ).bind(f, opts.encoder, opts.device, opts.max_batch_size, opts.max_wait_ms)
            handles.append(serve.run(app, name=f"memgas-shard-{i}", route_prefix=None))
    except BaseException:
        serve.shutdown()
        if own:
            ray.shutdown()
        raise
    note(f"memgas serve: {len(folders)} Ray Serve shard(s) of {opts.folder} ready")
    return RayBackend(handles, own_ray=own)
