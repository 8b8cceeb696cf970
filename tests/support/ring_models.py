"""Causal ring attention written as users write it (shard_map + fori_loop + ppermute), for tests, benchmarks and
the demo. Three variants:

- `position_ring_attention`: the causal mask comes from position ids passed in as data; they travel around the
  ring with k and v. Safe to reorder.
- `tile_skipping_ring_attention`: the same, but each (q half, kv half) tile that is fully masked is skipped with
  `lax.cond`, as fused kernels do; it also counts the tiles each device computes at each ring step.
- `axis_index_ring_attention`: the mask comes from `axis_index` offsets, so it depends on where a token sits;
  reordering it would change its results.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

NEG = -1e30


def _block(q, k, v, q_pos, k_pos):
    """Scores, masked by positions; returns (row max, row sum, unnormalised output) of one block."""
    s = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    s = jnp.where(q_pos[:, :, None] >= k_pos[:, None, :], s, NEG)
    m = jnp.max(s, axis=-1)
    p = jnp.exp(s - m[..., None])
    return m, jnp.sum(p, axis=-1), jnp.einsum("bqk,bkd->bqd", p, v)


def _merge(acc, blk):
    m0, l0, o0 = acc
    m1, l1, o1 = blk
    m = jnp.maximum(m0, m1)
    a0, a1 = jnp.exp(m0 - m), jnp.exp(m1 - m)
    return m, l0 * a0 + l1 * a1, o0 * a0[..., None] + o1 * a1[..., None]


def _init(q):
    """(row max, row sum, output) accumulators; derived from q so they vary over the mesh like q does."""
    zero = q[..., 0] * 0
    return zero + NEG, zero, q * 0


def _ring(cp):
    return [(i, (i + 1) % cp) for i in range(cp)]


def position_ring_attention(mesh, axis: str = "cp", batch_axis: str | None = "dp"):
    cp = mesh.shape[axis]
    spec = P(batch_axis, axis)

    def body(q, k, v, q_pos, k_pos):
        init = _init(q)

        def step(_, carry):
            acc, k, v, k_pos = carry
            acc = _merge(acc, _block(q, k, v, q_pos, k_pos))
            k, v, k_pos = (jax.lax.ppermute(t, axis, _ring(cp)) for t in (k, v, k_pos))
            return acc, k, v, k_pos

        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (init, k, v, k_pos))
        return o / l[..., None]

    return jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec, spec, spec), out_specs=spec)


def tile_skipping_ring_attention(mesh, axis: str = "cp", batch_axis: str | None = "dp"):
    """Each device splits its q and kv blocks into halves and computes a (q half, kv half) tile only when some query
    may see some key (`lax.cond` on the positions of the two halves), as fused kernels skip masked blocks. The ring
    loop is unrolled (a Python loop over steps)."""
    cp = mesh.shape[axis]
    spec = P(batch_axis, axis)

    def body(q, k, v, q_pos, k_pos):
        half = q.shape[1] // 2
        acc = _init(q)
        for _ in range(cp):
            parts = []
            for qi in range(2):
                qs = slice(qi * half, (qi + 1) * half)
                acc_q = tuple(a[:, qs] for a in acc)
                for ki in range(2):
                    ks = slice(ki * half, (ki + 1) * half)
                    live = jnp.max(q_pos[:, qs]) >= jnp.min(k_pos[:, ks])
                    acc_q = jax.lax.cond(live, lambda a, ks=ks, qs=qs: _merge(a, _block(
                        q[:, qs], k[:, ks], v[:, ks], q_pos[:, qs], k_pos[:, ks])), lambda a: a, acc_q)
                parts.append(acc_q)
            acc = tuple(jnp.concatenate([p[i] for p in parts], axis=1) for i in range(3))
            k, v, k_pos = (jax.lax.ppermute(t, axis, _ring(cp)) for t in (k, v, k_pos))
        m, l, o = acc
        return o / l[..., None]

    return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 5, out_specs=spec, check_vma=False)


def axis_index_ring_attention(mesh, axis: str = "cp", batch_axis: str | None = "dp"):
    """Positions computed from the device index: correct only for the contiguous layout."""
    cp = mesh.shape[axis]
    spec = P(batch_axis, axis)

    def body(q, k, v):
        n = q.shape[1]
        me = jax.lax.axis_index(axis)
        q_pos = jnp.broadcast_to(me * n + jnp.arange(n), q.shape[:2])
        init = _init(q)

        def step(s, carry):
            acc, k, v = carry
            src = (me - s) % cp
            k_pos = jnp.broadcast_to(src * n + jnp.arange(n), q.shape[:2])
            acc = _merge(acc, _block(q, k, v, q_pos, k_pos))
            k, v = (jax.lax.ppermute(t, axis, _ring(cp)) for t in (k, v))
            return acc, k, v

        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (init, k, v))
        return o / l[..., None]

    return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)


def dense_causal_attention(q, k, v):
    s = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    n = q.shape[1]
    s = jnp.where(jnp.arange(n)[:, None] >= jnp.arange(n)[None, :], s, NEG)
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)


def ring_transformer(mesh, layers: int, loss: bool = False, between=None, axis: str = "cp"):
    """`layers` blocks of position-carrying ring attention plus an MLP, with residual adds; `between(x)` (if
    given) runs on the activations between blocks. Returns f(x, pos, weights) -> activations, or the mean of their
    squares with `loss`. weights: per layer (wq, wk, wv, wo, w1, w2)."""
    attention = position_ring_attention(mesh, axis)

    def f(x, pos, weights):
        for wq, wk, wv, wo, w1, w2 in weights:
            x = x + attention(x @ wq, x @ wk, x @ wv, pos, pos) @ wo
            x = x + jnp.tanh(x @ w1) @ w2
            if between is not None:
                x = between(x)
        return jnp.mean(x ** 2) if loss else x

    return f
