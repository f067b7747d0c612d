"""One new question that names a speaker, against one conversation of a memory index
(``memgas_hybrid``, its speaker cue on): the search as it runs, where the speaker-weighted
BM25 of the conversation is kept with its view, against the same search with those
weights rebuilt for every question (what every such search paid before they were kept),
in the same run, alternating, on the same index and questions.

    python benchmarks/speaker_cue.py LOCOMO.json [--rounds 5] [--threads 1] [--max-questions N]

Prints p50 / p99 per mode and the ratio, and checks that both modes return the same
sessions and scores.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def run(path: str, rounds: int = 5, threads: int = 1, conversation: int = 0,
        max_questions: int = 0) -> dict:
    import torch

    import memgas_gpu as mg
    from memgas_gpu.encode.tiny import make_random_bert
    from memgas_gpu.retrieve.cues import named_speakers, speaker_data_of

    torch.set_num_threads(threads)
    ds = mg.load_dataset(path)
    with tempfile.TemporaryDirectory() as tmp:
        enc = mg.Encoder(make_random_bert(tmp), device="cpu")
        idx = mg.MemoryIndex.build(ds, enc, device="cpu", progress=False)
    conv = ds.conversations[conversation]
    view = idx.view([ds.conversations[conversation].id])
    names = speaker_data_of(view, [0]).speakers[0]
    qs = [q.text for q in conv.questions if sum(named_speakers(q.text, names)) == 1]
    qs = qs[:max_questions] if max_questions > 0 else qs
    if not qs:
        raise SystemExit(f"{path}: no question of {conv.id} names one of {names}")

    def search(q):
        return idx.search(conv.id, [q], k=10, encoder=enc, device="cpu")[0]

    def rebuilt(q):
        view.cache.pop("cue_speaker_bm25", None)  # the weights derived again
        return search(q)

    for q in qs[:2]:  # warm: the view, its postings and tables
        search(q)
    times = {"kept": [], "rebuilt": []}
    for _ in range(rounds):
        for q in qs:
            for mode, fn in (("rebuilt", rebuilt), ("kept", search)):
                t = time.perf_counter()
                got = fn(q)
                times[mode].append(time.perf_counter() - t)
                if mode == "rebuilt":
                    want = got
                elif (got.session_ids, got.scores) != (want.session_ids, want.scores):
                    raise AssertionError(f"kept and rebuilt weights differ for {q!r}")
    out = {"conversation": conv.id, "sessions": len(conv.sessions), "questions": len(qs)}
    for mode, ts in times.items():
        ts = sorted(ts)
        out[mode] = (statistics.median(ts), ts[min(len(ts) - 1, int(0.99 * len(ts)))])
    out["ratio"] = out["rebuilt"][0] / out["kept"][0]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="a LoCoMo file (e.g. ../shared/data/locomo/locomo_dev.json)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--conversation", type=int, default=0)
    ap.add_argument("--max-questions", type=int, default=0, help="0: every one")
    a = ap.parse_args(argv)
    r = run(a.path, a.rounds, a.threads, a.conversation, a.max_questions)
    print(f"{r['conversation']}: {r['sessions']} sessions, {r['questions']} questions "
          f"naming one speaker, {a.rounds} rounds, {a.threads} thread(s)")
    for mode in ("kept", "rebuilt"):
        p50, p99 = r[mode]
        print(f"  weights {mode:8s} p50 {p50 * 1e3:7.2f} ms  p99 {p99 * 1e3:7.2f} ms")
    print(f"  rebuilt / kept: {r['ratio']:.2f}x (same sessions and scores)")


if __name__ == "__main__":
    main()
