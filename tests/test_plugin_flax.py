"""With the plugin enabled, an unmodified Flax/optax training loop (plain jax.jit on the step, the model calling
other jitted functions) whose specs JAX would reject (an axis the mesh lacks) or pad (2 columns over tp=4) compiles
without padding, trains exactly like an unsharded reference, and each fix is reported at the model's line; disabled,
jax.jit behaves exactly as before. On jax.make_mesh's default (Explicit) axes, where the model places values with
`reshard`, and on Auto axes, where it constrains them with `with_sharding_constraint`."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax.training import train_state
from jax.sharding import PartitionSpec as P

import shardfix
from shardfix import ShardingFixWarning

MODES = {"explicit": jax.make_mesh((2, 4), ("dp", "tp")),
         "auto": jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)}


def explicit_axes() -> bool:
    return all(t == jax.sharding.AxisType.Explicit for t in jax.sharding.get_abstract_mesh().axis_types)


@jax.jit
def project(h, w):  # a jitted helper the model calls
    h = jax.nn.gelu(h @ w)
    if explicit_axes():
        return jax.sharding.reshard(h, P(None, "tp"))  # model: 2 columns over tp=4
    return jax.lax.with_sharding_constraint(h, P(None, "tp"))  # model: 2 columns over tp=4


class Model(nn.Module):
    constrained: bool = True

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(16)(x)
        if self.constrained and explicit_axes():  # values are placed with reshard on Explicit axes
            h = jax.sharding.reshard(h, P("dp", "sp"))  # model: "sp" is an axis of another mesh
            h = jax.sharding.reshard(h, P("dp", "tp"))  # model: divisible, left alone
        elif self.constrained:  # and constrained with with_sharding_constraint on Auto ones
            h = jax.lax.with_sharding_constraint(h, P("dp", "sp"))  # model: "sp" is an axis of another mesh
            h = jax.lax.with_sharding_constraint(h, P("dp", "tp"))  # model: divisible, left alone
        w = self.param("proj", nn.initializers.lecun_normal(), (16, 2))
        h = project(h, w) if self.constrained else jax.nn.gelu(h @ w)
        return nn.Dense(1)(h)


def make_train_step(model):
    @jax.jit
    def train_step(state, batch):
        def loss_fn(params):
            pred = model.apply({"params": params}, batch["x"])
            return jnp.mean((pred - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss
    return train_step


MODEL_LINES = {i for i, line in enumerate(open(__file__), 1) if "# model:" in line}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    batch = {"x": rng.standard_normal((8, 4)).astype(np.float32), "y": rng.standard_normal((8, 1)).astype(np.float32)}
    params = Model(constrained=False).init(jax.random.key(0), batch["x"])["params"]
    return batch, params


def train(model, params, batch, steps=3):
    step = make_train_step(model)
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
    losses = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(steps):
            state, loss = step(state, batch)
            losses.append(float(loss))
    told = [w for w in record if issubclass(w.category, ShardingFixWarning)]
    return state, losses, told, step


@pytest.mark.parametrize("mode", list(MODES))
def test_training_loop_through_the_plugin(data, mode):
    batch, params = data
    with jax.set_mesh(MODES[mode]):
        ref_state, ref_losses, _, _ = train(Model(constrained=False), params, batch)  # unsharded reference
        with pytest.raises(ValueError, match=re.escape("Resource axis: sp of P('dp', 'sp') is not found")):
            train(Model(), params, batch)  # plain jax.jit: the unknown axis is an error

        with shardfix.enabled():
            state, losses, told, step = train(Model(), params, batch)
            state0 = train_state.TrainState.create(apply_fn=Model().apply, params=params, tx=optax.adam(1e-2))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ShardingFixWarning)
                assert " pad(" not in step.lower(state0, batch).compile().as_text()
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)

        # each fix told once (the step compiles again for the updated state: nothing new): the trace's repairs as
        # the trace ends, the module's as it compiles
        assert len(told) == (1 if mode == "explicit" else 2)
        entries = [re.match(r"  (\S+):(\d+): (.*)", line) for w in told for line in str(w.message).splitlines()[1:]
                   if not line.startswith("      ")]
        assert all(e is not None and e[1] == __file__ and int(e[2]) in MODEL_LINES for e in entries), entries
        fixed = {e[3].split(": ", 1)[1] for e in entries}
        columns = "P(None, 'tp') -> P(None, None) [indivisible]" if mode == "explicit" else \
            "P(None, 'tp') -> <@mesh, [{}, {\"tp\":(1)2}]> [indivisible] (x2)"  # forward and backward
        assert fixed == {"P('dp', 'sp') -> P('dp', None) [unknown-axis]", columns}, fixed

        state, losses, told, step = train(Model(constrained=False), params, batch)  # disabled: jax.jit as before
        assert told == [] and losses == ref_losses
