"""``python -m memgas_gpu.testing prepare LOCOMO10 OUT``: the real-data test layout.

Writes, from the official ``locomo10.json`` (github.com/snap-research/LoCoMo), the
folder that ``MEMGAS_DATA`` names for the test suite and benchmarks: conversations
conv-26, conv-30 and conv-41 as a list file and as flat files, and conv-26 in
LongMemEval's format.  ``python -m memgas_gpu.testing standin OUT`` writes the same
layout from the project-made conversations instead.
"""
from __future__ import annotations

import argparse
import json
import sys

from .paths import ENV
from .standin import DEV_IDS, locomo_like_records, write_dev_layout


def main(argv=None) -> int:
    """Run the command; a missing or unreadable input, or an output that cannot be
    written, is one line on stderr and exit status 2 (no traceback)."""
    try:
        return _main(argv)
    except (OSError, ValueError) as e:
        if isinstance(e, OSError) and e.strerror:
            where = f"{e.filename}: " if e.filename is not None else ""
            why = f"{where}{e.strerror}"
        else:
            why = str(e)
        print(f"error: {' '.join(why.split())}", file=sys.stderr)
        return 2


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m memgas_gpu.testing")
    sub = p.add_subparsers(dest="cmd", required=True)
    prep = sub.add_parser("prepare", help="real-data layout from locomo10.json")
    prep.add_argument("locomo10")
    prep.add_argument("out")
    stand = sub.add_parser("standin", help="the same layout from project-made data")
    stand.add_argument("out")
    a = p.parse_args(argv)
    if a.cmd == "standin":
        records = locomo_like_records()
    else:
        with open(a.locomo10, encoding="utf-8") as f:
            try:
                records = json.load(f)
            except ValueError as e:
                raise ValueError(f"{a.locomo10}: not JSON ({e})") from None
        if not isinstance(records, list):
            raise ValueError(f"{a.locomo10}: expected a list of conversations (LoCoMo's "
                             f"locomo10.json), got a JSON {type(records).__name__}")
        by_id = {r.get("sample_id"): r for r in records if isinstance(r, dict)}
        missing = [c for c in DEV_IDS if c not in by_id]
        if missing:
            print(f"error: {a.locomo10}: no conversation {', '.join(missing)} "
                  "(expected LoCoMo's locomo10.json)", file=sys.stderr)
            return 2
        records = [by_id[c] for c in DEV_IDS]
    out = write_dev_layout(records, a.out)
    print(f"wrote {out}; set {ENV}={out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
