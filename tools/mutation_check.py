"""Apply curated mutations to a copy of the repository and check the tests kill each one.

Every entry of ``tools/mutations.toml`` names a file, an exact snippet of it, the wrong
code that replaces it, and why that code is wrong (the tests must notice). The script
copies the working tree (without ``.git``, with the built native extension) to a
temporary folder, and for each mutation: replaces the snippet there, runs the tests,
and restores the file. A mutation is

* KILLED when the tests fail (pytest exit status 1; 2 = the mutated code does not even
  import or collect, also a kill),
* SURVIVED when they pass: a test is missing or too weak,
* STALE when the snippet is not in the file exactly once: the code moved and the entry
  must be re-pointed (never silently skipped),
* NO TESTS / ERROR / TIMEOUT otherwise.

By default each entry runs its own ``tests`` list (affordable on a shared machine);
``--full`` runs the default suite (``pytest -x -q``) for every mutation instead. Before
mutating, each distinct test selection is run once on the unmutated copy (skip with
``--no-baseline``): a selection that already fails would make its kills meaningless.

Usage::

    python tools/mutation_check.py                 # every entry, its own tests
    python tools/mutation_check.py --only fuse_zeros rrf_times_rank
    python tools/mutation_check.py --area read_path --list
    python tools/mutation_check.py --full          # the default suite per mutation

Exit status 0 when every selected mutation is killed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ImportError:  # pragma: no cover - Python < 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", ".benchmarks",
                                "*.egg-info", "build", "dist", ".venv", "*.pyc")
KEYS = {"id", "file", "old", "new", "reason", "tests", "area"}


def load(path: Path) -> list[dict]:
    """The mutation entries of ``path``, checked for their fields."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out, seen = [], set()
    for i, m in enumerate(data.get("mutation", [])):
        where = f"{path}: mutation #{i + 1} ({m.get('id', '?')})"
        missing = {"id", "file", "old", "new", "reason"} - set(m)
        if missing:
            raise SystemExit(f"{where}: missing {', '.join(sorted(missing))}")
        unknown = set(m) - KEYS
        if unknown:
            raise SystemExit(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        if m["old"] == m["new"]:
            raise SystemExit(f"{where}: old and new are the same")
        if m["id"] in seen:
            raise SystemExit(f"{where}: duplicate id")
        seen.add(m["id"])
        out.append({"tests": [], "area": "", **m})
    return out


def copy_tree(dest: Path) -> Path:
    """Copy the repository to ``dest/<name>`` and link ``dest/shared`` to the checkout's
    ``../shared`` (tests/conftest.py finds the real data there)."""
    repo = dest / ROOT.name
    shutil.copytree(ROOT, repo, ignore=IGNORE, symlinks=True)
    shared = ROOT.parent / "shared"
    if shared.exists():
        (dest / "shared").symlink_to(shared, target_is_directory=True)
    return repo


def run_tests(repo: Path, tests: list[str], timeout: float) -> tuple[int, float, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, time.perf_counter() - t0, ""
    tail = (p.stdout + p.stderr).strip().splitlines()
    return p.returncode, time.perf_counter() - t0, tail[-1] if tail else ""


def verdict(rc: int) -> str:
    return {0: "SURVIVED", 1: "KILLED", 2: "KILLED", 5: "NO TESTS", -1: "TIMEOUT"}.get(
        rc, "ERROR")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, default=ROOT / "tools" / "mutations.toml")
    ap.add_argument("--only", nargs="+", metavar="ID", help="these entries only")
    ap.add_argument("--area", help="entries of this area only (e.g. read_path)")
    ap.add_argument("--full", action="store_true", help="run the default suite per mutation")
    ap.add_argument("--no-baseline", action="store_true",
                    help="do not run the unmutated test selections first")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per pytest run")
    ap.add_argument("--list", action="store_true", help="list the entries and stop")
    args = ap.parse_args(argv)

    entries = load(args.file)
    if args.only:
        unknown = set(args.only) - {m["id"] for m in entries}
        if unknown:
            ap.error(f"unknown id(s): {', '.join(sorted(unknown))}")
        entries = [m for m in entries if m["id"] in args.only]
    if args.area:
        entries = [m for m in entries if m["area"] == args.area]
    if args.list:
        for m in entries:
            print(f"{m['id']:32s} {m['area'] or '-':10s} {m['file']}: {m['reason']}")
        return 0

    rows, ok = [], True
    with tempfile.TemporaryDirectory(prefix="memgas-mutants-") as tmp:
        repo = copy_tree(Path(tmp))
        selection = (lambda m: []) if args.full else (lambda m: list(m["tests"]))
        if not args.no_baseline:
            for tests in sorted({tuple(selection(m)) for m in entries}):
                rc, secs, last = run_tests(repo, list(tests), args.timeout)
                label = " ".join(tests) or "default suite"
                print(f"baseline {label}: exit {rc} in {secs:.0f}s ({last})", flush=True)
                if rc != 0:
                    print(f"the unmutated tests fail ({label}); fix them first", file=sys.stderr)
                    return 1
        for m in entries:
            path = repo / m["file"]
            text = path.read_text(encoding="utf-8") if path.exists() else ""
            count = text.count(m["old"])
            if count != 1:
                res, secs, last = "STALE", 0.0, f"snippet found {count} times in {m['file']}"
            else:
                path.write_text(text.replace(m["old"], m["new"]), encoding="utf-8")
                try:
                    rc, secs, last = run_tests(repo, selection(m), args.timeout)
                finally:
                    path.write_text(text, encoding="utf-8")
                res = verdict(rc)
            ok &= res == "KILLED"
            rows.append((m, res, secs, last))
            print(f"{res:9s} {m['id']} ({secs:.0f}s): {last}", flush=True)

    print("\n| mutation | area | file | result | s | tests |\n|---|---|---|---|---|---|")
    for m, res, secs, _ in rows:
        tests = "default suite" if args.full else " ".join(m["tests"]) or "default suite"
        print(f"| {m['id']} | {m['area'] or '-'} | {m['file']} | {res} | {secs:.0f} | {tests} |")
    n_killed = sum(r[1] == "KILLED" for r in rows)
    print(f"\n{n_killed}/{len(rows)} killed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
