"""Mutants of Shardy's test cases (tests/data/shardy_mutants*.mlir, made by bench/shardy_mutants.py): each comes
out of `-p fix-shardings` verifying, or is refused in shardfix's words at a file:line:col; never a crash, hang,
traceback or output that doesn't verify. Each runs in a forked child with a time limit."""

import os
from pathlib import Path

import pytest

from support.corpus import Pool, judge, split_cases

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("name, count", [("shardy_mutants.mlir", 1000), ("shardy_mutants_generic.mlir", 400)])
def test_every_mutant_is_repaired_or_refused(tmp_path, name, count):
    # the second file: the cases as MLIR prints them in the generic form, shardings as properties
    mutants = DATA / name
    cases = split_cases(mutants.name, mutants.read_text(), split=True)
    assert len(cases) >= count
    for case in cases:
        case.expects_error = True  # a mutant may still be valid; either way it must be repaired or refused
    verdicts = judge(cases, Pool(tmp_path, jobs=min(4, os.cpu_count() or 2), timeout=120), plain_always=False)
    bad = [f"{v.case.name}: {v.result}: {(v.fix.stderr.strip().splitlines() or [''])[0]}"
           for v in verdicts if v.result.startswith("BAD")]
    assert not bad, "\n".join(bad[:20])
    assert {v.result for v in verdicts} <= {"repaired", "unchanged", "refused"}
