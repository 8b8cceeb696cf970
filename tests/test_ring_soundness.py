"""Soundness of ring-reorder on ring programs written as users write them: each is either rewritten, and then
computes exactly what jax.jit of the same program computes, or refused with the op and the line that broke a rule.
The programs known not to keep their results under a reorder must be refused."""

import re

import jax
import numpy as np
import pytest

from shardfix.jit.lowering import patch_lowered
from support.ring_programs import PROGRAMS

MESH = jax.make_mesh((2, 4), ("dp", "cp"))
LOCATED = re.compile(r"'(stablehlo|func|sdy)\.[a-z_]+' at \S+ring_programs\.py:\d+ ")


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def program(request):
    fn, args, expectation = PROGRAMS[request.param](MESH)
    lowered = jax.jit(fn).lower(*args)
    return request.param, lowered, args, expectation, lowered.compile()(*args)


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
def test_rewritten_or_refused_never_wrong(program, strategy):
    name, lowered, args, expectation, expected = program
    patched, report = patch_lowered(lowered, f"ring-reorder{{strategy={strategy}}}")
    decisions = report.rings
    assert decisions, f"{name}: no ring found"
    if all(d.applied for d in decisions):
        assert expectation == "reorder", f"{name} was rewritten but does not keep its results"
        got = patched.compile()(*args)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        return
    assert not any(d.applied for d in decisions)
    assert patched is lowered
    if expectation == "refuse" or strategy == "striped":
        for d in decisions:
            assert d.why.startswith("not provably safe") or "multiple of" in d.why, d.why
        return
    pytest.fail(f"{name} should be rewritten: {[d.why for d in decisions]}")


def test_refusals_name_the_op_and_the_users_line(program):
    name, lowered, args, expectation, _ = program
    if expectation != "refuse":
        return
    _, report = patch_lowered(lowered, "ring-reorder")
    for d in report.rings:
        assert LOCATED.search(d.why), f"{name}: {d.why}"
        assert d.location.startswith(str(__import__("support.ring_programs").ring_programs.__file__)), d.location
