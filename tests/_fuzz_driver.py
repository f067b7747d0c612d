"""Runs fuzz cases in one process: ``python _fuzz_driver.py CASES.json RESULTS.jsonl``.

Each case is ``{"id", "kind", "args"}``: the ``memgas`` arguments. Every case runs
in-process through click's CliRunner under a 20 s alarm; one JSON line per case gives
the exit code, the non-empty stderr lines and whether a traceback or a hang happened.
A ``start`` line is written (flushed) before each case so that the parent can name
the case that killed the process, if one does.
"""
from __future__ import annotations

import json
import signal
import sys
import traceback

from click.testing import CliRunner

from memgas_gpu.cli.main import cli


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def main() -> None:
    cases = json.load(open(sys.argv[1]))
    out = open(sys.argv[2], "a", buffering=1)
    signal.signal(signal.SIGALRM, _alarm)
    runner = CliRunner()
    for case in cases:
        out.write(json.dumps({"start": case["id"]}) + "\n")
        signal.alarm(20)
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
                              "stderr": err[-5:], "traceback": tb, "hang": hang}) + "\n")


if __name__ == "__main__":
    main()
