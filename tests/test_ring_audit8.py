"""Audit of integer exactness in the ring analysis (index arithmetic folded as exact only where the result type
holds every value), against jax.jit (8 CPU devices, dp=2 x cp=4, one-block-a-step causal rings with positions
from axis_index).

- The coordinate along another mesh axis (`lax.axis_index("dp")`, and the flat index over ("dp", "cp")) is
  bounded below only, so int32 is taken to hold it and what is computed from it: `dp * 3 * 2**30 >= 0` (and
  `dp + (2**31 - 1) >= 0`) is decided at compile time as always true, where in int32 it fails on dp = 1. A select
  on it between a causal mask and a block-diagonal one (`i == 0`, not a function of positions) is read as the
  causal mask alone and rewritten, so the dp = 1 rows lose their result. Forced zigzag; under the defaults
  (a blockwise kernel with chunk skips, so the defaults pick zigzag; the mask keeps the odd keys on cp device 1
  only where the flag holds); in a custom_vjp's forward and backward under jax.grad.
"""

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from shardfix import autofix_shardings
from support import ring_user_kernels as ruk
from test_ring_audit5 import MESH, SPEC, _max_error, _placed

CP, B, S, D = 4, 2, 32, 8


def _ring(body):
    return jax.shard_map(body, mesh=MESH, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)


def _causal_or_own_block(flag):
    """A fori_loop ring whose mask is causal where `flag()` holds and block-diagonal (the ring's step 0 only)
    where it doesn't."""

    def body(q, k, v):
        n, me = q.shape[1], lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)
        causal_here = flag()

        def step(i, carry):
            state, k, v = carry
            k_pos = ((me - i) % CP) * n + jnp.arange(n)
            causal = q_pos[:, None] >= k_pos[None, :]
            keep = jnp.where(causal_here, causal, jnp.broadcast_to(i == 0, causal.shape))
            state = ruk.merge_online(state, jnp.where(keep, ruk.scores(q, k), ruk.NEG), v, i)
            return (state,) + tuple(lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v))

        m, l = ruk.row_stats(q, ruk.NEG)
        (m, l, o), _, _ = lax.fori_loop(0, CP, step, ((m, l, jnp.zeros_like(q)), k, v))
        return o / l[..., None]

    return body


FLAGS = {
    "dp*3*2**30": lambda: lax.axis_index("dp") * (2 ** 30) * 3 >= 0,
    "dp+2**31-1": lambda: lax.axis_index("dp") + (2 ** 31 - 1) >= 0,
    "dp,cp*2**29": lambda: lax.axis_index(("dp", "cp")) * (2 ** 29) >= 0,
}


@pytest.mark.parametrize("flag", list(FLAGS))
def test_int32_overflow_of_another_axis_coordinate_keeps_results(flag):
    f = _ring(_causal_or_own_block(FLAGS[flag]))
    q, k, v = _placed(*[(B, S, D)] * 3)
    fixed = autofix_shardings(f, on_fix="ignore", ring_reorder="zigzag")
    decisions = fixed.lower(q, k, v).rings
    error = _max_error(fixed(q, k, v), jax.jit(f)(q, k, v))
    assert error <= 1e-5, (error, [(r.strategy, r.applied) for r in decisions])


def _dp_wrap_mask(q_pos, k_pos):
    """Causal; on dp = 1 (where `dp * 3 * 2**30 >= 0` fails in int32) cp device 1 also drops the odd keys, a mask
    that is not a function of positions alone."""
    wrapped = lax.axis_index("dp") * (2 ** 30) * 3 >= 0
    return (q_pos >= k_pos) & (wrapped | (lax.axis_index("cp") != 1) | (k_pos % 2 == 0)), None


def test_int32_overflow_of_another_axis_coordinate_keeps_results_under_defaults():
    f = _ring(ruk.blockwise_ring(CP, 2, _dp_wrap_mask, ruk.live_causal))
    q, k, v = _placed(*[(B, S, D)] * 3)
    fixed = autofix_shardings(f, on_fix="ignore")
    decisions = fixed.lower(q, k, v).rings
    error = _max_error(fixed(q, k, v), jax.jit(f)(q, k, v))
    assert error <= 1e-5, (error, [(r.strategy, r.applied) for r in decisions])


def test_int32_overflow_of_another_axis_coordinate_keeps_custom_vjp_gradients():
    f = _ring(ruk.vjp_ring(CP, _dp_wrap_mask))
    q, k, v = _placed(*[(B, S, D)] * 3)
    (w,) = _placed((B, S, D), seed=9)
    g = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * w), argnums=(0, 1, 2))
    fixed = autofix_shardings(g, on_fix="ignore", ring_reorder="zigzag")
    decisions = fixed.lower(q, k, v).rings
    error = _max_error(fixed(q, k, v), jax.jit(g)(q, k, v))
    assert error <= 1e-5, (error, [(r.strategy, r.applied) for r in decisions])


def test_another_axis_coordinate_that_fits_int32_is_rewritten_and_keeps_results():
    """The same select on `dp >= 0` (always true, no wrap): decided at compile time, the ring rewritten."""
    f = _ring(_causal_or_own_block(lambda: lax.axis_index("dp") >= 0))
    q, k, v = _placed(*[(B, S, D)] * 3)
    fixed = autofix_shardings(f, on_fix="ignore", ring_reorder="zigzag")
    decisions = fixed.lower(q, k, v).rings
    assert [(r.strategy, r.applied) for r in decisions] == [("zigzag", True)]
    assert _max_error(fixed(q, k, v), jax.jit(f)(q, k, v)) <= 1e-5
