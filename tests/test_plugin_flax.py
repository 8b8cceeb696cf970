"""With the plugin enabled, an unmodified Flax/optax training loop (plain jax.jit on the step, the model calling
other jitted functions) whose constraints JAX would pad compiles without padding, trains exactly like an unsharded
reference, and each fix is reported at the model's line; disabled, jax.jit behaves exactly as before."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax.training import train_state
from jax.sharding import NamedSharding, PartitionSpec as P

import shardfix
from shardfix import ShardingFixWarning

MESH = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
wsc = jax.lax.with_sharding_constraint


@jax.jit
def project(h, w):  # a jitted helper the model calls
    return wsc(jax.nn.gelu(h @ w), NamedSharding(MESH, P(None, "tp")))  # model: 2 columns over tp=4


class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(16)(x)
        h = wsc(h, NamedSharding(MESH, P("dp", "tp")))  # model: divisible, left alone
        w = self.param("proj", nn.initializers.lecun_normal(), (16, 2))
        h = project(h, w)
        return nn.Dense(1)(h)


@jax.jit
def train_step(state, batch):
    def loss_fn(params):
        pred = state.apply_fn({"params": params}, batch["x"])
        return jnp.mean((pred - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


MODEL_LINES = {i for i, line in enumerate(open(__file__), 1) if "# model:" in line}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    batch = {"x": rng.standard_normal((8, 4)).astype(np.float32), "y": rng.standard_normal((8, 1)).astype(np.float32)}
    params = Model().init(jax.random.key(0), batch["x"])["params"]
    return batch, params


def train(params, batch, steps=3):
    state = train_state.TrainState.create(apply_fn=Model().apply, params=params, tx=optax.adam(1e-2))
    losses = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(steps):
            state, loss = train_step(state, batch)
            losses.append(float(loss))
    told = [w for w in record if issubclass(w.category, ShardingFixWarning)]
    return state, losses, told


def test_training_loop_through_the_plugin(data):
    batch, params = data
    ref_state, ref_losses, told = train(params, batch)  # plain jax.jit: JAX pads, and computes the same values
    assert told == []
    state0 = train_state.TrainState.create(apply_fn=Model().apply, params=params, tx=optax.adam(1e-2))
    plain_text = train_step.lower(state0, batch).compile().as_text()
    assert " pad(" in plain_text

    with shardfix.enabled():
        state, losses, told = train(params, batch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ShardingFixWarning)
            assert " pad(" not in train_step.lower(state0, batch).compile().as_text()
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert len(told) == 1  # each fix told once (the step compiles again for the updated state: nothing new)
    entries = [re.match(r"  (\S+):(\d+): (.*)", line) for line in str(told[0].message).splitlines()[1:]
               if not line.startswith("      ")]
    assert entries and all(e is not None and e[1] == __file__ and int(e[2]) in MODEL_LINES for e in entries)
    assert all('{"tp"}]> -> ' in e[3] and "[indivisible]" in e[3] for e in entries)

    state, losses, told = train(params, batch)  # disabled: jax.jit as before
    assert told == [] and train_step.lower(state0, batch).compile().as_text() == plain_text
    assert losses == ref_losses
