"""The per-op rule table (shardfix.ring.optable, resolved by shardfix.ring.rules): every kind an entry names has
its rule, the attributes an entry says hoisting reads are the ones its ops carry, and the written-out inverses of
hoist-permutations' `moves` rules agree with `moves` itself, op by op, on the ops a real training step lowers to."""

import functools

import jax
from jaxlib.mlir import ir

from shardfix.ir import make_context, parse_module
from shardfix.ring import rules
from shardfix.ring.dims import shape
from shardfix.ring.optable import OPS, Motion
from support.llama import train_step

# Motions that hoist-permutations handles itself (calls.py for calls): no `moves` rule of rules.py
_OWN_MOTIONS = {Motion.CALL, Motion.SOURCE, Motion.AS_IS, Motion.NONE}
# attributes an op may leave out (a flag that defaults to false)
_OPTIONAL = {"indices_are_sorted"}


def _inverted(op, dim: int) -> dict[int, int]:
    """carriers(op, dim) computed the slow way: every operand dim `moves` sends to `dim`."""
    found = {}
    for i, value in enumerate(op.operands):
        for d in range(len(shape(value))):
            try:
                if rules.moves(op, i, d) == dim:
                    found[i] = d
            except rules.Blocked:
                pass
    return found


def _ops(block):
    for view in block.operations:
        op = view.operation
        yield op
        for region in op.regions:
            for inner in region.blocks:
                yield from _ops(inner)


@functools.cache
def _step_module():
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    step, args = train_step(mesh, layers=2)
    ctx = make_context()
    return ctx, parse_module(step.lower(*args).as_text(), ctx, "<step>")


def _step_ops():
    ctx, module = _step_module()
    for fn in module.regions[0].blocks[0].operations:
        for block in fn.operation.regions[0].blocks if fn.operation.regions else ():
            yield from _ops(block)


def test_every_kind_an_entry_names_has_its_rule():
    for name, entry in OPS.items():
        resolved = rules.RULES[name]
        assert (resolved.transfer is None) == (entry.transfer is None), name
        assert (resolved.moves is None) == (entry.motion in _OWN_MOTIONS), name
        if entry.motion in (Motion.SAME_SHAPE, Motion.WHERE_IT_LIVES):
            assert resolved.carries is not None, name  # hoist's shortcut for them is this rule's answer


def test_hoist_reads_names_attributes_the_ops_carry():
    ctx, _ = _step_module()
    seen = set()
    with ctx:
        for op in _step_ops():
            entry = OPS.get(op.name)
            if entry is None or not entry.hoist_reads:
                continue
            assert set(entry.hoist_reads) - _OPTIONAL <= set(op.attributes), str(op)  # (its names)
            seen.add(entry.motion)
    assert {Motion.BROADCAST, Motion.DOT, Motion.REDUCE, Motion.TRANSPOSE} <= seen


def test_written_out_inverses_agree_with_moves():
    ctx, _ = _step_module()
    checked = set()
    with ctx:
        for op in _step_ops():
            entry = rules.RULES.get(op.name)
            if entry is None or entry.carries is None or len(op.results) != 1:
                continue
            for dim in range(len(shape(op.results[0]))):
                assert entry.carries(op, dim) == _inverted(op, dim), (str(op), dim)
            checked.add(op.name)
    assert {"stablehlo.dot_general", "stablehlo.broadcast_in_dim", "stablehlo.add", "stablehlo.multiply"} <= checked
