"""Progress that reaches a log: plain lines off a terminal, tqdm on one, --quiet."""
from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from memgas_gpu import progress as pg
from memgas_gpu.progress import Progress


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def _lines(buf):
    return [x for x in buf.getvalue().splitlines() if x]


def test_log_lines_every_interval_with_rate_and_eta():
    out, clock = io.StringIO(), Clock()
    p = Progress(100, "encode", unit="text", enabled=True, file=out, interval=5,
                 clock=clock)
    clock.t += 1
    p.update(10)
    assert _lines(out) == []  # the interval has not passed
    clock.t += 4
    p.update(10)  # 20 of 100 after 5 s: 4/s, 80 left → 20 s
    assert _lines(out) == ["encode: 20/100 texts (20%), 4.0 texts/s, elapsed 5s, ETA 20s"]
    clock.t += 2
    p.update(30)
    assert len(_lines(out)) == 1  # next line only 5 s after the last one
    clock.t += 3
    p.set_postfix("900 tok/s")
    p.update(10)  # 60 after 10 s: 6/s, 40 left → 7 s (6.67 rounded)
    assert _lines(out)[-1] == ("encode: 60/100 texts (60%), 6.0 texts/s, elapsed 10s, "
                               "ETA 7s, 900 tok/s")
    clock.t += 110
    p.update(40)
    p.close()
    assert _lines(out)[-1] == ("encode: 100/100 texts (100%), done in 2m00s, 0.8 texts/s, "
                               "900 tok/s")
    n = len(_lines(out))
    p.close()  # idempotent
    assert len(_lines(out)) == n


def test_short_stage_prints_nothing_and_bytes_are_sized():
    out, clock = io.StringIO(), Clock()
    with Progress(10, "graph", unit="session", enabled=True, file=out, interval=5,
                  clock=clock) as p:
        p.update(10)
    assert out.getvalue() == ""
    with Progress(3, "graph", unit="session", enabled=True, file=out, interval=5,
                  clock=clock) as p:
        clock.t += 6
        p.update(3)  # one update finishing a long stage: only the closing line
    assert _lines(out) == ["graph: 3/3 sessions (100%), done in 6s, 0.5 sessions/s"]
    out = io.StringIO()
    with Progress(4_000_000_000, "load m.json", unit="B", unit_scale=True, enabled=True,
                  file=out, interval=5, clock=clock) as p:
        clock.t += 10
        p.update(1_000_000_000)
    first, last = _lines(out)
    assert first == "load m.json: 1.00GB/4.00GB (25%), 100MB/s, elapsed 10s, ETA 30s"
    assert last.startswith("load m.json: 1.00GB/4.00GB (25%), done in 10s")


def test_quiet_false_and_defaults_scopes():
    def run(**kw):
        out, clock = io.StringIO(), Clock()
        p = Progress(4, "s", file=out, interval=1, clock=clock, **kw)
        clock.t += 2
        p.update(1)
        p.close()
        return out.getvalue()

    assert run(enabled=None) and run(enabled=True)
    assert run(enabled=False) == ""
    with pg.defaults(False):
        assert run(enabled=None) == ""
        assert run(enabled=True)  # an explicit request wins over the scope
    with pg.quiet():
        assert run(enabled=True) == "" and pg.is_quiet()
    assert not pg.is_quiet() and run(enabled=None)
    pg.set_quiet(True)
    try:
        assert run(enabled=True) == ""
    finally:
        pg.set_quiet(False)


def test_terminal_gets_a_tqdm_bar_not_lines():
    out, clock = Tty(), Clock()
    p = Progress(4, "encode", unit="text", enabled=True, file=out, interval=0, clock=clock)
    clock.t += 5
    p.update(2)
    p.close()
    text = out.getvalue()
    assert "\r" in text and "2/4" in text and "ETA" not in text  # tqdm's own format


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    from memgas_gpu.encode.tiny import make_random_bert
    from memgas_gpu.synth import write_synthetic

    d = tmp_path_factory.mktemp("progress")
    write_synthetic(d / "s.json", questions=3, sessions=6, turns=2, words=8, progress=False)
    return d / "s.json", make_random_bert(str(d / "bert"))


def test_memgas_index_reports_every_stage_in_a_log_and_quiet_silences_it(
        tiny_data, tmp_path, monkeypatch):
    from memgas_gpu.cli.main import cli

    data, model = tiny_data
    monkeypatch.setenv("MEMGAS_PROGRESS_INTERVAL", "0")  # a line per update
    args = ["index", str(data), "--encoder", model, "--device", "cpu", "--out"]
    r = CliRunner().invoke(cli, args + [str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    stages = {x.split(":")[0] for x in r.stderr.splitlines() if ": " in x}
    assert {"expand (offline)", "encode", "graph (gmm)"} <= stages, r.stderr
    assert "ETA" in r.stderr and "done in" in r.stderr and "wrote" in r.stdout
    q = CliRunner().invoke(cli, args + [str(tmp_path / "b"), "--quiet"])
    assert q.exit_code == 0, q.output
    assert q.stderr == "" and "wrote" in q.stdout
    assert not pg.is_quiet()  # --quiet does not leak past the command
    a = json.loads((tmp_path / "a" / "manifest.json").read_text())
    b = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert a["version"] == b["version"]


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "-1", "ten", "1e400"])
def test_a_bad_interval_is_reported_once_and_the_default_used(raw, monkeypatch, capsys):
    monkeypatch.setenv("MEMGAS_PROGRESS_INTERVAL", raw)
    monkeypatch.setattr(pg, "_WARNED", set(), raising=False)
    assert Progress(3, "s", file=io.StringIO()).interval == 10.0  # not silenced
    assert Progress(3, "s", file=io.StringIO()).interval == 10.0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "MEMGAS_PROGRESS_INTERVAL" in err[0] and repr(raw) in err[0]
    for good, want in (("0", 0.0), ("2.5", 2.5), ("", 10.0)):
        monkeypatch.setenv("MEMGAS_PROGRESS_INTERVAL", good)
        assert Progress(3, "s", file=io.StringIO()).interval == want
    with pytest.raises(ValueError, match="interval"):
        Progress(3, "s", file=io.StringIO(), interval=float("nan"))


def test_no_stderr_means_no_progress_and_never_stdout(monkeypatch, capsys):
    clock = Clock()
    monkeypatch.setattr("sys.stderr", None)  # what Python has under 2>&-
    p = Progress(4, "load d.json", enabled=True, interval=0, clock=clock)
    clock.t += 5
    p.update(2)
    p.close()
    assert capsys.readouterr().out == ""


def test_a_closed_stream_stops_progress_not_the_job():
    out, clock = io.StringIO(), Clock()
    p = Progress(4, "encode", enabled=True, file=out, interval=0, clock=clock)
    out.close()
    clock.t += 5
    p.update(2)  # writing fails: progress stops, the caller goes on
    p.close()
    assert not p.enabled


def test_work_done_before_the_stage_counts_in_done_not_in_the_rate():
    out, clock = io.StringIO(), Clock()
    p = Progress(100, "llm", unit="request", enabled=True, file=out, interval=5,
                 clock=clock, initial=60)
    clock.t += 10
    p.update(20)  # 80 of 100 done; 20 in 10 s: 2/s, 20 left → 10 s
    assert _lines(out) == ["llm: 80/100 requests (80%), 2.0 requests/s, elapsed 10s, "
                           "ETA 10s"]
