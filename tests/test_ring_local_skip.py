"""A blockwise ring (Liu et al.'s shape: lax.scan over ring steps, over q chunks and over kv chunks) whose
chunk-pair skip reads the two chunk COUNTERS, `lax.cond((a >= c) & causal(first positions), ...)`: the local
indices of the chunks within their blocks, not their places in the sequence. Which token pairs a counter skip hides
changes when the reorder changes which tokens a chunk of a block holds (positions are rewritten, counters are not),
so ring-reorder must leave the ring alone (a skip must be decided by positions: the chunks' global indices), or
compute what jax.jit computes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import autofix_shardings
from support.ring_user_kernels import NEG, merge_online, ring, scores

CHUNK, B, S, D = 2, 2, 32, 8
SPEC = P("dp", "cp", None)


def counter_skip(q, k, v, by_hop=""):
    """by_hop: the skip reads the ring step instead, `lax.cond(i != 2, ...)` ("index"), or a constant table at the
    ring step ("table"): the blocks of one ring step left out, which are other tokens in another layout."""
    b, n, d = q.shape
    per = n // CHUNK
    me = lax.axis_index("cp")
    cp = S // n

    def chunks(x):
        return jnp.moveaxis(x.reshape((b, per, CHUNK) + x.shape[2:]), 1, 0)

    def unchunk(x):
        return jnp.moveaxis(x, 0, 1).reshape((b, n) + x.shape[3:])

    def ring_step(carry, i):
        acc, k, v = carry
        src = (me - i) % cp

        def q_step(_, xs):
            qi, acc_i, a = xs

            def kv_step(acc_i, ys):
                kj, vj, c = ys
                q_first, k_first = (me * per + a) * CHUNK, (src * per + c) * CHUNK
                q_pos, k_pos = q_first + jnp.arange(CHUNK), k_first + jnp.arange(CHUNK)

                def run(acc_i):
                    s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(qi, kj), NEG)
                    return merge_online(acc_i, s, vj, 0)

                if by_hop == "index":
                    live = i != 2
                elif by_hop == "table":
                    live = jnp.asarray([True, True, False, True])[i % 4]
                else:
                    live = (a >= c) & (q_first + CHUNK - 1 >= k_first)
                return lax.cond(live, run, lambda x: x, acc_i), None  # refused here

            acc_i, _ = lax.scan(kv_step, acc_i, (chunks(k), chunks(v), jnp.arange(per)))
            return None, acc_i

        _, acc_c = lax.scan(q_step, None, (chunks(q), tuple(chunks(x) for x in acc), jnp.arange(per)))
        acc = tuple(unchunk(x) for x in acc_c)
        return (acc, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))), None

    zero = jnp.zeros_like(q[..., 0])
    ((_, l, o), _, _), _ = lax.scan(ring_step, ((zero + NEG, zero, jnp.zeros_like(q)), k, v), jnp.arange(cp))
    return o / l[..., None]


@pytest.mark.parametrize("cp,strategy,by_hop", [(4, "zigzag", ""), (4, "striped", ""), (8, "auto", ""),
                                                (4, "zigzag", "index"), (4, "zigzag", "table")],
                         ids=["zigzag", "striped", "defaults-cp8", "ring-step-zigzag", "ring-step-table-zigzag"])
def test_skip_decided_by_chunk_counters_is_left_alone(cp, strategy, by_hop):
    """At cp = 8 the defaults choose zigzag themselves (the position half of the skip makes the ring unbalanced)."""
    mesh = jax.make_mesh((8 // cp, cp), ("dp", "cp"))
    fn = jax.shard_map(functools.partial(counter_skip, by_hop=by_hop), mesh=mesh, in_specs=(SPEC,) * 3,
                       out_specs=SPEC, check_vma=False)
    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal((B, S, D)).astype(np.float32), NamedSharding(mesh, SPEC))
            for _ in range(3)]
    low = autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(*args)
    decisions = [(r.strategy, r.applied, r.why) for r in low.rings]
    got = np.asarray(low.compile()(*args))
    np.testing.assert_allclose(got, np.asarray(jax.jit(fn)(*args)), rtol=1e-5, atol=1e-5,
                               err_msg=f"SOUNDNESS: {decisions}")
    assert low.rings and not any(r.applied for r in low.rings), decisions
    assert all(r.why.startswith("not provably safe: 'stablehlo.case'") for r in low.rings), decisions


def test_a_stacked_skip_predicate_reads_positions_alone():
    """A skip predicate JAX's partial evaluation stacked ahead of the loop is data to the analysis; it is accepted
    only where its function (analysis.index_to_data's canonical form) reads global positions, other mesh axes'
    coordinates, loop variables and constants: a ring coordinate or partition id outside a position, or a local
    index, names other tokens once the reorder changes what a block holds."""
    from shardfix.ring.branches import _of_positions
    pos = (("pos", "a0", 4), 1)
    node = (("lt", (((("pos", "a1", 1), 1),), -20), 0), 1)  # a node over a position and a constant
    for terms, variables, expected in (
            ((pos,), frozenset(), True),
            ((pos, node), frozenset(), True),
            ((pos, ("it3", 2)), frozenset({"it3"}), True),
            ((pos, (("other", "dp"), 1)), frozenset(), True),
            ((pos, ("c", 1)), frozenset(), False),
            ((pos, ("c[it3]", 1)), frozenset({"it3"}), False),
            ((pos, ("pid", 1)), frozenset(), False),
            ((pos, (("dim", 0), 1)), frozenset(), False),
            ((pos, (("floordiv", ((("c", 1),), 0), 2), 1)), frozenset(), False),
            ((pos, (("lt", ((pos,), 0.5), 0.5), 1)), frozenset(), False)):
        units: list[int] = []
        assert _of_positions((terms, 0), variables, units) is expected, terms
    units = []
    assert _of_positions(((pos, node), 0), frozenset(), units) and sorted(units) == [1, 4]
