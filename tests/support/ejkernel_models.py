"""ejkernel's XLA ring attention (the pinned test-only client, jax~=0.10) as users call it: under jax.shard_map
over a ("dp", "cp") mesh, causal, with or without position ids; and a small model built on it.

ejkernel 0.0.80.3's public `ring_attention` passes `causal_block_size=None` to its custom_vjp function, whose
fwd/bwd rules (unlike its primal body) don't replace None by the query chunk size: under differentiation the
public call attends to every key. `ring_attention(..., entry="vjp")` calls that custom_vjp function directly
with the block size given, which is what the public call means; the kernel itself is ejkernel's, unmodified.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def ring_attention(q, k, v, q_pos=None, kv_pos=None, *, axis: str, chunk: int, entry: str = "public"):
    """One device's blocks [batch, L, heads, dim] through ejkernel's causal ring attention over `axis`."""
    if entry == "public":
        from ejkernel.kernels._xla.ring_attention import ring_attention as public
        from ejkernel.ops import FwdParams
        kwargs = {} if q_pos is None else {"q_position_ids": q_pos, "kv_position_ids": kv_pos}
        return public(q, k, v, causal=True, axis_name=axis, fwd_params=FwdParams(q_blocksize=chunk,
                                                                                 kv_blocksize=chunk), **kwargs)
    from ejkernel.kernels._xla.ring_attention._interface import _ring_attention
    # positional: q, k, v, bias, q_segment_ids, kv_segment_ids, q_position_ids, kv_position_ids, softmax_aux,
    # axis_name, float32_logits, softmax_scale, query_chunk_size, key_chunk_size, causal_block_size, deterministic,
    # dropout_rng, pdrop, dtype, policy, precision, prevent_cse, sliding_window, logits_soft_cap,
    # attention_sink_size, causal
    return _ring_attention(q, k, v, None, None, None, q_pos, kv_pos, None, axis, True, None, chunk, chunk, chunk,
                           True, None, 0.0, jnp.float32, jax.checkpoint_policies.nothing_saveable,
                           jax.lax.Precision.DEFAULT, True, None, None, 0, True)


def sharded(mesh, chunk: int, positions: bool, entry: str = "public", axis: str = "cp", batch_axis: str = "dp"):
    """f(q, k, v[, q_pos, kv_pos]) over global [batch, S, heads, dim] arrays (positions [batch, S])."""
    spec, pspec = P(batch_axis, axis, None, None), P(batch_axis, axis)

    def body(q, k, v, *pos):
        return ring_attention(q, k, v, *pos, axis=axis, chunk=chunk, entry=entry)

    in_specs = (spec,) * 3 + ((pspec,) * 2 if positions else ())
    # ejkernel's skip branch returns its carry without the mesh axes it varies over: check_vma=True fails to trace
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=spec, check_vma=False)


def dense_causal(q, k, v):
    """Reference: dense causal softmax attention over [batch, S, heads, dim], scale 1/sqrt(dim)."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    n = q.shape[1]
    s = jnp.where(jnp.arange(n)[:, None] >= jnp.arange(n)[None, :], s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def inputs(mesh, length: int, batch: int = 2, heads: int = 2, dim: int = 16, seed: int = 0):
    """(q, k, v, positions) as numpy arrays."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((batch, length, heads, dim)).astype(np.float32) for _ in range(3))
    pos = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length)).copy()
    return q, k, v, pos


def model_loss(attention):
    """A stack of attention layers (q/k/v/o projections, residual adds); loss = mean(x ** 2).
    loss(weights, x, *pos) with weights a list of per-layer dicts."""

    def loss(weights, x, *pos):
        for w in weights:
            q, k, v = (jnp.einsum("bsd,dhk->bshk", x, w[name]) for name in ("wq", "wk", "wv"))
            x = x + jnp.einsum("bshk,hkd->bsd", attention(q, k, v, *pos), w["wo"])
        return jnp.mean(x ** 2)

    return loss


def llama_loss(attention):
    """A Llama-style stack: per layer RMSNorm, attention (q/k/v/o projections), residual add, RMSNorm, SwiGLU MLP,
    residual add; loss = mean(final RMSNorm(x) ** 2). loss(weights, x, *pos) with weights from llama_inputs."""

    def norm(x, scale):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale

    def loss(weights, x, *pos):
        for w in weights:
            h = norm(x, w["attn_norm"])
            q, k, v = (jnp.einsum("bsd,dhk->bshk", h, w[name]) for name in ("wq", "wk", "wv"))
            x = x + jnp.einsum("bshk,hkd->bsd", attention(q, k, v, *pos), w["wo"])
            h = norm(x, w["mlp_norm"])
            x = x + (jax.nn.silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]
        return jnp.mean(norm(x, 1.0) ** 2)

    return loss


def llama_inputs(mesh, layers: int, length: int, batch: int = 2, d_model: int = 32, heads: int = 2,
                 head_dim: int = 16, ffn: int = 64, seed: int = 0):
    """(weights, x) for llama_loss, placed as model_inputs places them."""
    weights, x = model_inputs(mesh, layers, length, batch, d_model, heads, head_dim, seed)
    key = jax.random.key(seed + 1)
    for i, w in enumerate(weights):
        ks = jax.random.split(jax.random.fold_in(key, i), 3)
        w["attn_norm"] = w["mlp_norm"] = jnp.ones((d_model,), jnp.float32)
        w["w_gate"] = jax.random.normal(ks[0], (d_model, ffn), jnp.float32) / np.sqrt(d_model)
        w["w_up"] = jax.random.normal(ks[1], (d_model, ffn), jnp.float32) / np.sqrt(d_model)
        w["w_down"] = jax.random.normal(ks[2], (ffn, d_model), jnp.float32) / np.sqrt(ffn * layers)
    return jax.device_put(weights, NamedSharding(mesh, P())), x


def model_inputs(mesh, layers: int, length: int, batch: int = 2, d_model: int = 32, heads: int = 2,
                 head_dim: int = 16, seed: int = 0):
    """(weights, x) placed on `mesh`: weights replicated, x sharded P("dp", "cp", None)."""
    key = jax.random.key(seed)
    weights = []
    for i in range(layers):
        ks = jax.random.split(jax.random.fold_in(key, i), 4)
        # scaled so that activations stay of order one through the residual stack (float32 stays accurate)
        w = {name: jax.random.normal(ks[j], (d_model, heads, head_dim), jnp.float32) / np.sqrt(d_model)
             for j, name in enumerate(("wq", "wk", "wv"))}
        w["wo"] = jax.random.normal(ks[3], (heads, head_dim, d_model), jnp.float32) / np.sqrt(heads * head_dim
                                                                                               * layers)
        weights.append(w)
    x = jax.random.normal(jax.random.fold_in(key, 1 << 20), (batch, length, d_model), jnp.float32)
    weights = jax.device_put(weights, NamedSharding(mesh, P()))
    return weights, jax.device_put(x, NamedSharding(mesh, P("dp", "cp", None)))
