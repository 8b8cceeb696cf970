"""The pure model: exact round trips with the printed sdy syntax and with jaxlib's sdy attributes."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfix.sdy_syntax import parse_mesh, parse_sharding_per_value, parse_tensor_sharding
from shardfix.sharding import (AxisRef, DimSharding, Mesh, ShardingPerValue, ShardingSyntaxError, TensorSharding,
                               from_spec_entries, parse_mesh_spec, shard_count, to_spec_entries, UNCONSTRAINED)
from strategies import meshes, tensor_shardings


@settings(max_examples=300, deadline=None)
@given(tensor_shardings(mesh_names=("mesh", "m2", "weird.name")))
def test_text_round_trip(sharding):
    assert parse_tensor_sharding(str(sharding)) == sharding
    assert parse_tensor_sharding(sharding.body()) == sharding


@settings(max_examples=300, deadline=None)
@given(tensor_shardings(), meshes())
def test_attribute_round_trip_matches_mlir_printer(ctx, sharding, inline_mesh):
    """Built through jaxlib's sdy classes, read back equal, and printed by MLIR exactly as we print it."""
    from shardfix.ir import sharding_from_attr, sharding_to_attr
    from jax._src.lib.mlir import ir
    for s in (sharding, TensorSharding(inline_mesh, sharding.dims, sharding.replicated, sharding.unreduced)):
        with ctx:
            attr = sharding_to_attr(s)
            assert str(attr) == str(s)
            assert sharding_from_attr(attr) == s
            assert sharding_from_attr(ir.Attribute.parse(str(s))) == s


@settings(max_examples=100, deadline=None)
@given(st.lists(tensor_shardings(), max_size=3))
def test_per_value_round_trip(ctx, shardings):
    from shardfix.ir import per_value_to_attr
    value = ShardingPerValue(tuple(shardings))
    assert parse_sharding_per_value(str(value)) == value
    with ctx:
        assert str(per_value_to_attr(shardings)) == str(value)


@settings(max_examples=100, deadline=None)
@given(meshes(), st.one_of(st.none(), st.lists(st.integers(0, 63), min_size=1, max_size=8)))
def test_mesh_round_trip(ctx, mesh, ids):
    from shardfix.ir import mesh_from_attr, mesh_to_attr
    mesh = Mesh(mesh.axes, None if ids is None else tuple(ids))
    assert parse_mesh(str(mesh)) == mesh
    with ctx:
        attr = mesh_to_attr(mesh)
        assert str(attr) == "#sdy.mesh" + str(mesh)
        assert mesh_from_attr(attr) == mesh


def test_printed_forms():
    s = TensorSharding("mesh", (DimSharding((AxisRef("a"), AxisRef("b", 1, 2))), DimSharding((), False, 1),
                                DimSharding((AxisRef("c"),), False, 0), DimSharding()),
                       (AxisRef("d"),), (AxisRef("e"),))
    assert str(s) == '#sdy.sharding<@mesh, [{"a", "b":(1)2}, {?}p1, {"c", ?}p0, {}], replicated={"d"}, unreduced={"e"}>'
    assert str(Mesh((("a", 2),), (1, 0))) == '<["a"=2], device_ids=[1, 0]>'
    assert Mesh((), (3,)).is_maximal


@pytest.mark.parametrize("text, message", [
    ('<@mesh, [{"a"}', "expected ','"),
    ('<@mesh, [{a}]>', "expected a quoted axis name"),
    ('<@mesh, [{"a":(x)2}]>', "expected an integer"),
    ('<@mesh, []> trailing', "unexpected trailing text"),
])
def test_syntax_errors(text, message):
    with pytest.raises(ShardingSyntaxError, match=message.replace("(", r"\(")):
        parse_tensor_sharding(text)


def test_partition_spec_entries_round_trip():
    s = from_spec_entries(("dp", None, ("tp", "sp"), UNCONSTRAINED), "mesh", rank=5)
    assert s.body() == '<@mesh, [{"dp"}, {}, {"tp", "sp"}, {?}, {}]>'
    assert to_spec_entries(s) == ("dp", None, ("tp", "sp"), UNCONSTRAINED)
    with pytest.raises(ValueError, match="sub-axes"):
        to_spec_entries(parse_tensor_sharding('<@mesh, [{"tp":(1)2}]>'))


def test_mesh_spec_and_counts():
    mesh = parse_mesh_spec("dp=2, tp=4")
    assert mesh.axes == (("dp", 2), ("tp", 4)) and mesh.size == 8
    assert shard_count(parse_tensor_sharding('<@m, [{"dp", "tp":(1)2}, {"zz"}]>'), mesh) == 4
    for bad in ("", "dp", "dp=2,,tp=2", "1x=2"):
        with pytest.raises(ValueError):
            parse_mesh_spec(bad)
