"""ring-reorder on 8 CPU devices: position-carrying ring attention (plain and tile-skipping) gives the same results
reordered as not and as dense causal attention; the axis_index ring is left alone and stays right; the inserted
permutation moves at most one local shard per device and gathers nothing."""

import jax
import numpy as np
import pytest
from jaxlib.mlir import ir

from shardfix import autofix_shardings
from support import ring_models
from support.hlo import collective_bytes
from shardfix.jit.lowering import patch_lowered
from support.ring_models import (axis_index_ring_attention, dense_causal_attention, position_ring_attention,
                                  tile_skipping_ring_attention)

MESHES = {"dp2xcp4": ((2, 4), 32), "cp8": ((1, 8), 64)}


def inputs(batch, length, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((batch, length, dim)).astype(np.float32) for _ in range(3))
    pos = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length)).copy()
    return q, k, v, pos


@pytest.fixture(scope="module", params=MESHES, ids=MESHES)
def setup(request):
    shape, length = MESHES[request.param]
    mesh = jax.make_mesh(shape, ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    return mesh, inputs(shape[0] * 2, length)


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("variant", ["plain", "tile-skipping"])
def test_reordered_equals_unreordered_and_dense(setup, strategy, variant):
    mesh, (q, k, v, pos) = setup
    make = position_ring_attention if variant == "plain" else tile_skipping_ring_attention
    args = (q, k, v, pos, pos)
    lowered = jax.jit(make(mesh)).lower(*args)
    patched, report = patch_lowered(lowered, f"ring-reorder{{strategy={strategy}}}")
    [decision] = report.rings
    if variant == "tile-skipping" and strategy == "striped":
        # The skip decides per half block, so a stripe must hold whole halves; moving at most one shard a device
        # then needs cp * cp * half tokens, more than there are.
        cp, half = mesh.shape["cp"], q.shape[1] // mesh.shape["cp"] // 2
        assert (decision.strategy, decision.applied) == (f"striped{{stripe={half}}}", False)
        assert decision.why == f"sequence length {q.shape[1]} is not a multiple of cp*cp*stripe = {cp * cp * half}"
        # One-token stripes would split the halves: the pair of halves a device skips would differ between orders.
        _, report = patch_lowered(lowered, "ring-reorder{strategy=striped stripe=1}")
        source = ring_models.__file__
        with open(source) as f:
            line = next(i for i, text in enumerate(f, 1) if "acc_q = jax.lax.cond(" in text)
        assert [r.why for r in report.rings] == [
            f"not provably safe with striped{{stripe=1}}: 'stablehlo.case' at {source}:{line} reads positions of "
            f"units of {half} tokens, which are not a whole part of the 1-token stripe"]
        return
    assert (decision.axis, decision.applied) == ("cp", True), decision.why
    plain_out = lowered.compile()(*args)
    fixed_out = patched.compile()(*args)
    np.testing.assert_allclose(np.asarray(fixed_out), np.asarray(plain_out), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(fixed_out), np.asarray(dense_causal_attention(q, k, v)), atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
def test_permutation_moves_at_most_one_shard_and_gathers_nothing(setup, strategy):
    mesh, (q, k, v, pos) = setup
    args = (q, k, v, pos, pos)
    lowered = jax.jit(position_ring_attention(mesh)).lower(*args)
    patched, _ = patch_lowered(lowered, f"ring-reorder{{strategy={strategy}}}")
    before, after = (collective_bytes(c.compile().as_text()) for c in (lowered, patched))
    assert "all-gather" not in after
    added = sorted(after.get("collective-permute", []) + after.get("all-to-all", []))
    for b in before.get("collective-permute", []):
        added.remove(b)
    # q, k, v, q_pos, k_pos reordered before the region and the output after it: one local shard each, in total
    # (zigzag: two half shards; striped: one all_to_all whose cp pieces make one shard, one piece staying home).
    local_bytes = [a.nbytes // mesh.size for a in (q, k, v, pos, pos, q)]
    assert sum(added) == sum(local_bytes)
    assert len(added) == (12 if strategy == "zigzag" else 6)


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
def test_axis_index_positions_are_rewritten(setup, strategy):
    """Positions computed as axis_index * L + iota: the reads of those positions get the new order's positions."""
    mesh, (q, k, v, _) = setup
    lowered = jax.jit(axis_index_ring_attention(mesh)).lower(q, k, v)
    patched, report = patch_lowered(lowered, f"ring-reorder{{strategy={strategy}}}")
    [decision] = report.rings
    assert decision.applied and "2 position read(s) rewritten" in decision.why, decision.why
    np.testing.assert_allclose(np.asarray(patched.compile()(q, k, v)), np.asarray(dense_causal_attention(q, k, v)),
                               atol=1e-5, rtol=1e-5)


def test_decorator_reorders_and_reports(setup):
    mesh, (q, k, v, pos) = setup
    f = autofix_shardings(position_ring_attention(mesh), ring_reorder="zigzag")
    lowered = f.lower(q, k, v, pos, pos)
    assert [(r.axis, r.strategy, r.applied) for r in lowered.rings] == [("cp", "zigzag", True)]
    assert "shardfix.ring_reorder" in lowered.as_text()
    np.testing.assert_allclose(np.asarray(f(q, k, v, pos, pos)), np.asarray(dense_causal_attention(q, k, v)),
                               atol=1e-5, rtol=1e-5)
    off = autofix_shardings(position_ring_attention(mesh), ring_reorder="off").lower(q, k, v, pos, pos)
    assert off.rings == [] and "shardfix.ring_reorder" not in off.as_text()


@pytest.mark.parametrize("groups, expected", [
    ('dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>', [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ('#stablehlo.replica_group_mesh_axes<mesh = @m, axes = [#stablehlo.axis_ref<name = "cp">]>',
     [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ('#stablehlo.replica_group_mesh_axes<mesh = @m, axes = [#stablehlo.axis_ref<name = "dp">]>',
     [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ('#stablehlo.replica_group_mesh_axes<mesh = @m, axes = [#stablehlo.axis_ref<name = "cp">, '
     '#stablehlo.axis_ref<name = "dp">]>', [[0, 4, 1, 5, 2, 6, 3, 7]]),
])
def test_replica_groups_in_both_spellings(groups, expected):
    """Collectives name their groups either as partition ids or (newer JAX) as axes of an sdy.mesh; both read the
    same; without the mesh it names, the mesh-axes form is not read at all (the collective is then refused)."""
    from shardfix.ir.context import make_context
    from shardfix.ring.detect import module_meshes, replica_groups
    text = ('module {\n  sdy.mesh @m = <["dp"=2, "cp"=4]>\n'
            '  func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n'
            '    %0 = "stablehlo.all_reduce"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, '
            f'replica_groups = {groups}, use_global_device_ids}}> ({{\n'
            '    ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n'
            '      %s = stablehlo.add %a, %b : tensor<f32>\n      stablehlo.return %s : tensor<f32>\n'
            '    }) : (tensor<4xf32>) -> tensor<4xf32>\n    return %0 : tensor<4xf32>\n  }\n}\n')
    with make_context():
        module = ir.Module.parse(text)
        op = module.body.operations[1].regions[0].blocks[0].operations[0]
        assert replica_groups(op.attributes["replica_groups"], module_meshes(module.operation)).tolist() == expected
        if groups.startswith("#"):
            assert replica_groups(op.attributes["replica_groups"], {}) is None


def test_ring_in_a_nested_shard_map_is_reordered():
    """A ring inside a shard_map inside another (dp outer, cp inner): the permutations bind only the axes the
    parent leaves, and the outer region, whose collectives are all the inner one's, is no ring of its own. Forward
    (reordered) and gradient (whatever is decided for its backward ring) equal to jax.jit's."""
    from support.ring_kernels import scan_ring_attention
    from jax.sharding import PartitionSpec as P
    mesh = jax.make_mesh((2, 4), ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    kernel = scan_ring_attention("cp", 4, 4)

    def inner(q, k, v):
        return jax.shard_map(kernel, in_specs=(P(None, "cp"),) * 3, out_specs=P(None, "cp"), axis_names={"cp"},
                             check_vma=False)(q, k, v)

    f = jax.shard_map(inner, mesh=mesh, in_specs=(P("dp"),) * 3, out_specs=P("dp"), axis_names={"dp"},
                      check_vma=False)
    q, k, v, _ = inputs(4, 32)
    loss = lambda q, k, v: (f(q, k, v) ** 2).sum()  # noqa: E731
    for program, args in ((f, (q, k, v)), (jax.grad(loss, argnums=(0, 1, 2)), (q, k, v))):
        low = autofix_shardings(program).lower(*args)
        if program is f:
            assert [r.applied for r in low.rings] == [True], [r.why for r in low.rings]
        got, want = low.compile()(*args), jax.jit(program)(*args)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
