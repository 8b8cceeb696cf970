"""Dependences the analysis must not lose on the way through an op: each program below is a causal ring that is
wrong after a reorder, because its scores read something the reorder changes, through an op whose rule used to
drop it; each was rewritten, with results off by 1 to 3 (zigzag and striped alike). Each is now left alone, with
the reason naming the op that reads it, and computes what jax.jit computes.

- A single token of a block (`k[:, :1]`, `q[:, 0]`: the token at one fixed place, another token once the blocks
  are reordered) through a contraction: the dot's result kept only the axes of its dims, so a row of size 1 was
  dropped and the product read as a function of no token (ring/contract.py `dot`).
- A value of the ring step (a temperature per step: which block it meets changes with the layout) through an op
  whose result named a function of its own regardless of its operands: a nested loop's results that follow no
  token (`jax.random.uniform(fold_in(key, i))` runs threefry's loop; a fori_loop started from i: ring/loops.py
  `_free_data`), or an op that moves data along an axis (`jnp.sort`, `lax.rev`, `jnp.pad` of a small replicated
  vector: ring/rules.py `_positional`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import autofix_shardings
from support import ring_user_kernels as uk

CP, S, D = 8, 64, 8
SPEC = P(None, "cp", None)


def _causal_ring(scores_of, loop: str = "fori"):
    """Causal ring attention with an online softmax over a lax.fori_loop or a lax.scan of the ring steps; the
    step's scores are `scores_of(q, k, i, t)` (i: the step, t: the step's temperature, which the scan takes as xs)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, t, carry):
            acc, k, v = carry
            k_pos = ((me - i) % CP) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores_of(q, k, i, t), uk.NEG)
            acc = uk.merge_online(acc, s, v, i)
            return (acc,) + tuple(lax.ppermute(x, "cp", uk.ring(CP)) for x in (k, v))

        start = (uk.init_state(q, "online"), k, v)
        if loop == "fori":
            acc, _, _ = lax.fori_loop(0, CP, lambda i, carry: step(i, None, carry), start)
        else:
            temps = 1.0 + 0.2 * jnp.arange(CP, dtype=jnp.float32)
            (acc, _, _), _ = lax.scan(lambda carry, xs: (step(*xs, carry), None), start, (jnp.arange(CP), temps))
        return uk.finish(acc, "online")
    return body


ONE_TOKEN = {  # scores plus a term of one token of a block, made by a contraction
    "first-key-of-the-block": lambda q, k: jnp.einsum("bqd,bkd->bqk", q, k[:, :1]),
    "first-query-against-the-keys": lambda q, k: jnp.einsum("bd,bkd->bk", q[:, 0], k)[:, None],
    "each-query-against-the-first-key": lambda q, k: jnp.einsum("bqd,bd->bq", q, k[:, 0])[..., None],
}
STEP_VALUES = {  # a value of the ring step i, through a loop of its own
    "prng-fold-in-the-step": lambda i: 1 + jax.random.uniform(jax.random.fold_in(jax.random.key(0), i)),
    "fori-loop-started-from-the-step": lambda i: 1 + 0.1 * lax.fori_loop(0, 3, lambda j, x: x * 1.1 + 0.1,
                                                                         i.astype(jnp.float32)),
}
MOVED = {  # a step's temperature through an op that moves data along an axis
    "sort": lambda t: jnp.sort(jnp.stack([t, jnp.float32(0.5)]))[1],
    "rev": lambda t: lax.rev(jnp.stack([t, jnp.float32(0.5)]), (0,))[1],
    "pad": lambda t: jnp.pad(t[None], (1, 0))[1],
}
PROGRAMS = {
    **{name: _causal_ring(lambda q, k, i, t, f=f: uk.scores(q, k) + f(q, k)) for name, f in ONE_TOKEN.items()},
    **{name: _causal_ring(lambda q, k, i, t, f=f: uk.scores(q, k) * f(i)) for name, f in STEP_VALUES.items()},
    **{name: _causal_ring(lambda q, k, i, t, f=f: uk.scores(q, k) * f(t), "scan") for name, f in MOVED.items()},
}
FIXED_PLACE = ("combines tokens with the token at one fixed place of a block",)
# (with jax 0.10.2 the maximum of the step's scaled scores is where a step value through a loop is met first)
STEP = ("depends on the ring step, not only on tokens", "takes the maximum of different aggregates")
READ_AT = {**{name: FIXED_PLACE for name in ONE_TOKEN}, **{name: STEP for name in (*STEP_VALUES, *MOVED)}}


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_left_alone_and_equal_to_jit(name, strategy):
    mesh = jax.make_mesh((CP,), ("cp",))
    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal((1, S, D)).astype(np.float32), NamedSharding(mesh, SPEC))
            for _ in range(3)]
    fn = jax.shard_map(PROGRAMS[name], mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
    fixed = autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore")
    (ring,) = fixed.lower(*args).rings
    assert not ring.applied and ring.why.startswith("not provably safe: '"), ring.why
    assert any(reason in ring.why for reason in READ_AT[name]), ring.why
    with jax.set_mesh(mesh):
        np.testing.assert_array_equal(np.asarray(fixed(*args)), np.asarray(jax.jit(fn)(*args)))
