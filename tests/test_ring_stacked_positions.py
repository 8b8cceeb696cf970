"""A table of every ring step's key positions, built before the ring loop and read one row per step.

Kernels that precompute their masks stack them by ring step: the coordinate of the block j steps behind is
`(axis_index - jnp.arange(cp)) % cp`, row j of the table holds that block's positions, and step i reads row i
(`masks[i]`, `lax.dynamic_slice`, or `lax.scan` over the stacked masks). Each row is then the block the step holds,
so the positions are rewritten like any others and the ring is rewritten, equal to jax.jit. Read at another row
than the step's, built the other way round the ring or two steps a row, the mask meets another block's tokens and
the ring is refused; read whole (no one block's positions), it is refused at the read, saying what to do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from support import ring_user_kernels as uk
from support.ring_check import decisions_of_equal_run, normal_args

CP, S, D = 8, 64, 8
SPEC = P("dp", "cp", None)
NEG = -1e30
OTHER_TOKENS = "combines data of different tokens (blocks or positions) elementwise"
READ_WHOLE = ("reads positions of a different block along a dim (a table of every ring step's positions) as data: "
              "slice out the ring step's row first")


def _stacked(read: str):
    """Causal ring attention whose mask for step i is row i of a table made before the loop. `read`: "index"
    (masks[i]), "slice" (lax.dynamic_slice_in_dim), "scan" (lax.scan over the table), "next" (row i + 1),
    "reversed" (the table built for a ring turning the other way), "two_steps" (rows two ring steps apart),
    "any" (the rows or-ed together)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)
        hops = jnp.arange(CP)
        src = {"reversed": (me + hops) % CP, "two_steps": (me - 2 * hops) % CP}.get(read, (me - hops) % CP)
        k_pos = src[:, None] * n + jnp.arange(n)[None, :]
        masks = q_pos[None, :, None] >= k_pos[:, None, :]

        def merge(state, mask, k, v):
            m0, l0, o0 = state
            s = jnp.where(mask[None], jnp.einsum("bqd,bkd->bqk", q, k), NEG)
            m = jnp.maximum(m0, jnp.max(s, axis=-1))
            p = jnp.exp(s - m[..., None])
            c = jnp.exp(m0 - m)
            return m, l0 * c + jnp.sum(p, axis=-1), o0 * c[..., None] + p @ v

        def step(i, carry):
            state, k, v = carry
            mask = {"slice": lambda: lax.dynamic_slice_in_dim(masks, i, 1)[0],
                    "next": lambda: masks[(i + 1) % CP],
                    "any": lambda: jnp.any(masks, axis=0)}.get(read, lambda: masks[i])()
            return merge(state, mask, k, v), lax.ppermute(k, "cp", uk.ring(CP)), lax.ppermute(v, "cp", uk.ring(CP))

        z = jnp.zeros(q.shape[:2], q.dtype)
        start = (z + NEG, z, jnp.zeros_like(q))
        if read == "scan":
            def scan_step(carry, mask):
                state, k, v = carry
                return (merge(state, mask, k, v), lax.ppermute(k, "cp", uk.ring(CP)),
                        lax.ppermute(v, "cp", uk.ring(CP))), None
            (state, _, _), _ = lax.scan(scan_step, (start, k, v), masks)
        else:
            state, _, _ = lax.fori_loop(0, CP, step, (start, k, v))
        return state[2] / state[1][..., None]
    return body


def _run(read: str, strategy: str, grad: bool = False):
    mesh = jax.make_mesh((1, CP), ("dp", "cp"))
    fn = jax.shard_map(_stacked(read), mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
    if grad:
        fn = jax.grad(lambda *a, f=fn: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2))
    return decisions_of_equal_run(fn, normal_args(mesh, SPEC, (1, S, D), 3), mesh, strategy)


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("read", ["index", "slice", "scan"])
def test_a_table_of_step_positions_read_at_the_step_is_rewritten(read, strategy):
    (ring,) = _run(read, strategy)
    assert ring.applied, ring.why
    assert ring.why == "3 operand(s) reordered, 1 result(s) restored, 2 position read(s) rewritten", ring.why


def test_a_table_of_step_positions_is_rewritten_under_jax_grad():
    rings = _run("index", "zigzag", grad=True)
    assert len(rings) == 2 and all(r.applied for r in rings), [r.why for r in rings]


@pytest.mark.parametrize("read, reason", [("next", OTHER_TOKENS), ("reversed", OTHER_TOKENS),
                                          ("two_steps", OTHER_TOKENS), ("any", READ_WHOLE)])
def test_a_table_read_other_than_at_the_step_is_refused(read, reason):
    (ring,) = _run(read, "zigzag")
    assert not ring.applied
    assert reason in ring.why, ring.why
