"""A Llama-style training step (RMSNorm, attention with rotary positions, SwiGLU MLP, tied-free output head,
cross-entropy loss, value_and_grad and an SGD update) on a (dp, tp) mesh, Megatron-style: attention heads and
the MLP's hidden dim over tp, the batch over dp.

Its defaults carry the indivisible dims real models have: 6 heads over tp=4 and a vocabulary of 32003 over tp=4
(both inside the step, where XLA pads them), with a hidden size of 1000. The layers are unrolled, so the lowered
module grows linearly with `layers` (what the scaling benchmarks need).

    step, args = train_step(mesh, layers=4)
    loss, params = step(*args)                       # or step.lower(*args)
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P


@dataclass(frozen=True)
class Config:
    layers: int = 4
    hidden: int = 1000
    heads: int = 6
    head_dim: int = 64
    ffn: int = 2688
    vocab: int = 32003
    batch: int = 4
    seq: int = 16
    learning_rate: float = 1e-2


def param_specs(config: Config) -> dict:
    """PartitionSpecs of the parameters (all divisible: JAX rejects indivisible argument shardings)."""
    layer = {"attn_norm": P(None), "wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"),
             "wo": P("tp", None), "mlp_norm": P(None), "w1": P(None, "tp"), "w3": P(None, "tp"), "w2": P("tp", None)}
    return {"embed": P(None, "tp"), "layers": [dict(layer) for _ in range(config.layers)], "final_norm": P(None),
            "head": P(None, None)}


def param_shapes(config: Config) -> dict:
    qkv = config.heads * config.head_dim
    layer = {"attn_norm": (config.hidden,), "wq": (config.hidden, qkv), "wk": (config.hidden, qkv),
             "wv": (config.hidden, qkv), "wo": (qkv, config.hidden), "mlp_norm": (config.hidden,),
             "w1": (config.hidden, config.ffn), "w3": (config.hidden, config.ffn), "w2": (config.ffn, config.hidden)}
    return {"embed": (config.vocab, config.hidden), "layers": [dict(layer) for _ in range(config.layers)],
            "final_norm": (config.hidden,), "head": (config.hidden, config.vocab)}


def _is_shape(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def init_params(config: Config, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def init(shape):  # norms start at one, matrices small and random
        if len(shape) == 1:
            return jnp.ones(shape, jnp.float32)
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32) * 0.02)

    return jax.tree.map(init, param_shapes(config), is_leaf=_is_shape)


def _rms_norm(x, weight):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * weight


def _rotary(x, positions):
    half = x.shape[-1] // 2
    freq = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = positions[:, None].astype(jnp.float32) * freq[None, :]
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def forward_loss(params: dict, tokens, targets, mesh, config: Config):
    constrain = lambda x, *spec: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))  # noqa: E731
    b, s = tokens.shape
    positions = jnp.arange(s)
    x = constrain(params["embed"][tokens], "dp", None, "tp")
    mask = jnp.tril(jnp.ones((s, s), bool))
    for layer in params["layers"]:
        h = _rms_norm(x, layer["attn_norm"])
        q = constrain((h @ layer["wq"]).reshape(b, s, config.heads, config.head_dim), "dp", None, "tp", None)
        k = constrain((h @ layer["wk"]).reshape(b, s, config.heads, config.head_dim), "dp", None, "tp", None)
        v = constrain((h @ layer["wv"]).reshape(b, s, config.heads, config.head_dim), "dp", None, "tp", None)
        q, k = _rotary(q, positions), _rotary(k, positions)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(config.head_dim)
        scores = constrain(jnp.where(mask, scores, -1e9), "dp", "tp", None, None)
        attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        x = x + constrain(attn.reshape(b, s, -1) @ layer["wo"], "dp", None, None)
        h = _rms_norm(x, layer["mlp_norm"])
        gate = constrain(jax.nn.silu(h @ layer["w1"]) * (h @ layer["w3"]), "dp", None, "tp")
        x = x + constrain(gate @ layer["w2"], "dp", None, None)
    logits = constrain(_rms_norm(x, params["final_norm"]) @ params["head"], "dp", None, "tp")
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def jitted_step(mesh, config: Config):
    """The step jitted with the parameters' and data's shardings."""

    def step(params, tokens, targets):
        loss, grads = jax.value_and_grad(forward_loss)(params, tokens, targets, mesh, config)
        new = jax.tree.map(lambda p, g: p - config.learning_rate * g, params, grads)
        return loss, new

    param_shardings = _shardings(mesh, config)
    data_sharding = NamedSharding(mesh, P("dp", None))
    return jax.jit(step, in_shardings=(param_shardings, data_sharding, data_sharding),
                   out_shardings=(NamedSharding(mesh, P()), param_shardings))


def _shardings(mesh, config: Config) -> dict:
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), param_specs(config),
                        is_leaf=lambda x: isinstance(x, P))


def train_step(mesh, layers: int = 4, **overrides):
    """(the jitted value_and_grad + SGD step, its arguments placed on `mesh`)."""
    config = Config(layers=layers, **overrides)
    data_sharding = NamedSharding(mesh, P("dp", None))
    params = jax.device_put(init_params(config), _shardings(mesh, config))
    rng = np.random.default_rng(1)
    tokens, targets = (jax.device_put(rng.integers(0, config.vocab, (config.batch, config.seq)).astype(np.int32),
                                      data_sharding) for _ in range(2))
    return jitted_step(mesh, config), (params, tokens, targets)


def lowered_step(mesh, layers: int, **overrides):
    """The step lowered for abstract arguments: nothing is allocated, whatever the size."""
    config = Config(layers=layers, **overrides)
    return jitted_step(mesh, config).lower(*abstract_args(mesh, layers, **overrides))


def abstract_args(mesh, layers: int = 4, **overrides):
    """Like train_step's arguments, as ShapeDtypeStructs: lowering big configurations allocates nothing."""
    config = Config(layers=layers, **overrides)
    params = jax.tree.map(lambda shape, spec: jax.ShapeDtypeStruct(shape, jnp.float32,
                                                                   sharding=NamedSharding(mesh, spec)),
                          param_shapes(config), param_specs(config), is_leaf=_is_shape)
    data = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32, sharding=NamedSharding(mesh, P("dp", None)))
    return params, data, data
