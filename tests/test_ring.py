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
        assert (decision.strategy, decision.applied, decision.why) == {
            4: ("striped{stripe=4}", False, "sequence length 32 is not a multiple of cp*cp*stripe = 64"),
            8: ("striped{stripe=4}", False, "sequence length 64 is not a multiple of cp*cp*stripe = 256"),
        }[mesh.shape["cp"]]
        # One-token stripes would split the halves: the pair of halves a device skips would differ between orders.
        _, report = patch_lowered(lowered, "ring-reorder{strategy=striped stripe=1}")
        source = ring_models.__file__
        with open(source) as f:
            line = next(i for i, text in enumerate(f, 1) if "acc_q = jax.lax.cond(" in text)
        assert [r.why for r in report.rings] == [
            f"not provably safe with striped{{stripe=1}}: 'stablehlo.case' at {source}:{line} reads positions of "
            "units of 4 tokens, which are not a whole part of the 1-token stripe"]
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


# ---------------------------------------------------------------------------------------------------------------
# The layout the kernel's cost picks: tiles counted from its skip conditionals at compile time.

CP4 = jax.make_mesh((2, 4), ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _compile_time_tiles(lowered, layouts):
    """{layout: [device][step] tiles} of the lowered program's one proved ring region, counted by ring/cost.py
    (layout None: as written; else (strategy, stripe))."""
    from shardfix.ir import make_context, parse_module
    from shardfix.ring.cost import Counter
    from shardfix.ring.detect import axis_strides, module_funcs
    from shardfix.ring.prove import prove_rings
    ctx = make_context()
    module = parse_module(lowered.as_text(), ctx, "<lowered>")
    with ctx:
        (v,) = prove_rings(module.operation)
        assert v.proved, v.why
        counter = Counter(module_funcs(module.operation), {r.op for r in v.rewrites})
        stride = axis_strides(v.ring.mesh)["cp"]
        pids = [c * stride for c in range(v.ring.cp)]
        return {layout: [list(row) for row in counter.count(
            v.ring.region, pids, v.rewrites, None if layout is None else (*layout, v.ring.cp, v.block), "").counts]
            for layout in layouts}


def test_tiles_counted_at_compile_time_are_the_running_programs():
    """The causal blockwise kernel (chunk pairs above the diagonal skipped with lax.cond) at cp=4, two chunks a
    device: the tiles each device computes at each ring step, counted at compile time, as written and zigzag, are
    the ones the running program computes (its skip conditionals logged as it runs)."""
    from jax.sharding import PartitionSpec as P
    from support import tiles
    from support.ring_kernels import scan_ring_attention
    spec = P("dp", "cp")
    logged = tiles.with_skip_log(scan_ring_attention("cp", 4, 4), CP4, (spec,) * 3, spec, entries=16)
    q, k, v, _ = inputs(2, 32)
    plain = jax.jit(logged).lower(q, k, v)
    counted = _compile_time_tiles(plain, [None, ("zigzag", 0)])
    assert counted[None] == [[3, 0, 0, 0], [3, 4, 0, 0], [3, 4, 4, 0], [3, 4, 4, 4]]
    assert counted[("zigzag", 0)] == [[3, 2, 2, 2]] * 4
    fixed = autofix_shardings(logged).lower(q, k, v)
    (decision,) = fixed.rings
    assert (decision.strategy, decision.applied, decision.critical_before, decision.critical_after,
            decision.ideal) == ("zigzag", True, 15, 9, 9.0)
    for program, expected in ((plain, counted[None]), (fixed, counted[("zigzag", 0)])):
        out, log = tiles.instrumented(program).compile()(q, k, v)
        ran = tiles.tiles_per_step(np.asarray(log), 4)
        assert ran[:4].tolist() == ran[4:].tolist() == expected  # rows in mesh order: a ring per dp
        np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(logged)(q, k, v)[0]), atol=1e-5, rtol=1e-5)


def _window_ring_attention(axis, cp, chunk, window):
    """Blockwise sliding-window causal ring attention (as in Mistral-style kernels): a query attends to the
    `window` keys up to itself; a chunk pair none of whose (query, key) pairs is in the window is skipped with
    lax.cond, decided from the chunks' global positions."""
    import jax.numpy as jnp
    from support.ring_kernels import NEG, _merge, _positions

    def kernel(q, k, v):
        b, n, _ = q.shape
        me = jax.lax.axis_index(axis)

        def ring_step(carry, s):
            acc, k, v = carry
            src = (me - s) % cp
            kc, vc = (x.reshape((b, n // chunk, chunk) + x.shape[2:]).swapaxes(0, 1) for x in (k, v))
            parts = []
            for i in range(n // chunk):
                q_first = me * n + i * chunk
                qi = q[:, i * chunk:(i + 1) * chunk]

                def kv_chunk(acc_i, xs, qi=qi, q_first=q_first):
                    kj, vj, j = xs
                    k_first = src * n + j * chunk
                    q_pos, k_pos = _positions(q_first, chunk, b), _positions(k_first, chunk, b)
                    gap = q_pos[:, :, None] - k_pos[:, None, :]
                    s_ij = jnp.einsum("bqd,bkd->bqk", qi, kj)
                    s_ij = jnp.where((gap >= 0) & (gap < window), s_ij, NEG)
                    live = (q_first + chunk - 1 >= k_first) & (q_first - (k_first + chunk - 1) < window)
                    return jax.lax.cond(live, lambda a: _merge(a, s_ij, vj), lambda a: a, acc_i), None

                acc_i = tuple(a[:, i * chunk:(i + 1) * chunk] for a in acc)
                parts.append(jax.lax.scan(kv_chunk, acc_i, (kc, vc, jnp.arange(n // chunk)))[0])
            acc = tuple(jnp.concatenate([p[t] for p in parts], axis=1) for t in range(3))
            ring = [(i, (i + 1) % cp) for i in range(cp)]
            return (acc,) + tuple(jax.lax.ppermute(t, axis, ring) for t in (k, v)), None

        zero = q[..., 0] * 0
        ((m, l, o), _, _), _ = jax.lax.scan(ring_step, ((zero + NEG, zero, q * 0), k, v), jnp.arange(cp))
        return o / l[..., None]
    return kernel


@pytest.mark.parametrize("window, applied, before, after, ideal", [(4, False, 4, 4, 3.75), (24, True, 14, 9, 8.75)])
def test_a_sliding_window_is_reordered_only_when_long(window, applied, before, after, ideal):
    """A short window leaves every device about the same work at every step (the count says so, and the ring is
    left alone); a long one is nearly causal, and zigzag pays. Results equal to jax.jit's either way."""
    from jax.sharding import PartitionSpec as P
    f = jax.shard_map(_window_ring_attention("cp", 4, 4, window), mesh=CP4, in_specs=(P("dp", "cp"),) * 3,
                      out_specs=P("dp", "cp"), check_vma=False)
    q, k, v, _ = inputs(2, 32)
    low = autofix_shardings(f).lower(q, k, v)
    (d,) = low.rings
    assert (d.applied, d.critical_before, d.critical_after, d.ideal) == (applied, before, after, ideal), d
    assert d.strategy == ("zigzag" if applied else "auto")
    if not applied:
        assert d.why.startswith("balanced as written: 4 tiles on the critical path (ideal 3.75)"), d.why
    np.testing.assert_allclose(np.asarray(low.compile()(q, k, v)), np.asarray(jax.jit(f)(q, k, v)), atol=1e-5,
                               rtol=1e-5)


def test_a_ring_without_skips_is_left_alone():
    """Non-causal work (every tile computed: no skip conditional) costs the same in every layout: left alone,
    saying so, forward and backward."""
    from support.ring_kernels import fori_ring_attention, sharded
    f = sharded(fori_ring_attention("cp", 4), CP4)
    q, k, v, _ = inputs(2, 32)
    loss = lambda q, k, v: (f(q, k, v) ** 2).sum()  # noqa: E731
    low = autofix_shardings(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v)
    assert [(d.applied, d.strategy, d.critical_before) for d in low.rings] == [(False, "auto", None)] * 2
    assert all(d.why == "balanced as written: the ring has no skip conditional, so the kernel computes every tile "
               "and every layout costs the same" for d in low.rings)
    assert "shardfix.sequence_permutation" not in low.as_text()


def test_skips_decided_by_data_leave_the_choice_to_the_user():
    """Skips decided by positions passed in as data can't be counted at compile time: the decision says what it
    rests on and leaves the ring as written; strategy=zigzag still reorders it (and stays right)."""
    q, k, v, pos = inputs(4, 32)
    f = tile_skipping_ring_attention(CP4)
    (d,) = autofix_shardings(f).lower(q, k, v, pos, pos).rings
    assert (d.applied, d.strategy) == (False, "auto")
    assert d.why == ("every skip decision depends on data (positions or segment ids passed in), so the count can't "
                     "tell layouts apart: left as written (strategy=zigzag reorders it anyway)")
    forced = autofix_shardings(f, ring_reorder="zigzag")
    assert [r.applied for r in forced.lower(q, k, v, pos, pos).rings] == [True]
    np.testing.assert_allclose(np.asarray(forced(q, k, v, pos, pos)), np.asarray(jax.jit(f)(q, k, v, pos, pos)),
                               atol=1e-5, rtol=1e-5)


def test_a_group_equal_to_a_proved_one_takes_its_verdict():
    """Layers each under their own shard_map (no function shared): a group (a layer's forward and backward rings)
    with the key of a proved one takes its verdict, ops moved to the same places, which is the one proving it
    directly gives."""
    from jax.sharding import PartitionSpec as P
    from shardfix.ir import make_context, parse_module
    from shardfix.ring.detect import module_funcs
    from shardfix.ring.memo import GroupMemo
    from shardfix.ring.prove import prove_rings
    from support.ring_kernels import scan_ring_attention

    def loss(ws, x):
        for w in ws:
            f = jax.shard_map(scan_ring_attention("cp", 4, 4), mesh=CP4, in_specs=(P("dp", "cp"),) * 3,
                              out_specs=P("dp", "cp"), check_vma=False)
            x = x + f(x @ w, x, x)
        return (x ** 2).sum()

    q, _, _, _ = inputs(2, 32)
    text = jax.jit(jax.grad(loss)).lower([np.eye(8, dtype=np.float32)] * 3, q).as_text()
    ctx = make_context()
    module = parse_module(text, ctx, "<lowered>")
    with ctx:
        verdicts = prove_rings(module.operation)
        by_group: dict = {}
        for v in verdicts:
            by_group.setdefault(v.group, []).append(v)
        groups = list(by_group.values())
        assert len(groups) == 3 and all(v.proved and v.rewrites for v in verdicts)
        memo = GroupMemo(module_funcs(module.operation))
        facts = lambda v: ({(r.calls, r.op, r.operand, r.unit) for r in v.rewrites}, v.units,  # noqa: E731
                           v.sequence_operands, v.sequence_results, v.proved, v.block, v.length, v.ring.region)
        carried_over = 0
        for group in groups:
            regions = [v.ring for v in group]
            key = memo.key(regions)
            carried = memo.get(key, regions)
            if carried is None:
                memo.put(key, regions, group)
                continue
            carried_over += 1
            assert [facts(c) for c in carried] == [facts(v) for v in group]
        # the first layer's backward gives no gradient for the input: its group differs; the others are equal
        assert carried_over == 1
