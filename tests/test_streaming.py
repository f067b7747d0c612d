"""LongMemEval loading streams: peak memory stays within 3x the file size."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from memgas_gpu.synth import write_synthetic

from _rss import HWM

_PROBE = HWM + textwrap.dedent("""
    import json, sys, time
    base = hwm_bytes()
    import memgas_gpu as mg
    t = time.perf_counter()
    ds = mg.load_dataset(sys.argv[1])
    dt = time.perf_counter() - t
    peak = hwm_bytes()
    print(json.dumps({"conversations": len(ds), "distinct": len(ds.distinct_sessions()),
                      "seconds": dt, "peak": peak, "base": base}))
""")


def _probe(path):
    out = subprocess.run([sys.executable, "-c", _PROBE, str(path)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_longmemeval_m_shaped_load_within_3x_file_size(tmp_path):
    # LongMemEval-M proportions (500 sessions of ~2,000 tokens per haystack), fewer
    # haystacks: a file of a few hundred MB
    path = tmp_path / "m_slice.json"
    write_synthetic(path, questions=40, sessions=500, turns=12, words=115, seed=1,
                    progress=False)
    size = path.stat().st_size
    assert size > 150e6
    r = _probe(path)
    assert r["conversations"] == 40
    assert r["distinct"] < 40 * 500  # haystacks share a pool
    assert r["peak"] <= 3 * size, (r, size)


def test_small_file_streams_and_shares_sessions(tmp_path):
    path = tmp_path / "small.json"
    write_synthetic(path, questions=12, sessions=30, seed=3, progress=False)
    raw = json.loads(path.read_text())
    r = _probe(path)
    ids = {(sid.replace("answer_", "", 1) if sid.startswith("answer_") else sid)
           for inst in raw for sid in inst["haystack_session_ids"]}
    assert r["conversations"] == len(raw) == 12
    assert r["distinct"] == len(ids)
