"""Key positions computed from the device index and sent around the ring with their block as integers.

A kernel may make its keys' positions once, `axis_index * n + iota`, and ppermute them beside k and v every step
(instead of recomputing them from the step, or carrying the source coordinate). Such integers, made from one ring
coordinate, are followed through the loop as the positions of the block a number of ring steps away (plus any
constant the body adds each step), so the mask meets the keys the step holds and the ring is rewritten, equal to
jax.jit. Sent the other way round the ring, twice a step, not at all, or advanced by a block's length instead of
sent, they are not the positions of the block the step holds, and the ring is refused.
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
OUT_OF_BLOCK = ("computes a position (coordinate * 8 + index) whose index may fall outside 0..7, so it is not the "
                "place of a token of that block")


def _travelling(send: str, batched: bool = False):
    """Causal ring attention whose key positions travel with the keys. `send`: "ring" (ppermuted as k is),
    "back" (the other way), "twice" (two steps a step), "kept" (never sent), "advanced" (+ n instead of sent).
    `batched`: the positions broadcast over the batch before the loop."""
    def body(q, k, v):
        n = q.shape[1]
        q_pos = lax.axis_index("cp") * n + jnp.arange(n)
        forward, back = uk.ring(CP), [(j, i) for i, j in uk.ring(CP)]

        def step(i, carry):
            m0, l0, o0, k, v, k_pos = carry
            kp = k_pos[0] if batched else k_pos
            s = jnp.where(q_pos[None, :, None] >= kp[None, None, :], jnp.einsum("bqd,bkd->bqk", q, k), NEG)
            m = jnp.maximum(m0, jnp.max(s, axis=-1))
            p = jnp.exp(s - m[..., None])
            c = jnp.exp(m0 - m)
            sent = {"ring": lambda: lax.ppermute(k_pos, "cp", forward),
                    "back": lambda: lax.ppermute(k_pos, "cp", back),
                    "twice": lambda: lax.ppermute(lax.ppermute(k_pos, "cp", forward), "cp", forward),
                    "kept": lambda: k_pos, "advanced": lambda: k_pos + n}[send]()
            return (m, l0 * c + jnp.sum(p, axis=-1), o0 * c[..., None] + p @ v, lax.ppermute(k, "cp", forward),
                    lax.ppermute(v, "cp", forward), sent)

        z = jnp.zeros(q.shape[:2], q.dtype)
        k_pos = jnp.broadcast_to(q_pos[None], q.shape[:2]) if batched else q_pos
        _, l, o, _, _, _ = lax.fori_loop(0, CP, step, (z + NEG, z, jnp.zeros_like(q), k, v, k_pos))
        return o / l[..., None]
    return body


def _run(fn_body, strategy: str, grad: bool = False):
    mesh = jax.make_mesh((1, CP), ("dp", "cp"))
    fn = jax.shard_map(fn_body, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
    if grad:
        fn = jax.grad(lambda *a, f=fn: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2))
    return decisions_of_equal_run(fn, normal_args(mesh, SPEC, (1, S, D), 3), mesh, strategy)


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("batched", [False, True], ids=["vector", "batched"])
def test_positions_sent_with_their_block_are_rewritten(batched, strategy):
    (ring,) = _run(_travelling("ring", batched), strategy)
    assert ring.applied, ring.why
    assert ring.why == "3 operand(s) reordered, 1 result(s) restored, 2 position read(s) rewritten", ring.why


def test_positions_sent_with_their_block_are_rewritten_under_jax_grad():
    rings = _run(_travelling("ring"), "zigzag", grad=True)
    assert len(rings) == 2 and all(r.applied for r in rings), [r.why for r in rings]


@pytest.mark.parametrize("send, reason", [("back", OTHER_TOKENS), ("twice", OTHER_TOKENS), ("kept", OTHER_TOKENS),
                                          ("advanced", OUT_OF_BLOCK)])
def test_positions_that_do_not_follow_their_block_are_refused(send, reason):
    (ring,) = _run(_travelling(send), "zigzag")
    assert not ring.applied
    assert reason in ring.why, ring.why
