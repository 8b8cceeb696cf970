"""correct_spec and get_corrected_named_sharding (ejkernel's documented semantics)."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from shardfix import correct_spec, get_corrected_named_sharding
from shardfix.jit.specs import from_named_sharding, to_named_sharding
from shardfix.sharding import parse_tensor_sharding


def mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names))


@pytest.fixture(scope="module")
def dp_mp():
    return mesh((2, 4), ("dp", "mp"))


@pytest.mark.parametrize("shape, spec, expected", [
    ((12, 8), P(("dp", "mp")), P()),
    ((6, 8), P("mp"), P()),
    ((8, 6), P("dp", "mp"), P("dp")),
    ((2, 8), P("mp", "dp"), P(None, "dp")),
    ((12, 8), P(("mp", "dp")), P()),
    ((8, 8), P(("dp", "tp")), P()),  # unknown axis: the whole entry goes
    ((8,), P("dp", "mp"), P("dp")),  # spec longer than the rank
    ((8, 1024, 512), P("dp", "tp", None), P("dp")),
    ((8, 100, 512), P("dp", "mp", None), P("dp", "mp")),  # ejkernel's docstring example: already valid
    ((8, 8), P(P.UNCONSTRAINED, "mp"), P(None, "mp")),
])
def test_ejkernel_vectors(dp_mp, shape, spec, expected):
    result = get_corrected_named_sharding(shape, spec, dp_mp)
    assert result.spec == expected and result.mesh == dp_mp


def test_size_one_axes_kept():
    m = mesh((8, 1), ("x", "one"))
    assert get_corrected_named_sharding((8, 6), P("x", "one"), m).spec == P("x", "one")


def test_duplicates_are_refused_like_jax(dp_mp):
    with pytest.raises(Exception, match="(?i)duplicate"):
        get_corrected_named_sharding((8, 8), P("dp", "dp"), dp_mp)


@pytest.mark.parametrize("policy, expected", [("drop", P()), ("prefix", P("dp")), ("subaxis", P("dp"))])
def test_correct_spec_policies(dp_mp, policy, expected):
    assert correct_spec((12, 8), P(("dp", "mp")), dp_mp, policy=policy) == expected


def test_correct_spec_drops_duplicates_and_unknown(dp_mp):
    assert correct_spec((8, 8), P("dp", ("dp", "zz", "mp")), dp_mp) == P("dp", "mp")


def test_named_sharding_round_trip(dp_mp):
    from jax.sharding import NamedSharding
    named = NamedSharding(dp_mp, P(("dp", "mp"), None, P.UNCONSTRAINED))
    model = from_named_sharding(named, rank=4)
    assert model.body() == '<@mesh, [{"dp", "mp"}, {}, {?}, {}]>'
    assert to_named_sharding(model, dp_mp) == named
    with pytest.raises(ValueError, match="sub-axes"):
        to_named_sharding(parse_tensor_sharding('<@mesh, [{"mp":(1)2}]>'), dp_mp)
