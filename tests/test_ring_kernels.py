"""Ring attention kernels written as training code writes them (custom_vjp, positions from axis_index, a fori_loop
kernel and a lax.scan blockwise kernel with skipped chunks), fully and partially manual, through
`@autofix_shardings` with its default options: each ring is reordered (zigzag; striped where asked), the results
and the gradients equal dense causal attention, the permutation moves at most one local shard per device and
nothing is gathered. A function called both from a reordered region and from one left alone is copied."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardfix import autofix_shardings
from support import ring_kernels
from support.hlo import collective_bytes
from support.ring_models import dense_causal_attention

CP, LENGTH, CHUNK = 4, 64, 4


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, CP), ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((2, LENGTH, 8)).astype(np.float32) for _ in range(4))


def kernel(name: str):
    if name == "fori":
        return ring_kernels.fori_ring_attention("cp", CP)
    return ring_kernels.scan_ring_attention("cp", CP, CHUNK)


def loss_of(attention, w):
    return lambda q, k, v: jnp.sum(attention(q, k, v) * w)


@pytest.mark.parametrize("strategy", ["auto", "striped"])
@pytest.mark.parametrize("manual", ["full", "partial"])
@pytest.mark.parametrize("name", ["fori", "scan"])
def test_forward_and_gradients_reordered_and_exact(mesh, data, name, manual, strategy):
    q, k, v, w = data
    attention = ring_kernels.sharded(kernel(name), mesh, partial=manual == "partial")
    grad = autofix_shardings(jax.grad(loss_of(attention, w), argnums=(0, 1, 2)), ring_reorder=strategy)
    forward = autofix_shardings(attention, ring_reorder=strategy)
    # the fori kernel reads positions of single tokens, the blockwise one of chunks: striped keeps them whole; the
    # fori kernel computes every block (no skip), so auto leaves it as written, while the blockwise one's skipped
    # chunks make zigzag pay
    expected = ("zigzag", True) if strategy == "auto" else (f"striped{{stripe={1 if name == 'fori' else CHUNK}}}", True)
    if strategy == "auto" and name == "fori":
        expected = ("auto", False)
    for fn, rings in ((forward, 1), (grad, 2)):
        decisions = fn.lower(q, k, v).rings
        assert [(r.axis, r.strategy, r.applied) for r in decisions] == [("cp", *expected)] * rings, \
            [r.why for r in decisions]
    np.testing.assert_allclose(np.asarray(forward(q, k, v)), np.asarray(dense_causal_attention(q, k, v)),
                               atol=1e-5, rtol=1e-5)
    reference = jax.grad(loss_of(dense_causal_attention, w), argnums=(0, 1, 2))(q, k, v)
    for got, want in zip(grad(q, k, v), reference):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("strategy", ["auto", "striped"])
@pytest.mark.parametrize("manual", ["full", "partial"])
def test_permutation_moves_one_shard_and_gathers_nothing(mesh, data, manual, strategy):
    """q, k, v reordered and the output restored, each moving at most one local shard a device: zigzag as two
    half shards; striped as one all_to_all (a quarter of it staying home), or, where the region leaves the batch
    axis to propagation, as three quarter-shard collective_permutes (an all_to_all there would be gathered)."""
    q, k, v, _ = [jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("dp", "cp")))
                  for x in data]
    attention = ring_kernels.sharded(kernel("scan"), mesh, partial=manual == "partial")
    before = collective_bytes(jax.jit(attention).lower(q, k, v).compile().as_text())
    after = collective_bytes(autofix_shardings(attention, ring_reorder=strategy).lower(q, k, v).compile().as_text())
    assert "all-gather" not in after
    added = sorted(after.get("collective-permute", []))
    for b in before.get("collective-permute", []):
        added.remove(b)
    shard = q.nbytes // 8
    if strategy == "auto":
        assert (added, after.get("all-to-all")) == ([shard // 2] * 8, None)
    elif manual == "full":
        assert (added, after.get("all-to-all")) == ([], [shard] * 4)
    else:
        assert (added, after.get("all-to-all")) == ([shard // 4] * 12, None)


def test_function_shared_with_a_region_left_alone_is_copied(mesh, data):
    """One jitted kernel called from two regions: the second also takes a cumsum along the sequence, so it stays
    in order; the first is reordered and reads its positions from a copy of the kernel."""
    q, k, v, _ = data
    inner = jax.jit(ring_kernels.fori_ring_attention("cp", CP))
    first = ring_kernels.sharded(inner, mesh)
    second = ring_kernels.sharded(lambda q, k, v: jnp.cumsum(inner(q, k, v), axis=1), mesh)

    def f(q, k, v):
        return first(q, k, v), second(q, k, v)

    fixed = autofix_shardings(f, ring_reorder="zigzag")  # the fori kernel skips nothing: auto would keep it
    lowered = fixed.lower(q, k, v)
    assert [r.applied for r in lowered.rings] == [False, True]
    assert "slides a window along the data" in lowered.rings[0].why
    text = lowered.as_text()
    calls = re.findall(r"call @(\w+)\(", text)
    assert "attention" in calls and "attention_zigzag_0" in calls
    for got, want in zip(fixed(q, k, v), jax.jit(f)(q, k, v)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_plain_differentiation_of_an_online_softmax_loop_is_refused(mesh, data):
    """Without a custom_vjp, JAX's backward of an online softmax rescales by running maxima of the forward's
    order (exact only up to a telescoping product): left as it is, with the op and the line."""
    from support.ring_models import axis_index_ring_attention
    q, k, v, w = data
    grad = autofix_shardings(jax.grad(loss_of(axis_index_ring_attention(mesh), w), argnums=(0, 1, 2)))
    decisions = grad.lower(q, k, v).rings
    assert decisions and not any(r.applied for r in decisions)
    assert all(r.why.startswith("not provably safe") for r in decisions)
    for got, want in zip(grad(q, k, v), jax.jit(jax.grad(loss_of(axis_index_ring_attention(mesh), w),
                                                          argnums=(0, 1, 2)))(q, k, v)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
