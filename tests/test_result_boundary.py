"""A value the function returns from a sharding constraint JAX can't read back (6 rows over 8 devices, Auto axes):
JAX converts the result's sharding to a NamedSharding, which holds neither a padded split nor a sub-axis, and raises
IndivisibleError as plain jax.jit does (JAX 0.12). Whatever policy keeps inside the function, the result gets a sharding JAX can
read, corrected as at an entry boundary, and the values are the unsharded program's."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import shardfix
from shardfix import ShardingFixWarning, autofix_shardings

MESH = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
X = np.arange(12, dtype=np.float32).reshape(6, 2)


def constrained(x):
    return jax.lax.with_sharding_constraint(x * 2, NamedSharding(MESH, P("data")))


@pytest.mark.parametrize("policy", ["auto", "subaxis", "prefix", "drop"])
def test_returned_constraint_gets_a_boundary_sharding(policy):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        doubled = autofix_shardings(constrained, policy=policy)(X)
    np.testing.assert_array_equal(np.asarray(doubled), X * 2)
    assert doubled.sharding.is_fully_replicated  # no even split of 6 rows over 8 a NamedSharding can hold
    text = "\n".join(str(c.message) for c in caught if issubclass(c.category, ShardingFixWarning))
    assert "P('data', None) -> P(None, None)" in text, text
    # auto and subaxis keep a split inside (padded; a sub-axis) and repair the result; prefix and drop the constraint
    assert ("result (shape (6, 2)), set by sdy.sharding_constraint" in text) == (policy in ("auto", "subaxis")), text


def test_under_the_plugin():
    with shardfix.enabled(on_fix="ignore"):
        doubled = jax.jit(constrained)(jnp.asarray(X))
    np.testing.assert_array_equal(np.asarray(doubled), X * 2)
