"""What @autofix_shardings records while JAX differentiates a ring shard_map (ring/ties.py, shardfix.jit._jax's
autodiff ties): which result of the original shard_map each cotangent operand of the backward region differentiates,
which results had a symbolically zero cotangent, and which results the forward region still computes after JAX
dropped those nobody reads. The module alone does not say (two results of one type look alike); these tests fail
where JAX's shard_map autodiff rules move and the record goes missing or wrong."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardfix import autofix_shardings
from shardfix.jit import tracing
from shardfix.ring import ties
from support import ring_user_kernels as uk
from support.ring_user_programs import meshes

SPEC = jax.sharding.PartitionSpec("dp", "cp", None)
_NAME = re.compile(r'loc\("([^"]*)"')


def _two_results(mesh):
    """A ring with two results of one type: z (a per-token function of q and k) and y (v rolled over tokens)."""
    def body(q, k, v):
        z = q * jnp.tanh(k)
        y = jnp.concatenate([v[:, -1:], v[:, :-1]], axis=1) * jnp.tanh(k)
        return z, y
    return jax.shard_map(body, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=(SPEC, SPEC))


def _args(mesh):
    rng = np.random.default_rng(0)
    return [jax.device_put(rng.standard_normal((2, 16, 4)).astype(np.float32), jax.NamedSharding(mesh, SPEC))
            for _ in range(3)]


def _ties_of(fun, args) -> tuple[list[ties.Tie], list[ties.Tie]]:
    """The forward and backward ties of the shard_map regions of jax.jit(fun)'s module, traced as
    @autofix_shardings traces (in a repair session)."""
    with tracing.repairing():
        module = jax.jit(fun).lower(*args).compiler_ir("stablehlo")
    found = [ties.of_location(name) for name in _region_names(module.operation)]
    return ([t for t in found if t is not None and t.role is ties.Role.FORWARD],
            [t for t in found if t is not None and t.role is ties.Role.BACKWARD])


def _region_names(op) -> list[str]:
    """The location name of each manual computation nested in `op`."""
    names = []
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                if inner.name == "sdy.manual_computation":
                    found = _NAME.search(str(inner.location))
                    names.append(found.group(1) if found else "")
                names += _region_names(inner)
    return names


@pytest.mark.parametrize("read, differentiated, zero", [
    ("y", {0: 1}, {0}),  # loss reads y only through its derivative, z is aux: the forward drops y
    ("z", {0: 0}, {1}),  # the other way round
    ("both", {0: 0, 1: 1}, set()),
])
def test_the_backward_names_the_results_its_cotangents_differentiate(read, differentiated, zero):
    mesh = meshes()["explicit"]
    f = _two_results(mesh)
    w = np.arange(2 * 16 * 4, dtype=np.float32).reshape(2, 16, 4)

    def loss(q, k, v):
        z, y = f(q, k, v)
        value = {"y": jnp.sum(y * w), "z": jnp.sum(z * w), "both": jnp.sum(z * w) + jnp.sum(y * y)}[read]
        return value, (z if read == "y" else y if read == "z" else None)

    with jax.set_mesh(mesh):
        forwards, backwards = _ties_of(jax.grad(loss, argnums=(0, 1, 2), has_aux=True), _args(mesh))
    assert len(backwards) == 1 and len(forwards) == 1, (forwards, backwards)
    backward, forward = backwards[0], forwards[0]
    assert backward.ring == forward.ring and backward.results == forward.results == 2
    assert backward.cotangents() == differentiated
    assert backward.zero == zero
    # the forward region computes the results whose values the program reads (aux, or y for y * y's derivative);
    # the others JAX dropped
    assert {j for j in forward.slots if j is not None} == {"y": {0}, "z": {1}, "both": {1}}[read], forward


def test_nothing_is_recorded_outside_a_repair_session():
    mesh = meshes()["explicit"]
    f = _two_results(mesh)

    def loss(q, k, v):
        z, y = f(q, k, v)
        return jnp.sum(y) + jnp.sum(z)

    with jax.set_mesh(mesh):
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*_args(mesh)).as_text(debug_info=True)
    assert ties.PREFIX not in text


def test_a_backward_of_a_result_made_by_the_same_expression_as_a_proved_one_is_refused_by_name():
    """The program of [audit2] (tests/test_ring_user_programs.py): one comprehension makes what z reads (q shifted
    over features) and what y sums (v shifted over tokens); the loss reads y only through its derivative and
    returns z. The refusal names the result the backward differentiates, which the forward does not compute."""
    jax.clear_caches()

    def shift(t, u, axis):
        s, n = jax.lax.mul(t, jax.lax.tanh(u)), t.shape[axis]
        return jax.lax.concatenate([jax.lax.slice_in_dim(s, n - 1, n, axis=axis),
                                    jax.lax.slice_in_dim(s, 0, n - 1, axis=axis)], axis)

    def body(q, k, v):
        cp, n = 4, q.shape[1]
        me = jax.lax.axis_index("cp")
        q_pos = (me * n + jnp.arange(n))[:, None]

        def step(i, carry):
            acc, y, k, v = carry
            k_pos = (((me - i) % cp) * n + jnp.arange(n))[None, :]
            qs, ys = [shift(t, u, axis) for t, u, axis in ((q, q, 2), (v, k, 1))]
            acc = uk.merge_online(acc, jnp.where(q_pos >= k_pos, uk.scores(qs, k), uk.NEG), v, i)
            k, v = (jax.lax.ppermute(t, "cp", uk.ring(cp)) for t in (k, v))
            return acc, y + ys, k, v

        (_, l, o), y, _, _ = jax.lax.fori_loop(0, cp, step, (uk.row_stats(q, uk.NEG) + (jnp.zeros_like(q),),
                                                              jnp.zeros_like(v), k, v))
        return o / l[..., None], y

    mesh = meshes()["explicit"]
    f = jax.shard_map(body, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=(SPEC, SPEC), check_vma=False)
    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal((2, 32, 8)).astype(np.float32), jax.NamedSharding(mesh, SPEC))
            for _ in range(3)]
    w = rng.standard_normal((2, 32, 8)).astype(np.float32)

    def loss(q, k, v):
        z, y = f(q, k, v)
        return jnp.sum(y * w), z

    grad = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)
    low = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore").lower(*args)
    assert not any(r.applied for r in low.rings), [(r.applied, r.why) for r in low.rings]
    assert any("differentiates result 1 of the ring region at" in r.why and "operand 0 is its cotangent" in r.why
               for r in low.rings), [r.why for r in low.rings]
    for got, want in zip(jax.tree.leaves(low.compile()(*args)), jax.tree.leaves(jax.jit(grad)(*args))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_a_ring_nested_in_a_data_parallel_shard_map_is_tied_apart_from_it():
    """dp outer, cp inner: each shard_map JAX differentiates gets its own ties, the inner regions' (whose names
    are relative to the outer body's) apart from the outer's."""
    from support.ring_user_programs import PROGRAMS
    p = next(p for p in PROGRAMS if p.name == "grad-nested-fori-causal@auto")
    fn, args = p.build(meshes()[p.mesh])
    with jax.set_mesh(meshes()[p.mesh]):
        forwards, backwards = _ties_of(jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=p.wrt), args)
    assert len(forwards) == len(backwards) == 2, (forwards, backwards)
    assert {t.ring for t in forwards} == {t.ring for t in backwards} and len({t.ring for t in forwards}) == 2
    for t in backwards:
        assert t.cotangents() == {0: 0} and t.zero == frozenset()
    for t in forwards:
        assert [j for j in t.slots if j is not None] == [0]


def test_a_plain_autodiff_ring_is_refused_for_what_remains_unproved_once_its_cotangents_are_tied():
    """An online-softmax ring (the registry's grad-fori-causal) differentiated by jax.grad: the cotangent is tied
    to the ring's one result, which is proved; the backward is still left alone, the reason naming what is not
    proved (the order-free gradient at ties of the running maximum, the positions the backward recomputes)."""
    from support.ring_user_programs import PROGRAMS
    p = next(p for p in PROGRAMS if p.name == "grad-fori-causal")
    fn, args = p.build(meshes()[p.mesh])
    grad = jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=p.wrt)
    low = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore").lower(*args)
    assert len(low.rings) == 2 and not any(r.applied for r in low.rings), [(r.applied, r.why) for r in low.rings]
    assert any("and so are the results its cotangents differentiate (result 0 of the ring region at" in r.why
               and "each running maximum must receive a cotangent that is zero" in r.why for r in low.rings), \
        [r.why for r in low.rings]
