"""Runs fuzz cases in one process: ``python _fuzz_driver.py CASES.json RESULTS.jsonl``.

Each case is ``{"id", "kind", ...}`` and one of

* ``"args"``: ``memgas`` arguments, run in-process through click's CliRunner;
* ``"api"``: ``{"family": "online" | "gam", "seed", "index"}``: one hostile call of the
  library's online API (``add_session``, ``remove_session``, ``search``, ``retrieve`` on
  a fresh load of the index folder ``index``) or of ``GamWriter`` (``add``, ``flush``,
  a failing ``encode``), drawn from ``random.Random(seed)`` (see :func:`api_case`).

Every case runs under a 20 s alarm; one JSON line per case gives the exit code (CLI) or
the outcome (API), the non-empty stderr lines or the error message, and whether a
traceback or a hang happened.  A ``start`` line is written (flushed) before each case so
that the parent can name the case that killed the process, if one does.

An API call passes when it returns, and the object then still saves and loads (an
index) or still writes, flushes and answers (a GAM writer); or when it raises a
deliberate refusal (a :class:`~memgas_gpu.errors.MemgasError`, or exactly ``ValueError``,
``TypeError``, ``KeyError`` or ``IndexError``) in one line *and leaves the object as it was*.  Anything
else is a failure: another exception type, a refusal that changed the object, an
accepted call that broke it, a hang.
"""
from __future__ import annotations

import json
import random
import signal
import sys
import tempfile
import traceback
import zlib

from click.testing import CliRunner

from memgas_gpu.cli.main import cli


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


# ---------------------------------------------------------------- hostile values
_NAN = float("nan")
IDS = ["conv-30", None, 5, "", "nope", "\udfff", ["conv-30"], 2.5]
SESSION_IDS = ["fresh", None, 7, "", "session_1", "\udfff", "x" * 5000, _NAN]
DATES = ["2023/06/01 10:00", None, 30, _NAN, "", "0001/01/01", "not a date", "\udfff",
         "9999/12/31", float("inf")]
TURNS = [("[A]: I bought a violin.",), (), (None,), "just a string", ("\udfff",),
         ("[A]: " + "word " * 20000,), (5,), ("[A]: ok", "[B]: " + "é" * 50)]
TEXTS = [None, "", 5, "\udfff", "summary of it", "x" * 100000]
QUERIES = [["violin"], [], "violin", [None], ["\udfff"], ["x" * 100000], [5], ["violin"] * 50]
KS = [5, 0, -1, 2.5, 10 ** 12, None, "5", _NAN, True]
EVIDENCE = [2, 2.5, -1, None, 10 ** 9, "2", _NAN]
Q_DATES = [None, 123, "0001/01/01", "nan", "\udfff", "2023/05/01", 2.5]
METHODS = ["memgas", "memgas_hybrid", "bm25", "bogus", None, 5]
SETTINGS = [{}, {"topk": 10 ** 9}, {"topk": -1}, {"damping": _NAN}, {"bogus": 1},
            {"temperature": 0.0}, {"time_beta": float("inf")}]


def _pick(rng: random.Random, values: list, normal):
    """The normal value three times in four; a hostile one otherwise."""
    return normal if rng.random() < 0.75 else rng.choice(values)


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------- state fingerprints
def _crc(x) -> int:
    import torch

    if x is None:
        return -1
    if isinstance(x, (tuple, list)):
        return zlib.crc32(json.dumps([_crc(v) for v in x]).encode())
    flat = x.detach().contiguous().reshape(-1)
    return zlib.crc32(flat.view(torch.uint8).numpy()) if flat.numel() else 0


def index_state(idx) -> str:
    """Everything a save would write, as one string (public attributes only)."""
    parts = [_crc(getattr(idx, k)) for k in ("conv_offsets", "row_slot", "gran", "concat",
                                             "q_emb", "q_conv", "turns", "turn_ptr")]
    if idx.snapshot().turn_text is not None:
        parts += [_crc(idx.snapshot().turn_text.data), _crc(idx.snapshot().turn_text.offsets)]
    parts += [(k, _crc(v)) for k, v in sorted(idx.snapshot().graphs.items())]
    lex = idx.snapshot().lexical
    if lex is not None:
        parts += [len(lex.vocab), _crc(lex.queries.indptr), _crc(lex.queries.indices)]
        parts += [(g, _crc([m.indptr, m.indices, m.tf]), _crc(lex.doc_ptr[g]))
                  for g, m in sorted(lex.docs.items())]
    parts += [repr([(c.id, list(c.session_ids), list(c.session_dates))
                    for c in idx.conversations]), len(idx.questions)]
    return repr(parts)


def writer_state(w) -> str:
    return repr([len(w.texts), len(w.event_ptr), len(w.edges), list(w.conv_ids),
                 w._buf_start, w._buf_tokens, _crc(w.emb[-1:]), w.tokens[-3:],
                 w.summaries[-1:], len(w.keys)])


def _clean_refusal(exc: BaseException) -> bool:
    from memgas_gpu.errors import MemgasError

    deliberate = (ValueError, TypeError, KeyError, IndexError)  # exactly these types
    return (isinstance(exc, MemgasError) or type(exc) in deliberate) \
        and "\n" not in str(exc).strip()


# ---------------------------------------------------------------- the online API
def _online_call(rng: random.Random, idx):
    """(name, description, function, is_write) of one hostile online-API call."""
    from memgas_gpu.data.model import Session

    op = rng.choice(["add_session", "add_session", "add_session", "remove_session",
                     "search", "search", "retrieve"])
    cid = _pick(rng, IDS, "conv-30")
    if op == "add_session":
        sid, date = _pick(rng, SESSION_IDS, "fresh"), _pick(rng, DATES, "2023/06/01 10:00")
        turns = _pick(rng, TURNS, ("[A]: I bought a violin.",))
        summary, keywords = _pick(rng, TEXTS, None), _pick(rng, TEXTS, None)
        desc = (f"add_session({_describe(cid)}, Session({_describe(sid)}, {_describe(date)}, "
                f"{_describe(turns)}), summary={_describe(summary)}, "
                f"keywords={_describe(keywords)})")

        def call():
            session = Session(id=sid, date=date, turns=turns)
            return idx.add_session(cid, session, summary=summary, keywords=keywords)
        return op, desc, call, True
    if op == "remove_session":
        sid = _pick(rng, SESSION_IDS + ["session_3"], "session_2")
        return op, f"remove_session({_describe(cid)}, {_describe(sid)})", \
            lambda: idx.remove_session(cid, sid), True
    method = _pick(rng, METHODS, "memgas_hybrid")
    settings = _pick(rng, SETTINGS, {})
    if op == "search":
        queries, k = _pick(rng, QUERIES, ["violin"]), _pick(rng, KS, 5)
        evidence, qd = _pick(rng, EVIDENCE, 2), _pick(rng, Q_DATES, None)
        desc = (f"search({_describe(cid)}, {_describe(queries)}, k={_describe(k)}, "
                f"method={method!r}, evidence={_describe(evidence)}, "
                f"question_date={_describe(qd)}, **{settings})")
        return op, desc, lambda: idx.search(cid, queries, k=k, method=method,
                                            evidence=evidence, question_date=qd,
                                            device="cpu", **settings), False
    questions = _pick(rng, [[0, 1], [], [10 ** 6], [-1], [2.5], "0", None], None)
    desc = f"retrieve(questions={_describe(questions)}, method={method!r}, **{settings})"
    return op, desc, lambda: idx.retrieve(questions, method=method, device="cpu",
                                          **settings), False


def run_online(case: dict) -> dict:
    from memgas_gpu.retrieve import MemoryIndex

    rng = random.Random(case["seed"])
    idx = MemoryIndex.load(case["index"])
    op, desc, call, write = _online_call(rng, idx)
    before = index_state(idx)
    out = {"call": desc}
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - classified below
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        if not _clean_refusal(exc):
            out["verdict"] = "crash"
            out["traceback"] = traceback.format_exc()[-3000:]
        elif index_state(idx) != before:
            out["verdict"] = "refused but changed"
        else:
            out["verdict"] = "refused"
        return out
    if write:  # accepted: what was written must save and load back
        with tempfile.TemporaryDirectory() as tmp:
            try:
                back = MemoryIndex.load(idx.save(f"{tmp}/idx"))
                back.retrieve(method="memgas_hybrid", device="cpu")
            except Exception as exc:  # noqa: BLE001
                out["verdict"] = "accepted but broken"
                out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                return out
    out["verdict"] = "ok"
    return out


# ---------------------------------------------------------------- the GAM writer
def run_gam(case: dict) -> dict:
    import torch

    from memgas_gpu.data.model import Conversation, Dataset, Question
    from memgas_gpu.gam import GamParams, GamWriter

    from _gam_fake import FakeEncoder

    rng = random.Random(case["seed"])
    enc = FakeEncoder()
    fail = {"next": False}

    def encode(texts):
        if fail["next"]:
            fail["next"] = False
            raise RuntimeError("the encoder failed (injected)")
        return enc.encode(texts)

    seg = rng.choice(["semantic", "tokens40", "turns2", "session"])
    w = GamWriter(encode, GamParams(segmentation=seg, theta=0.5, min_events=2,
                                    max_tokens=40))
    lines = [f"[{'AB'[i % 2]}]: line {i} about violins and trips" for i in range(12)]
    for i, text in enumerate(lines[:6]):
        w.add("c", f"s{i // 3}", text, enc.encode([text])[0], len(text.split()))
    op = rng.choice(["add", "add", "add", "failing_encode"])
    text = _pick(rng, TEXTS + ["[A]: fine"], "[A]: a normal line")
    emb = _pick(rng, ["nan", "inf", "wrong_size", "zeros", "2d", "huge", "int"], "ok")
    tokens = _pick(rng, [-5, _NAN, 10 ** 30, 2.5, None, "3", float("inf"), 0], 4)
    cid, sid = _pick(rng, [None, 5, "", "d"], "c"), _pick(rng, [None, 5, "", "s0"], "s2")
    vec = enc.encode([str(text)])[0]
    vec = {"ok": vec, "nan": vec * _NAN, "inf": vec / 0.0, "zeros": vec * 0,
           "wrong_size": torch.cat([vec, vec[:1]]), "2d": vec[None].repeat(2, 1),
           "huge": vec * 1e38, "int": vec.long()}[emb]
    if op == "failing_encode":
        desc = "add(...) with encode() failing once at the consolidation, then retried"
        fail["next"] = True

        def call():
            w.add("c", "s2", "[A]: a new session starts", enc.encode(["x"])[0], 4)
    else:
        desc = (f"add({_describe(cid)}, {_describe(sid)}, {_describe(text)}, emb={emb}, "
                f"tokens={_describe(tokens)})")

        def call():
            w.add(cid, sid, text, vec, tokens)
    before = writer_state(w)
    out = {"call": f"[{seg}] {desc}"}
    refused = False
    try:
        call()
    except Exception as exc:  # noqa: BLE001
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        injected = op == "failing_encode" and type(exc) is RuntimeError
        if not (_clean_refusal(exc) or injected):
            out["verdict"] = "crash"
            out["traceback"] = traceback.format_exc()[-3000:]
            return out
        if writer_state(w) != before:
            out["verdict"] = "refused but changed"
            return out
        refused = True
        if injected:  # the retry must now go through
            call()
    try:  # the writer must go on working (a new session of its last conversation)
        for i, t in enumerate(lines[6:]):
            w.add(w.conv_ids[-1], "s-after", t, enc.encode([t])[0], len(t.split()))
        w.flush()
        ds = Dataset([Conversation(c, [], [Question(id=f"q{c}", text="what about violins?")])
                      for c in w.conv_ids], format="locomo")
        r = w.index(ds, enc).retrieve()
        if bool(torch.isnan(r.scores).any()):
            raise ValueError("NaN scores in the ranking")
    except Exception as exc:  # noqa: BLE001
        out["verdict"] = "broken afterwards"
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        out["traceback"] = traceback.format_exc()[-3000:]
        return out
    out["verdict"] = "refused" if refused else "ok"
    return out


def run_api(case: dict) -> dict:
    return {"online": run_online, "gam": run_gam}[case["family"]](case)


# ---------------------------------------------------------------- main
def main() -> None:
    cases = json.load(open(sys.argv[1]))
    out = open(sys.argv[2], "a", buffering=1)
    signal.signal(signal.SIGALRM, _alarm)
    runner = CliRunner()
    for case in cases:
        out.write(json.dumps({"start": case["id"]}) + "\n")
        signal.alarm(20)
        if "args" not in case:
            try:
                res = run_api(case)
            except Hang:
                res = {"verdict": "hang"}
            finally:
                signal.alarm(0)
            out.write(json.dumps({"id": case["id"], "kind": case["kind"], **res},
                                 default=str) + "\n")
            continue
        try:
            res = runner.invoke(cli, case["args"], catch_exceptions=True)
        finally:
            signal.alarm(0)
        exc = res.exception
        hang = isinstance(exc, Hang)
        tb = None
        if exc is not None and not isinstance(exc, SystemExit):
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]
        err = [ln for ln in res.stderr.splitlines() if ln.strip()]
        out.write(json.dumps({"id": case["id"], "kind": case["kind"], "code": res.exit_code,
                              "stderr": err[-5:], "traceback": tb, "hang": hang,
                              "stdout": res.stdout[:1 << 20]}) + "\n")


if __name__ == "__main__":
    main()
