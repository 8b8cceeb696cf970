"""A ring whose layout saves fewer tiles than its own permutations cost is reordered where hoist-permutations runs
next and leaves permutations that cost less than the layout saves: a stack of layers pays for one permutation in
and one out, not one a layer. Counted on copies of the module, each run through ring-reorder and
hoist-permutations; the results stay jax.jit's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardfix import autofix_shardings
from shardfix.jit.lowering import patch_lowered
from support import ring_user_kernels as uk
from support import ring_user_programs as up

MESH = up.meshes()["explicit"]  # dp=2 x cp=4, jax.make_mesh's default (Explicit) axes
PERMUTATION = "shardfix.sequence_permutation"


def _attention():
    """The blockwise kernel with a sliding window of 40 tokens (10 a device, chunks of 4): zigzag shortens its
    critical path from 44 to 34 tiles, and its four permuted tensors (q, k, v and the output) cost about 15.1."""
    return up.sharded(MESH, uk.blockwise_ring(4, 4, uk.MASKS["window40"], uk.LIVE["window40"]), 3)


def _stack(layers: int):
    attention = _attention()

    def program(x):
        for _ in range(layers):
            x = x + attention(x, x * 0.5, jnp.tanh(x))
        return x

    return program


@pytest.fixture(scope="module")
def x():
    return up.qkv(MESH)[0]


def test_a_stack_of_layers_pays_for_one_permutation_in_and_one_out(x):
    program = _stack(4)
    lowered = autofix_shardings(program, on_fix="ignore").lower(x)
    assert [(r.applied, r.strategy, r.critical_before, r.critical_after) for r in lowered.rings] == \
        [(True, "zigzag", 44, 34)] * 4
    # 4 x 10 tiles saved; what hoist-permutations leaves: x's permutation in and the result's out, each tensor a
    # quarter of the region's 15.1
    assert lowered.rings[0].why == (
        "3 operand(s) reordered, 1 result(s) restored, 8 position read(s) rewritten; alone it would not pay for its "
        "own permutations (zigzag would shorten the critical path only from 44 to 34 tiles (ideal 30.25), not by "
        "more than the permutation costs (about 15.1 tiles)), but hoist-permutations leaves permutations that cost "
        "about 7.6 tiles, against 40 tiles saved on the critical paths of the 4 ring region(s) reordered for this "
        "reason")
    assert lowered.as_text().count(PERMUTATION) == 2
    expected = jax.jit(program)(x)
    np.testing.assert_allclose(np.asarray(lowered.compile()(x)), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_the_gradient_of_a_layer_is_jits(x):
    program = _stack(1)

    def loss(x):
        return jnp.sum(program(x) ** 2)

    fixed = autofix_shardings(jax.grad(loss), on_fix="ignore")
    decisions = fixed.lower(x).rings
    assert len(decisions) == 2 and all(r.applied and r.strategy == "zigzag" for r in decisions)
    np.testing.assert_allclose(np.asarray(fixed(x)), np.asarray(jax.jit(jax.grad(loss))(x)), rtol=1e-5, atol=1e-5)


def test_a_layer_whose_permutations_all_stay_is_left_as_written():
    q, k, v = up.qkv(MESH)  # three inputs: their permutations are three, and the output's a fourth
    (decision,) = autofix_shardings(_attention(), on_fix="ignore").lower(q, k, v).rings
    assert not decision.applied
    assert decision.why == (
        "zigzag would shorten the critical path only from 44 to 34 tiles (ideal 30.25), not by more than the "
        "permutation costs (about 15.1 tiles); nor after hoist-permutations: reordered, the 1 ring region(s) of this "
        "program that don't pay for their own permutations would save 10 tiles and leave permutations that cost "
        "about 15.1")


@pytest.mark.parametrize("pipeline", ["ring-reorder", "ring-reorder,canonicalize,hoist-permutations"])
def test_without_hoist_permutations_right_after_each_layer_pays_alone(x, pipeline):
    lowered = jax.jit(_stack(2)).lower(x)
    moved, report = patch_lowered(lowered, pipeline)
    assert [r.applied for r in report.rings] == [False, False]
    assert report.rings[0].why == ("zigzag would shorten the critical path only from 44 to 34 tiles (ideal 30.25), "
                                   "not by more than the permutation costs (about 15.1 tiles)")
    assert PERMUTATION not in moved.as_text()


def test_bands_among_layers_that_pay_alone_are_charged_only_the_permutations_they_add(x):
    window = _attention()
    causal = up.sharded(MESH, uk.blockwise_ring(4, 4, uk.MASKS["causal"], uk.LIVE["causal"]), 3)

    def program(x):
        for attention in (causal, window, causal, window):
            x = x + attention(x, x * 0.5, jnp.tanh(x))
        return x

    lowered = autofix_shardings(program, on_fix="ignore").lower(x)
    assert [(r.applied, r.strategy, r.critical_before, r.critical_after) for r in lowered.rings] == \
        [(True, "zigzag", 58, 34), (True, "zigzag", 44, 34)] * 2
    # the causal layers are reordered anyway, so the window layers add no permutation to those left: 0 tiles
    assert lowered.rings[1].why.endswith("hoist-permutations leaves permutations that cost about 0.0 tiles, "
                                         "against 20 tiles saved on the critical paths of the 2 ring region(s) "
                                         "reordered for this reason")
    assert lowered.rings[0].why == "3 operand(s) reordered, 1 result(s) restored, 4 position read(s) rewritten"
    assert lowered.as_text().count(PERMUTATION) == 2
    np.testing.assert_allclose(np.asarray(lowered.compile()(x)), np.asarray(jax.jit(program)(x)), rtol=1e-5,
                               atol=1e-5)
