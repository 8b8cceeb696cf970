"""Every case's outcome through `tools/opt -p fix-shardings`, recorded whole (verdict, exit status, output, messages),
and two records compared: how a change to the loader or the pass is shown to keep every outcome.

    python bench/shardy_outcomes.py record mutants OUT.json            # tests/data/shardy_mutants*.mlir
    python bench/shardy_outcomes.py record corpus OUT.json --corpus SHARDY_CHECKOUT
    python bench/shardy_outcomes.py compare BEFORE.json AFTER.json [--results TITLE]

Run `record` once with the code before the change (a copy of it first on PYTHONPATH) and once after; `compare`
prints each case whose outcome differs and, with `--results`, puts the counts into bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import common  # noqa: F401  (sets XLA_FLAGS first, puts tests/ on the path)
from support.corpus import Pool, judge, load_cases, split_cases

FIELDS = ("result", "code", "stdout", "stderr", "again")
DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def record(which: str, out: Path, corpus: Path | None, jobs: int) -> None:
    if which == "corpus":
        sdy = corpus / "shardy" / "dialect" / "sdy"
        cases, plain_always = load_cases(sdy if sdy.is_dir() else corpus), True
    else:
        cases, plain_always = [], False
        for name in ("shardy_mutants.mlir", "shardy_mutants_generic.mlir"):
            for case in split_cases(name, (DATA / name).read_text(), split=True):
                case.expects_error = True  # as tests/test_mutants.py judges them
                cases.append(case)
    with tempfile.TemporaryDirectory(prefix="shardfix-outcomes-") as work:
        verdicts = judge(cases, Pool(Path(work), jobs, 120), plain_always=plain_always)
    out.write_text(json.dumps({v.case.name: {"result": v.result, "code": v.fix.code, "stdout": v.fix.stdout,
                                             "stderr": v.fix.stderr,
                                             "again": None if v.reparse is None else v.reparse.code}
                               for v in verdicts}, indent=0))
    print(which, len(verdicts), collections.Counter(v.result for v in verdicts))


def compare(before: Path, after: Path, results: str | None) -> int:
    old, new = json.loads(before.read_text()), json.loads(after.read_text())
    differ = [name for name in old if name not in new or any(old[name][f] != new[name][f] for f in FIELDS)]
    for name in differ:
        changed = [f for f in FIELDS if name not in new or old[name][f] != new[name][f]]
        print(f"{name}: {', '.join(changed)}\n  before: {old[name]['stderr'][:400]}\n"
              f"  after:  {new.get(name, {}).get('stderr', '')[:400]}")
    counts = collections.Counter(case["result"] for case in new.values())
    summary = (f"{len(old)} cases, {len(old) - len(differ)} with the same verdict, exit status, output and messages, "
               f"{len(differ)} differing; after: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    print(summary)
    if results:
        from results import replace_section
        replace_section(results, f"{results}\n\nCommand: `python bench/shardy_outcomes.py record ... BEFORE.json` "
                                 f"(with the earlier code), `record ... AFTER.json`, `compare BEFORE.json AFTER.json`. "
                                 f"{summary}.\n")
    return 1 if differ else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("which", choices=["mutants", "corpus"])
    rec.add_argument("out", type=Path)
    rec.add_argument("--corpus", type=Path, help="a checkout of openxla/shardy (for `corpus`)")
    rec.add_argument("--jobs", type=int, default=2)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    cmp.add_argument("--results", help="the title of the bench/RESULTS.md section to write")
    args = ap.parse_args(argv)
    if args.command == "record":
        if args.which == "corpus" and args.corpus is None:
            ap.error("record corpus needs --corpus SHARDY_CHECKOUT")
        record(args.which, args.out, args.corpus, args.jobs)
        return 0
    return compare(args.before, args.after, args.results)


if __name__ == "__main__":
    sys.exit(main())
