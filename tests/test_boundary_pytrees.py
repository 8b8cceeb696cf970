"""Argument and result pytrees at the decorated function's boundary: jax.jit reads a None in in/out shardings as
matching a None the arguments (or results) hold, which has no leaf; shardfix reads them the same way, and repairs
the shardings of the leaves there are. A typed PRNG key is an argument like any other."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from shardfix import ShardingFixWarning, autofix_shardings

MESH = jax.make_mesh((2, 4), ("dp", "tp"))


def scaled(pair):
    x, nothing = pair
    assert nothing is None
    return x * 2, None


def test_none_leaf_in_argument_and_result_matches_jax_jit():
    with jax.set_mesh(MESH):
        x = jax.device_put(jnp.arange(8.0), P("tp"))
        want, _ = jax.jit(scaled, in_shardings=((P("tp"), None),), out_shardings=(P("tp"), None))((x, None))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing to repair: nothing said
            got, nothing = autofix_shardings(scaled, in_shardings=((P("tp"), None),),
                                             out_shardings=(P("tp"), None))((x, None))
    assert nothing is None
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert got.sharding == want.sharding


def test_leaves_beside_a_none_are_repaired():
    with jax.set_mesh(MESH), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = jax.device_put(jnp.arange(8.0), P("tp"))
        got, _ = autofix_shardings(scaled, in_shardings=((P("tp", "tp"), None),),
                                   out_shardings=(P(("tp", "dp")), None))((x, None))
    np.testing.assert_array_equal(np.asarray(got), np.arange(8.0) * 2)
    assert got.sharding.spec == P(("tp", "dp"))
    text = "\n".join(str(c.message) for c in caught if issubclass(c.category, ShardingFixWarning))
    assert "in_shardings[0][0] (shape (8,)): P('tp', 'tp') -> P('tp',) [rank-mismatch]" in text, text


def test_typed_prng_key_argument():
    """A typed key (jax.random.key) is a jax.Array without `weak_type`: Flax Linen's jitted init takes one."""
    draw = lambda key: jax.random.normal(key, (8,))  # noqa: E731
    with jax.set_mesh(MESH):
        f = autofix_shardings(draw, in_shardings=P())
        for key in (jax.random.key(0), jax.device_put(jax.random.key(0), P())):
            np.testing.assert_array_equal(np.asarray(f(key)), np.asarray(jax.jit(draw)(jax.random.key(0))))
