"""Scale-out on Ray: encoder actors, parallel graph chunks, parallel evaluation.

The single-process pipeline stays the one source of truth; Ray only changes *where*
its independent pieces run:

* **Encoding** — :class:`RayEncoder` tokenises and plans batches on the driver
  exactly as :class:`~memgas_gpu.encode.Encoder` does (same sort, same token
  budget), then sends each planned batch's token windows to an encoder actor (one
  per GPU, or CPU workers).  Results come back in plan order, so an
  :class:`~memgas_gpu.encode.EmbeddingStore` commits the same shards, and every
  embedding is computed from the same padded batch as in one process.
* **Graph** — chunks of whole conversations are independent; they run as Ray tasks.
* **Evaluation** — question subsets run as Ray tasks against one shared index.

Fault tolerance: actors restart when killed (``max_restarts``) and their pending
calls are retried (``max_task_retries``); tasks are retried (``max_retries``).  A
killed driver resumes from the shards the store already committed.
"""
from __future__ import annotations

import os
from collections import deque
from typing import Iterator, Optional, Sequence

import torch

__all__ = ["require_ray", "init_ray", "RayEncoder", "ray_graph_mapper", "retrieve_ray",
           "build_index_ray"]

INSTALL_HINT = 'Ray is not installed: pip install "memgas_gpu[ray]" (or pip install ray)'


def require_ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(INSTALL_HINT) from e
    return ray


def init_ray(address: Optional[str] = None, num_cpus: Optional[int] = None):
    """Connect to a cluster (``address``, e.g. ``"auto"`` or ``"ray://host:10001"``) or
    start a local instance (``None`` / ``"local"``)."""
    ray = require_ray()
    if not ray.is_initialized():
        kw = dict(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
        if address in (None, "", "local"):
            ray.init(num_cpus=num_cpus, **kw)
        else:
            ray.init(address=address, **kw)
    return ray


class _EncoderActor:
    """Holds one Encoder; encodes one planned batch of token windows per call."""

    def __init__(self, encoder_kwargs: dict, threads: Optional[int]) -> None:
        from ..encode import Encoder

        if threads:
            torch.set_num_threads(threads)
        self.encoder = Encoder(**encoder_kwargs)

    def info(self) -> dict:
        return {"fingerprint": self.encoder.fingerprint, "dim": self.encoder.dim,
                "describe": self.encoder.describe(), "pid": os.getpid()}

    def encode(self, windows, token_budget):
        from ..encode.batching import Tokenized

        tok = Tokenized(windows=windows)
        (_, emb), = self.encoder.encode_batches(tok, [list(range(len(windows)))],
                                                token_budget=token_budget, progress=False)
        return emb.float().cpu()


class RayEncoder:
    """An Encoder whose forward passes run on Ray actors (same results, more devices).

    Args:
        encoder_kwargs: arguments of :class:`~memgas_gpu.encode.Encoder` (model,
            pooling, max_length, dtype, …), used by every actor and by the driver's
            local tokenizer.
        num_workers: encoder actors (default 2).
        num_gpus: GPUs per actor (1 on GPU clusters: one actor per GPU; 0 on CPUs).
        threads: torch threads per actor (``None``: the driver's count, so CPU
            results match the single-process run bit for bit).
        in_flight: batches queued per actor.
    """

    def __init__(self, encoder_kwargs: Optional[dict] = None, num_workers: int = 2,
                 num_gpus: float = 0, threads: Optional[int] = None,
                 in_flight: int = 2) -> None:
        ray = require_ray()
        from ..encode import Encoder

        self.encoder_kwargs = dict(encoder_kwargs or {})
        self.local = Encoder(**dict(self.encoder_kwargs, device="cpu"))
        actor_cls = ray.remote(num_cpus=1, num_gpus=num_gpus, max_restarts=-1,
                               max_task_retries=3)(_EncoderActor)
        threads = threads or torch.get_num_threads()
        self.actors = [actor_cls.remote(self.encoder_kwargs, threads)
                       for _ in range(max(1, num_workers))]
        self._info = ray.get(self.actors[0].info.remote())
        self.in_flight = max(1, in_flight)
        self.token_budget = self.local.token_budget
        self.device = torch.device("cpu")

    # the Encoder interface the store and the pipeline use
    @property
    def fingerprint(self) -> str:
        return self._info["fingerprint"]

    @property
    def dim(self) -> int:
        return int(self._info["dim"])

    def describe(self) -> dict:
        return dict(self._info["describe"], ray_workers=len(self.actors))

    def tokenize(self, texts):
        return self.local.tokenize(texts)

    def plan(self, tok, sort_keys=None, token_budget=None, batch_size=None):
        return self.local.plan(tok, sort_keys=sort_keys, token_budget=token_budget,
                               batch_size=batch_size)

    def encode_batches(self, tok, batches: Sequence[list[int]], *, token_budget=None,
                       progress=None) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Planned batches on the actors (round robin); results in plan order."""
        ray = require_ray()
        from ..progress import Progress

        budget = int(token_budget or self.token_budget)
        bar = Progress(sum(len(b) for b in batches), "encode (ray)", unit="text",
                       enabled=progress)
        pending: deque = deque()
        limit = self.in_flight * len(self.actors)
        try:
            for k, items in enumerate(batches):
                actor = self.actors[k % len(self.actors)]
                pending.append((items, actor.encode.remote([tok.windows[i] for i in items],
                                                           budget)))
                if len(pending) >= limit:
                    items0, ref = pending.popleft()
                    yield items0, ray.get(ref)
                    bar.update(len(items0))
            while pending:
                items0, ref = pending.popleft()
                yield items0, ray.get(ref)
                bar.update(len(items0))
        finally:
            bar.close()

    def shutdown(self) -> None:
        """Release the actors (and the CPUs/GPUs they hold)."""
        ray = require_ray()
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []

    def encode(self, texts, progress=None, **_):
        single = isinstance(texts, str)
        batch = [texts] if single else list(texts)
        out = torch.empty(len(batch), self.dim)
        if batch:
            tok = self.tokenize(batch)
            for items, emb in self.encode_batches(tok, self.plan(tok), progress=progress):
                out[torch.tensor(items)] = emb
        return out[0] if single else out


def ray_graph_mapper(max_retries: int = 3):
    """A ``mapper`` for :func:`memgas_gpu.retrieve.graphs.build_graph`: chunks as tasks."""
    ray = require_ray()
    from ..retrieve.graphs import graph_chunk

    task = ray.remote(max_retries=max_retries)(graph_chunk)

    def mapper(fn, arg_lists):
        refs = [task.remote(*args) for args in arg_lists]
        for ref in refs:
            yield ray.get(ref)

    return mapper


def _retrieve_part(index, questions, method, params, device, settings):
    from ..retrieve.search import retrieve

    return retrieve(index, questions, method=method, params=params, device=device, **settings)


def retrieve_ray(index, method: str = "memgas", params=None, num_tasks: int = 2,
                 device: Optional[str] = None, max_retries: int = 3, **settings):
    """:func:`memgas_gpu.retrieve.retrieve` over question subsets run as Ray tasks.

    Conversations are kept whole within a task (their questions share PageRank rows).
    Returns one :class:`~memgas_gpu.retrieve.Retrieval` in question order.
    """
    ray = require_ray()
    from ..retrieve.engine import resolve
    from ..retrieve.search import Retrieval

    resolve(index, method, params, **settings)  # bad settings fail here, not in a task
    conv = index.q_conv.tolist()
    convs = sorted(set(conv))
    parts = [set(convs[i::num_tasks]) for i in range(max(1, num_tasks))]
    groups = [[q for q, c in enumerate(conv) if c in p] for p in parts]
    groups = [g for g in groups if g]
    import copy

    light = copy.copy(index)  # what tasks need: tensors and metadata, not the encoder
    light._encoder = None
    ref_index = ray.put(light)
    task = ray.remote(max_retries=max_retries)(_retrieve_part)
    results = ray.get([task.remote(ref_index, g, method, params, device, settings) for g in groups])
    n_q = len(conv)
    width = max((r.scores.shape[1] for r in results), default=0)
    scores = torch.full((n_q, width), float("-inf"), dtype=results[0].scores.dtype)
    ranks = torch.full((n_q, width), -1, dtype=torch.long)
    n = torch.zeros(n_q, dtype=torch.long)
    for g, r in zip(groups, results):
        qi = torch.tensor(g)
        scores[qi, :r.scores.shape[1]] = r.scores
        ranks[qi, :r.rankings.shape[1]] = r.rankings
        n[qi] = r.n_sessions.cpu()
    return Retrieval(method, torch.arange(n_q), scores, ranks, n, params=results[0].params)


def build_index_ray(dataset, encoder_kwargs: Optional[dict] = None, *, num_workers: int = 2,
                    num_gpus: float = 0, store_dir: Optional[str] = None, **build_kwargs):
    """:meth:`MemoryIndex.build` with Ray encoder actors and parallel graph chunks.

    Args:
        dataset: the dataset.
        encoder_kwargs: :class:`~memgas_gpu.encode.Encoder` arguments for the actors.
        num_workers: encoder actors.
        num_gpus: GPUs per actor.
        store_dir: optional embedding-store folder (on storage every node sees, for
            a cluster): shards are committed by the driver in plan order, so a killed
            driver resumes where it stopped.
        **build_kwargs: the rest of :meth:`MemoryIndex.build`'s arguments (``params=``,
            a :class:`~memgas_gpu.retrieve.BuildParams`, or its fields).
    """
    from ..encode import EmbeddingStore
    from ..retrieve import MemoryIndex

    enc = RayEncoder(encoder_kwargs, num_workers=num_workers, num_gpus=num_gpus)
    store = EmbeddingStore(store_dir, enc.fingerprint) if store_dir else None
    tasks = ray_graph_mapper()

    def mapper(fn, arg_lists):
        enc.shutdown()  # encoding is done: free the actors' CPUs/GPUs for graph tasks
        return tasks(fn, arg_lists)

    try:
        idx = MemoryIndex.build(dataset, enc, store=store, graph_mapper=mapper,
                                **build_kwargs)
    finally:
        if enc.actors:
            enc.shutdown()
    idx._encoder = enc.local  # same embedding function, in this process
    return idx
