"""The plugin repairs wherever JAX checks a spec while it is on, traced or eager: device_put,
make_array_from_callback, an eager reshard or with_sharding_constraint (with the NamedSharding made for it), a
jax.jit's in/out shardings as jax.jit builds them (the decorator's repair, in the decorator's words), and a
with_sharding_constraint meant as a reshard on Explicit axes. Each fix is told at the user's line; the values are
what the repaired spec gives; with the plugin off JAX raises as before."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import shardfix
from shardfix import ShardingFixError, ShardingFixWarning, autofix_shardings

EXPLICIT = jax.make_mesh((2, 4), ("dp", "tp"))
AUTO = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
X = np.arange(48, dtype=np.float32).reshape(6, 8)

EAGER = {  # name -> (call, the spec it should get)
    "device_put unknown axis": (lambda: jax.device_put(X, NamedSharding(EXPLICIT, P("missing"))), P(None, None)),
    "device_put duplicate": (lambda: jax.device_put(X, NamedSharding(EXPLICIT, P("tp", "tp"))), P(None, "tp")),
    "make_array_from_callback": (lambda: jax.make_array_from_callback(
        X.shape, NamedSharding(EXPLICIT, P("dp", "missing")), lambda index: X[index]), P("dp", None)),
    "reshard": (lambda: jax.sharding.reshard(jax.device_put(X, NamedSharding(EXPLICIT, P())),
                                             NamedSharding(EXPLICIT, P("tp", "zz"))), P(None, None)),
    "with_sharding_constraint": (lambda: jax.lax.with_sharding_constraint(
        jax.device_put(X, NamedSharding(AUTO, P())), NamedSharding(AUTO, P("zz", "tp"))), P(None, "tp")),
}


def told(run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run()
    return out, [w for w in caught if issubclass(w.category, ShardingFixWarning)]


@pytest.mark.parametrize("name", list(EAGER))
def test_eager_check_points(name):
    call, spec = EAGER[name]
    with pytest.raises(Exception):  # noqa: B017  (JAX's own error, whichever it is)
        call()
    with shardfix.enabled():
        out, warned = told(call)
    np.testing.assert_array_equal(np.asarray(out), X)
    assert out.sharding.spec == spec
    assert [(w.filename, w.lineno) for w in warned] == [(__file__, call.__code__.co_firstlineno)]
    assert "shardfix changed 1 sharding(s) of eager code (outside jit)" in str(warned[0].message)
    with shardfix.enabled(on_fix="error"), pytest.raises(ShardingFixError):
        call()
    with pytest.raises(Exception):  # noqa: B017  (off again: JAX's own error)
        call()


def test_jit_shardings_as_jax_jit_builds_them_same_repair_same_words():
    with jax.set_mesh(EXPLICIT):
        x = jax.device_put(jnp.asarray(X), P(None, "tp"))
        with pytest.raises(Exception, match="duplicate entries"):
            jax.jit(lambda x: x * 2, in_shardings=P("tp", "tp"))
        decorated, by_decorator = told(lambda: autofix_shardings(
            lambda x: {"y": x * 2}, in_shardings=P("tp", "tp"), out_shardings={"y": P("dp", "dp")})(x))
        with shardfix.enabled():
            plain, by_plugin = told(lambda: jax.jit(
                lambda x: {"y": x * 2}, in_shardings=P("tp", "tp"), out_shardings={"y": P("dp", "dp")})(x))
    np.testing.assert_array_equal(np.asarray(plain["y"]), X * 2)
    assert plain["y"].sharding == decorated["y"].sharding
    lines = lambda warned: [line.split(": ", 1)[1] for line in str(warned[0].message).splitlines()[1:]  # noqa: E731
                            if line.startswith("  /")]
    assert lines(by_plugin) == lines(by_decorator) == [
        "in_shardings[0] (shape (6, 8)): P('tp', 'tp') -> P(None, 'tp') [duplicate-axis]",
        "out_shardings['y'] (shape (6, 8)): P('dp', 'dp') -> P('dp', None) [duplicate-axis]"]


def filter_shard_step(w, x):
    """What Equinox's filter_shard and Flax's logical constraints do: a constraint meant as a reshard."""
    w = jax.lax.with_sharding_constraint(w, NamedSharding(EXPLICIT, P("tp", None)))
    return jnp.tanh(x @ w).sum()


@pytest.mark.parametrize("how", ["decorator", "plugin", "eager"])
def test_constraint_on_explicit_axes_is_the_reshard_it_meant(how):
    w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    want = np.tanh(X @ w).sum()
    with jax.set_mesh(EXPLICIT):
        wd, xd = jax.device_put(w, P(None, "tp")), jax.device_put(X, P())
        with pytest.raises(AssertionError, match="acts as an assert"):
            jax.jit(filter_shard_step)(wd, xd)
        if how == "decorator":
            got, warned = told(lambda: autofix_shardings(filter_shard_step)(wd, xd))
        elif how == "plugin":
            with shardfix.enabled():
                got, warned = told(lambda: jax.jit(filter_shard_step)(wd, xd))
        else:
            with shardfix.enabled():
                got, warned = told(lambda: jax.lax.with_sharding_constraint(wd, NamedSharding(EXPLICIT, P("tp", None))))
            assert got.sharding.spec == P("tp", None)
            np.testing.assert_array_equal(np.asarray(got), w)
            got = filter_shard_step(got, xd)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    text = str(warned[0].message)
    assert "with_sharding_constraint (shape (8, 8)): P(None, 'tp') -> P('tp', None) [explicit-constraint]" in text
    assert "asserts the value's sharding where every mesh axis is Explicit" in text
