"""Micro-batching of searches: many callers, one :meth:`MemoryIndex.search_many` call.

A :class:`Batcher` sits in front of one memory.  Each caller's ``search`` (any thread,
or ``asearch`` from an event loop) is checked in the caller's thread, then queued; one
worker thread takes what is queued — up to ``max_batch_size`` questions, waiting at
most ``max_wait_ms`` after the oldest one arrived — and answers it with one
``search_many`` (one encoder batch, one read-path call per method and settings).  Each
caller gets exactly its own results, or its own error.

While the worker computes a batch, new calls queue up, so the batch size follows the
load: one caller alone waits ``max_wait_ms`` at most, many callers share the encoder and
the read path.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Optional, Sequence

__all__ = ["Batcher", "BATCH_BUCKETS", "check_request"]

#: upper bounds of the batch-size histogram (questions per batch); the last is +inf
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class _Item:
    """One caller's checked request, and where its answer goes."""

    __slots__ = ("request", "questions", "arrived", "result", "error", "_event", "_loop",
                 "_future")

    def __init__(self, request, loop=None) -> None:
        self.request = request
        self.questions = len(request.queries)
        self.arrived = time.monotonic()
        self.result = self.error = None
        self._event = threading.Event() if loop is None else None
        self._loop = loop
        self._future = loop.create_future() if loop is not None else None

    def finish(self, result=None, error: Optional[BaseException] = None) -> None:
        self.result, self.error = result, error
        if self._loop is None:
            self._event.set()
        else:
            self._loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        if self._future.done():  # the caller was cancelled
            return
        if self.error is not None:
            self._future.set_exception(self.error)
        else:
            self._future.set_result(self.result)

    def wait(self):
        self._event.wait()
        if self.error is not None:
            raise self.error
        return self.result

    async def await_(self):
        return await self._future


def check_request(conversation_id, queries: Sequence[str], k: int = 10,
                  method: Optional[str] = None, evidence: int = 3,
                  question_date: Optional[str] = None, after: Optional[str] = None,
                  before: Optional[str] = None, metadata: Optional[dict] = None,
                  **settings):
    """The checked :class:`~memgas_gpu.retrieve.search.SearchRequest` of the arguments
    of :meth:`MemoryIndex.search`, or a one-line TypeError / ValueError naming the bad
    one: what one caller's call is refused for, before it can fail anyone else's batch."""
    from ..retrieve.engine import resolve
    from ..retrieve.presets import DEFAULT_METHOD
    from ..retrieve.search import SearchRequest

    for name in ("encoder", "device"):
        if name in settings:
            raise TypeError(f"{name}= is the batcher's (Batcher(..., {name}=)), not a "
                            "search argument")
    if method is not None and not isinstance(method, str):
        raise TypeError(f"method must be a string or None, got {method!r:.80}")
    req = SearchRequest(conversation_id, queries, k, method, evidence, question_date,
                        after, before, metadata, dict(settings))
    checked = req.checked()
    resolve(None, method or DEFAULT_METHOD, None, **settings)  # SettingsError
    return checked


class Batcher:
    """Answers concurrent :meth:`search` calls on ``memory`` in shared batches.

    Args:
        memory: a :class:`~memgas_gpu.MemoryIndex` (or anything with ``search`` and
            ``search_many``).
        max_batch_size: questions per batch at most (a single call with more questions
            is answered alone); ``1`` turns batching off: every call is a direct
            ``memory.search`` in the caller's thread.
        max_wait_ms: how long the worker waits, after the oldest queued call arrived,
            for more calls before it starts a batch that is not full.
        encoder, device: passed to every ``search_many`` (default: the memory's).

    ``search`` may be called from any number of threads; :meth:`stats` gives the
    counters (batches, questions, mean batch size, queue depth) for metrics.
    :meth:`close` answers what is queued, then stops the worker.
    """

    def __init__(self, memory, max_batch_size: int = 64, max_wait_ms: float = 5.0,
                 encoder: Any = None, device: Optional[str] = None) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) \
                or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, (int, float)) \
                or not 0 <= max_wait_ms < float("inf"):
            raise ValueError(f"max_wait_ms must be a finite number >= 0, got {max_wait_ms!r}")
        self.memory = memory
        self.max_batch_size = max_batch_size
        self.max_wait_ms = float(max_wait_ms)
        self.encoder, self.device = encoder, device
        self._cond = threading.Condition()
        self._queue: list[_Item] = []
        self._closed = False
        self._counts = {"batches": 0, "requests": 0, "questions": 0, "errors": 0,
                        "seconds": 0.0, "retried": 0}
        self._hist = [0] * (len(BATCH_BUCKETS) + 1)
        self._in_flight = 0
        self._worker: Optional[threading.Thread] = None
        if max_batch_size > 1:
            self._worker = threading.Thread(target=self._run, name="memgas-batcher",
                                            daemon=True)
            self._worker.start()

    @property
    def batching(self) -> bool:
        """False when ``max_batch_size`` is 1 (every call is a direct search)."""
        return self._worker is not None

    # ------------------------------------------------------------------ callers
    def request(self, conversation_id, queries: Sequence[str], k: int = 10,
                method: Optional[str] = None, evidence: int = 3,
                question_date: Optional[str] = None, after: Optional[str] = None,
                before: Optional[str] = None, metadata: Optional[dict] = None,
                **settings):
        """:func:`check_request` of these arguments (those of
        :meth:`MemoryIndex.search`)."""
        return check_request(conversation_id, queries, k, method, evidence, question_date,
                             after, before, metadata, **settings)

    def search(self, conversation_id, queries: Sequence[str], k: int = 10,
               method: Optional[str] = None, evidence: int = 3,
               question_date: Optional[str] = None, after: Optional[str] = None,
               before: Optional[str] = None, metadata: Optional[dict] = None,
               **settings) -> list:
        """:meth:`MemoryIndex.search <memgas_gpu.MemoryIndex.search>` with these
        arguments, answered in a batch with the other callers' (blocks until then).

        Raises:
            TypeError, ValueError: a bad argument of this call (nothing was queued).
            RuntimeError: the batcher is closed.
        """
        req = self.request(conversation_id, queries, k, method, evidence, question_date,
                           after, before, metadata, **settings)
        if not self.batching:
            return self._direct(req)
        item = _Item(req)
        self._enqueue(item)
        return item.wait()

    async def asearch(self, conversation_id, queries: Sequence[str], k: int = 10,
                      method: Optional[str] = None, evidence: int = 3,
                      question_date: Optional[str] = None, after: Optional[str] = None,
                      before: Optional[str] = None, metadata: Optional[dict] = None,
                      **settings) -> list:
        """:meth:`search` for an event loop: the call waits without holding a thread
        (without batching, the direct search runs in the loop's default executor)."""
        req = self.request(conversation_id, queries, k, method, evidence, question_date,
                           after, before, metadata, **settings)
        loop = asyncio.get_running_loop()
        if not self.batching:
            return await loop.run_in_executor(None, self._direct, req)
        item = _Item(req, loop)
        self._enqueue(item)
        return await item.await_()

    def _direct(self, req) -> list:
        t0 = time.perf_counter()
        try:
            out = self.memory.search_many([req], encoder=self.encoder, device=self.device)[0]
        except BaseException:
            self._count(1, 1, 1, time.perf_counter() - t0)
            raise
        self._count(len(req.queries), 1, 0, time.perf_counter() - t0)
        return out

    def _enqueue(self, item: _Item) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._queue.append(item)
            self._cond.notify()

    # ------------------------------------------------------------------ the worker
    def _take(self) -> Optional[list]:
        """The next batch (None once closed and drained): waits for a first call, then
        until the batch is full or ``max_wait_ms`` after its oldest call."""
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            deadline = self._queue[0].arrived + self.max_wait_ms / 1e3
            while not self._closed:
                if sum(i.questions for i in self._queue) >= self.max_batch_size:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, n = [], 0
            while self._queue and (not batch or
                                   n + self._queue[0].questions <= self.max_batch_size):
                item = self._queue.pop(0)
                batch.append(item)
                n += item.questions
            self._in_flight = len(batch)
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                self._answer(batch)
            finally:
                with self._cond:
                    self._in_flight = 0

    def _answer(self, batch: list) -> None:
        t0 = time.perf_counter()
        try:
            outs = self.memory.search_many([i.request for i in batch], encoder=self.encoder,
                                           device=self.device)
        except BaseException as e:  # noqa: BLE001 - each caller gets its own answer
            if len(batch) == 1:
                self._count(batch[0].questions, 1, 1, time.perf_counter() - t0)
                batch[0].finish(error=e)
                return
            # one request the checks let through failed the batch: answer each alone,
            # so that only its caller gets the error
            with self._cond:
                self._counts["retried"] += 1
            for item in batch:
                t1 = time.perf_counter()
                try:
                    got = self.memory.search_many([item.request], encoder=self.encoder,
                                                  device=self.device)[0]
                except BaseException as e1:  # noqa: BLE001
                    self._count(item.questions, 1, 1, time.perf_counter() - t1)
                    item.finish(error=e1)
                else:
                    self._count(item.questions, 1, 0, time.perf_counter() - t1)
                    item.finish(got)
            return
        self._count(sum(i.questions for i in batch), len(batch), 0, time.perf_counter() - t0)
        for item, out in zip(batch, outs):
            item.finish(out)

    def _count(self, questions: int, requests: int, errors: int, seconds: float) -> None:
        with self._cond:
            c = self._counts
            c["batches"] += 1
            c["requests"] += requests
            c["questions"] += questions
            c["errors"] += errors
            c["seconds"] += seconds
            b = next((j for j, hi in enumerate(BATCH_BUCKETS) if questions <= hi),
                     len(BATCH_BUCKETS))
            self._hist[b] += 1

    # ------------------------------------------------------------------ state
    def stats(self) -> dict:
        """Counters since the start: ``batches``, ``requests``, ``questions`` (answered,
        errors included), ``errors``, ``seconds`` (in ``search_many``),
        ``mean_batch_size`` (questions per batch), ``queue_depth`` (calls waiting for a
        batch), ``in_flight`` (calls of the batch being answered), ``retried`` (batches
        answered request by request after one failed), ``batch_sizes`` (``{upper bound:
        batches}``, cumulative as Prometheus buckets; ``"+Inf"`` last)."""
        with self._cond:
            c = dict(self._counts)
            c["queue_depth"] = len(self._queue)
            c["in_flight"] = self._in_flight
            hist = list(self._hist)
        c["mean_batch_size"] = c["questions"] / c["batches"] if c["batches"] else 0.0
        cum, run = {}, 0
        for hi, n in zip([*BATCH_BUCKETS, "+Inf"], hist):
            run += n
            cum[hi] = run
        c["batch_sizes"] = cum
        c["max_batch_size"] = self.max_batch_size
        c["max_wait_ms"] = self.max_wait_ms
        return c

    def close(self, timeout: Optional[float] = None) -> None:
        """Answer what is queued, then stop the worker; later calls are refused."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join(timeout)

    def __enter__(self) -> "Batcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
