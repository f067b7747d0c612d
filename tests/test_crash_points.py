"""Crash points, enumerated: a fixed script of writes on a memory opened on a folder is
run once per durability-relevant call (every write, fsync, rename and unlink under the
folder), crashing there (tests/_fsrecord.py); what a kill (-9) and what a power loss
(strict model: a file's bytes as of its last fsync, a folder's entries as of its own
last fsync; and one that keeps half of the appends not synced) would leave must open,
``MemoryIndex.open`` and ``MemoryIndex.load`` must agree, hold every acknowledged write,
and of the write in flight all or nothing (an ``add_sessions`` of several sessions is
one write: all of its sessions or none).  The same script under a full disk (ENOSPC
from the n-th write or fsync): a write that raised is absent after a reopen, the
acknowledged ones present, the folder opens, in the same process (a failed open lets
the folder go).  Eviction is on: the memory reopened halfway keeps nothing it reads from
the folder (``max_resident_bytes=0``: its writes, its commits and its last compaction
read every conversation again from the packs), and a memory opened on a crashed folder
keeps a segment or two, while ``MemoryIndex.load``, which must agree with it, keeps
everything.

Oracle: a fresh in-RAM memory given the same writes (per conversation: session ids,
dates, metadata, turn texts, embeddings and the association graph), one per prefix of
the script's writes, built once.

The default run takes every crash point of the first open and of the writes of
several sessions, the first of every step and every K-th point elsewhere, and every
other full-disk point (and the first of every step);
``-m slow`` runs them all.  The store's chunk pages are of one chunk and merges take
two, so that the script's commits write a chunk page.  Five bugs of the format-3 code were found here (a crash in
the first open, a full disk during an automatic checkpoint, a failed open keeping the
log's lock, a new folder not fsync'd in its parent, a replaced manifest unlinked
without a folder fsync); each has a test of its own below.
"""
from __future__ import annotations

import errno
import gc
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Optional

import pytest
import torch

from memgas_gpu import Dataset, Session
from memgas_gpu.retrieve import MemoryIndex
from memgas_gpu.storage.log import WriteAheadLog

from _fsrecord import CRASH_OPS, FSRecorder, SimulatedCrash
from _memory_model import DATES, POOL, tiny_encoder

pytest.importorskip("Stemmer")

#: the script: ("open"|"reopen", open kwargs), ("add", conversation, POOL index, DATES
#: index, metadata), ("batch", conversation, [POOL index, ...], DATES index) (one
#: add_sessions), ("replace", conversation, POOL index, DATES index, metadata) (the
#: session of that POOL entry's id), ("remove", conversation, session), ("forget",
#: conversation), ("checkpoint",), ("compact",), ("close",)
SCRIPT = [
    ("open", {}),
    ("add", "A", 0, 0, {"source": "chat"}),
    ("add", "B", 0, 1, None),  # the same session as A's s1: stored once, shared
    ("batch", "A", [3, 5], 2),  # s2 and s4 in one write
    ("add", "C", 4, 3, {"n": 2}),
    ("checkpoint",),
    ("replace", "B", 1, 1, {"v": 2}),  # B's s1 (shared with A) replaced: A keeps its own
    ("add", "B", 6, 1, None),
    ("remove", "A", "s1"),  # the first s1's content is no one's now
    ("forget", "C"),
    ("add", "C", 5, 0, None),  # C again: A's s4, shared
    ("compact",),  # drops the first s1 and C's first session from the store
    ("close",),
    # from here every write commits by itself, and nothing read from the folder is kept
    ("reopen", {"checkpoint_bytes": 1, "max_resident_bytes": 0}),
    ("batch", "D", [7, 2], 3),
    ("add", "B", 3, 2, None),  # A's s2, shared
    ("replace", "D", 0, 0, None),  # D's s1 (the violin lesson) becomes POOL[0]'s
    ("remove", "B", "s5"),
    ("compact",),  # a full commit: A and C read again from the old commit's packs
]
#: what the memories opened on crashed folders keep of what they read (a segment or
#: two: the others are read again when the checks need them)
MAX_RESIDENT = 4096
REOPEN = next(i for i, s in enumerate(SCRIPT) if s[0] == "reopen")
DATA_OPS = [s for s in SCRIPT if s[0] in ("add", "batch", "replace", "remove", "forget")]
#: script steps whose every crash point the default run takes (the first open, and the
#: writes of several sessions: all or nothing)
WHOLE_STEPS = (0,) + tuple(i for i, s in enumerate(SCRIPT) if s[0] == "batch")
#: the default run: every K-th crash point outside WHOLE_STEPS
K = 4


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", autouse=True)
def chunk_pages_in_every_commit():
    """Store chunk pages of one chunk, merges of two chunks: the script's commits write
    a chunk page, so crash points fall among those writes too (with the defaults,
    pages of 16, a memory this small writes none)."""
    from memgas_gpu.storage import commit

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(commit, "CHUNK_PAGE", 1)
        mp.setattr(commit, "CHUNK_FANIN", 2)
        yield


def test_the_script_writes_chunk_pages(tmp_path, enc, monkeypatch):
    """The script's commits write a chunk page and a later commit lists its chunks
    without it (the crash points then fall among those writes)."""
    from memgas_gpu.storage import commit

    pages = []
    put = commit.json_blob

    def recording(value):
        if isinstance(value, dict) and "chunk_pages" in value:
            pages.append(value["chunk_pages"]["pages"])
        return put(value)

    monkeypatch.setattr(commit, "json_blob", recording)
    prog = run_script(tmp_path / "m", enc)
    prog.mems[-1].close()
    assert prog.error is None and prog.step == len(SCRIPT), prog.error
    assert 0 in pages[pages.index(1):], pages


class _Memo:
    """An encoder that encodes each distinct input once (the script runs hundreds of
    times; the embeddings are the tiny encoder's own)."""

    def __init__(self, enc) -> None:
        self.enc, self.memo = enc, {}
        inner = enc.encode

        def encode(texts, *a, **kw):
            key = (texts if isinstance(texts, str) else tuple(texts), a,
                   tuple(sorted(kw.items())))
            got = self.memo.get(key)
            if got is None:
                got = self.memo[key] = inner(texts, *a, **kw)
            return got.clone() if isinstance(got, torch.Tensor) else got.copy()

        enc.encode = encode


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster on a shared machine
    old = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("bert"))  # tiny_encoder's model folder
    try:
        e = tiny_encoder()
    finally:
        tempfile.tempdir = old
    _Memo(e)
    yield e
    torch.set_num_threads(threads)


def _apply(mem: MemoryIndex, op, enc) -> None:
    if op[0] in ("add", "replace"):
        _, cid, p, d, md = op
        s = POOL[p]
        write = mem.add_session if op[0] == "add" else mem.replace_session
        write(cid, Session(s.id, DATES[d], s.turns), encoder=enc,
              summary=f"summary {p}", keywords=f"keywords {p}", metadata=md)
    elif op[0] == "batch":
        _, cid, ps, d = op
        mem.add_sessions(cid, [Session(POOL[p].id, DATES[d], POOL[p].turns) for p in ps],
                         encoder=enc, summaries=[f"summary {p}" for p in ps],
                         keywords=[f"keywords {p}" for p in ps],
                         metadata=[{"batch": i} for i in range(len(ps))])
    elif op[0] == "remove":
        mem.remove_session(op[1], op[2])
    else:
        mem.forget_conversation(op[1])


def summary(mem: MemoryIndex) -> list:
    """What a user can tell apart: per conversation, in order, its sessions (id, date,
    metadata, turns), their embeddings and the conversation's graph."""
    out = []
    for c in mem.conversations:
        v = mem.view([c.id])
        g = v.graph()
        out.append((c.id, [mem.get_session(c.id, sid) for sid in c.session_ids],
                    v.gran[v.row_slot].clone(), g[0].clone(), g[1].clone()))
    return out


def same(a: list, b: list) -> Optional[str]:
    """None when the summaries agree, else what differs first."""
    if [x[0] for x in a] != [x[0] for x in b]:
        return f"conversations {[x[0] for x in a]} != {[x[0] for x in b]}"
    for x, y in zip(a, b):
        if x[1] != y[1]:
            return f"{x[0]}: sessions {x[1]} != {y[1]}"
        if x[2].shape != y[2].shape or not torch.allclose(x[2], y[2], atol=1e-6, rtol=0):
            return f"{x[0]}: embeddings differ"
        if not (torch.equal(x[3], y[3]) and torch.equal(x[4], y[4])):
            return f"{x[0]}: graphs differ"
    return None


@pytest.fixture(scope="module")
def oracle(enc) -> list:
    """``[k]``: the summary of a fresh in-RAM memory given the script's first k
    writes."""
    mem = MemoryIndex.build(Dataset([]), enc, device="cpu", progress=False)
    out = [summary(mem)]
    for op in DATA_OPS:
        _apply(mem, op, enc)
        out.append(summary(mem))
    return out


# ---------------------------------------------------------------------------- running
@dataclass
class Progress:
    """How far a run of the script got."""

    acked: int = 0  # writes that returned
    in_flight: Optional[int] = None  # the write (index into DATA_OPS) that was running
    step: int = 0  # the script step that was running (len(SCRIPT): it completed)
    error: Optional[BaseException] = None  # what stopped it
    mems: list = field(default_factory=list)


class _Logs:
    """Every WriteAheadLog opened, to let go of those a crashed run left open (its
    objects are abandoned as a killed process leaves them)."""

    def __enter__(self):
        self.real, self.opened = WriteAheadLog.__dict__["open"], []
        real = WriteAheadLog.open

        def tracking(folder, **kw):
            w = real(folder, **kw)
            self.opened.append(w)
            return w

        WriteAheadLog.open = staticmethod(tracking)
        return self

    def __exit__(self, *exc):
        WriteAheadLog.open = self.real

    def release(self) -> None:
        for w in self.opened:
            if w._fd >= 0:
                try:
                    os.close(w._fd)
                except OSError:
                    pass
                w._fd = -1
            if w._lock is not None:
                w._lock.release()
            w._closed = w._closing = True


def run_script(folder: Path, enc, rec: Optional[FSRecorder] = None) -> Progress:
    """Run SCRIPT on ``folder`` until it ends or a call raises (a simulated crash, an
    injected error); the memories are then abandoned as a killed process leaves them."""
    prog = Progress()
    mem = None
    k = 0
    try:
        for i, step in enumerate(SCRIPT):
            prog.step = i
            if rec is not None:
                rec.note("step", i)
            kind = step[0]
            if kind in ("open", "reopen"):
                mem = MemoryIndex.open(folder, encoder=enc, **step[1])
                prog.mems.append(mem)
            elif kind == "checkpoint":
                mem.checkpoint()
            elif kind == "compact":
                mem.compact()
            elif kind == "close":
                mem.close()
            else:
                prog.in_flight = k
                _apply(mem, step, enc)
                prog.in_flight = None
                k += 1
                prog.acked = k
        prog.step = len(SCRIPT)
    except (SimulatedCrash, Exception) as e:  # noqa: BLE001 - the sweeps judge it
        prog.error = e
    if rec is not None:
        rec.note("end")
        rec.disarm()  # what follows (abandoning the memory) is no crash point
    return prog


def abandon(prog: Progress, logs: _Logs) -> None:
    for m in prog.mems:
        if not m._closed:
            m.abandon()
    logs.release()


def let_go(prog: Progress, rec: FSRecorder) -> None:
    """Close the descriptors a run left open that no object holds any more.  The run's
    memories and the frames of what stopped it are dropped and collected first, so an
    object that still holds a file (a commit's pack reader, open for the memory's
    life) closes it itself: closed here by its number, the object would close, when
    the collector gets to it, whatever file a later run had opened under that number."""
    prog.mems.clear()
    e, seen = prog.error, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    gc.collect()
    for fd in rec.leaked_fds():
        os.close(fd)


class Verdict(NamedTuple):
    """What is wrong with a folder: ``kind`` is "open" (refused), "read" (opened, then
    refused when its conversations were read), "load" (refused after an open),
    "disagree" (load and open differ), "lost" (it holds neither the acknowledged writes
    nor those and the one in flight: a write half there is lost), "raised" (it holds a
    write that raised: acknowledged as failed, yet there)."""

    kind: str
    message: str


def check_folder(path: Path, enc, oracle: list, prog: Progress,
                 raised: bool = False) -> tuple[Optional[Verdict], Optional[int]]:
    """``(None, writes held)`` when ``path`` opens, ``load`` agrees with ``open``, and
    both hold the acknowledged writes (and the one in flight entirely or not at all,
    or, when it ``raised``, not at all); else ``(what is wrong, None)``."""
    logs = _Logs()
    with logs, FSRecorder(path, real_fsync=False):  # the model's fsyncs only: faster
        try:
            mem = MemoryIndex.open(path, encoder=enc, max_resident_bytes=MAX_RESIDENT)
        except Exception as e:  # noqa: BLE001 - reported
            logs.release()
            return Verdict("open", f"{type(e).__name__}: "
                                   f"{' '.join(str(e).split())[:300]}"), None
    try:
        try:  # the conversations are read here, when first needed
            got = summary(mem)
        except Exception as e:  # noqa: BLE001 - reported
            return Verdict("read", f"{type(e).__name__}: "
                                   f"{' '.join(str(e).split())[:300]}"), None
        try:
            loaded = summary(MemoryIndex.load(path))
        except Exception as e:  # noqa: BLE001 - reported
            return Verdict("load", f"{type(e).__name__}: "
                                   f"{' '.join(str(e).split())[:300]}"), None
        diff = same(loaded, got)
        if diff is not None:
            return Verdict("disagree", diff), None
        k = prog.acked
        diff = same(got, oracle[k])
        if diff is None:
            return None, k
        if prog.in_flight is not None and same(got, oracle[k + 1]) is None:
            if not raised:
                return None, k + 1  # the write in flight, whole
            return Verdict("raised", f"write {k + 1} ({DATA_OPS[k][:3]}) raised, yet the "
                                     "folder holds it"), None
        nor = " (nor those and the one in flight)" if prog.in_flight is not None else ""
        return Verdict("lost", f"holds not the {k} acknowledged writes{nor}: {diff}"), None
    finally:
        mem.abandon()
        logs.release()


def step_of(rec: FSRecorder, upto: int) -> int:
    """The script step running at event ``upto``."""
    steps = [rec.events[i].detail for i in rec.find("note", "step", stop=upto)]
    return steps[-1] if steps else 0


def count_points(tmp: Path, enc, ops=CRASH_OPS) -> list[int]:
    """The script step of each call of ``ops`` the script makes (crash point n is
    ``[n - 1]``)."""
    folder = tmp / "count" / "mem"
    folder.mkdir(parents=True)
    with _Logs() as logs, FSRecorder(folder, real_fsync=False) as rec:
        prog = run_script(folder, enc, rec)
        evicted = prog.mems[-1].residency()["evictions"] if prog.mems else 0
        abandon(prog, logs)
    assert prog.step == len(SCRIPT), prog.error
    assert evicted > 0, "the reopened memory dropped nothing it read from the folder"
    end = rec.first("note", "end")
    steps = [step_of(rec, i) for i, e in enumerate(rec.events[:end]) if e.op in ops]
    shutil.rmtree(tmp / "count")
    return steps


class Outcome(NamedTuple):
    n: int  # the crash point (or the failing call)
    step: int  # the script step it was in
    event: tuple  # the call
    state: str  # "kill", "power", "torn" (a power loss tearing unsynced appends), "disk"
    verdict: Optional[Verdict]
    held: Optional[int] = None  # the writes the folder holds (when it is right)
    acked: int = 0  # the writes acknowledged before the crash or the failure
    error: Optional[str] = None  # "disk": what the script raised (None: it went on)
    lock_kept: bool = False  # "disk": the reopen in the same process found it locked

    def __str__(self) -> str:
        where = f"point {self.n} ({SCRIPT[self.step][0]} step {self.step}, {self.event})"
        what = "ok" if self.verdict is None else f"{self.verdict.kind}: {self.verdict.message}"
        return f"{where} {self.state}: {what}{' [lock kept]' if self.lock_kept else ''}"


def _tree(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
            for p in folder.rglob("*")}


def crash_sweep(tmp: Path, enc, oracle: list, points) -> list[Outcome]:
    """Crash the script at each of ``points``; check what a kill and a power loss (and a
    power loss that tears the appends not synced, where that differs) leave.  A point
    past the script's last call ends the sweep: what a kill and a power loss leave
    after the script ran to its end is checked (event ``("end", ...)``) as well."""
    out = []
    for n in points:
        base = tmp / f"crash-{n}"
        folder = base / "mem"
        folder.mkdir(parents=True)  # the fresh folder exists: its own entry is durable
        with _Logs() as logs, FSRecorder(folder, real_fsync=False) as rec:
            rec.crash_at(n, base / "states", tear=0.5)
            prog = run_script(folder, enc, rec)
            if rec.crash is None and prog.error is None:  # every write acknowledged
                end = [("kill", rec.kill_state(base / "end" / "kill")),
                       ("power", rec.power_loss_state(base / "end" / "power"))]
            abandon(prog, logs)
            let_go(prog, rec)
        if rec.crash is None:
            assert prog.error is None, prog.error
            for kind, path in end:
                verdict, held = check_folder(path, enc, oracle, prog)
                out.append(Outcome(n, len(SCRIPT) - 1, ("end", ".", None), kind, verdict,
                                   held, prog.acked))
            shutil.rmtree(base)
            break
        assert isinstance(prog.error, SimulatedCrash), prog.error
        c = rec.crash
        step = step_of(rec, c.events_before)
        states = [("kill", c.kill), ("power", c.power)]
        if _tree(c.torn) != _tree(c.power):
            states.append(("torn", c.torn))
        for kind, path in states:
            verdict, held = check_folder(path, enc, oracle, prog)
            out.append(Outcome(n, step, tuple(c.event), kind, verdict, held, prog.acked))
        shutil.rmtree(base)
    return out


def disk_sweep(tmp: Path, enc, oracle: list, points, ops=("write", "fsync")) -> list:
    """Fail the n-th write or fsync with ENOSPC for each n of ``points``; the script
    stops at the first call that raises (an automatic commit that fails raises
    nothing: the script goes on), the memory is let go, and the folder is opened again
    in this process (as an application would); a folder a failed open kept locked is
    opened once more after the logs are let go, to see what else is wrong."""
    out = []
    for n in points:
        base = tmp / f"disk-{n}"
        folder = base / "mem"
        folder.mkdir(parents=True)
        held = None
        with _Logs() as logs, FSRecorder(folder, real_fsync=False) as rec:
            rec.fail_at(n, errno.ENOSPC, ops=ops)
            prog = run_script(folder, enc, rec)
            for m in prog.mems:
                if not m._closed:
                    m.abandon()
            if prog.error is not None and not isinstance(prog.error, OSError):
                verdict = Verdict("error", f"raised {type(prog.error).__name__}: "
                                           f"{prog.error}")
                kept = False
            else:
                verdict, held = check_folder(folder, enc, oracle, prog, raised=True)
                kept = verdict is not None and verdict.kind == "open" and \
                    "open for writing" in verdict.message
                logs.release()
                let_go(prog, rec)
                if kept:  # what else is wrong once the kept log is let go
                    verdict, held = check_folder(folder, enc, oracle, prog, raised=True)
        if not rec.failures:
            shutil.rmtree(base)
            break
        ev = rec.failures[0]
        error = None if prog.error is None else f"{type(prog.error).__name__}: {prog.error}"
        out.append(Outcome(n, step_of(rec, rec.events.index(ev)), tuple(ev), "disk",
                           verdict, held, prog.acked, error, kept))
        shutil.rmtree(base)
    return out


# ---------------------------------------------------------------------------- the sweeps
def _default_points(steps: list[int], whole=WHOLE_STEPS, k: int = K) -> list[int]:
    """Points of the default run: every point of the steps ``whole``, the first point of
    every step, every k-th point elsewhere."""
    return [n for n, s in enumerate(steps, 1)
            if s in whole or n % k == 0 or n == 1 or steps[n - 2] != s]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, enc, oracle):
    """The crash points and full-disk points of the script, counted once."""
    tmp = tmp_path_factory.mktemp("points")
    return {"crash": count_points(tmp, enc), "disk": count_points(tmp, enc,
                                                                   ("write", "fsync"))}


@pytest.fixture(scope="module")
def crash_outcomes(tmp_path_factory, enc, oracle, sweeps) -> list[Outcome]:
    steps = sweeps["crash"]
    points = _default_points(steps)
    tmp = tmp_path_factory.mktemp("crash")
    out = crash_sweep(tmp, enc, oracle, points + [len(steps) + 1])
    shutil.rmtree(tmp)
    # every point reached, and no point past them: the script then ran to its end
    assert {o.n for o in out} == set(points) | {len(steps) + 1}
    return out


@pytest.fixture(scope="module")
def disk_outcomes(tmp_path_factory, enc, oracle, sweeps) -> list[Outcome]:
    steps = sweeps["disk"]
    points = _default_points(steps, whole=(0,), k=2)
    tmp = tmp_path_factory.mktemp("disk")
    out = disk_sweep(tmp, enc, oracle, points + [len(steps) + 1])
    shutil.rmtree(tmp)
    assert {o.n for o in out} == set(points)
    return out


def _wrong(outcomes: list[Outcome]) -> list[str]:
    return [str(o) for o in outcomes if o.verdict is not None or o.lock_kept]


def _of(outcomes: list[Outcome], *kinds: str) -> list[Outcome]:
    return [o for o in outcomes if SCRIPT[o.step][0] in kinds]


# ---------------------------------------------------------------------------- the tests
def test_every_crash_point_keeps_the_acknowledged_writes(crash_outcomes):
    """Kill and power loss at each crash point (default run: the first open and the
    writes of several sessions whole, every K-th point elsewhere): the folder opens,
    load agrees with open, every acknowledged write is there and the write in flight
    entirely or not at all; and after a kill or a power loss once the script ended
    (its last step a compaction of a memory that keeps nothing resident), every write."""
    assert len(crash_outcomes) >= 100
    assert {o.state for o in crash_outcomes} == {"kill", "power", "torn"}
    assert {SCRIPT[o.step][0] for o in crash_outcomes} == {s[0] for s in SCRIPT}
    bad = _wrong(crash_outcomes)
    assert not bad, "\n".join(bad)


def test_a_full_disk_at_every_write_or_fsync_loses_nothing_acknowledged(disk_outcomes):
    """ENOSPC from the n-th write or fsync (every other one by default): the write that
    raised is absent after a reopen, the acknowledged ones present, the folder opens in
    the same process."""
    assert len(disk_outcomes) >= 50
    bad = _wrong(disk_outcomes)
    assert not bad, "\n".join(bad)


def test_a_crash_in_the_first_open_leaves_a_folder_that_opens(crash_outcomes, sweeps):
    """Formerly a known bug: a kill while the first open of a new folder wrote its first
    checkpoint left a temporary file every later open refused ("not an index")."""
    first = [o for o in crash_outcomes if o.step == 0]
    assert len({o.n for o in first}) == sweeps["crash"].count(0) >= 10
    bad = _wrong(first)
    assert not bad, "\n".join(bad)
    assert {o.held for o in first} == {0}


def test_a_write_of_several_sessions_is_all_or_nothing_at_every_crash_point(
        crash_outcomes, sweeps):
    """Every crash point of each ``add_sessions`` (one with a commit after it): the
    folder holds all of its sessions or none, never some; both happen (before and
    after its record is durable)."""
    batches = _of(crash_outcomes, "batch")
    steps = [i for i, s in enumerate(SCRIPT) if s[0] == "batch"]
    assert len({o.n for o in batches}) == sum(sweeps["crash"].count(i) for i in steps)
    bad = _wrong(batches)
    assert not bad, "\n".join(bad)
    for i in steps:
        held = {o.held - o.acked for o in batches if o.step == i}
        assert held == {0, 1}, (i, SCRIPT[i], held)


def test_a_write_that_raises_for_a_full_disk_is_absent(disk_outcomes):
    """Formerly a known bug: a full disk during the commit a write runs by itself made
    the write raise although it was durable.  Now a write that raises is absent, and a
    full disk in the commit after it raises nothing (the write is in the log)."""
    writes = _of(disk_outcomes, "add", "batch", "replace", "remove", "forget")
    raised = [o for o in writes if o.error is not None]
    assert raised and not _wrong(raised), "\n".join(_wrong(raised))
    assert all(o.held == o.acked for o in raised)
    committing = [o for o in writes if REOPEN < o.step and
                  (o.event[1].startswith("data/") or "manifest" in o.event[1])]
    assert committing, "no full disk hit an automatic commit"
    assert [str(o) for o in committing if o.error is not None] == []
    assert not _wrong(committing), "\n".join(_wrong(committing))


def test_a_failed_open_lets_the_folder_go(disk_outcomes):
    """Formerly a known bug: an open that failed (a full disk while it stamped the lock
    or wrote the first commit) kept the log's lock; the next open in the process was
    refused."""
    opens = _of(disk_outcomes, "open", "reopen")
    assert any(o.error is not None for o in opens)
    assert [str(o) for o in opens if o.lock_kept] == []
    bad = _wrong(opens)
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_every_crash_point_and_full_disk_point(tmp_path, enc, oracle, sweeps):
    """Every crash point and every full-disk point of the script."""
    crash = crash_sweep(tmp_path, enc, oracle, range(1, len(sweeps["crash"]) + 2))
    disk = disk_sweep(tmp_path, enc, oracle, range(1, len(sweeps["disk"]) + 2))
    assert len(crash) >= 2 * len(sweeps["crash"]) + 2 and len(disk) == len(sweeps["disk"])
    assert {o.n for o in crash} == set(range(1, len(sweeps["crash"]) + 2))
    print(f"{len(sweeps['crash'])} crash points ({len(crash)} states), "
          f"{len(disk)} full-disk points")
    bad = _wrong(crash + disk)
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------- a full disk, then a crash
def _pointer_sync_fails_then_crash(base: Path, enc, n: Optional[int]):
    """Three writes; a checkpoint whose fsync of the folder after the pointer's rename
    fails (ENOSPC: the pointer may name the new commit, or not); a fourth write; a
    checkpoint that crashes at its n-th call (None: it runs)."""
    folder = base / "mem"
    folder.mkdir(parents=True)
    mem = MemoryIndex.open(folder, encoder=enc)
    try:
        for op in DATA_OPS[:3]:
            _apply(mem, op, enc)
        with FSRecorder(folder, real_fsync=False) as rec:
            rec.fail_at(3, errno.ENOSPC, ops=("fsync",))  # the pack, the pointer's file, "."
            with pytest.raises(OSError):
                mem.checkpoint()
        assert [(e.path, e.detail) for e in rec.failures] == [(".", "fsync")]
        assert rec.find("rename", "*", "manifest.json")  # renamed before the fsync failed
        _apply(mem, DATA_OPS[3], enc)
        with FSRecorder(folder, real_fsync=False) as rec:
            if n is not None:
                rec.crash_at(n, base / "states", tear=0.5)
            try:
                mem.checkpoint()
            except SimulatedCrash:
                pass
            calls = rec.calls()
    finally:
        mem.abandon()
    return rec.crash, calls


def test_a_commit_whose_pointer_sync_failed_is_never_written_over(tmp_path, enc, oracle):
    """A full disk at the fsync of the folder after a checkpoint renamed the pointer
    into place (the checkpoint raises; the pointer may name its commit already), then a
    kill or a power loss at every call of the next checkpoint: the folder opens with
    every acknowledged write (the next commit never writes over the blobs the pointer
    may name)."""
    _, calls = _pointer_sync_fails_then_crash(tmp_path / "count", enc, None)
    shutil.rmtree(tmp_path / "count")
    assert calls >= 8
    prog = Progress(acked=4)
    bad = []
    for n in range(1, calls + 1):
        base = tmp_path / f"crash-{n}"
        crash, _ = _pointer_sync_fails_then_crash(base, enc, n)
        for kind, path in (("kill", crash.kill), ("power", crash.power),
                           ("torn", crash.torn)):
            verdict, held = check_folder(path, enc, oracle, prog)
            if verdict is not None or held != 4:
                bad.append(f"point {n} ({crash.event}) {kind}: {verdict}")
        shutil.rmtree(base)
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------- a new folder
def _first_write_then_crash(tmp_path: Path, enc):
    """A memory opened on a folder that does not exist yet, one add acknowledged, a
    crash at the next durability call (the second add's log write)."""
    parent = tmp_path / "parent"
    parent.mkdir()
    folder = parent / "mem"
    with _Logs() as logs, FSRecorder(parent, real_fsync=False) as rec:
        mem = MemoryIndex.open(folder, encoder=enc)
        _apply(mem, DATA_OPS[0], enc)
        rec.crash_at(1, tmp_path / "states")
        with pytest.raises(SimulatedCrash):
            _apply(mem, DATA_OPS[1], enc)
        mem.abandon()
        logs.release()
    return rec.crash, Progress(acked=1, in_flight=1)


def test_a_kill_after_the_first_write_to_a_new_folder_keeps_it(tmp_path, enc, oracle):
    crash, prog = _first_write_then_crash(tmp_path, enc)
    assert check_folder(crash.kill / "mem", enc, oracle, prog) == (None, 1)


def test_a_power_loss_after_the_first_write_to_a_new_folder_keeps_it(tmp_path, enc,
                                                                     oracle):
    """Formerly a known bug: the memory's folder was made but its entry never fsync'd in
    its parent, so a power loss after an acknowledged write could take the folder."""
    crash, prog = _first_write_then_crash(tmp_path, enc)
    assert (crash.power / "mem").is_dir(), "the folder itself is gone"
    assert check_folder(crash.power / "mem", enc, oracle, prog) == (None, 1)
