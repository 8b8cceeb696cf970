"""Training on jax.make_mesh's default axes (Explicit on JAX 0.12): the forward and backward rings of a custom_vjp
kernel pass residuals (the softmax statistics) through a sharding constraint that only re-asserts their layout.
Both rings are rewritten together and the gradients equal jax.jit's; a per-device value that anything outside the
ring regions reads keeps them as written."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import autofix_shardings
from support import ring_kernels

SPEC = P("dp", "cp", None)


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "cp"))  # the default axis types: Explicit on JAX 0.12


@pytest.fixture(scope="module")
def data(mesh):
    rng = np.random.default_rng(0)
    return tuple(jax.device_put(rng.standard_normal((2, 32, 8)).astype(np.float32), NamedSharding(mesh, SPEC))
                 for _ in range(4))


@pytest.mark.parametrize("name", ["fori", "scan"])
def test_custom_vjp_backward_ring_rewritten_with_its_forward(mesh, data, name):
    q, k, v, w = data
    kernel = ring_kernels.fori_ring_attention("cp", 4) if name == "fori" else \
        ring_kernels.scan_ring_attention("cp", 4, 4)
    attention = ring_kernels.sharded(kernel, mesh)

    def loss(q, k, v):
        return jnp.sum(attention(q, k, v) * w)

    grad = autofix_shardings(jax.grad(loss, argnums=(0, 1, 2)), ring_reorder="zigzag")
    decisions = grad.lower(q, k, v).rings
    assert [(r.strategy, r.applied) for r in decisions] == [("zigzag", True)] * 2, [r.why for r in decisions]
    for got, want in zip(grad(q, k, v), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_per_device_value_read_outside_through_a_constraint_is_refused(mesh, data):
    """The maxima of each device's block, one per device, re-asserted (reshard) and weighted outside:
    after a reorder each device's maximum would be over other tokens."""
    q = data[0]

    def body(x):
        total = cur = jnp.sum(x, axis=1, keepdims=True)
        for _ in range(3):
            cur = jax.lax.ppermute(cur, "cp", [(i, (i + 1) % 4) for i in range(4)])
            total = total + cur
        return x + total, jnp.max(x, axis=(1, 2))[:, None]

    ring = jax.shard_map(body, mesh=mesh, in_specs=SPEC, out_specs=(SPEC, P("dp", "cp")), check_vma=False)

    def f(x):
        out, peaks = ring(x)
        peaks = jax.sharding.reshard(peaks, NamedSharding(mesh, P("dp", "cp")))
        return out, peaks * jnp.arange(4.0)

    fixed = autofix_shardings(f, ring_reorder="zigzag")
    decisions = fixed.lower(q).rings
    assert decisions and not any(r.applied for r in decisions)
    # the reader named is the multiply behind the constraints, not a constraint
    assert any("per-device value that 'stablehlo.multiply' outside the ring regions reads" in r.why
               for r in decisions), [r.why for r in decisions]
    for got, want in zip(fixed(q), jax.jit(f)(q), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
