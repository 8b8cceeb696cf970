"""On 8 CPU devices: programs with indivisible shardings give the same results after fix-shardings, and their
compiled HLO no longer pads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from support.hlo import pad_count as pads
from shardfix.jit.lowering import patch_lowered


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() == 8
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


CONSTRAINT_LINE = next(i for i, line in enumerate(open(__file__), 1) if line.rstrip().endswith("# fixed here"))


def constrained(mesh, spec):
    def f(x):
        y = jax.lax.with_sharding_constraint(jnp.sin(x) * 2.0, NamedSharding(mesh, spec))  # fixed here
        return jnp.tanh(y) + 1.0
    return f


def reference(x):
    return np.tanh(np.sin(x) * 2.0) + 1.0


@pytest.mark.parametrize("shape, spec, policy, expected", [
    ((6, 8), P("tp", None), "subaxis", '<@mesh, [{"tp":(1)2}, {}]>'),
    ((6, 8), P("tp", None), "drop", '<@mesh, [{}, {}]>'),
    ((12, 8), P(("dp", "tp"), None), "subaxis", '<@mesh, [{"dp", "tp":(1)2}, {}]>'),
    ((12, 8), P(("dp", "tp"), None), "prefix", '<@mesh, [{"dp"}, {}]>'),
    ((8, 6), P("dp", "tp"), "subaxis", '<@mesh, [{"dp"}, {"tp":(1)2}]>'),
])
def test_fixed_program_is_equal_and_unpadded(mesh, shape, spec, policy, expected):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) / 7.0
    lowered = jax.jit(constrained(mesh, spec)).lower(x)
    unfixed = lowered.compile()
    assert pads(unfixed.as_text()) > 0  # XLA pads the indivisible constraint

    patched, report = patch_lowered(lowered, f"fix-shardings{{policy={policy}}}")
    assert [f.after for f in report.fixes] == [expected]
    assert report.fixes[0].location == f"{__file__}:{CONSTRAINT_LINE}"  # the user's with_sharding_constraint
    fixed = patched.compile()
    assert pads(fixed.as_text()) == 0
    np.testing.assert_allclose(np.asarray(fixed(x)), reference(x), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(fixed(x)), np.asarray(unfixed(x)), rtol=0, atol=0)


def test_jax_cached_module_is_not_edited(mesh):
    x = np.ones((6, 8), np.float32)
    lowered = jax.jit(constrained(mesh, P("tp", None))).lower(x)
    before = lowered.as_text()
    patch_lowered(lowered)
    assert lowered.as_text() == before
    assert '{"tp"}' in jax.jit(constrained(mesh, P("tp", None))).lower(x).as_text()


def test_valid_program_is_returned_unchanged(mesh):
    x = np.ones((8, 8), np.float32)
    lowered = jax.jit(constrained(mesh, P("tp", None))).lower(x)
    patched, report = patch_lowered(lowered)
    assert patched is lowered and not report
