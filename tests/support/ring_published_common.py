"""Shared pieces of the published ring programs (tests/support/ring_published.py): sizes, meshes, arguments, the
ring shift, one block's attention as flash kernels return it, and the online-softmax merge."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

B, S, D = 2, 64, 8
SEQ = P("dp", "cp", None)
NEG = -1e30  # a finite masked logit, as splash / flash kernels use (a fully masked row gets lse ~ NEG)


def mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("dp", "cp"))


def auto_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces.


def normal(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def put(m, x, spec):
    return jax.device_put(x, NamedSharding(m, spec))


def qkv(m):
    return tuple(put(m, normal((B, S, D), seed), SEQ) for seed in range(3))


def shift(x, cp: int, d: int = 1):
    """Every device sends x to the device d steps up the ring."""
    return lax.ppermute(x, "cp", [(i, (i + d) % cp) for i in range(cp)])


def block_attention(q, k, v, mask=None, sink=None, by_hand: bool = False):
    """(softmax(q k^T / sqrt(d)) v, log-sum-exp per query) of one pair of blocks: what flash-attention kernels
    return; `sink`: one more logit per query in the denominator (attention sinks); `by_hand`: the log-sum-exp
    written out as flash kernels compute it (row max + log of the row sum) rather than jax.nn.logsumexp."""
    s = jnp.einsum("bqd,bkd->bqk", q, k) * (q.shape[-1] ** -0.5)
    if mask is not None:
        s = jnp.where(mask, s, NEG)
    if by_hand:
        m = s.max(-1)
        lse = m + jnp.log(jnp.exp(s - m[..., None]).sum(-1))
    else:
        lse = jax.nn.logsumexp(s, axis=-1)
    if sink is not None:
        lse = jnp.logaddexp(lse, sink)
    return jnp.einsum("bqk,bkd->bqd", jnp.exp(s - lse[..., None]), v), lse


def local_causal(n: int):
    """flash-attn's causal=True on one block: by local indices."""
    i = jnp.arange(n)
    return i[:, None] >= i[None, :]


def shard_map(m, body, in_specs, out_specs):
    return jax.shard_map(body, mesh=m, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def online_merge(state, q, k, v, mask):
    """One block into the running (acc, max, sum) of the online softmax (what splash / flash kernels do inside)."""
    acc, m, l = state
    s = jnp.einsum("bqd,bkd->bqk", q, k) * (q.shape[-1] ** -0.5)
    s = jnp.where(mask, s, NEG)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.exp(s - m_new[..., None])
    corr = jnp.exp(m - m_new)
    return acc * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v), m_new, l * corr + p.sum(-1)


def online_merge_biased(state, q, k, v, mask, bias):
    """online_merge with a bias (ALiBi, relative position buckets) added to the scores."""
    acc, m, l = state
    s = jnp.einsum("bqd,bkd->bqk", q, k) * (q.shape[-1] ** -0.5) + bias
    s = jnp.where(mask, s, NEG)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.exp(s - m_new[..., None])
    corr = jnp.exp(m - m_new)
    return acc * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v), m_new, l * corr + p.sum(-1)


