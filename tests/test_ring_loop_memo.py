"""Loops analysed once per distinct input (ring/loopmemo.py): a blockwise kernel's chunk loop, nested in the ring
loop, gets the same inputs in two passes of the loop around it and is analysed once for both; every verdict is the
one a fresh analysis of every pass gives (proved or refused, the reason, the rewrites and the units, op for op)."""

import jax
import pytest

from shardfix.ir import make_context, parse_module
from shardfix.ring import loopmemo
from shardfix.ring.prove import prove_rings
from support import ring_user_programs as rup

# a forward blockwise kernel, its training step (a forward and a backward ring), and a refused one with loops
NAMES = ("blockwise-causal-segments", "grad-blockwise-window40", "refuse-hop-keyed-dropout")


def _fields(verdict) -> tuple:
    return (verdict.proved, verdict.why, verdict.loc, verdict.sequence_operands, verdict.sequence_results,
            verdict.block, verdict.length, verdict.group,
            [(r.op, r.operand, r.unit, r.calls) for r in verdict.rewrites], verdict.units)


@pytest.fixture(scope="module")
def lowered():
    meshes = rup.meshes()
    programs = {p.name: p for p in rup.PROGRAMS}
    texts = {}
    for name in NAMES:
        fn, args = programs[name].build(meshes[programs[name].mesh])
        texts[name] = jax.jit(fn).lower(*args).as_text()
    return texts


@pytest.mark.parametrize("name", NAMES)
def test_verdicts_are_those_of_a_fresh_analysis(lowered, name, monkeypatch):
    ctx = make_context()
    module = parse_module(lowered[name], ctx)
    with ctx:
        monkeypatch.setattr(loopmemo, "_key", lambda engine, op, inits: None)
        fresh = [_fields(v) for v in prove_rings(module.operation)]
        monkeypatch.undo()
        memoized = [_fields(v) for v in prove_rings(module.operation)]
    assert memoized == fresh
    assert [v[0] for v in fresh] == ([False] if name.startswith("refuse") else [True] * len(fresh))
    # that the memo is taken at all is held by test_ring_audit10's four-deep case on every JAX version: these
    # kernels' chunk loops get equal inputs under jax 0.12's lowering, not under 0.10.2's (a slot the q-chunk loop
    # changes is read by the kv-chunk loop)
