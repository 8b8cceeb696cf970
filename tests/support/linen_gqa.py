"""The GQA transformer in Flax Linen, sharded as Flax's Linen guides write it: parameters annotated with
`nn.with_logical_partitioning`, activations with `nn.with_logical_constraint`, logical names mapped by
`nn.logical_axis_rules`; a `TrainState` whose optax state is sharded like the parameters. Two flows: the guide's
jitted init and step with in/out shardings from `nn.get_partition_spec` + `nn.logical_to_mesh` (`functional`), and
the eager one, `nn.unbox` + `nn.logical_to_mesh_sharding` + `jax.device_put`, then a jax.jit step (`eager`).
Imports no shardfix."""

from __future__ import annotations

import jax
import numpy as np
import optax
from flax import linen as nn
from flax.training import train_state
from jax.sharding import PartitionSpec as P

from support.gqa import EMBED, HEAD_DIM, HEADS, KV_HEADS, LEARNING_RATE, MLP, STEPS, VOCAB, attention, unconstrained

INIT = nn.initializers.normal(0.3)


def constrained(x, names):
    return nn.with_logical_constraint(x, names)


class GQA(nn.Module):
    sharded: bool = True

    def param_(self, name: str, shape: tuple, names: tuple, init=INIT):
        return self.param(name, nn.with_logical_partitioning(init, names), shape)

    @nn.compact
    def __call__(self, tokens):
        constrain = constrained if self.sharded else unconstrained
        embed = nn.Embed(VOCAB, EMBED, embedding_init=nn.with_logical_partitioning(INIT, ("vocab", "embed")))
        x = constrain(embed(tokens), ("batch", "length", "embed"))
        norm = nn.RMSNorm(scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)))
        x = x + attention(norm(x), self.param_("wq", (EMBED, HEADS, HEAD_DIM), ("embed", "heads", None)),
                          self.param_("wk", (EMBED, KV_HEADS, HEAD_DIM), ("embed", "kv_heads", None)),
                          self.param_("wv", (EMBED, KV_HEADS, HEAD_DIM), ("embed", "kv_heads", None)),
                          self.param_("wo", (HEADS, HEAD_DIM, EMBED), ("heads", None, "embed")), constrain)
        norm = nn.RMSNorm(scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)))
        up = nn.Dense(MLP, kernel_init=nn.with_logical_partitioning(INIT, ("embed", "mlp")),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))
        down = nn.Dense(EMBED, use_bias=False, kernel_init=nn.with_logical_partitioning(INIT, ("mlp", "embed")))
        x = constrain(x + down(jax.nn.gelu(up(norm(x)))), ("batch", "length", "embed"))
        return constrain(embed.attend(x), ("batch", "length", "vocab"))


def optimizer_for(kind: str) -> optax.GradientTransformation:
    return optax.adam(LEARNING_RATE) if kind == "adam" else optax.sgd(LEARNING_RATE, momentum=0.9)


def init_fn(key, tokens, model: GQA, optimizer):
    """The guide's init: the model's variables (boxed with their logical names) in a TrainState."""
    variables = model.init(key, tokens[:, :-1])
    return train_state.TrainState.create(apply_fn=model.apply, params=variables["params"], tx=optimizer)


def train_step(state, tokens):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def run(step, state, tokens) -> tuple[list, list]:
    losses = []
    for _ in range(STEPS):
        state, loss = step(state, tokens)
        losses.append(float(loss))
    return losses, [np.asarray(x) for x in jax.tree.leaves(state.params)]  # a box's leaf is its value


def reference(kind: str) -> tuple[list, list]:
    """(losses, parameter leaves) of the unsharded run."""
    from support.gqa import tokens
    state = nn.unbox(init_fn(jax.random.key(0), tokens(), GQA(sharded=False), optimizer_for(kind)))
    return run(jax.jit(train_step), state, tokens())


def functional(kind: str, decorate, tokens, rules) -> tuple[list, list]:
    """The guide's flow with `decorate` in jax.jit's place: the state's logical specs from an abstract init, mapped
    to the mesh by the rules; a jitted init and step with those in/out shardings."""
    model, optimizer, key = GQA(), optimizer_for(kind), jax.random.key(0)
    abstract = decorate(init_fn, static_argnums=(2, 3)).eval_shape(key, tokens, model, optimizer)
    specs = nn.logical_to_mesh(nn.get_partition_spec(abstract), rules)
    batch = nn.logical_to_mesh_axes(("batch", None), rules)
    init = decorate(init_fn, static_argnums=(2, 3), in_shardings=(P(), batch), out_shardings=specs)
    state = init(key, tokens, model, optimizer)
    step = decorate(train_step, in_shardings=(specs, batch), out_shardings=(specs, P()))
    losses, params = run(step, state, tokens)
    return losses, params


def eager(kind: str, tokens, mesh, rules) -> tuple[list, list]:
    """Initialise and `nn.unbox` on the host (no mesh), then, under the mesh and rules, `jax.device_put` the
    parameters where `nn.logical_to_mesh_sharding` says; the optimizer's state is made from the placed parameters;
    a jax.jit step. (Unboxing under the mesh would apply each box's constraint eagerly to an array on one device,
    which JAX rejects on Auto axes for any spec, a valid one too.)"""
    variables = GQA(sharded=False).init(jax.random.key(0), tokens[:, :-1])
    host_params = nn.unbox(variables["params"])
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(variables), mesh, rules)
        params = jax.device_put(host_params, shardings["params"])
        state = train_state.TrainState.create(apply_fn=GQA().apply, params=params, tx=optimizer_for(kind))
        if mesh.are_all_axes_explicit:
            # nn.Embed's gather (jnp.take) of batch-sharded tokens is ambiguous to JAX on Explicit axes and Linen's
            # Embed takes no out_sharding: there the batch goes in unplaced, as JAX itself requires
            return run(jax.jit(train_step), state, tokens)
        batch = nn.logical_to_mesh_sharding(P("batch", None), mesh, rules)
        return run(jax.jit(train_step), state, jax.device_put(tokens, batch))
