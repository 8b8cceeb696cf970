"""correct_spec, get_corrected_named_sharding (ejkernel's semantics) and repair_spec on PartitionSpecs; unreduced and
reduced axes survive every helper. (tests/clients/test_ejkernel_specs.py compares with ejkernel itself.)"""

import jax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import correct_spec, get_corrected_named_sharding
from shardfix.jit.specs import from_named_sharding, repair_spec, to_named_sharding
from shardfix.sdy_syntax import parse_tensor_sharding


@pytest.fixture(scope="module")
def dp_mp():
    return jax.make_mesh((2, 4), ("dp", "mp"))


# What ejkernel 0.0.80.3 returns for each (checked against it in tests/clients/test_ejkernel_specs.py).
EJKERNEL_VECTORS = [
    ((12, 8), P(("dp", "mp")), P()),
    ((6, 8), P("mp"), P()),
    ((8, 6), P("dp", "mp"), P("dp", None)),
    ((2, 8), P("mp", "dp"), P(None, "dp")),
    ((12, 8), P(("mp", "dp")), P()),
    ((8, 8), P(("dp", "tp")), P()),  # an unknown axis: the whole entry goes
    ((8,), P("dp", "mp"), P("dp")),  # spec longer than the rank
    ((8, 8, 8), P("dp"), P("dp", None, None)),  # one entry per dimension
    ((8, 1024, 512), P("dp", "tp", None), P("dp", None, None)),
    ((8, 100, 512), P("dp", "mp", None), P("dp", "mp", None)),  # ejkernel's docstring example: already valid
    ((8, 8), P(P.UNCONSTRAINED, "mp"), P(None, "mp")),
    ((3, 8), P("dp", "dp"), P(None, "dp")),  # the indivisible duplicate goes first: no duplicate is left
    ((0, 8), P("dp"), P("dp", None)),
    ((), P("dp"), P()),
    ((8, 8), P(), P()),
]


@pytest.mark.parametrize("shape, spec, expected", EJKERNEL_VECTORS)
def test_ejkernel_vectors(dp_mp, shape, spec, expected):
    result = get_corrected_named_sharding(shape, spec, dp_mp)
    assert result.spec == expected and result.mesh == dp_mp


def test_size_one_axes_kept():
    mesh = jax.make_mesh((8, 1), ("x", "one"))
    assert get_corrected_named_sharding((8, 6), P("x", "one"), mesh).spec == P("x", "one")


def test_duplicates_left_in_the_result_raise_like_ejkernel(dp_mp):
    from jax.sharding import NamedSharding as NS
    with pytest.raises(Exception, match="has duplicate entries for `dp`") as caught:
        get_corrected_named_sharding((8, 8), P("dp", "dp"), dp_mp)
    with pytest.raises(type(caught.value)):
        NS(dp_mp, P("dp", "dp"))  # the same error JAX (and so ejkernel) raises


@pytest.mark.parametrize("policy, expected", [("drop", P()), ("prefix", P("dp", None)), ("subaxis", P("dp", None))])
def test_correct_spec_policies(dp_mp, policy, expected):
    assert correct_spec((12, 8), P(("dp", "mp")), dp_mp, policy=policy) == expected


def test_correct_spec_drops_duplicates_and_unknown(dp_mp):
    assert correct_spec((8, 8), P("dp", ("dp", "zz", "mp")), dp_mp) == P("dp", "mp")


def test_repair_spec_says_what_a_sub_axis_would_have_kept(dp_mp):
    fixed, reasons = repair_spec(P("mp", None), dp_mp, (6, 8), "subaxis")
    assert fixed == P(None, None)
    assert [(r.code, r.detail) for r in reasons] == [
        ("indivisible", "dim 0 of size 6 is not divisible by 'mp' (size 4); now None (size 1)"),
        ("indivisible", 'dim 0: the subaxis policy would keep the sub-axis {"mp":(1)2} ("mp":(1)2 is 2 of mp\'s 4 '
                        'devices), which a PartitionSpec can\'t hold; kept the longest dividing prefix of axes '
                        'instead (none)'),
    ]
    assert repair_spec(P("mp", None), dp_mp, (6, 8), "drop")[1][1:] == []  # drop wants no sub-axis


def test_repair_spec_names_only_and_valid_specs(dp_mp):
    spec = P("dp", None)
    assert repair_spec(spec, dp_mp, (8, 8), "subaxis") == (spec, [])  # valid: the same object, no reason
    assert repair_spec(P("dp"), dp_mp, (8, 8), "subaxis") == (P("dp"), [])  # shorter than the rank: valid
    fixed, reasons = repair_spec(P("mp", "fsdp"), dp_mp, None, "subaxis")  # shape unknown: names only
    assert fixed == P("mp", None) and [r.code for r in reasons] == ["unknown-axis"]



@pytest.mark.parametrize("spec, shape, expected_partitions", [
    (P("mp", None, unreduced={"dp"}), (6, 8), (None, None)),
    (P("mp", "fsdp", reduced={"dp"}), (6, 8), (None, None)),
    (P(None, "mp", unreduced={"dp"}), (8, 8), (None, "mp")),
])
def test_unreduced_and_reduced_survive_every_helper(dp_mp, spec, shape, expected_partitions):
    for result in (correct_spec(shape, spec, dp_mp, policy="subaxis"), repair_spec(spec, dp_mp, shape, "drop")[0],
                   get_corrected_named_sharding(shape, spec, dp_mp).spec):
        assert result.unreduced == spec.unreduced and result.reduced == spec.reduced
    assert repair_spec(spec, dp_mp, shape, "subaxis")[0].partitions == expected_partitions


def test_named_sharding_round_trip():
    # UNCONSTRAINED needs Auto axes
    dp_mp = jax.make_mesh((2, 4), ("dp", "mp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    named = NamedSharding(dp_mp, P(("dp", "mp"), None, P.UNCONSTRAINED))
    model = from_named_sharding(named, rank=4)
    assert model.body() == '<@mesh, [{"dp", "mp"}, {}, {?}, {}]>'
    assert to_named_sharding(model, dp_mp) == named
    with pytest.raises(ValueError, match="sub-axes"):
        to_named_sharding(parse_tensor_sharding('<@mesh, [{"mp":(1)2}]>'), dp_mp)
