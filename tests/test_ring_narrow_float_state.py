"""A ring whose merge state is stored in a float type of narrower range than the merge's (float16 between steps,
as a kernel run in float16 does with `.astype(q.dtype)`): a float->float convert is a rounding, but a narrowing one
also overflows, and whether a running sum overflows depends on the order the blocks come in, which the reorder
changes. ring-reorder must leave such a ring alone (or compute what jax.jit computes)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import autofix_shardings
from support.ring_user_kernels import ring

CP, B, S, D = 4, 2, 32, 8
NEG = -6e4  # below every score, and a float16
SPEC = P("dp", "cp", None)


def float16_state(q, k, v, narrow=lambda x, dtype: x.astype(dtype)):
    """Non-causal ring attention, the online-softmax merge in float32, the state stored in float16 every step."""
    b, n, d = q.shape

    def step(i, carry):
        (m0, l0, o0), k, v = carry
        s = jnp.einsum("bqd,bkd->bqk", q, k).astype(jnp.float32)
        m = jnp.maximum(m0.astype(jnp.float32), s.max(-1))
        p = jnp.exp(s - m[..., None])
        c = jnp.exp(m0.astype(jnp.float32) - m)
        l = l0.astype(jnp.float32) * c + p.sum(-1)
        o = o0.astype(jnp.float32) * c[..., None] + jnp.einsum("bqk,bkd->bqd", p, v.astype(jnp.float32))
        state = (narrow(m, q.dtype), narrow(l, q.dtype), narrow(o, q.dtype))  # refused here
        return state, lax.ppermute(k, "cp", ring(CP)), lax.ppermute(v, "cp", ring(CP))

    state = (jnp.full((b, n), NEG, q.dtype), jnp.zeros((b, n), q.dtype), jnp.zeros((b, n, d), q.dtype))
    (_, l, o), _, _ = lax.fori_loop(0, CP, step, (state, k, v))
    return o.astype(jnp.float32) / l.astype(jnp.float32)[..., None]


def _args(mesh):
    """q = 0 (every key weighs 1); v = +10000 on sequence chunks 0 and 4 (of 8), -10000 on chunks 2 and 6, 0
    elsewhere. The contiguous blocks sum to +40000, -40000, +40000, -40000 (float16 holds 65504): in no ring order
    does a running sum overflow. The zigzag blocks (chunks b and 7 - b) sum to +40000, -40000, -40000, +40000: two
    of one sign in a row overflow to inf."""
    chunk = np.arange(S) // (S // 8)
    sign = np.select([np.isin(chunk, (0, 4)), np.isin(chunk, (2, 6))], [1.0, -1.0], 0.0)
    q = np.zeros((B, S, D))
    k = np.random.default_rng(1).standard_normal((B, S, D))
    v = 10000.0 * sign[None, :, None] * np.ones((B, S, D))
    return tuple(jax.device_put(x.astype(np.float16), NamedSharding(mesh, SPEC)) for x in (q, k, v))


def float16_range(q, k, v):
    """The same with the state kept in float32 but rounded to float16's range and precision every step
    (lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10)): the same overflow."""
    return float16_state(q, k, v, lambda x, dtype: lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10))


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("body,dtype", [(float16_state, np.float16), (float16_range, np.float32)],
                         ids=["astype", "reduce_precision"])
def test_running_sum_stored_in_float16_is_left_alone(body, dtype, strategy):
    mesh = jax.make_mesh((2, CP), ("dp", "cp"))
    fn = jax.shard_map(body, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
    args = tuple(a.astype(dtype) for a in _args(mesh))
    want = np.asarray(jax.jit(fn)(*args))
    assert np.all(np.isfinite(want)) and np.max(np.abs(want)) == 0.0  # sums to exactly 0 in the written order
    low = autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(*args)
    decisions = [(r.strategy, r.applied, r.why) for r in low.rings]
    got = np.asarray(low.compile()(*args))
    np.testing.assert_array_equal(got, want, err_msg=f"SOUNDNESS: {decisions}")
    assert low.rings and not any(r.applied for r in low.rings), decisions
    refusal = re.compile(r"not provably safe: 'stablehlo\.(convert|reduce_precision)' at ")
    assert all(refusal.match(r.why) for r in low.rings), decisions
