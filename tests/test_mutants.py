"""Mutants of Shardy's test cases (tests/data/shardy_mutants*.mlir, made by bench/shardy_mutants.py): each comes
out of `-p fix-shardings` verifying, or is refused in shardfix's words at a file:line:col; never a crash, hang,
traceback or output that doesn't verify. Each runs in a child with a time limit, forked by a fresh interpreter (never
by this process, which holds JAX's threads)."""

import os
from pathlib import Path

import pytest

from support.corpus import judge_file

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("name, count, every", [("shardy_mutants.mlir", 250, 4), ("shardy_mutants.mlir", 1000, 1),
                                                 ("shardy_mutants_generic.mlir", 400, 1)],
                         ids=["shardy_mutants.mlir-every-fourth", "shardy_mutants.mlir-all",
                              "shardy_mutants_generic.mlir-all"])
def test_every_mutant_is_repaired_or_refused(tmp_path, name, count, every):
    # the default run judges every fourth case of the first file (make test-exhaustive: all of them)
    # the second file: the cases as MLIR prints them in the generic form, shardings as properties
    # a mutant may still be valid (expects_error): either way it must be repaired or refused
    verdicts = judge_file(DATA / name, tmp_path, expects_error=True, jobs=min(4, os.cpu_count() or 2), timeout=120,
                          plain_always=False, every=every)
    assert len(verdicts) >= count
    bad = [f"{case}: {result}: {first}" for case, result, first in verdicts if result.startswith("BAD")]
    assert not bad, "\n".join(bad[:20])
    assert {result for _, result, _ in verdicts} <= {"repaired", "unchanged", "refused"}
