"""Audit of the proof's memo (ring/memo.py) and the structural keys it groups ring regions by (ring/structural.py):
a verdict is carried only to a region that is the same program as the one proved.

- A function's name is replaced by its key wherever the region's text shows `@name`, but the printer also writes a
  custom_call's target as `@target`: a region calling custom_call "other_target" on token data gets the key of the
  same region calling custom_call "Sharding" (an annotation the analysis reads as the identity) as soon as the
  module holds functions named "Sharding" and "other_target" with equal keys (two jitted helpers with the same
  body). The opaque custom call, refused on its own, then takes the annotation's "applied" verdict when the
  annotated layer comes first (and the annotated layer the refusal when it comes second).
"""

import jax
import pytest
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
    assert [applied for applied, _ in decisions] == [EXPECTED[t] for t in targets], decisions
    for (applied, why), target in zip(decisions, targets):
        if not applied:
            assert f"opaque custom call ('{target}')" in why, decisions
