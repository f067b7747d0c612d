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

**Fair sharing.**  Each queued call belongs to a *tenant* (``None`` for the plain
``search`` / ``asearch``; :meth:`Batcher.asearch_request` names one).  A batch is formed
round-robin across the tenants that have work queued, the least recently served first
(FIFO within a tenant), and a request submitted with :meth:`~Batcher.asearch_request`
is cut into pieces that fit the batches, so one tenant's large search or flood of
searches holds another tenant's one question back by one batch (the one being
answered when it came), not by all of its own (the bound: :class:`Batcher`).

:class:`BatchStats` and :func:`answer_batch` are the batch counters and the "answer
each request alone after a failed batch" rule, shared by the :class:`Batcher` and the
Ray Serve shards (:mod:`.ray_serve`).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from typing import Any, Hashable, Optional, Sequence

__all__ = ["Batcher", "BATCH_BUCKETS", "BatchStats", "answer_batch", "answer_each",
           "check_request", "recheck_request"]

#: upper bounds of the batch-size histogram (questions per batch); the last is +inf
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


# ---------------------------------------------------------------------- shared pieces
class BatchStats:
    """Thread-safe counters of the ``search_many`` calls that answered searches: one
    *batch* per call, its questions, requests, errors (requests answered with an error)
    and seconds, a histogram of questions per batch (:data:`BATCH_BUCKETS`), and
    ``retried`` (batches that failed and were answered request by request)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {"batches": 0, "requests": 0, "questions": 0, "errors": 0,
                        "seconds": 0.0, "retried": 0}
        self._hist = [0] * (len(BATCH_BUCKETS) + 1)

    def record(self, questions: int, requests: int, errors: int, seconds: float) -> None:
        """One ``search_many`` call answered ``requests`` requests of ``questions``
        questions in all, ``errors`` of them with an error."""
        b = next((j for j, hi in enumerate(BATCH_BUCKETS) if questions <= hi),
                 len(BATCH_BUCKETS))
        with self._lock:
            c = self._counts
            c["batches"] += 1
            c["requests"] += requests
            c["questions"] += questions
            c["errors"] += errors
            c["seconds"] += seconds
            self._hist[b] += 1

    def retry(self) -> None:
        """A batch failed and its requests are answered one by one."""
        with self._lock:
            self._counts["retried"] += 1

    def snapshot(self) -> dict:
        """The counters, ``mean_batch_size`` (questions per batch) and ``batch_sizes``
        (``{upper bound: batches}``, cumulative as Prometheus buckets, ``"+Inf"``
        last)."""
        with self._lock:
            c = dict(self._counts)
            hist = list(self._hist)
        c["mean_batch_size"] = c["questions"] / c["batches"] if c["batches"] else 0.0
        cum, run = {}, 0
        for hi, n in zip([*BATCH_BUCKETS, "+Inf"], hist):
            run += n
            cum[hi] = run
        c["batch_sizes"] = cum
        return c


def _questions(request) -> int:
    return len(request.queries)


def answer_each(memory, requests: Sequence, encoder: Any = None,
                device: Optional[str] = None, stats: Optional[BatchStats] = None) -> list:
    """Each of ``requests`` answered alone (``memory.search_many([request])``): a list
    with, for each, its results or the exception of its own call (each call counted in
    ``stats`` as a batch of one request)."""
    out = []
    for r in requests:
        t0 = time.perf_counter()
        try:
            got = memory.search_many([r], encoder=encoder, device=device)[0]
        except BaseException as e:  # noqa: BLE001 - each request gets its own answer
            got = e
        if stats is not None:
            stats.record(_questions(r), 1, int(isinstance(got, BaseException)),
                         time.perf_counter() - t0)
        out.append(got)
    return out


def answer_batch(memory, requests: Sequence, encoder: Any = None,
                 device: Optional[str] = None, stats: Optional[BatchStats] = None) -> list:
    """``requests`` (checked :class:`~memgas_gpu.retrieve.search.SearchRequest` objects)
    answered with one ``memory.search_many``: a list with, for each request, its results
    or an exception.  If the call fails, a lone request gets that error; several are
    answered alone (:func:`answer_each`), so that an error reaches only the request
    that causes it.  Never raises for a request's failure; counts in ``stats``.

    The one rule of the :class:`Batcher` and of the Ray Serve shards::

        outs = answer_batch(memory, requests, encoder, device, stats)
        # outs[i]: requests[i]'s list of SearchResult, or the exception it raised
    """
    t0 = time.perf_counter()
    try:
        outs = list(memory.search_many(list(requests), encoder=encoder, device=device))
        if len(outs) != len(requests):  # a caller left without an answer would wait on
            raise RuntimeError(f"search_many answered {len(outs)} of {len(requests)} "
                               "requests")
    except BaseException as e:  # noqa: BLE001 - each request gets its own answer
        if len(requests) == 1:
            if stats is not None:
                stats.record(_questions(requests[0]), 1, 1, time.perf_counter() - t0)
            return [e]
        # one request the checks let through failed the batch: answer each alone, so
        # that only its own caller gets the error
        if stats is not None:
            stats.retry()
        return answer_each(memory, requests, encoder, device, stats)
    if stats is not None:
        stats.record(sum(_questions(r) for r in requests), len(requests), 0,
                     time.perf_counter() - t0)
    return outs


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


def recheck_request(request):
    """A :class:`~memgas_gpu.retrieve.search.SearchRequest` as queued: one that
    :func:`check_request` returned (:meth:`Batcher.request`, the HTTP app's one check)
    as it is, any other checked now (a TypeError for anything that is no request)."""
    if not dataclasses.is_dataclass(request) or not hasattr(request, "queries"):
        raise TypeError(f"expected a SearchRequest (Batcher.request(...)), got "
                        f"{type(request).__name__}")
    if hasattr(request, "keep"):  # set by SearchRequest.checked(): checked once already
        return request
    return check_request(request.conversation_id, request.queries, request.k,
                         request.method, request.evidence, request.question_date,
                         request.after, request.before, request.metadata,
                         **dict(request.settings or {}))


# ---------------------------------------------------------------------- queued calls
class _Item:
    """One caller's checked request, how much of it is handed out and answered, and
    where its answer goes.  A *splittable* item (:meth:`Batcher.asearch_request`) may be
    answered in pieces across batches; any other is answered by one call.

    The worker hands out pieces (``next``) and withdraws items under the batcher's lock;
    it answers them (:meth:`answered`) without it, from its own thread only."""

    __slots__ = ("request", "questions", "key", "splittable", "arrived", "next", "left",
                 "results", "error", "done", "withdrawn", "_event", "_loop", "_future")

    def __init__(self, request, loop=None, key=None, splittable: bool = False) -> None:
        self.request = request
        self.questions = len(request.queries)
        self.key, self.splittable = key, splittable
        self.arrived = time.monotonic()
        self.next = 0  # questions handed out to batches
        self.left = self.questions  # questions not yet answered
        self.results: Optional[list] = [None] * self.questions if splittable else None
        self.error: Optional[BaseException] = None
        self.done = False  # answered (results, or the error of one piece)
        self.withdrawn = False  # out of the queue before it was all handed out
        self._event = threading.Event() if loop is None else None
        self._loop = loop
        self._future = loop.create_future() if loop is not None else None

    def answered(self, i: int, j: int, out) -> None:
        """Questions ``i:j`` answered: ``out`` is their results or an exception."""
        if self.done:
            return
        if isinstance(out, BaseException):
            self.finish(error=out)
            return
        if not self.splittable:
            self.finish(out)
            return
        self.results[i:j] = out
        self.left -= j - i
        if self.left == 0:
            self.finish(self.results)

    def finish(self, result=None, error: Optional[BaseException] = None) -> None:
        if self.done:
            return
        self.done = True
        self.results, self.error = result, error
        if self._loop is None:
            self._event.set()
            return
        try:
            self._loop.call_soon_threadsafe(self._settle)
        except RuntimeError:  # the caller's loop is closed: nobody waits any more
            pass

    def _settle(self) -> None:
        if self._future.done():  # the caller was cancelled
            return
        if self.error is not None:
            self._future.set_exception(self.error)
        else:
            self._future.set_result(self.results)

    def wait(self):
        self._event.wait()
        if self.error is not None:
            raise self.error
        return self.results


class Batcher:
    """Answers concurrent searches on ``memory`` in shared batches, fairly across tenants.

    Args:
        memory: a :class:`~memgas_gpu.MemoryIndex` (or anything with ``search_many``).
        max_batch_size: questions per batch at most (a single :meth:`search` call with
            more questions is answered alone; a request given to :meth:`asearch_request`
            is cut into pieces that fit); ``1`` turns batching off: every call is a
            direct ``memory.search_many`` (in the caller's thread, or the event loop's
            default executor), in arrival order, without fairness.
        max_wait_ms: how long the worker waits, after the oldest queued call arrived,
            for more calls before it starts a batch that is not full.
        encoder, device: passed to every ``search_many`` (default: the memory's).
        fair: form batches round-robin across tenants, the least recently served
            first (default); False: first come, first served across tenants (a flood
            delays everyone queued behind it; large requests are still cut).

    **The bound.**  A batch is formed from the tenants with work queued, in order of
    the batch that last served them (a tenant whose queue was empty joins at the end of
    the current round; ties: the oldest call first), each tenant taking its calls
    first come, first served, up to ``ceil(room left / tenants)`` questions (a
    request of :meth:`asearch_request` is cut there), in rounds until the batch is
    full.  So with ``T`` tenants queued, the call (or next piece) at the head of a
    tenant's queue is in one of the next ``ceil(T / max_batch_size)`` batches after the
    one being answered when it got there (for two tenants: the next batch), whatever
    the other tenants' requests' sizes; a tenant's own calls go first come, first
    served.  (A plain :meth:`search` call that does not fit the room left waits for
    the next batch, where it goes first; one larger than a batch is answered alone.)

    ``search`` may be called from any number of threads, the ``a*`` methods from any
    number of event loops; :meth:`stats` gives the counters for metrics.
    :meth:`close` answers what is queued, then stops the worker.
    """

    def __init__(self, memory, max_batch_size: int = 64, max_wait_ms: float = 5.0,
                 encoder: Any = None, device: Optional[str] = None,
                 fair: bool = True) -> None:
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
        self.fair = bool(fair)
        self._cond = threading.Condition()
        #: tenant -> its queued calls (FIFO); without fairness one queue (key None)
        self._queues: dict = {}
        #: tenant with work queued -> the serial of the batch that last served it, or
        #: the serial when its queue was opened (the round-robin order)
        self._rank: dict = {}
        self._serial = 0  # batches formed
        self._queued = 0  # questions queued and not yet handed out
        self._calls = 0  # calls queued (for queue_depth)
        self._closed = False
        self._stats = BatchStats()
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
        arguments, answered in one batch with the other callers' (blocks until then),
        as tenant ``None``.

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
        return await self._await(req, None, splittable=False)

    def search_request(self, request, tenant: Optional[Hashable] = None) -> list:
        """:meth:`asearch_request` for a thread (blocks until answered)."""
        req, key = recheck_request(request), self._key(tenant)
        if not self.batching:
            return self._direct(req)
        item = _Item(req, None, key, splittable=True)
        self._enqueue(item)
        return item.wait()

    async def asearch_request(self, request, tenant: Optional[Hashable] = None) -> list:
        """The results of ``request`` (a :class:`~memgas_gpu.retrieve.search.SearchRequest`,
        e.g. what :meth:`request` returned: it is checked again here), one per
        question and in its order, as ``memory.search_many([request])[0]`` gives them
        (up to float rounding of another batch), answered in the batches on behalf of
        ``tenant`` (any hashable; ``None`` is also the plain :meth:`search` callers').

        Unlike :meth:`asearch`, the request is cut into pieces that fit the batches
        (see the class's bound): while one tenant searches thousands of questions,
        another tenant's one-question search waits for about one batch, not for all of
        them.  Each piece reads the memory as it is when its batch starts, so a write
        that lands while a large request is answered may be seen by its later pieces
        only.  The call waits without holding a thread; if it is cancelled (the client
        hung up), its pieces not yet handed to a batch are dropped at once.

        Raises:
            TypeError, ValueError: a bad request or tenant (nothing was queued).
            RuntimeError: the batcher is closed.
            Any error the memory raised for one of its pieces (its other pieces are
            dropped).

        The HTTP backend calls it as::

            req = batcher.request(conversation_id, questions, **kwargs)  # 422 if bad
            results = await batcher.asearch_request(req, tenant=tenant)
        """
        req = recheck_request(request)
        return await self._await(req, self._key(tenant), splittable=True)

    def _key(self, tenant):
        try:
            hash(tenant)
        except TypeError:
            raise TypeError(f"tenant must be hashable (a name, an id), got "
                            f"{type(tenant).__name__}") from None
        return tenant if self.fair else None

    async def _await(self, req, key, splittable: bool) -> list:
        loop = asyncio.get_running_loop()
        if not self.batching:
            return await loop.run_in_executor(None, self._direct, req)
        item = _Item(req, loop, key, splittable)
        self._enqueue(item)
        try:
            return await item._future
        except asyncio.CancelledError:
            self._withdraw(item)
            raise

    def _direct(self, req) -> list:
        out = answer_batch(self.memory, [req], self.encoder, self.device, self._stats)[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def _enqueue(self, item: _Item) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            q = self._queues.get(item.key)
            if q is None:  # joins at the end of the current round
                q = self._queues[item.key] = collections.deque()
                self._rank[item.key] = self._serial
            q.append(item)
            self._queued += item.questions
            self._calls += 1
            self._cond.notify()

    def _withdraw(self, item: _Item) -> None:
        """Take ``item`` out of its queue (its caller gave up, or a piece failed): what
        of it is not handed out yet is never asked."""
        with self._cond:
            if item.withdrawn or item.next == item.questions:
                return  # out already, or all handed out
            item.withdrawn = True
            q = self._queues[item.key]
            q.remove(item)
            self._queued -= item.questions - item.next
            self._calls -= 1
            if not q:
                del self._queues[item.key], self._rank[item.key]

    # ------------------------------------------------------------------ the worker
    def _take(self) -> Optional[list]:
        """The next batch, ``[(item, start, end, request)]`` (None once closed and
        drained): waits for a first call, then until the batch is full or
        ``max_wait_ms`` after the oldest call queued."""
        with self._cond:
            while True:
                while not self._queues:
                    if self._closed:
                        return None
                    self._cond.wait()
                while not self._closed and self._queues \
                        and self._queued < self.max_batch_size:
                    oldest = min(q[0].arrived for q in self._queues.values())
                    left = oldest + self.max_wait_ms / 1e3 - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._queues:  # else every call queued was withdrawn meanwhile
                    break
            batch = self._form()
            self._in_flight = len(batch)
        return [(item, i, j, _piece(item.request, i, j, item.questions))
                for item, (i, j) in batch]

    def _form(self) -> list:
        """Hand out the next batch, ``[(item, (start, end))]`` (held: ``_cond``; see the
        class docstring for the order)."""
        order = sorted(self._queues, key=lambda t: (self._rank[t], self._queues[t][0].arrived))
        self._serial += 1
        room = self.max_batch_size
        pieces: dict = {}  # item -> [start, end], in the order handed out
        while room > 0:  # rounds: each tenant its share of the room left
            active = [key for key in order if key in self._queues]
            if not active:
                break
            share = -(-room // len(active))
            took = False
            for key in active:
                q, taken = self._queues[key], 0
                while q and room > 0 and taken < share:  # its calls, first come first
                    item = q[0]
                    rest = item.questions - item.next
                    if item.splittable:
                        n = min(rest, share - taken, room)
                    elif rest <= room or not pieces:  # a call larger than a batch: alone
                        n = rest
                    else:
                        break  # does not fit: the tenant waits for the next batch
                    span = pieces.setdefault(item, [item.next, item.next])
                    span[1] += n
                    item.next += n
                    taken += n
                    room -= n
                    self._queued -= n
                    if item.next == item.questions:
                        q.popleft()
                        self._calls -= 1
                if taken:
                    self._rank[key] = self._serial
                    took = True
                if not q:
                    del self._queues[key], self._rank[key]
            if not took:
                break
        return [(item, tuple(span)) for item, span in pieces.items()]

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                self._answer(batch)
            except BaseException as e:  # noqa: BLE001 - the worker must not die
                for item, i, j, _ in batch:
                    item.answered(i, j, e)
            finally:
                with self._cond:
                    self._in_flight = 0

    def _answer(self, batch: list) -> None:
        outs = answer_batch(self.memory, [req for _, _, _, req in batch], self.encoder,
                            self.device, self._stats)
        for (item, i, j, _), out in zip(batch, outs):
            item.answered(i, j, out)
            if isinstance(out, BaseException) and item.next < item.questions:
                self._withdraw(item)  # its other pieces are not asked

    # ------------------------------------------------------------------ state
    def stats(self) -> dict:
        """Counters since the start: ``batches``, ``requests`` (answered, errors
        included; a request answered in pieces counts once per piece), ``questions``,
        ``errors``, ``seconds`` (in ``search_many``), ``mean_batch_size`` (questions per
        batch), ``queue_depth`` (calls waiting for a batch, or for their next piece's),
        ``tenants_queued`` (tenants with calls waiting), ``in_flight`` (calls or
        pieces in the batch being answered), ``retried`` (batches answered request by
        request after one failed), ``batch_sizes`` (``{upper bound: batches}``,
        cumulative as Prometheus buckets; ``"+Inf"`` last)."""
        c = self._stats.snapshot()
        with self._cond:
            c["queue_depth"] = self._calls
            c["tenants_queued"] = len(self._queues)
            c["in_flight"] = self._in_flight
        c["max_batch_size"] = self.max_batch_size
        c["max_wait_ms"] = self.max_wait_ms
        c["fair"] = self.fair
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


def _piece(request, i: int, j: int, n: int):
    """Questions ``i:j`` of the checked ``request`` of ``n`` questions, as a request."""
    if i == 0 and j == n:
        return request
    return dataclasses.replace(request, conversation_id=list(request.conversation_id[i:j]),
                               queries=list(request.queries[i:j]))
