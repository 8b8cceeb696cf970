"""The correction core: vectors from Shardy/MaxText/ejkernel, and properties checked by the real sdy verifier."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfix.correct import CorrectionError, Site, correct_sharding
from shardfix.sdy_syntax import parse_tensor_sharding
from shardfix.sharding import Mesh, shard_count
from strategies import meshes, tensor_shardings

DP_MP = {"mesh": Mesh((("dp", 2), ("mp", 4)))}


def fix(text, shape, policy="subaxis", meshes=DP_MP, **site):
    fixed, reasons = correct_sharding(parse_tensor_sharding(text), Site(tuple(shape), **site), meshes, policy)
    return fixed.body(), [r.code for r in reasons]


@pytest.mark.parametrize("shape, before, subaxis, prefix, drop", [
    # (vectors of shared notes, section 3: Shardy getEvenlySharded | MaxText-like prefix | ejkernel drop)
    ((12, 8), '{"dp", "mp"}, {}', '{"dp", "mp":(1)2}, {}', '{"dp"}, {}', "{}, {}"),
    ((6, 8), '{"mp"}, {}', '{"mp":(1)2}, {}', "{}, {}", "{}, {}"),
    ((8, 6), '{"dp"}, {"mp"}', '{"dp"}, {"mp":(1)2}', '{"dp"}, {}', '{"dp"}, {}'),
    ((2, 8), '{"mp"}, {"dp"}', '{"mp":(1)2}, {"dp"}', '{}, {"dp"}', '{}, {"dp"}'),
    ((12, 8), '{"mp", "dp"}, {}', '{"mp"}, {}', '{"mp"}, {}', "{}, {}"),
    ((8, 100), '{"dp"}, {"mp"}', '{"dp"}, {"mp"}', '{"dp"}, {"mp"}', '{"dp"}, {"mp"}'),
])
def test_policy_vectors(shape, before, subaxis, prefix, drop):
    for policy, expected in (("subaxis", subaxis), ("prefix", prefix), ("drop", drop)):
        assert fix(f"<@mesh, [{before}]>", shape, policy)[0] == f"<@mesh, [{expected}]>", policy


def test_three_axes_vector():
    meshes = {"mesh": Mesh((("a", 2), ("b", 4), ("c", 2)))}
    assert fix('<@mesh, [{"a", "b", "c"}, {}]>', (4, 8), meshes=meshes)[0] == '<@mesh, [{"a", "b":(1)2}, {}]>'


def test_no_subaxes_at_entry_boundary():
    assert fix('<@mesh, [{"dp", "mp"}, {}]>', (12, 8), allow_subaxes=False)[0] == '<@mesh, [{"dp"}, {}]>'


def test_unknown_axis_then_divisibility():
    assert fix('<@mesh, [{"dp", "tp"}, {}]>', (8, 8)) == ('<@mesh, [{"dp"}, {}]>', ["unknown-axis"])


def test_a_duplicate_axis_stays_where_it_divides():
    # the first use wins, unless it doesn't divide its dim and a later one does: that one keeps the axis
    for policy in ("auto", "subaxis", "prefix", "drop"):
        assert fix('<@mesh, [{"dp"}, {"dp"}]>', (3, 16), policy) == ('<@mesh, [{}, {"dp"}]>', ["duplicate-axis"])
    assert fix('<@mesh, [{"dp"}, {"dp"}]>', (4, 16)) == ('<@mesh, [{"dp"}, {}]>', ["duplicate-axis"])
    assert fix('<@mesh, [{"dp"}, {"dp"}]>', (3, 5)) == ('<@mesh, [{}, {}]>', ["duplicate-axis", "indivisible"])
    # a manual axis sets the body's local shapes: it stays on the dim it is written on
    assert fix('<@mesh, [{"dp"}, {"mp", "dp"}]>', (4, 16), manual_axes=frozenset({"dp"}))[0] == \
        '<@mesh, [{"dp"}, {"mp"}]>'


def test_size_one_axes_are_kept():
    meshes = {"mesh": Mesh((("x", 8), ("one", 1)))}
    assert fix('<@mesh, [{"x"}, {"one"}]>', (8, 6), meshes=meshes) == ('<@mesh, [{"x"}, {"one"}]>', [])


def test_manual_axis_indivisible_is_an_error():
    with pytest.raises(CorrectionError, match="manual axes"):
        fix('<@mesh, [{"mp"}, {}]>', (6, 8), manual_axes=frozenset({"mp"}))
    assert fix('<@mesh, [{"dp", "mp"}, {}]>', (6, 8), manual_axes=frozenset({"dp"}))[0] == \
        '<@mesh, [{"dp"}, {}]>'


def _verifies(ctx, mesh, sharding, shape) -> bool:
    from jax._src.lib.mlir import ir
    ttype = f"tensor<{'x'.join(map(str, shape))}xf32>" if shape else "tensor<f32>"
    text = (f"sdy.mesh @mesh = {mesh}\n"
            f"func.func private @f(%arg0: {ttype} {{sdy.sharding = {sharding}}}) -> {ttype} {{\n"
            f"  return %arg0 : {ttype}\n}}")
    with ctx:
        try:
            ir.Module.parse(text)
            return True
        except ir.MLIRError as e:
            raise AssertionError(f"{sharding} on {ttype}: {e}") from None


@settings(max_examples=400, deadline=None)
@given(meshes(), tensor_shardings(), st.lists(st.integers(1, 24), max_size=4))
def test_any_sharding_becomes_valid_and_divisible(ctx, mesh, sharding, shape):
    meshes_ = {"mesh": mesh}
    shards = {}
    for policy in ("subaxis", "prefix", "drop"):
        fixed, _ = correct_sharding(sharding, Site(tuple(shape)), meshes_, policy)
        assert _verifies(ctx, mesh, fixed, shape)
        for d, n in zip(fixed.dims, shape):
            assert n % math.prod(a.size_in(mesh) for a in d.axes) == 0
        again, reasons = correct_sharding(fixed, Site(tuple(shape)), meshes_, policy)
        assert again == fixed and not reasons  # idempotent
        shards[policy] = shard_count(fixed, mesh)
    assert shards["subaxis"] >= shards["prefix"] >= shards["drop"]


@settings(max_examples=200, deadline=None)
@given(meshes(), st.lists(st.integers(1, 24), max_size=4), st.data())
def test_valid_divisible_shardings_are_left_alone(ctx, mesh, shape, data):
    sharding = data.draw(tensor_shardings(names=list(mesh.axis_names), max_rank=len(shape)))
    try:
        _verifies(ctx, mesh, sharding, shape)
    except AssertionError:
        return  # only valid inputs are of interest here
    if any(n % math.prod(a.size_in(mesh) for a in d.axes) for d, n in zip(sharding.dims, shape)):
        return
    assert correct_sharding(sharding, Site(tuple(shape)), {"mesh": mesh}) == (sharding, [])
