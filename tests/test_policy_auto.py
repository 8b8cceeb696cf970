"""The auto policy (fix-shardings' default): inside a function, keep XLA's padded split of an indivisible dim when
it leaves each device fewer rows than any even split, repair when an even split is as cheap; at an entry
function's boundary (where JAX rejects indivisible shardings) always repair. Checked on the correction core (a
property over many shapes) and end to end through patch_lowered on 8 simulated devices."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix.correct import KEPT_PADDING, Site, correct_sharding
from shardfix.jit.lowering import patch_lowered
from shardfix.sharding import AxisRef, DimSharding, Mesh, TensorSharding

MESH = Mesh((("dp", 2), ("tp", 4)))


def rows_per_device(n: int, dim: DimSharding, mesh: Mesh) -> int:
    """What the partitioner gives each device: the rows of an even split, or of the padded one."""
    return -(-n // math.prod(a.size_in(mesh) for a in dim.axes))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5000), st.sampled_from([("dp",), ("tp",), ("dp", "tp"), ("tp", "dp")]))
def test_auto_never_gives_a_device_more_rows_than_padding(n, axes):
    before = TensorSharding("mesh", (DimSharding(tuple(AxisRef(a) for a in axes)),))
    after, reasons = correct_sharding(before, Site((n,)), {"mesh": MESH}, "auto")
    padded = rows_per_device(n, before.dims[0], MESH)
    assert rows_per_device(n, after.dims[0], MESH) <= padded
    if after == before and n % math.prod(a.size_in(MESH) for a in before.dims[0].axes):
        assert [r.code for r in reasons] == [KEPT_PADDING]  # a padded split kept says so
    subaxis, _ = correct_sharding(before, Site((n,)), {"mesh": MESH}, "subaxis")
    if rows_per_device(n, subaxis.dims[0], MESH) <= padded:
        assert after == subaxis  # an even split as cheap as padding is taken


def test_auto_repairs_at_the_entry_boundary():
    before = TensorSharding("mesh", (DimSharding((AxisRef("dp"), AxisRef("tp"))),))
    after, reasons = correct_sharding(before, Site((2050,), allow_subaxes=False), {"mesh": MESH}, "auto")
    assert after.body() == '<@mesh, [{"dp"}]>' and [r.code for r in reasons] == ["indivisible"]


def test_the_three_cases_through_patch_lowered():
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    cases = {  # (x shape, spec of the constrained value, expected: kept padded or the repair)
        "2050 rows over (dp, tp)": ((2050, 16), P(("dp", "tp"), None), None),
        "1 row over dp": ((1, 16), P("dp", None), '<@mesh, [{}, {}]>'),
        "2 columns over tp": ((4, 2), P(None, "tp"), '<@mesh, [{}, {"tp":(1)2}]>'),
    }
    for name, (shape, spec, repaired) in cases.items():
        def f(x):
            return jnp.sum(jnp.tanh(jax.lax.with_sharding_constraint(x * 2.0, NamedSharding(mesh, spec))), axis=0)

        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        lowered = jax.jit(f).lower(x)
        patched, report = patch_lowered(lowered, "fix-shardings")
        if repaired is None:
            assert patched is lowered and not report.fixes, name
            assert [r.message.split(": ", 1)[1].startswith("dim 0 of size 2050 over {\"dp\", \"tp\"} (size 8): "
                                                           "kept the padded split, 257 rows a device")
                    for r in report.remarks] == [True], name
        else:
            assert [fix.after for fix in report.fixes] == [repaired], name
        np.testing.assert_allclose(np.asarray(patched.compile()(x)), np.tanh(x * 2.0).sum(axis=0), rtol=1e-5,
                                   atol=1e-5)
