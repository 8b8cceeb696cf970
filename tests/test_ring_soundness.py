"""Soundness of ring-reorder on ring programs written as users write them: each states, per strategy, whether it
is rewritten (and then computes exactly what jax.jit of the same program computes), refused (the reorder would
change its results: the report names the op and the user's line), or left alone because the layout doesn't fit
its length. Every case checks what it states."""

import re

import jax
import numpy as np
import pytest

from shardfix.jit.lowering import patch_lowered
from support import ring_programs
from support.ring_programs import PROGRAMS, STRATEGIES, expected

MESH = jax.make_mesh((2, 4), ("dp", "cp"))
LOCATED = re.compile(r"'(stablehlo|func|sdy)\.[a-z_]+' at \S+ring_programs\.py:\d+ ")


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def program(request):
    fn, args, expectation = PROGRAMS[request.param](MESH)
    lowered = jax.jit(fn).lower(*args)
    return request.param, lowered, args, expectation, lowered.compile()(*args)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_program_does_what_it_states(program, strategy):
    name, lowered, args, expectation, reference = program
    outcome = expected(expectation, strategy)
    patched, report = patch_lowered(lowered, f"ring-reorder{{strategy={strategy}}}")
    decisions = report.rings
    assert decisions, f"{name}: no ring found"
    whys = [d.why for d in decisions]
    if outcome == "reorder":
        assert all(d.applied for d in decisions), f"{name} should be rewritten under {strategy}: {whys}"
        got = patched.compile()(*args)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(reference), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        return
    assert not any(d.applied for d in decisions), f"{name} must be left alone under {strategy}: {whys}"
    assert patched is lowered
    if outcome == "unfit":
        assert all("is not a multiple of" in why for why in whys), whys
    else:
        assert outcome == "refuse", outcome
        assert all(why.startswith("not provably safe") or "is not a multiple of" in why for why in whys), whys


REFUSED = sorted(name for name, build in PROGRAMS.items()
                 if expected(build(MESH)[2], "zigzag") == "refuse")


@pytest.mark.parametrize("name", REFUSED)
def test_refusals_name_the_op_and_the_users_line(name):
    fn, args, _ = PROGRAMS[name](MESH)
    _, report = patch_lowered(jax.jit(fn).lower(*args), "ring-reorder{strategy=zigzag}")
    assert report.rings
    for d in report.rings:
        assert LOCATED.search(d.why), f"{name}: {d.why}"
        assert d.location.startswith(ring_programs.__file__), d.location
