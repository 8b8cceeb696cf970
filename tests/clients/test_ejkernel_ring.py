"""ejkernel's XLA ring attention (pinned test-only client), unmodified, through `@autofix_shardings` with its
default options: causal, with and without position ids, forward and gradients (its custom_vjp backward). A ring
whose kernel skips the chunk pairs above the causal diagonal is reordered (zigzag by default; striped where the
kernel's chunks divide the stripe); one whose kernel computes every pair (given position ids, or not causal) is
balanced as written and left so by default, and reordered when a layout is asked for; the results equal dense causal
attention to 1e-5, the permutation moves one local shard per device and gathers nothing; measured on the running
program, every device computes the same number of tiles at every ring step; an 8-layer training step keeps one
permutation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardfix import autofix_shardings
from support import ejkernel_models as ejk
from support import tiles
from support.hlo import collective_bytes

CHUNK = 8
PERMUTATION = "shardfix.sequence_permutation"


def make_mesh(shape=(2, 4), explicit: bool = True):
    """jax.make_mesh's default (Explicit) axes, or Auto ones."""
    if explicit:
        return jax.make_mesh(shape, ("dp", "cp"))
    return jax.make_mesh(shape, ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def placed(mesh, arrays):
    q, k, v, pos = arrays
    seq, ids = NamedSharding(mesh, P("dp", "cp", None, None)), NamedSharding(mesh, P("dp", "cp"))
    return tuple(jax.device_put(x, seq) for x in (q, k, v)) + (jax.device_put(pos, ids),)


@pytest.mark.parametrize("explicit", [True, False], ids=["explicit", "auto-axes"])
@pytest.mark.parametrize("positions,strategy,length", [
    (False, "auto", 64), (True, "auto", 64), (True, "zigzag", 64), (False, "striped", 128), (True, "striped", 128)],
    ids=["no-position-ids-auto", "position-ids-auto", "position-ids-zigzag", "no-position-ids-striped",
         "position-ids-striped"])
def test_forward_and_gradients_reordered_and_exact(positions, strategy, length, explicit):
    mesh = make_mesh(explicit=explicit)
    raw = ejk.inputs(mesh, length)
    q, k, v, pos = placed(mesh, raw)
    args = (q, k, v) + ((pos, pos) if positions else ())
    w = np.random.default_rng(1).standard_normal(raw[0].shape).astype(np.float32)
    forward = ejk.sharded(mesh, CHUNK, positions)
    backward_ready = ejk.sharded(mesh, CHUNK, positions, entry="vjp")

    def loss(q, k, v, *pos):
        return jnp.sum(backward_ready(q, k, v, *pos) * w)

    fixed_forward = autofix_shardings(forward, ring_reorder=strategy)
    fixed_grad = autofix_shardings(jax.grad(loss, argnums=(0, 1, 2)), ring_reorder=strategy)
    # without position ids the kernel computes positions of chunks from its ring coordinate (a stripe keeps them
    # whole) and skips the pairs above the diagonal; with them it reads no position at all and skips no pair (its
    # skip predicate is the constant true): every device computes all 2 x 2 pairs at each of the 4 steps
    if strategy == "striped":
        expected = (f"striped{{stripe={1 if positions else CHUNK}}}", True)
    else:
        expected = ("auto", False) if strategy == "auto" and positions else ("zigzag", True)
    for fn, rings in ((fixed_forward, 1), (fixed_grad, 2)):
        decisions = fn.lower(*args).rings
        assert [(r.strategy, r.applied) for r in decisions] == [expected] * rings, [r.why for r in decisions]
        if expected == ("auto", False):
            # the why counts the region's group: the backward's ring beside the forward's
            total = 16 * rings
            assert [r.why for r in decisions] == [f"balanced as written: {total} tiles on the critical path (ideal "
                                                  f"{total}), and no layout shortens it"] * rings
    dense = ejk.dense_causal(*raw[:3])
    np.testing.assert_allclose(np.asarray(fixed_forward(*args)), np.asarray(dense), atol=1e-5, rtol=1e-5)
    reference = jax.grad(lambda q, k, v: jnp.sum(ejk.dense_causal(q, k, v) * w), argnums=(0, 1, 2))(*raw[:3])
    for got, want in zip(fixed_grad(*args), reference):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_public_entry_under_grad_is_left_by_default_and_unchanged_when_reordered():
    """Under differentiation ejkernel 0.0.80.3's public call attends to every key (not causal): it skips no chunk
    pair, so by default its rings are left as written, balanced; reordered when asked, whatever it computes, the
    reordered program computes the same."""
    mesh = make_mesh()
    q, k, v, _ = placed(mesh, ejk.inputs(mesh, 64))
    attention = ejk.sharded(mesh, CHUNK, False)
    grad = jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v) ** 2), argnums=(0, 1, 2))
    by_default = autofix_shardings(grad).lower(q, k, v).rings
    assert [(r.strategy, r.applied, r.critical_before, r.ideal) for r in by_default] == [("auto", False, 16, 16)] * 2
    fixed = autofix_shardings(grad, ring_reorder="zigzag")
    assert [(r.strategy, r.applied) for r in fixed.lower(q, k, v).rings] == [("zigzag", True)] * 2
    for got, want in zip(fixed(q, k, v), jax.jit(grad)(q, k, v)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_permutation_moves_one_local_shard_and_gathers_nothing():
    mesh = make_mesh()
    q, k, v, _ = placed(mesh, ejk.inputs(mesh, 64))
    attention = ejk.sharded(mesh, CHUNK, False)
    before = collective_bytes(jax.jit(attention).lower(q, k, v).compile().as_text())
    after = collective_bytes(autofix_shardings(attention).lower(q, k, v).compile().as_text())
    assert "all-gather" not in after and "all-to-all" not in after
    added = sorted(after.get("collective-permute", []))
    for b in before.get("collective-permute", []):
        added.remove(b)
    shard = q.nbytes // mesh.size
    assert added == [shard // 2] * 8  # q, k, v in and the output back: two half shards each


@pytest.mark.parametrize("cp,before", [(4, 1.667), (8, 1.824)])
def test_every_device_computes_the_same_tiles_at_every_step(cp, before):
    """Tiles are (query chunk, key chunk) pairs; the kernel skips a pair when every key lies after every query.
    Counted on the running program, per device and ring step, before and after the pass."""
    mesh = make_mesh((8 // cp, cp))
    length = 2 * CHUNK * cp  # two chunks a device
    q, k, v, _ = placed(mesh, ejk.inputs(mesh, length))
    spec = P("dp", "cp", None, None)
    logged = tiles.with_skip_log(lambda q, k, v: ejk.ring_attention(q, k, v, axis="cp", chunk=CHUNK), mesh,
                                 (spec,) * 3, spec, entries=cp * 4)
    lowered = jax.jit(logged).lower(q, k, v)
    fixed = autofix_shardings(logged).lower(q, k, v)
    assert [r.applied for r in fixed.rings] == [True]
    counts = {}
    for name, program in (("before", lowered), ("after", fixed)):
        out, log = tiles.instrumented(program).compile()(q, k, v)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ejk.dense_causal(*(np.asarray(x) for x in (q, k, v)))),
                                   atol=1e-5, rtol=1e-5)
        counts[name] = tiles.tiles_per_step(np.asarray(log), cp)
    # contiguous: device d computes its diagonal (3 of 4 pairs) at step 0, then all 4 pairs for d steps, then none
    contiguous = np.array([[3] + [4 if s <= d else 0 for s in range(1, cp)] for d in range(cp)] * (8 // cp))
    np.testing.assert_array_equal(counts["before"], contiguous)
    assert round(tiles.critical_path_over_ideal(counts["before"]), 3) == before
    # zigzag: the diagonal pairs at step 0, then two pairs at every step on every device
    np.testing.assert_array_equal(counts["after"], np.array([[3] + [2] * (cp - 1)] * 8))
    assert tiles.critical_path_over_ideal(counts["after"]) <= 1.05


@pytest.mark.parametrize("model", ["attention", "llama"])
def test_eight_layer_model_keeps_one_permutation_and_trains_the_same(model):
    """attention: residual attention layers; llama: RMSNorm, attention, RMSNorm, SwiGLU MLP (jax.nn.silu is a
    function call in the module, elementwise as a whole, under differentiation with a residual result)."""
    loss_of, inputs = (ejk.model_loss, ejk.model_inputs) if model == "attention" else (ejk.llama_loss,
                                                                                        ejk.llama_inputs)
    mesh = make_mesh()
    weights, x = inputs(mesh, 8, 64)
    loss = loss_of(ejk.sharded(mesh, CHUNK, False, entry="vjp"))
    fixed = autofix_shardings(jax.value_and_grad(loss))
    lowered = fixed.lower(weights, x)
    assert len(lowered.rings) == 16 and all(r.applied for r in lowered.rings)
    # at most 3 asked for; hoisted across every layer and the weight gradients' sums over tokens, only the
    # input's is left
    assert lowered.as_text().count(PERMUTATION) == 1
    value, grads = fixed(weights, x)
    dense = loss_of(ejk.dense_causal)
    ref_value, ref_grads = jax.jit(jax.value_and_grad(dense))(jax.device_get(weights), jax.device_get(x))
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_sliding_window_computed_from_the_blocks_positions_is_proved():
    """ejkernel's sliding window (a mask from the distance between the two blocks' positions, and a skip of the
    chunk pairs outside the window) is a function of positions: proved and rewritten, the program computing what
    it computed. (A refusal inside ejkernel naming the op, its place there and the user's line:
    tests/clients/test_ejkernel_masks.py, segment ids read at the devices' offsets.)"""
    from ejkernel.kernels._xla.ring_attention import ring_attention as public
    from ejkernel.ops import FwdParams

    mesh = make_mesh()
    q, k, v, _ = placed(mesh, ejk.inputs(mesh, 64))
    spec = P("dp", "cp", None, None)

    def body(q, k, v):
        return public(q, k, v, causal=True, axis_name="cp", sliding_window=(8, 0),
                      fwd_params=FwdParams(q_blocksize=CHUNK, kv_blocksize=CHUNK))

    windowed = jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec, check_vma=False)
    fixed = autofix_shardings(windowed, ring_reorder="zigzag")
    (decision,) = fixed.lower(q, k, v).rings
    assert decision.applied, decision.why
    np.testing.assert_allclose(np.asarray(fixed(q, k, v)), np.asarray(jax.jit(windowed)(q, k, v)),
                               atol=1e-5, rtol=1e-5)
