"""A Llama-style training step (embedding, RoPE, ring attention in every layer, SwiGLU, cross-entropy,
value_and_grad, SGD) on jax.make_mesh's default axes, through `@autofix_shardings` with its defaults, with a
custom_vjp ring kernel and with a kernel JAX differentiates itself (no custom_vjp: the backward's skips read the
predicates its forward saved, which the tile count follows): every ring (forward and backward, every layer) is
rewritten, the loss and the updated parameters equal jax.jit's to 1e-5, and the program permutes only its two
sequence inputs (tokens, targets): every other permutation is hoisted through the layers and cancelled."""

import functools

import jax
import numpy as np
import pytest

from shardfix import autofix_shardings
from support import ring_llama

PERMUTATION = "shardfix.sequence_permutation"
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
LAYERS = 2


@functools.cache
def setup(kind: str):
    mesh = jax.make_mesh((2, 4), ("dp", "cp"))
    step = ring_llama.train_step(mesh, kind)
    args = ring_llama.inputs(mesh, LAYERS)
    return step, args, autofix_shardings(step).lower(*args)


@pytest.mark.parametrize("kind", ["custom_vjp", "autodiff"])
def test_every_ring_rewritten_and_the_step_unchanged(kind):
    step, args, low = setup(kind)
    assert len(low.rings) == 2 * LAYERS and all(r.applied for r in low.rings), [r.why for r in low.rings]
    got = low.compile(compiler_options=FAST)(*args)
    want = jax.jit(step).lower(*args).compile(compiler_options=FAST)(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["custom_vjp", "autodiff"])
def test_one_permutation_per_sequence_input(kind):
    """Hoisted across RoPE (halves of the feature dim sliced and concatenated, their transposes padded), the
    positions (an iota, computed in the permuted order), the embedding's gather and its gradient's scatter-add,
    SwiGLU and log_softmax (calls) and their transposes; the loss and the weight gradients sum over the tokens,
    so no inverse is left at the outputs."""
    _, args, low = setup(kind)
    text = low.as_text()
    assert text.count(PERMUTATION) == 2
    tokens, targets = (f"%arg{len(jax.tree.leaves(args[0])) + i}" for i in range(2))
    permuted = sorted(line.split("sdy.manual_computation(")[1].split(")")[0] for line in text.splitlines()
                      if "sdy.manual_computation(" in line and "manual_axes" in line)
    assert {tokens, targets} <= set(permuted), permuted
