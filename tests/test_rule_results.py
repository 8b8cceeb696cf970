"""JAX's own sharding rules under shardfix: a rule whose result names one mesh axis on two dims (a dot of
x[b@fsdp, ...] with w[..., e@fsdp]) is a DuplicateSpecError in plain JAX. shardfix makes NamedSharding's construction
checks lenient while it traces, so such a result must be repaired where its type is made, else a type with a
duplicate axis reaches JAX and the backward pass fails ("Expected cotangent type f32[4@fsdp,3,8@fsdp]")."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import shardfix
from shardfix import ShardingFixWarning, autofix_shardings

MESH = jax.make_mesh((2, 4), ("fsdp", "tp"), axis_types=(AxisType.Explicit,) * 2)
W = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
X = np.linspace(0, 1, 96, dtype=np.float32).reshape(4, 3, 8)


def step(w, x):
    def loss(w):
        return jnp.sum(jnp.tanh(x @ w) ** 2)  # x[4@fsdp, 3, 8] @ w[8, 8@fsdp]: fsdp on dims 0 and 2 of the result
    value, grad = jax.value_and_grad(loss)(w)
    return w - 0.1 * grad, value


def reference(steps: int):
    w, out = W, []
    for _ in range(steps):
        w, value = jax.jit(step)(w, X)
        out.append(value)
    return w, out


def sharded_inputs():
    return jax.device_put(W, P(None, "fsdp")), jax.device_put(X, P("fsdp", None, None))


@pytest.mark.parametrize("how", ["decorator", "plugin"])
def test_duplicate_axis_from_a_rule_is_repaired_and_training_continues(how):
    want_w, want_values = reference(2)
    with jax.set_mesh(MESH), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w, x = sharded_inputs()
        if how == "decorator":
            f = autofix_shardings(step, out_shardings=(P("fsdp", "tp"), P()))
            values = []
            for _ in range(2):  # step 2 takes step 1's results
                w, value = f(w, x)
                values.append(value)
        else:
            with shardfix.enabled():
                f = jax.jit(step, out_shardings=(P("fsdp", "tp"), P()))
                values = []
                for _ in range(2):
                    w, value = f(w, x)
                    values.append(value)
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(values), np.asarray(want_values), rtol=1e-6)
    assert w.sharding.spec == P("fsdp", "tp")
    texts = [str(c.message) for c in caught if issubclass(c.category, ShardingFixWarning)]
    assert any("P('fsdp', None, 'fsdp') -> P('fsdp', None, None) [duplicate-axis]" in t for t in texts), texts


def test_plain_jax_still_raises_outside_shardfix():
    with jax.set_mesh(MESH):
        w, x = sharded_inputs()
        with pytest.raises(Exception, match="illegally sharded result"):
            jax.jit(step)(w, x)
