"""hoist-permutations on 8 CPU devices: the permutations an N-layer ring transformer needs don't grow with N, and
the results stay those of the program without shardfix; what can't be moved stays, and is reported."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardfix import autofix_shardings
from support.hlo import collective_bytes
from shardfix.jit.lowering import patch_lowered
from support.ring_models import ring_transformer

MESH = jax.make_mesh((2, 4), ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
B, S, H = 2, 32, 16


def inputs(layers, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, S, H)).astype(np.float32)
    pos = np.broadcast_to(np.arange(S, dtype=np.int32), (B, S)).copy()
    weights = [[(rng.standard_normal((H, H)) * 0.2).astype(np.float32) for _ in range(6)] for _ in range(layers)]
    return x, pos, weights


def permutes(compiled) -> int:
    """The collective permutes and all-to-alls of a compiled program."""
    found = collective_bytes(compiled.as_text())
    return len(found.get("collective-permute", [])) + len(found.get("all-to-all", []))


@functools.cache
def as_written(layers: int, loss: bool) -> tuple:
    """(arguments, lowered, its permutes, its result): the program without shardfix, compiled once for both
    layouts."""
    args = inputs(layers)
    lowered = jax.jit(ring_transformer(MESH, layers, loss)).lower(*args)
    compiled = lowered.compile()
    return args, lowered, permutes(compiled), np.asarray(compiled(*args))


@functools.cache
def as_written_between(between) -> tuple:
    """(arguments, lowered, its result): two ring layers with `between` between them, compiled once for both
    layouts."""
    args = inputs(2)
    lowered = jax.jit(ring_transformer(MESH, 2, between=between)).lower(*args)
    return args, lowered, np.asarray(lowered.compile()(*args))


@pytest.mark.parametrize("loss", [False, True], ids=["activations", "mean-loss"])
@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
def test_permutations_do_not_grow_with_layers(loss, strategy):
    per_layer, hoisted = {}, {}
    depths = (1, 2, 4)  # three depths show the growth: one layer, and each doubling twice
    for layers in depths:
        args, lowered, before, expected = as_written(layers, loss)
        reordered, _ = patch_lowered(lowered, f"ring-reorder{{strategy={strategy}}}")
        moved, report = patch_lowered(lowered, f"ring-reorder{{strategy={strategy}}},hoist-permutations")
        assert report.remarks == []
        per_layer[layers] = reordered.as_text().count("shardfix.sequence_permutation")
        compiled = moved.compile()
        # the collectives the pipeline added (the ring's own permutes are in both)
        hoisted[layers] = permutes(compiled) - before
        np.testing.assert_allclose(np.asarray(compiled(*args)), expected, atol=2e-5, rtol=2e-5)
    assert per_layer == {n: 6 * n for n in depths}  # q, k, v, q_pos, k_pos in and the output out, per layer
    assert len(set(hoisted.values())) == 1, hoisted  # the same for every depth
    # x and pos permuted once at the input; activations restored once at the output, a mean loss not at all
    permutes_per_tensor = 2 if strategy == "zigzag" else 1
    assert hoisted[1] == permutes_per_tensor * (2 if loss else 3)


@pytest.mark.parametrize("between, blocker", [
    (lambda x: jnp.flip(x, axis=1), "func.call' to '@_flip"),  # JAX wraps flip and cumsum in private functions
    (lambda x: jnp.cumsum(x, axis=1), "func.call' to '@cumsum"),
    (lambda x: x.reshape(B, S * H).reshape(B, S, H), "stablehlo.reshape"),
])
def test_blockers_keep_results(between, blocker):
    args = inputs(2)
    lowered = jax.jit(ring_transformer(MESH, 2, between=between)).lower(*args)
    moved, report = patch_lowered(lowered, "ring-reorder{strategy=zigzag},hoist-permutations")
    messages = [r.message for r in report.remarks]
    assert f"an inverse zigzag permutation stops at '{blocker}'" in " ".join(messages), messages
    assert moved.as_text().count("shardfix.sequence_permutation") == 5  # x, pos in; around the blocker; out
    np.testing.assert_allclose(np.asarray(moved.compile()(*args)), np.asarray(lowered.compile()(*args)),
                               atol=2e-5, rtol=2e-5)


MIXING = np.tril(np.ones((S, S), np.float32)) / np.arange(1, S + 1, dtype=np.float32)[:, None]  # a moving average


def dense_attention(x):
    scores = jnp.einsum("bsh,bth->bst", x, x) / np.sqrt(H)
    return jnp.einsum("bst,bth->bsh", jax.nn.softmax(scores, axis=-1), x)


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("between, stop", [
    # tokens mixed by a matrix: the dot_general sums the matrix's token dim and gives a result along its other one,
    # which it can't read in permuted order along both: the motion stops there
    (lambda x: x + jnp.einsum("st,bth->bsh", jnp.asarray(MIXING), x), "would read an operand in two sequence orders"),
    # a dense attention layer between two ring ones: scores in permuted order along their queries, contiguous
    # along their keys, and the weighted sum over the keys in that order
    (dense_attention, None),
], ids=["token-mixing", "dense-attention"])
def test_a_layer_that_mixes_tokens_keeps_results(between, stop, strategy):
    """Layers that mix tokens between two ring regions: the results stay those of jax.jit."""
    args, lowered, expected = as_written_between(between)
    moved, report = patch_lowered(lowered, f"ring-reorder{{strategy={strategy}}},hoist-permutations")
    assert all(r.applied for r in report.rings) and len(report.rings) == 2
    np.testing.assert_allclose(np.asarray(moved.compile()(*args)), expected, atol=2e-5, rtol=2e-5)
    if stop is not None:
        assert any(stop in r.message for r in report.remarks), report.remarks


def test_decorator_hoists():
    args = inputs(4)
    f = autofix_shardings(ring_transformer(MESH, 4), ring_reorder="zigzag")
    lowered = f.lower(*args)
    assert len(lowered.rings) == 4 and all(r.applied for r in lowered.rings)
    assert lowered.as_text().count("shardfix.sequence_permutation") == 3
    np.testing.assert_allclose(np.asarray(f(*args)), np.asarray(jax.jit(ring_transformer(MESH, 4))(*args)),
                               atol=2e-5, rtol=2e-5)
