"""Shardy's own test corpus through `tools/opt -p fix-shardings`, when a copy of it is given.

    python bench/shardy_corpus.py PATH [--jobs 2] [--timeout 60] [--filter TEXT] [--details FILE.json]

PATH is a checkout of openxla/shardy (its shardy/dialect/sdy tests are read), or any directory of .mlir files.
Every case runs plain (parse, verify, print), through fix-shardings, and its output is parsed and verified again,
each in a forked child with a time limit. The bar: every case that loads comes out verifying; every invalid one is
repaired, or refused with shardfix's own located message; no crash, hang, traceback or unverifiable output.
Cases written in syntax newer than the installed jaxlib's dialects can't be loaded at all: counted apart.
`--results` adds the table to bench/RESULTS.md (the section "Shardy's test corpus").
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (sets XLA_FLAGS first, puts tests/ on the path)
from support.corpus import Pool, judge, load_cases

SECTION = "## Shardy's test corpus through fix-shardings"


def corpus_root(path: Path) -> Path:
    sdy = path / "shardy" / "dialect" / "sdy"
    return sdy if sdy.is_dir() else path


def summarize(verdicts) -> tuple[str, list[str]]:
    """The Markdown table and the lines naming every bad case."""
    counts = collections.Counter((v.case.kind, v.result.split(":")[0]) for v in verdicts)
    kinds = collections.Counter(v.case.kind for v in verdicts)
    columns = ["repaired", "unchanged", "refused", "unsupported", "BAD"]
    rows = ["| cases | total | " + " | ".join(columns) + " |", "|---|---:|" + "---:|" * len(columns)]
    for kind in ("VALID", "INVALID"):
        rows.append(f"| {kind.lower()} | {kinds[kind]} | " + " | ".join(str(counts[(kind, c)]) for c in columns)
                    + " |")
    bad = [f"{v.case.name} [{v.case.kind}] {v.result}: " + (v.fix.stderr.strip().splitlines() or [""])[0][:300]
           for v in verdicts if v.result.startswith("BAD")]
    return "\n".join(rows), bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path, help="a checkout of openxla/shardy, or a directory of .mlir files")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a run may take before it counts as a hang")
    ap.add_argument("--filter", default="", help="only cases whose file name contains this")
    ap.add_argument("--details", type=Path, help="write every case's verdict and messages here (JSON)")
    ap.add_argument("--results", action="store_true", help="put the table into bench/RESULTS.md")
    args = ap.parse_args(argv)

    root = corpus_root(args.path)
    cases = [c for c in load_cases(root) if args.filter in c.name]
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shardfix-corpus-") as work:
        verdicts = judge(cases, Pool(Path(work), args.jobs, args.timeout))
    seconds = time.monotonic() - start
    table, bad = summarize(verdicts)
    commit = _commit(args.path)
    print(f"{len(cases)} cases from {root}{commit} in {seconds:.0f} s\n\n{table}\n")
    for line in bad:
        print("BAD", line)
    if args.details:
        args.details.write_text(json.dumps([
            {"case": v.case.name, "kind": v.case.kind, "result": v.result, "fixes": v.fixes,
             "fix_stderr": v.fix.stderr[-4000:], "traceback": v.fix.traceback[-4000:]} for v in verdicts], indent=1))
    if args.results:
        from results import replace_section
        replace_section(SECTION, f"{SECTION}\n\nCommand: `python bench/shardy_corpus.py SHARDY_CHECKOUT`; "
                                 f"{len(cases)} cases{commit}; each case plain, through `-p fix-shardings`, and its "
                                 f"output verified again, in a child with a {args.timeout:g} s limit. "
                                 "*unsupported*: valid cases the installed jaxlib's dialects can't read (newer "
                                 "syntax or ops); *BAD*: a crash, hang, traceback, unverifiable output, a loadable "
                                 "module refused, or a refusal not in shardfix's words.\n\n" + table + "\n")
    return 1 if bad else 0


def _commit(path: Path) -> str:
    marker = path / "SOURCE_COMMIT"
    if marker.exists():
        return f" (openxla/shardy {marker.read_text().split()[1][:8]})"
    head = path / ".git" / "HEAD"
    return f" ({head.read_text().strip()[:12]})" if head.exists() and not head.read_text().startswith("ref") else ""


if __name__ == "__main__":
    sys.exit(main())
