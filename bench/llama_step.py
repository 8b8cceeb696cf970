"""A Llama-style training step (RMSNorm, grouped attention heads, SwiGLU MLP, tied-free logits, cross-entropy,
value_and_grad and an SGD update) with the sharding constraints people write for dp x tp, several of them
indivisible on a dp=2 x tp=4 mesh: 6 heads over tp=4, a vocabulary of 103 over tp=4. Arguments are
ShapeDtypeStructs, so the step can be lowered and compiled at any depth without allocating its parameters: the
benchmarks time compilation, not execution. Layers are unrolled, as in a model without scan."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    layers: int
    hidden: int = 48  # 6 heads of 8
    heads: int = 6
    ffn: int = 64
    vocab: int = 103
    seq: int = 16
    batch: int = 4


def llama_step(mesh, config: Config):
    """(the step function, its abstract arguments: params, tokens)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    c = config
    head_dim = c.hidden // c.heads

    def constrain(x, *spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))

    def rms_norm(x, scale):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale

    def attention(x, layer):
        b, s, _ = x.shape
        q = constrain((x @ layer["wq"]).reshape(b, s, c.heads, head_dim), "dp", None, "tp", None)  # 6 heads / 4
        k = constrain((x @ layer["wk"]).reshape(b, s, c.heads, head_dim), "dp", None, "tp", None)
        v = constrain((x @ layer["wv"]).reshape(b, s, c.heads, head_dim), "dp", None, "tp", None)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(head_dim)
        mask = jnp.tril(jnp.ones((s, s), bool))
        weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, s, c.hidden)
        return constrain(out @ layer["wo"], "dp", None, None)

    def mlp(x, layer):
        h = constrain(jax.nn.silu(x @ layer["w_gate"]) * (x @ layer["w_up"]), "dp", None, "tp")
        return constrain(h @ layer["w_down"], "dp", None, None)

    def loss_fn(params, tokens):
        x = params["embed"][tokens[:, :-1]]
        for layer in params["layers"]:
            x = x + attention(rms_norm(x, layer["norm1"]), layer)
            x = x + mlp(rms_norm(x, layer["norm2"]), layer)
        logits = constrain(rms_norm(x, params["norm"]) @ params["unembed"], "dp", None, "tp")  # vocab 103 / 4
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    def step(params, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss

    def spec(shape, *axes):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P(*axes)))

    layer = {"norm1": spec((c.hidden,)), "norm2": spec((c.hidden,)),
             "wq": spec((c.hidden, c.hidden), None, "tp"), "wk": spec((c.hidden, c.hidden), None, "tp"),
             "wv": spec((c.hidden, c.hidden), None, "tp"), "wo": spec((c.hidden, c.hidden), "tp", None),
             "w_gate": spec((c.hidden, c.ffn), None, "tp"), "w_up": spec((c.hidden, c.ffn), None, "tp"),
             "w_down": spec((c.ffn, c.hidden), "tp", None)}
    params = {"embed": spec((c.vocab, c.hidden)), "norm": spec((c.hidden,)),
              "unembed": spec((c.hidden, c.vocab)), "layers": [dict(layer) for _ in range(c.layers)]}
    tokens = jax.ShapeDtypeStruct((c.batch, c.seq + 1), jnp.int32, sharding=NamedSharding(mesh, P("dp", None)))
    return step, (params, tokens)
