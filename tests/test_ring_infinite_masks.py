"""An online softmax whose running max starts at -inf (jnp.full) and whose masked scores are -inf, with no guard on
the shift: exp(-inf - -inf) is nan for every row that has seen no visible key yet, and stays nan. Which rows see no
key in their first blocks depends on which tokens a block holds, so the reorder changes which results are nan.
ring-reorder must leave such a ring alone (or compute what jax.jit computes, nans included); the guarded merge
(shift by where(isfinite(m), m, 0)) is order-free and may be rewritten."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import autofix_shardings
from support.ring_user_kernels import merge_guarded, merge_online, ring

CP, B, S, D = 4, 2, 32, 8
SPEC = P("dp", "cp", None)


def strict_causal(merge, init="full", fill=-jnp.inf):
    """Ring attention where a query sees only earlier tokens (q > k), masked with `fill` (in q's type), the state
    from jnp.full (or from q: zeros_like(q) + fill, which carries q's sharding)."""
    def body(q, k, v):
        b, n, d = q.shape
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            state, k, v = carry
            k_pos = ((me - i) % CP) * n + jnp.arange(n)
            s = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(jnp.float32(d))
            s = jnp.where(q_pos[:, None] > k_pos[None, :], s, fill).astype(q.dtype)
            state = merge(state, s, v, i)  # refused here
            return state, lax.ppermute(k, "cp", ring(CP)), lax.ppermute(v, "cp", ring(CP))

        if init == "full":
            state = (jnp.full((b, n), fill, q.dtype), jnp.zeros((b, n), q.dtype), jnp.zeros((b, n, d), q.dtype))
        else:
            zero = jnp.zeros_like(q[..., 0])
            state = (zero + fill, zero, jnp.zeros_like(q))
        (_, l, o), _, _ = lax.fori_loop(0, CP, step, (state, k, v))
        return o / l[..., None]
    return body


def _run(merge, strategy, init="full"):
    mesh = jax.make_mesh((2, CP), ("dp", "cp"))
    fn = jax.shard_map(strict_causal(merge, init), mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal((B, S, D)).astype(np.float32), NamedSharding(mesh, SPEC))
            for _ in range(3)]
    low = autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(*args)
    return low, np.asarray(jax.jit(fn)(*args)), np.asarray(low.compile()(*args))


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("init", ["full", "from_q"])
def test_unguarded_merge_of_infinite_masks_is_left_alone(init, strategy):
    low, want, got = _run(merge_online, strategy, init)
    decisions = [(r.strategy, r.applied, r.why) for r in low.rings]
    # jax.jit's nans: the first query of each contiguous block (its own block, seen first, hides every key)
    assert np.flatnonzero(np.isnan(want[0, :, 0])).tolist() == [0, 8, 16, 24]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True, err_msg=f"SOUNDNESS: {decisions}")
    assert low.rings and not any(r.applied for r in low.rings), decisions
    assert all(r.why.startswith("not provably safe") for r in low.rings), decisions


def test_guarded_merge_of_infinite_masks_computes_what_jax_jit_computes():
    """The guard makes the merge order-free: rewritten or not, the same results (the first token's row, which sees
    no key at all, is nan in both)."""
    low, want, got = _run(merge_guarded, "zigzag")
    assert low.rings, "no ring found"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True,
                               err_msg=str([(r.strategy, r.applied, r.why) for r in low.rings]))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # -1e30 to float16, on purpose
def test_finite_mask_value_that_float16_makes_infinite_is_left_alone():
    """The same kernel written with a finite mask value (-1e30, order-free in float32) and run in float16, where
    -1e30 is -inf: the same nans, reached without writing -inf."""
    from support.ring_user_kernels import NEG

    body = strict_causal(merge_online, fill=NEG)
    mesh = jax.make_mesh((2, CP), ("dp", "cp"))
    fn = jax.shard_map(body, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal((B, S, D)).astype(np.float16), NamedSharding(mesh, SPEC))
            for _ in range(3)]
    low = autofix_shardings(fn, ring_reorder="zigzag", on_fix="ignore").lower(*args)
    decisions = [(r.strategy, r.applied, r.why) for r in low.rings]
    want, got = np.asarray(jax.jit(fn)(*args), np.float32), np.asarray(low.compile()(*args), np.float32)
    # float16 rounding aside (2e-2), the same results and the same nans
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2, equal_nan=True, err_msg=f"SOUNDNESS: {decisions}")
    assert low.rings and not any(r.applied for r in low.rings), decisions
