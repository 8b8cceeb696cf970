"""Causal ring attention kernels written the way training code writes them: a `jax.custom_vjp` whose forward
and backward each pass blocks around the ring, positions computed from `axis_index` (no position ids), the
backward recomputing each block's probabilities from the forward's log-sum-exp.

- `fori_ring_attention`: one block a ring step, `lax.fori_loop` over the steps.
- `scan_ring_attention`: blockwise: `lax.scan` over the steps, and inside a step `lax.scan` over key chunks for
  each query chunk, a (query chunk, key chunk) pair skipped with `lax.cond` when every key lies after every query.

Both are per-device functions to put under `jax.shard_map` over the ring axis; inputs are [batch, L, dim].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG = -1e30

def _ring(cp: int):
    return [(i, (i + 1) % cp) for i in range(cp)]

def _positions(start, n: int, batch: int):
    return jnp.broadcast_to(start + jnp.arange(n), (batch, n))

def _scores(q, k, q_pos, k_pos):
    s = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    return jnp.where(q_pos[:, :, None] >= k_pos[:, None, :], s, NEG)

def _merge(acc, s, v):
    """Fold one block of scores (and its values) into the running (max, sum, output)."""
    m0, l0, o0 = acc
    m = jnp.maximum(m0, jnp.max(s, axis=-1))
    p = jnp.exp(s - m[..., None])
    scale = jnp.exp(m0 - m)
    return m, l0 * scale + jnp.sum(p, axis=-1), o0 * scale[..., None] + jnp.einsum("bqk,bkd->bqd", p, v)

def _block_grads(q, k, v, do, lse, delta, q_pos, k_pos):
    """(dq, dk, dv) contributions of one (query block, key block) pair."""
    p = jnp.exp(_scores(q, k, q_pos, k_pos) - lse[..., None])
    dv = jnp.einsum("bqk,bqd->bkd", p, do)
    ds = p * (jnp.einsum("bqd,bkd->bqk", do, v) - delta[..., None]) / jnp.sqrt(jnp.float32(q.shape[-1]))
    return jnp.einsum("bqk,bkd->bqd", ds, k), jnp.einsum("bqk,bqd->bkd", ds, q), dv

# ---------------------------------------------------------------------------------------------------------------
# One block a ring step, fori_loop.

def fori_ring_attention(axis: str, cp: int):
    @jax.custom_vjp
    def attention(q, k, v):
        return _fori_forward(q, k, v)[0]

    def _fori_forward(q, k, v):
        b, n, _ = q.shape
        me = jax.lax.axis_index(axis)
        q_pos = _positions(me * n, n, b)

        def step(s, carry):
            acc, k, v = carry
            k_pos = _positions(((me - s) % cp) * n, n, b)
            acc = _merge(acc, _scores(q, k, q_pos, k_pos), v)
            return (acc,) + tuple(jax.lax.ppermute(t, axis, _ring(cp)) for t in (k, v))

        zero = q[..., 0] * 0
        (m, l, o), _, _ = jax.lax.fori_loop(0, cp, step, ((zero + NEG, zero, q * 0), k, v))
        out = o / l[..., None]
        return out, (q, k, v, out, m + jnp.log(l))

    def backward(res, do):
        q, k, v, out, lse = res
        b, n, _ = q.shape
        me = jax.lax.axis_index(axis)
        q_pos = _positions(me * n, n, b)
        delta = jnp.sum(do * out, axis=-1)

        def step(s, carry):
            dq, k, v, dk, dv = carry
            k_pos = _positions(((me - s) % cp) * n, n, b)
            gq, gk, gv = _block_grads(q, k, v, do, lse, delta, q_pos, k_pos)
            moved = tuple(jax.lax.ppermute(t, axis, _ring(cp)) for t in (k, v, dk + gk, dv + gv))
            return (dq + gq,) + moved

        dq, _, _, dk, dv = jax.lax.fori_loop(0, cp, step, (q * 0, k, v, k * 0, v * 0))
        return dq, dk, dv

    attention.defvjp(_fori_forward, backward)
    return attention

# ---------------------------------------------------------------------------------------------------------------
# Blockwise: lax.scan over ring steps and key chunks, skipped chunk pairs.

def scan_ring_attention(axis: str, cp: int, chunk: int):
    def chunks(x):  # [b, n, ...] -> [n / chunk, b, chunk, ...]
        b, n = x.shape[:2]
        return x.reshape((b, n // chunk, chunk) + x.shape[2:]).swapaxes(0, 1)

    def unchunk(x):
        c, b = x.shape[:2]
        return x.swapaxes(0, 1).reshape((b, c * chunk) + x.shape[3:])

    def live(q_first, k_first):
        return q_first + chunk - 1 >= k_first

    @jax.custom_vjp
    def attention(q, k, v):
        return forward(q, k, v)[0]

    def forward(q, k, v):
        b, n, _ = q.shape
        me = jax.lax.axis_index(axis)

        def ring_step(carry, s):
            acc, k, v = carry
            src = (me - s) % cp
            kc, vc = chunks(k), chunks(v)
            parts = []
            for i in range(n // chunk):
                q_first = me * n + i * chunk
                qi = q[:, i * chunk:(i + 1) * chunk]

                def kv_chunk(acc_i, xs, qi=qi, q_first=q_first):
                    kj, vj, j = xs
                    k_first = src * n + j * chunk
                    s_ij = _scores(qi, kj, _positions(q_first, chunk, b), _positions(k_first, chunk, b))
                    return jax.lax.cond(live(q_first, k_first), lambda a: _merge(a, s_ij, vj), lambda a: a,
                                        acc_i), None

                acc_i = tuple(a[:, i * chunk:(i + 1) * chunk] for a in acc)
                parts.append(jax.lax.scan(kv_chunk, acc_i, (kc, vc, jnp.arange(n // chunk)))[0])
            acc = tuple(jnp.concatenate([p[t] for p in parts], axis=1) for t in range(3))
            return (acc,) + tuple(jax.lax.ppermute(t, axis, _ring(cp)) for t in (k, v)), None

        zero = q[..., 0] * 0
        ((m, l, o), _, _), _ = jax.lax.scan(ring_step, ((zero + NEG, zero, q * 0), k, v), jnp.arange(cp))
        out = o / l[..., None]
        return out, (q, k, v, out, m + jnp.log(l))

    def backward(res, do):
        q, k, v, out, lse = res
        b, n, _ = q.shape
        me = jax.lax.axis_index(axis)
        delta = jnp.sum(do * out, axis=-1)

        def ring_step(carry, s):
            dq, k, v, dk, dv = carry
            src = (me - s) % cp
            gk, gv = jnp.zeros_like(k), jnp.zeros_like(v)
            dq_parts = []
            for i in range(n // chunk):
                q_first = me * n + i * chunk
                rows = slice(i * chunk, (i + 1) * chunk)
                qi, doi, lsei, deltai = q[:, rows], do[:, rows], lse[:, rows], delta[:, rows]

                def kv_chunk(dq_i, xs, qi=qi, doi=doi, lsei=lsei, deltai=deltai, q_first=q_first):
                    kj, vj, j = xs
                    k_first = src * n + j * chunk

                    def compute(dq_i):
                        g = _block_grads(qi, kj, vj, doi, lsei, deltai, _positions(q_first, chunk, b),
                                         _positions(k_first, chunk, b))
                        return dq_i + g[0], g[1], g[2]

                    def skip(dq_i):
                        return dq_i, jnp.zeros_like(kj), jnp.zeros_like(vj)

                    dq_i, dkj, dvj = jax.lax.cond(live(q_first, k_first), compute, skip, dq_i)
                    return dq_i, (dkj, dvj)

                dq_i, (dks, dvs) = jax.lax.scan(kv_chunk, dq[:, rows], (chunks(k), chunks(v), jnp.arange(n // chunk)))
                dq_parts.append(dq_i)
                gk, gv = gk + unchunk(dks), gv + unchunk(dvs)
            moved = tuple(jax.lax.ppermute(t, axis, _ring(cp)) for t in (k, v, dk + gk, dv + gv))
            return (jnp.concatenate(dq_parts, axis=1),) + moved, None

        (dq, _, _, dk, dv), _ = jax.lax.scan(ring_step, (q * 0, k, v, k * 0, v * 0), jnp.arange(cp))
        return dq, dk, dv

    attention.defvjp(forward, backward)
    return attention

def sharded(kernel, mesh, axis: str = "cp", batch_axis: str | None = "dp", partial: bool = False):
    """f(q, k, v) over global [batch, S, dim] arrays: the kernel under jax.shard_map, batch on `batch_axis` and
    sequence on `axis`; `partial`: manual over the ring axis only (the batch axis stays automatic)."""
    from jax.sharding import PartitionSpec as P
    spec = P(None if partial else batch_axis, axis)
    extra = {"axis_names": {axis}} if partial else {}
    return jax.shard_map(kernel, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec, check_vma=False, **extra)

__all__ = ["fori_ring_attention", "scan_ring_attention", "sharded"]
