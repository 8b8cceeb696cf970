"""Audit of today's ring changes against jax.jit (8 CPU devices, dp=2 x cp=4); every program here is one that held.

- hoist-permutations with two orders in one model (under the defaults a causal blockwise layer gets zigzag and a
  StreamingLLM one striped{stripe=2}): layers alternating A, B, A, a jitted function (a func.call) reading positions
  between them, and one value read both by the B layer's permutation and by the later A layer.
- A safe custom_vjp ring whose loop runs two ring steps an iteration (lax.scan unroll=2) next to a refused ring
  (keys sorted along the sequence), under jax.grad: the safe ring is rewritten on its own, the refused one left.
"""

import jax
import jax.numpy as jnp
import numpy as np

from shardfix import autofix_shardings
from support import ring_user_kernels as ruk
from support import ring_user_refusals as refusals
from support import ring_user_variants as variants
from test_ring_audit5 import MESH, SPEC, _max_error, _placed

CP, B, S, D = 4, 2, 64, 8
TABLE = np.random.default_rng(3).standard_normal((S, D)).astype(np.float32)


def _ring(body):
    return jax.shard_map(body, mesh=MESH, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)


def _blockwise(mask: str):
    return _ring(ruk.blockwise_ring(CP, 2, ruk.MASKS[mask], ruk.LIVE[mask]))


@jax.jit
def _positional(x):
    """A function of its own (a func.call in the module) that reads positions: an integer iota mask and a table
    row per position."""
    pos = jnp.arange(x.shape[1])
    return jnp.where((pos % 3 == 0)[:, None], x, 2 * x) + jnp.asarray(TABLE)[pos]


def test_layers_alternating_two_orders_keep_results():
    causal, sinks = _blockwise("causal"), _blockwise("sinks")

    def model(q, k, v):
        h = _positional(causal(q, k, v))
        return causal(h + sinks(h, k, v), k, v)

    q, k, v = _placed(*[(B, S, D)] * 3)
    fixed = autofix_shardings(model)
    decisions = fixed.lower(q, k, v).rings
    assert [(r.strategy, r.applied) for r in decisions] == [
        ("zigzag", True), ("striped{stripe=2}", True), ("zigzag", True)], [r.why for r in decisions]
    assert _max_error(fixed(q, k, v), jax.jit(model)(q, k, v)) <= 1e-5


def test_unrolled_custom_vjp_ring_beside_a_refused_ring_keeps_gradients():
    safe, refused = _ring(variants.vjp_unrolled(CP)), _ring(refusals.sorted_keys(CP))
    q, k, v, w = _placed(*[(B, 32, D)] * 4)
    grad = jax.grad(lambda q, k, v: jnp.sum(safe(refused(q, k, v), k, v) * w), argnums=(0, 1, 2))
    fixed = autofix_shardings(grad, ring_reorder="striped")
    decisions = fixed.lower(q, k, v).rings
    assert sorted(r.applied for r in decisions) == [False, False, True, True], [r.why for r in decisions]
    assert _max_error(fixed(q, k, v), jax.jit(grad)(q, k, v)) <= 1e-5
