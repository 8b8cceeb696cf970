"""The GQA transformer in Equinox, sharded as Equinox's parallelism example writes it: `eqx.filter_shard` on the
model, the optimizer state and the batch, eagerly and inside the step, with the specs the logical-axis rules give
each parameter (the optax state sharded like the parameters); a step jitted on the arrays of the model
(`eqx.partition` / `eqx.combine`, what `eqx.filter_jit` does). Imports no shardfix."""

from __future__ import annotations

from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from support.gqa import (EMBED, HEAD_DIM, HEADS, KV_HEADS, LEARNING_RATE, MLP, STEPS, VOCAB, attention, mesh_spec,
                         unconstrained)


class GQA(eqx.Module):
    embed: jax.Array
    norm1: jax.Array
    wq: jax.Array
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array
    norm2: jax.Array
    up: jax.Array
    up_bias: jax.Array
    down: jax.Array

    def __init__(self, key):
        keys = iter(jax.random.split(key, 7))
        normal = lambda shape: 0.3 * jax.random.normal(next(keys), shape)  # noqa: E731
        self.embed = normal((VOCAB, EMBED))
        self.wq, self.wk = normal((EMBED, HEADS, HEAD_DIM)), normal((EMBED, KV_HEADS, HEAD_DIM))
        self.wv, self.wo = normal((EMBED, KV_HEADS, HEAD_DIM)), normal((HEADS, HEAD_DIM, EMBED))
        self.up, self.down = normal((EMBED, MLP)), normal((MLP, EMBED))
        self.norm1, self.norm2, self.up_bias = jnp.ones(EMBED), jnp.ones(EMBED), jnp.zeros(MLP)

    def __call__(self, tokens, mesh_name: str | None = None):
        constrain = unconstrained if mesh_name is None else sharded(mesh_name)
        if mesh_name is not None and jax.sharding.get_abstract_mesh().are_all_axes_explicit:
            # Explicit axes: JAX can't tell where a gather by batch-sharded tokens goes unless told
            x = self.embed.at[tokens].get(out_sharding=mesh_spec(("batch", "length", "embed"), mesh_name))
        else:
            x = jnp.take(self.embed, tokens, axis=0)
        x = constrain(x, ("batch", "length", "embed"))
        x = x + attention(rms_norm(x, self.norm1), self.wq, self.wk, self.wv, self.wo, constrain)
        x = x + jax.nn.gelu(rms_norm(x, self.norm2) @ self.up + self.up_bias) @ self.down
        x = constrain(x, ("batch", "length", "embed"))
        return constrain(x @ self.embed.T, ("batch", "length", "vocab"))


# Each parameter's logical names: what the rules of a mesh turn into its spec.
NAMES = {"embed": ("vocab", "embed"), "norm1": ("embed",), "wq": ("embed", "heads", None),
         "wk": ("embed", "kv_heads", None), "wv": ("embed", "kv_heads", None), "wo": ("heads", None, "embed"),
         "norm2": ("embed",), "up": ("embed", "mlp"), "up_bias": ("mlp",), "down": ("mlp", "embed")}


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def specs(model: GQA, optimizer, opt_state, mesh_name: str) -> tuple:
    """(the model with each parameter replaced by its spec, the same for the optimizer's state: each moment as its
    parameter, the rest replicated)."""
    named = eqx.tree_at(lambda m: [getattr(m, n) for n in NAMES], model, list(NAMES))
    model_specs = jax.tree.map(lambda name: mesh_spec(NAMES[name], mesh_name), named)
    opt_specs = optax.tree_map_params(optimizer, lambda _, spec: spec, opt_state, model_specs,
                                      transform_non_params=lambda _: P(), is_leaf=lambda x: isinstance(x, P))
    return model_specs, opt_specs


def optimizer_for(kind: str) -> optax.GradientTransformation:
    return optax.adam(LEARNING_RATE) if kind == "adam" else optax.sgd(LEARNING_RATE, momentum=0.9)


def sharded(mesh_name: str) -> Callable:
    """An activation constrained with `eqx.filter_shard` to the spec the rules give its logical names."""
    return lambda x, names: eqx.filter_shard(x, mesh_spec(names, mesh_name))


def loss_fn(model: GQA, tokens, mesh_name: str | None = None):
    logits = model(tokens[:, :-1], mesh_name)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def make_step(optimizer, mesh_name: str | None, model_specs=None, opt_specs=None) -> Callable:
    """The parallelism example's step: model, optimizer state and batch constrained with `eqx.filter_shard` on the
    way in and out, activations too (`mesh_name` None: the unsharded reference)."""
    def train_step(model, opt_state, tokens):
        if mesh_name is not None:
            model, opt_state = eqx.filter_shard((model, opt_state), (model_specs, opt_specs))
            tokens = eqx.filter_shard(tokens, mesh_spec(("batch", None), mesh_name))
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, tokens, mesh_name)
        updates, opt_state = optimizer.update(grads, opt_state, model)
        model = eqx.apply_updates(model, updates)
        if mesh_name is not None:
            model, opt_state = eqx.filter_shard((model, opt_state), (model_specs, opt_specs))
        return model, opt_state, loss
    return train_step


def run(step, model, opt_state, tokens) -> tuple[list, list]:
    losses = []
    for _ in range(STEPS):
        model, opt_state, loss = step(model, opt_state, tokens)
        losses.append(float(loss))
    return losses, [np.asarray(x) for x in jax.tree.leaves(model)]


def start(kind: str):
    model, optimizer = GQA(jax.random.key(0)), optimizer_for(kind)
    return model, optimizer, optimizer.init(model)


def reference(kind: str) -> tuple[list, list]:
    from support.gqa import tokens
    model, optimizer, opt_state = start(kind)
    return run(jax.jit(make_step(optimizer, None)), model, opt_state, tokens())


def traced(kind: str, decorate, tokens, mesh_name: str) -> tuple[list, list]:
    """The step jitted by `decorate`, with the specs as its in and out shardings too."""
    model, optimizer, opt_state = start(kind)
    model_specs, opt_specs = specs(model, optimizer, opt_state, mesh_name)
    step = decorate(make_step(optimizer, mesh_name, model_specs, opt_specs),
                    in_shardings=(model_specs, opt_specs, mesh_spec(("batch", None), mesh_name)),
                    out_shardings=(model_specs, opt_specs, P()))
    return run(step, model, opt_state, tokens)


def eager(kind: str, tokens, mesh_name: str) -> tuple[list, list]:
    """The example's flow: the model, its optimizer state and the batch placed with `eqx.filter_shard` before the
    first step too, then an `eqx.filter_jit` step."""
    model, optimizer, opt_state = start(kind)
    model_specs, opt_specs = specs(model, optimizer, opt_state, mesh_name)
    model, opt_state = eqx.filter_shard((model, opt_state), (model_specs, opt_specs))
    tokens = eqx.filter_shard(tokens, mesh_spec(("batch", None), mesh_name))
    return run(eqx.filter_jit(make_step(optimizer, mesh_name, model_specs, opt_specs)), model, opt_state, tokens)
