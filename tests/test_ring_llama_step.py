"""A Llama-style training step (embedding, RoPE, ring attention in every layer, SwiGLU, cross-entropy,
value_and_grad, SGD) on jax.make_mesh's default axes, through `@autofix_shardings` with its defaults, with a
custom_vjp ring kernel: every ring (forward and backward, every layer) is rewritten, and the loss and the updated
parameters equal jax.jit's to 1e-5."""

import functools

import jax
import numpy as np
import pytest

from shardfix import autofix_shardings
from support import ring_llama

FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
LAYERS = 2


@functools.cache
def setup(kind: str):
    mesh = jax.make_mesh((2, 4), ("dp", "cp"))
    step = ring_llama.train_step(mesh, kind)
    args = ring_llama.inputs(mesh, LAYERS)
    return step, args, autofix_shardings(step).lower(*args)


@pytest.mark.parametrize("kind", ["custom_vjp"])
def test_every_ring_rewritten_and_the_step_unchanged(kind):
    step, args, low = setup(kind)
    assert len(low.rings) == 2 * LAYERS and all(r.applied for r in low.rings), [r.why for r in low.rings]
    got = low.compile(compiler_options=FAST)(*args)
    want = jax.jit(step).lower(*args).compile(compiler_options=FAST)(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
