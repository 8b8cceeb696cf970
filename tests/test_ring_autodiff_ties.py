"""Why a backward ring that jax.grad made is not rewritten on the strength of its forward's proof.

The argument "the derivative of an equivariant function is equivariant" holds for derivatives, not for what autodiff
computes where the function has none. JAX differentiates `max(a, b)` at a tie by giving each side half the
cotangent, so a running maximum folded block by block splits a tie by the order the blocks arrive in: with three
tied blocks the first two get a quarter each and the last a half. The reorder changes which tokens arrive at which
ring step, so a ring whose forward is proved (a maximum is an order-free merge) has a gradient that the reorder
changes wherever scores tie (padding tokens, repeated keys). These tests hold both facts: the program reordered by
hand before jax.grad computes the same forward and a different gradient, and ring-reorder leaves the backward (and
its forward) alone, so the decorated program's gradient is jax.jit's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import autofix_shardings
from support.ring_user_programs import meshes

CP, N, D = 4, 32, 4
SEQ = P("dp", "cp")


def ring_max(mesh):
    """Per query, the largest score over every key, the keys' blocks passed around the ring (max-pooled attention
    scores): proved, the maximum being an order-free merge."""
    perm = [(i, (i + 1) % CP) for i in range(CP)]

    def body(q, k):
        def step(_, carry):
            m, kb = carry
            m = jnp.maximum(m, jnp.einsum("bqd,bkd->bqk", q, kb).max(-1))
            return m, jax.lax.ppermute(kb, "cp", perm)

        m, _ = jax.lax.fori_loop(0, CP, step, (jnp.full_like(q[..., 0], -1e30), k))
        return m

    return jax.shard_map(body, mesh=mesh, in_specs=(SEQ, SEQ), out_specs=SEQ)


def zigzag(x, inverse: bool = False):
    """Tokens in zigzag order along dim 1 (device i holds chunks i and 2 CP - 1 - i), or back."""
    c = x.shape[1] // (2 * CP)
    order = np.concatenate([np.r_[i * c:(i + 1) * c, (2 * CP - 1 - i) * c:(2 * CP - i) * c] for i in range(CP)])
    return x.at[:, np.argsort(order) if inverse else order].get(out_sharding=SEQ)


def tied_inputs(mesh):
    """q random, every key the same vector: each query's scores all tie."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, N, D)).astype(np.float32)
    k = np.broadcast_to(rng.standard_normal((1, 1, D)), (2, N, D)).astype(np.float32)
    sharding = NamedSharding(mesh, SEQ)
    return jax.device_put(q, sharding), jax.device_put(k, sharding)


def loss(f):
    return lambda q, k: jnp.sum(f(q, k) ** 2)


def test_reordering_before_jax_grad_keeps_the_ring_max_but_changes_its_gradient_at_ties():
    mesh = meshes()["explicit"]
    f = ring_max(mesh)

    def reordered(q, k):
        return zigzag(f(zigzag(q), zigzag(k)), inverse=True)

    q, k = tied_inputs(mesh)
    with jax.set_mesh(mesh):
        np.testing.assert_array_equal(jax.jit(f)(q, k), jax.jit(reordered)(q, k))
        grad = np.asarray(jax.jit(jax.grad(loss(f), argnums=1))(q, k))
        grad_reordered = np.asarray(jax.jit(jax.grad(loss(reordered), argnums=1))(q, k))
    # the cotangent of each query's maximum goes to the keys of the blocks in the proportions their arrival order
    # gives; the sums over keys agree, the keys' shares don't
    np.testing.assert_allclose(grad.sum(1), grad_reordered.sum(1), rtol=1e-5, atol=1e-4)
    assert np.abs(grad - grad_reordered).max() > 0.1 * np.abs(grad).max()


def test_ring_reorder_leaves_the_backward_of_a_ring_max_alone_and_its_gradient_is_jax_jits():
    mesh = meshes()["explicit"]
    grad = jax.grad(loss(ring_max(mesh)), argnums=1)
    q, k = tied_inputs(mesh)
    low = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore").lower(q, k)
    assert len(low.rings) == 2 and not any(r.applied for r in low.rings), [(r.applied, r.why) for r in low.rings]
    assert any("give the kernel a custom_vjp" in r.why for r in low.rings)
    np.testing.assert_array_equal(low.compile()(q, k), jax.jit(grad)(q, k))
