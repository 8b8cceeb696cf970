"""The per-op rule table (shardfix.ring.rules): the written-out inverses of hoist-permutations' `moves` rules agree
with `moves` itself, op by op, on the ops a real training step lowers to."""

import jax
from jaxlib.mlir import ir

from shardfix.ir import make_context, parse_module
from shardfix.ring import rules
from shardfix.ring.dims import shape
from support.llama import train_step


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


def test_written_out_inverses_agree_with_moves():
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    step, args = train_step(mesh, layers=2)
    ctx = make_context()
    module = parse_module(step.lower(*args).as_text(), ctx, "<step>")
    checked = set()
    with ctx:
        for fn in module.regions[0].blocks[0].operations:
            for block in fn.operation.regions[0].blocks if fn.operation.regions else ():
                for op in _ops(block):
                    entry = rules.RULES.get(op.name)
                    if entry is None or entry.carries is None or len(op.results) != 1:
                        continue
                    for dim in range(len(shape(op.results[0]))):
                        assert entry.carries(op, dim) == _inverted(op, dim), (str(op), dim)
                    checked.add(op.name)
    assert {"stablehlo.dot_general", "stablehlo.broadcast_in_dim", "stablehlo.add", "stablehlo.multiply"} <= checked
