"""The GQA transformer in Flax NNX, sharded as Flax's NNX sharding guide writes it: `nnx.with_partitioning` and
`out_sharding=` metadata with logical names, variables sharded eagerly as they are created under `jax.set_mesh` and
`nnx.logical_axis_rules`, the optimizer's state sharded like the parameters, `nnx.get_partition_spec` +
`jax.device_put` + `nnx.update`, and an `nnx.jit` training step. Imports no shardfix."""

from __future__ import annotations

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

from support.gqa import EMBED, HEAD_DIM, HEADS, KV_HEADS, LEARNING_RATE, MLP, STEPS, VOCAB, attention, place

INIT = nnx.initializers.normal(0.3)


def activation(x, names: tuple, sharded: bool):
    """An activation placed by its logical names, under the rules in force (MaxText's logical constraints)."""
    return place(x, logical_spec(names)) if sharded else x


def logical_spec(names: tuple) -> P:
    """The spec the rules in force give logical `names`."""
    from flax.core.spmd import get_logical_axis_rules
    table = dict(get_logical_axis_rules())
    return P(*(table.get(n) for n in names))


class Attention(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.wq = nnx.Param(INIT(rngs.params(), (EMBED, HEADS, HEAD_DIM)), out_sharding=("embed", "heads", None))
        self.wk = nnx.Param(INIT(rngs.params(), (EMBED, KV_HEADS, HEAD_DIM)), out_sharding=("embed", "kv_heads", None))
        self.wv = nnx.Param(INIT(rngs.params(), (EMBED, KV_HEADS, HEAD_DIM)), out_sharding=("embed", "kv_heads", None))
        self.wo = nnx.Param(INIT(rngs.params(), (HEADS, HEAD_DIM, EMBED)), out_sharding=("heads", None, "embed"))

    def __call__(self, x, sharded: bool):
        return attention(x, self.wq[...], self.wk[...], self.wv[...], self.wo[...],
                         lambda y, names: activation(y, names, sharded))


class GQA(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, EMBED, embedding_init=nnx.with_partitioning(INIT, ("vocab", "embed")),
                               rngs=rngs)
        self.norm1 = nnx.RMSNorm(EMBED, scale_init=nnx.with_partitioning(nnx.initializers.ones, ("embed",)),
                                 rngs=rngs)
        self.attention = Attention(rngs)
        self.norm2 = nnx.RMSNorm(EMBED, scale_init=nnx.with_partitioning(nnx.initializers.ones, ("embed",)),
                                 rngs=rngs)
        self.up = nnx.Linear(EMBED, MLP, kernel_init=nnx.with_partitioning(INIT, ("embed", "mlp")),
                             bias_init=nnx.with_partitioning(nnx.initializers.zeros, ("mlp",)), rngs=rngs)
        self.down = nnx.Linear(MLP, EMBED, use_bias=False, kernel_init=nnx.with_partitioning(INIT, ("mlp", "embed")),
                               rngs=rngs)

    def __call__(self, tokens, sharded: bool = True):
        if sharded and jax.sharding.get_abstract_mesh().are_all_axes_explicit:
            # Explicit axes: JAX can't tell where a gather by batch-sharded tokens goes unless told
            x = self.embed(tokens, out_sharding=logical_spec(("batch", "length", "embed")))
        else:
            x = self.embed(tokens)
        x = activation(x, ("batch", "length", "embed"), sharded)
        x = x + self.attention(self.norm1(x), sharded)
        x = x + self.down(jax.nn.gelu(self.up(self.norm2(x))))
        x = activation(x, ("batch", "length", "embed"), sharded)
        return activation(self.embed.attend(x), ("batch", "length", "vocab"), sharded)


def optimizer_for(kind: str) -> optax.GradientTransformation:
    return optax.adam(LEARNING_RATE) if kind == "adam" else optax.sgd(LEARNING_RATE, momentum=0.9)


def loss_fn(model: GQA, tokens, sharded: bool = True):
    logits = model(tokens[:, :-1], sharded)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


@nnx.jit(static_argnums=3)
def train_step(model: GQA, optimizer: nnx.Optimizer, tokens, sharded: bool = True):
    loss, grads = nnx.value_and_grad(loss_fn)(model, tokens, sharded)
    optimizer.update(model, grads)
    return loss


def create(kind: str) -> tuple[GQA, nnx.Optimizer]:
    """The model and its optimizer, sharded eagerly as they are created when a mesh and rules are in force."""
    model = GQA(rngs=nnx.Rngs(0))
    return model, nnx.Optimizer(model, optimizer_for(kind), wrt=nnx.Param)


def shard_as_annotated(*nodes) -> None:
    """The guide's explicit placement: each variable where its annotation says (`nnx.get_partition_spec`,
    `jax.device_put`, `nnx.update`)."""
    state = nnx.state(nodes)
    nnx.update(nodes, jax.device_put(state, nnx.get_partition_spec(state)))


def batch_on_mesh(tokens):
    return jax.device_put(tokens, logical_spec(("batch", None)))


def reference(kind: str) -> tuple[list, list]:
    """(losses, parameter leaves) of the unsharded run: no mesh, variables not sharded."""
    from support.gqa import tokens
    with nnx.use_eager_sharding(False):
        model, optimizer = create(kind)
    losses = [float(train_step(model, optimizer, tokens(), False)) for _ in range(STEPS)]
    return losses, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def train_eagerly(kind: str, tokens) -> tuple[list, list]:
    """The guide's flow, under the mesh and rules in force: create (sharded eagerly), place, train with nnx.jit."""
    model, optimizer = create(kind)
    shard_as_annotated(model, optimizer)
    batch = batch_on_mesh(tokens)
    losses = [float(train_step(model, optimizer, batch)) for _ in range(STEPS)]
    return losses, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]



def functional(kind: str, decorate, tokens, batch_spec):
    """The functional form Flax documents for jax.jit (`nnx.split` / `nnx.merge`), with `decorate` in jax.jit's
    place: an init that returns the sharded state (the variables sharded eagerly while it is traced) and a step on
    it, both with the annotations' specs as out (and in) shardings. Returns (losses, parameter leaves)."""
    structure = []

    def init():
        graphdef, state = nnx.split(create(kind))
        structure.append(graphdef)  # the same for every trace: no array in it
        return state

    specs = nnx.get_partition_spec(decorate(init).eval_shape())  # the annotations, as the variables carry them
    init, graphdef = decorate(init, out_shardings=specs), structure[0]

    @decorate(in_shardings=(specs, batch_spec), out_shardings=(specs, P()))
    def step(state, tokens):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(loss_fn)(model, tokens)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    state, losses = init(), []
    for _ in range(STEPS):
        state, loss = step(state, tokens)
        losses.append(float(loss))
    model, _ = nnx.merge(graphdef, state)
    return losses, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
