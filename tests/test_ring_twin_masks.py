"""One mask computed by two ops. The rewrite changes the positions an op reads where the analysis reads them, so
two ops computing the same comparison are two values to it: each is rewritten where it is read, and neither stands
in for the other. Here the causal mask is computed twice and the copies are combined the ways jnp spells it
(a where choosing between them, a sum of their int8 casts, a stricter comparison and-ed with a looser one); each
program merges its own block before a lax.fori_loop over the others (the masks are the backward's residuals there
under jax.grad) and in the loop. Taken as one value, only one copy's comparison was rewritten and the program
mixed the old layout's mask with the new one's (wrong by 1 to 12 in the result and its gradient). Each is
rewritten and equal to jax.jit, forward and jax.grad, in both layouts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import autofix_shardings
from support import ring_user_kernels as uk

CP, S, D = 8, 128, 8
SPEC = P("dp", "cp", None)


def _twins(kind: str):
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def mask(k_pos):
            first = q_pos[:, None] >= k_pos[None, :]
            second = (me * n + jnp.arange(n))[:, None] >= k_pos[None, :]
            if kind == "where":
                return jnp.where((q_pos % 2 == 0)[:, None], first, second)
            if kind == "where-by-key":
                return jnp.where((k_pos % 3 == 0)[None, :], first, second)
            if kind == "int8-sum":
                return (first.astype(jnp.int8) + second.astype(jnp.int8)) > 1
            return (q_pos[:, None] > k_pos[None, :]) & (q_pos[:, None] >= k_pos[None, :])  # "implied"

        state = uk.merge_online(uk.init_state(q, "online"), jnp.where(mask(q_pos), uk.scores(q, k), uk.NEG), v, 0)
        k, v = (lax.ppermute(t, "cp", uk.ring(CP)) for t in (k, v))

        def step(i, carry):
            state, k, v = carry
            k_pos = ((me - i) % CP) * n + jnp.arange(n)
            state = uk.merge_online(state, jnp.where(mask(k_pos), uk.scores(q, k), uk.NEG), v, i)
            return (state,) + tuple(lax.ppermute(t, "cp", uk.ring(CP)) for t in (k, v))

        state, _, _ = lax.fori_loop(1, CP, step, (state, k, v))
        return uk.finish(state, "online")
    return body


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
@pytest.mark.parametrize("kind", ["where", "where-by-key", "int8-sum", "implied"])
def test_copies_of_a_mask_are_each_rewritten(kind, grad, strategy):
    mesh = jax.make_mesh((1, CP), ("dp", "cp"))
    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal((1, S, D)).astype(np.float32), NamedSharding(mesh, SPEC))
            for _ in range(3)]
    fn = jax.shard_map(_twins(kind), mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
    if grad:
        w = rng.standard_normal((1, S, D)).astype(np.float32)

        def loss(*a, f=fn):
            y = f(*a)
            return jnp.sum(y * w + y * y / 2)
        fn = jax.grad(loss, argnums=(0, 1, 2))
    fixed = autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore")
    rings = fixed.lower(*args).rings
    assert len(rings) == (2 if grad else 1) and all(r.applied for r in rings), [r.why for r in rings]
    with jax.set_mesh(mesh):
        want, got = jax.jit(fn)(*args), fixed(*args)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5 * max(1.0, np.abs(a).max()))
