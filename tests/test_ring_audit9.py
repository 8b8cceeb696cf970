"""Audit of the proof's memo (ring/memo.py) and the structural keys it groups ring regions by (ring/structural.py):
a verdict is carried only to a region that is the same program as the one proved.

- A function's name is replaced by its key wherever the region's text shows `@name`, but the printer also writes a
  custom_call's target as `@target`: a region calling custom_call "other_target" on token data gets the key of the
  same region calling custom_call "Sharding" (an annotation the analysis reads as the identity) as soon as the
  module holds functions named "Sharding" and "other_target" with equal keys (two jitted helpers with the same
  body). The opaque custom call, refused on its own, then takes the annotation's "applied" verdict when the
  annotated layer comes first (and the annotated layer the refusal when it comes second). The same where the custom
  call sits in a jitted helper of each layer: the helper calling "other_target" takes over the key of the one
  calling "Sharding" (the strings differ, but the printed helper shows its target only as `@Sharding`).
- The group key leaves out the constant behind an operand, which the proof reads for infinities
  (finite.finite_constant): a layer given a -inf table would take the verdict of the same layer given a finite
  one. Held on this commit only because every operand reaching the infinity check raises IndexError (key[4] of a
  4-item key) and is refused.
- The group key names the region that produces an operand, not which of its results: a group whose regions read
  A's results the other way round takes the first group's decisions (results right here: the regions concerned
  are proved apart, reading A unreordered).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P
from jax._src.interpreters import mlir
from jax.extend.core import Primitive

from shardfix import autofix_shardings
from support import ring_user_kernels as ruk
from test_ring_audit5 import MESH, SPEC, _placed

CP, B, S, D = 4, 2, 32, 8


def _custom_call(target: str) -> Primitive:
    """x -> stablehlo.custom_call @target(x), of x's type."""
    prim = Primitive(f"audit9_{target}")
    prim.def_abstract_eval(lambda x: x)
    mlir.register_lowering(prim, lambda ctx, x: mlir.custom_call(target, result_types=[x.type], operands=[x]).results)
    return prim


CALLS = {target: _custom_call(target) for target in ("Sharding", "other_target")}


def _layer(target: str, helper: bool):
    """A one-block causal ring whose queries first go through custom_call `target` (in a jitted helper of the
    layer's own with `helper`)."""
    body = ruk.one_block_ring(CP, ruk.causal)
    call = jax.jit(CALLS[target].bind) if helper else CALLS[target].bind
    return jax.shard_map(lambda q, k, v: body(call(q), k, v), mesh=MESH, in_specs=(SPEC,) * 3, out_specs=SPEC,
                         check_vma=False)


@jax.jit
def Sharding(x):  # noqa: N802 (named like the custom call target)
    return x * 2.0


@jax.jit
def other_target(x):
    return x * 2.0


def _decisions(targets: list[str], helper: bool) -> list[tuple[bool, str]]:
    layers = [_layer(t, helper) for t in targets]

    def f(q, k, v):
        return [layer(q, k, v) for layer in layers] + [Sharding(q), other_target(q)]

    low = autofix_shardings(f, on_fix="ignore", ring_reorder="zigzag").lower(*_placed(*[(B, S, D)] * 3))
    return [(r.applied, r.why) for r in low.rings]


EXPECTED = {"Sharding": True, "other_target": False}  # the annotation is read through; the opaque call is refused


@pytest.mark.parametrize("helper", [False, True], ids=["in_region", "in_helper"])
@pytest.mark.parametrize("targets", [["Sharding"], ["other_target"], ["Sharding", "other_target"],
                                     ["other_target", "Sharding"]], ids="-".join)
def test_custom_call_target_named_like_a_function_is_not_carried_over(targets, helper):
    decisions = _decisions(targets, helper)
    # the layers share their source line: compared as a multiset, each refusal naming the opaque target
    assert sorted(applied for applied, _ in decisions) == sorted(EXPECTED[t] for t in targets), decisions
    assert all("opaque custom call ('other_target')" in why for applied, why in decisions if not applied), decisions


# ---------------------------------------------------------------------------------------------------------------
# What the group key leaves out: the finiteness of a constant a region is given as an operand.


def _table_bias_layer():
    """A causal ring (finite mask) whose scores add a replicated key bias table given as operand 3, the running max
    started at -inf with no guard: where the table holds -inf, a row whose first block shows only those keys gets
    exp(-inf - -inf) = nan, which rows depending on the block order."""

    def body(q, k, v, table):
        n, me = q.shape[1], lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            state, k, v = carry
            k_pos = ((me - i) % CP) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], ruk.scores(q, k), ruk.NEG) + table[k_pos][None, None, :]
            return (ruk.merge_online(state, s, v, i),) + tuple(lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v))

        m, l = ruk.row_stats(q, -jnp.inf)
        (m, l, o), _, _ = lax.fori_loop(0, CP, step, ((m, l, jnp.zeros_like(q)), k, v))
        return o / l[..., None]

    return jax.shard_map(body, mesh=MESH, in_specs=(SPEC,) * 3 + (P(),), out_specs=SPEC, check_vma=False)


def test_minus_infinity_table_does_not_take_the_verdict_of_a_finite_one():
    """Two layers, the same program but for the constant table each is given (the first -1e30 on keys 0..7, the
    second -inf there): the proof reads the constant behind the operand (finite.finite_constant), the group key
    does not, so the -inf layer must not take the finite layer's verdict. (On this commit every such operand bias
    is refused: finite._describe reads key[4] of the 4-item ("operand", place, i, finite) key, an IndexError;
    with key[3] read instead, the second layer takes the first's verdict and jax.jit's 128 nans are lost.)"""
    finite, infinite = np.zeros(S, np.float32), np.zeros(S, np.float32)
    finite[:8], infinite[:8] = -1e30, -np.inf
    layers = [_table_bias_layer() for _ in range(2)]

    def f(q, k, v):
        return [layer(q, k, v, jnp.asarray(t)) for layer, t in zip(layers, (finite, infinite))]

    args = _placed(*[(B, S, D)] * 3)
    fixed = autofix_shardings(f, on_fix="ignore", ring_reorder="zigzag")
    decisions = [(r.applied, r.why) for r in fixed.lower(*args).rings]
    want = [np.asarray(x) for x in jax.jit(f)(*args)]
    assert np.isnan(want[1]).sum() == 128  # the program's own nans: rows of cp device 0
    for got, expected in zip(fixed(*args), want, strict=True):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5, equal_nan=True,
                                   err_msg=str(decisions))
    assert sum(applied for applied, _ in decisions) <= 1, decisions


# ---------------------------------------------------------------------------------------------------------------
# What the group key leaves out: which result of a group's region an operand is.

POS = P("dp", "cp")


def _positions_and_local_index():
    """A causal ring that also returns each token's position and its index within the block (not a position)."""

    def body(q, k, v):
        o = ruk.one_block_ring(CP, ruk.causal)(q, k, v)
        (b, n), me = q.shape[:2], lax.axis_index("cp")
        return o, jnp.broadcast_to(me * n + jnp.arange(n), (b, n)), jnp.broadcast_to(jnp.arange(n), (b, n))

    return jax.shard_map(body, mesh=MESH, in_specs=(SPEC,) * 3, out_specs=(SPEC, POS, POS), check_vma=False)


def _data_positions_ring():
    return jax.shard_map(ruk.one_block_ring(CP, ruk.causal, positions="data", loop="unrolled"), mesh=MESH,
                         in_specs=(SPEC,) * 3 + (POS, POS), out_specs=SPEC, check_vma=False)


def _position_groups(orders: list[str]):
    """Per order a group [A, B1, B2]: A returns (o, positions, local index); B1 and B2 (rings over data positions)
    read o and, "ab": B1 the positions and B2 the local index, "ba": the other way round. The groups' keys are
    equal (B1 and B2 read "a result of A" either way)."""
    groups = [(_positions_and_local_index(), _data_positions_ring(), _data_positions_ring(), o) for o in orders]

    def f(q, k, v):
        out = []
        for a, b1, b2, order in groups:
            o, positions, local = a(q, k, v)
            x, y = (positions, local) if order == "ab" else (local, positions)
            out.append(b1(o, k, v, x, x))
            out.append(b2(o, k, v, y, y))  # on a line of its own: the decisions' locations tell B1 and B2 apart
        return out

    args = _placed(*[(B, S, D)] * 3)
    fixed = autofix_shardings(f, on_fix="ignore", ring_reorder="zigzag")
    rings = fixed.lower(*args).rings
    want = jax.jit(f)(*args)
    for got, expected in zip(fixed(*args), want, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)
    return [(r.applied, str(r.loc), r.why) for r in rings]


def test_group_reading_the_other_result_is_not_given_the_first_groups_decisions():
    """Results are right either way (the regions proved apart read A unreordered), but the "ba" group, after an
    "ab" group, takes the "ab" group's decisions: B1 (reading the local index) applied, B2 (reading positions)
    refused for the while loop of a B reading positions, where on its own the "ba" group refuses B1 for its local
    index and applies B2."""
    alone = _position_groups(["ba"])
    after = _position_groups(["ab", "ba"])
    assert sorted(after) == sorted(_position_groups(["ab"]) + alone), (after, alone)
