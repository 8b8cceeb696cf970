"""A Llama-style training step with ring attention in every layer, on jax.make_mesh's default axes ("dp", "cp"):
token embedding, per layer RMSNorm, q/k/v projections, RoPE from global positions, causal ring attention (a
blockwise kernel that skips chunk pairs above the diagonal) under jax.shard_map, output projection, residual add,
RMSNorm, SwiGLU MLP, residual add; final RMSNorm, output head, cross-entropy; value_and_grad and an SGD update.

Two attention kernels: "custom_vjp" (tests/support/ring_kernels.scan_ring_attention, forward and backward rings
written by hand) and "autodiff" (ring_user_kernels.blockwise_ring, differentiated by JAX).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from support import ring_kernels, ring_user_kernels as uk

B, S, D_MODEL, HEAD, FFN, VOCAB, CHUNK = 2, 64, 16, 8, 32, 50, 4
SEQ = P("dp", "cp", None)


def attention(mesh, kind: str):
    cp = mesh.shape["cp"]
    if kind == "custom_vjp":
        kernel = ring_kernels.scan_ring_attention("cp", cp, CHUNK)
    else:
        kernel = uk.blockwise_ring(cp, CHUNK, uk.causal, uk.live_causal)
    return jax.shard_map(kernel, mesh=mesh, in_specs=(SEQ,) * 3, out_specs=SEQ, check_vma=False)


def _norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _rope(x, positions):
    half = x.shape[-1] // 2
    angles = positions[:, None].astype(jnp.float32) * (1.0 / 10000.0 ** (jnp.arange(half) / half))[None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def train_step(mesh, kind: str, learning_rate: float = 0.1):
    """step(params, tokens, targets) -> (loss, new params)."""
    attend = attention(mesh, kind)

    def loss_fn(params, tokens, targets):
        # Explicit axes: a gather by sharded indices says where its result lives
        x = params["embed"].at[tokens].get(out_sharding=NamedSharding(mesh, SEQ))
        positions = jnp.arange(tokens.shape[1])
        for layer in params["layers"]:
            h = _norm(x, layer["attn_norm"])
            q, k, v = (h @ layer[name] for name in ("wq", "wk", "wv"))
            x = x + attend(_rope(q, positions), _rope(k, positions), v) @ layer["wo"]
            h = _norm(x, layer["mlp_norm"])
            x = x + (jax.nn.silu(h @ layer["w1"]) * (h @ layer["w3"])) @ layer["w2"]
        logp = jax.nn.log_softmax(_norm(x, params["final_norm"]) @ params["head"], axis=-1)
        return -jnp.mean(jnp.sum(logp * jax.nn.one_hot(targets, VOCAB), axis=-1))

    def step(params, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        return loss, jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)

    return step


def inputs(mesh, layers: int, seed: int = 0):
    """(params replicated, tokens and targets [B, S] sharded batch on dp, sequence on cp)."""
    rng = np.random.default_rng(seed)

    def mat(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    layer = lambda: {"attn_norm": np.ones(D_MODEL, np.float32), "mlp_norm": np.ones(D_MODEL, np.float32),  # noqa
                     "wq": mat(D_MODEL, HEAD), "wk": mat(D_MODEL, HEAD), "wv": mat(D_MODEL, HEAD),
                     "wo": mat(HEAD, D_MODEL), "w1": mat(D_MODEL, FFN), "w3": mat(D_MODEL, FFN),
                     "w2": mat(FFN, D_MODEL)}
    params = {"embed": mat(VOCAB, D_MODEL), "layers": [layer() for _ in range(layers)],
              "final_norm": np.ones(D_MODEL, np.float32), "head": mat(D_MODEL, VOCAB)}
    params = jax.device_put(params, NamedSharding(mesh, P()))
    tokens, targets = (jax.device_put(rng.integers(0, VOCAB, (B, S)).astype(np.int32),
                                      NamedSharding(mesh, P("dp", "cp"))) for _ in range(2))
    return params, tokens, targets
