"""Strict residuals (prove._accept_autodiff proves a plain-autodiff pair's forward with `whole=True`): positions
the forward hands the backward as a residual are read where the forward returns them, and rewritten as any read of
positions is, so the backward meets the new layout's positions, as the forward's results do. What stays refused: a
backward that computes positions of its own (obligation (d)), and an op that only residuals depend on computing
positions (Engine._skip: the proof never interprets it, so nothing rewrites it).

A ring with RoPE whose cos/sin tables are differentiated hands the backward positions: the forward gathers the
tables' rows at its tokens' positions (rewritten by the reorder), and JAX hands those positions to the backward as
a residual to scatter the tables' cotangents at. The hand-reordered twin shows what the rewrite must do: with the
forward reordered and the tables' cotangents scattered at the positions of the new layout, the tables' gradient is
jax.jit's; at the positions of the old layout it is not. Its backward also recomputes the key positions of each
ring step in its loop, so the program is refused for that; differentiated in q, k, v only, it is rewritten. The
bidirectional ring of tests/support/ring_user_variants.py hands its backward the masks of the merges outside its
loop, rewritten so (grad-bidirectional-ring-causal@cp8 in the programs' registry: equal to jax.jit)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from shardfix import autofix_shardings
from support import ring_user_kernels as uk
from support.ring_user_programs import meshes, rope_table, sharded, qkv, replicated, zigzag_layout

CP = 4


def _line(text: str) -> int:
    """The line of this file that holds `text`."""
    return next(i for i, held in enumerate(open(__file__), 1) if text in held)


def _contiguous(c, n):
    return c * n + jnp.arange(n)


def _rope_ring(positions=_contiguous, scattered_at=None):
    """Body f(q, k, v, cos, sin): non-causal ring attention with RoPE, the tables' rows gathered at `positions(c, n)`
    of block c. `scattered_at`: the forward as written, but the tables' cotangents scattered at those positions (the
    backward reading the residual positions of another layout)."""
    def rows(table, at):
        if scattered_at is None:
            return table[at]
        wrong = table[scattered_at(*at)]
        return wrong - lax.stop_gradient(wrong) + lax.stop_gradient(table[positions(*at)])

    def body(q, k, v, cos, sin):
        n = q.shape[1]
        me = lax.axis_index("cp")

        def gather(t, c):
            return t[positions(c, n)] if scattered_at is None else rows(t, (c, n))  # strict: handed on

        q = uk.rotate(q, gather(cos, me), gather(sin, me))

        def step(i, carry):
            acc, k, v = carry
            source = (me - i) % CP
            s = uk.scores(q, uk.rotate(k, gather(cos, source), gather(sin, source)))
            acc = uk.merge_online(acc, s, v, i)
            return (acc,) + tuple(lax.ppermute(t, "cp", uk.ring(CP)) for t in (k, v))

        acc, _, _ = lax.fori_loop(0, CP, step, (uk.init_state(q, "online"), k, v))
        return uk.finish(acc, "online")
    return body


@functools.cache
def _program():
    mesh = meshes()["explicit"]
    return mesh, tuple(qkv(mesh)) + tuple(replicated(mesh, t) for t in rope_table())


def _grad(body, wrt, order=slice(None)):
    """jax.grad of a loss of body's result, its tokens weighted as `order` lays them out."""
    mesh, args = _program()
    fn = sharded(mesh, body, 3, n_rep=2)
    w = np.asarray(np.random.default_rng(5).standard_normal(args[0].shape), np.float32)[:, order]

    def loss(*a):
        y = fn(*a)
        return jnp.sum(y * w + y * y / 2)
    return jax.grad(loss, argnums=wrt)


def test_positions_handed_to_the_backward_are_rewritten_and_must_be():
    _, args = _program()
    whys = [r.why for r in autofix_shardings(_grad(_rope_ring(), (0, 1, 2, 3, 4)), ring_reorder="zigzag",
                                             on_fix="ignore").lower(*args).rings]
    assert len(whys) == 2 and all(whys), whys
    line = next(i for i, text in enumerate(open(__file__), 1) if text.rstrip().endswith("# strict: handed on"))
    # the residual positions are rewritten; what refuses the pair is the backward's own positions of each step
    recomputed = (f"it recomputes positions, or values from them, at {__file__}:{line} (scatter) (from "
                  f"{__file__}:{_line('return c * n')} (iota), {__file__}:{_line('me = lax.axis_index')} "
                  "(partition_id)), which are not rewritten like the forward's")
    assert all(recomputed in why and "hands the backward positions" not in why for why in whys), whys
    # without the tables' gradient, nothing hands positions on: the same ring is rewritten, forward and backward
    low = autofix_shardings(_grad(_rope_ring(), (0, 1, 2)), ring_reorder="zigzag", on_fix="ignore").lower(*args)
    assert [r.applied for r in low.rings] == [True, True], [r.why for r in low.rings]

    # the twins, reordered by hand: tokens in the zigzag layout, every position the forward reads the zigzag one
    order, zigzag = zigzag_layout(CP, args[0].shape[1])
    permuted = [jax.device_put(np.asarray(x)[:, order], x.sharding) for x in args[:3]] + list(args[3:])
    want = jax.jit(_grad(_rope_ring(), (0, 1, 2, 3, 4)))(*args)
    gaps = []
    for scattered_at in (None, _contiguous):  # the rewrite with the residual positions rewritten, and as written
        got = jax.jit(_grad(_rope_ring(zigzag, scattered_at), (0, 1, 2, 3, 4), order))(*permuted)
        got = [np.asarray(g)[:, np.argsort(order)] for g in got[:3]] + [np.asarray(g) for g in got[3:]]
        for g, ref in zip(got[:3], want[:3]):  # q, k, v's cotangents are the same either way
            np.testing.assert_allclose(g, np.asarray(ref), atol=1e-4)
        gaps.append(max(float(np.abs(g - np.asarray(ref)).max()) for g, ref in zip(got[3:], want[3:])))
    assert gaps[0] <= 1e-4 and gaps[1] > 1e-2, gaps


# No JAX program was found whose forward computes a position for its backward alone (an op that only residuals
# depend on, itself reading an iota, a partition or replica id, in its regions or callees): the guard that refuses
# such an op (Engine._skip under State.strict_residuals) checked on a constructed module.
_SKIPPED = """
func.func private @where_am_i() -> tensor<ui32> {
  %0 = stablehlo.partition_id : tensor<ui32>
  return %0 : tensor<ui32>
}
func.func @main(%x: tensor<4xf32>) -> (tensor<4xi32>, tensor<ui32>, tensor<4xf32>) {
  %0 = stablehlo.iota dim = 0 : tensor<4xi32>
  %1 = func.call @where_am_i() : () -> tensor<ui32>
  %2 = stablehlo.negate %x : tensor<4xf32>
  return %0, %1, %2 : tensor<4xi32>, tensor<ui32>, tensor<4xf32>
}
"""


def test_an_op_only_residuals_depend_on_computing_a_position_is_refused_under_strict_residuals(ctx):
    from shardfix.ir import parse_module
    from shardfix.ring.analysis import Engine, Refusal, State
    from shardfix.ring.autodiff import OPAQUE
    from shardfix.ring.detect import module_funcs

    module = parse_module(_SKIPPED, ctx)
    with ctx:
        funcs = module_funcs(module.operation)
        iota, call, negate = (op.operation for op in list(funcs["main"].regions[0].blocks[0].operations)[:3])
        source = list(funcs["where_am_i"].regions[0].blocks[0].operations)[0].operation
        why = ("computes positions (or a device index) that only the backward reads, which the proof of its results "
               "does not follow, so the rewrite would leave them in the old layout")
        for op, at in ((iota, iota), (call, source)):  # the op itself; a function it calls
            with pytest.raises(Refusal) as refused:
                Engine(State(ring=None, funcs=funcs, strict_residuals=True), scope=None)._skip(op)
            assert str(refused.value) == why and refused.value.op == at
        # what reads no position is set aside as a residual; outside a tied pair's proof so is any op
        engine = Engine(State(ring=None, funcs=funcs, strict_residuals=True), scope=None)
        engine._skip(negate)
        lenient = Engine(State(ring=None, funcs=funcs), scope=None)
        for op in (iota, call):
            lenient._skip(op)
        assert [engine.env[r] for r in negate.results] + [lenient.env[op.results[0]] for op in (iota, call)] == \
            [OPAQUE] * 3
