"""ejkernel's XLA ring attention (pinned test-only client), unmodified, with the masks models use and no position
ids: sliding windows, StreamingLLM sinks, softmax_aux sink logits, segment ids. Through `@autofix_shardings` with
its defaults on jax.make_mesh's default axes, forward and jax.grad (its custom_vjp backward): every ring is
rewritten, the tiles the busiest device computes go from 15 to 9 (two chunks a device at cp=4: the ideal), and the
results equal jax.jit's to 1e-5. Segment ids sharded along the sequence make the kernel read its ids at offsets
of the device's own (clamped) slice: that program depends on where tokens sit and is left as it is."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardfix import autofix_shardings
from support import ejkernel_masks as em

FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
PROVED = [name for name in em.VARIANTS if name != "segments-sharded"]


def mesh():
    return jax.make_mesh((2, 4), ("dp", "cp"))


def under_test(variant: str, grad: bool):
    m = mesh()
    args = em.inputs(m, variant)
    fn = em.sharded(m, variant, differentiable=grad)
    if grad:
        w = np.random.default_rng(3).standard_normal((em.B, em.S, em.H, em.D)).astype(np.float32)
        attention = fn
        fn = jax.grad(lambda *a: jnp.sum(attention(*a) * w), argnums=(0, 1, 2))
    return fn, args


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
@pytest.mark.parametrize("variant", PROVED)
def test_rewritten_balanced_and_equal(variant, grad):
    fn, args = under_test(variant, grad)
    low = autofix_shardings(fn).lower(*args)
    assert [(r.strategy, r.applied) for r in low.rings] == [("zigzag", True)] * (2 if grad else 1), \
        [r.why for r in low.rings]
    for r in low.rings:
        assert (r.critical_before, r.critical_after, r.ideal) == (15, 9, 9.0), r
    got = low.compile(compiler_options=FAST)(*args)
    want = jax.jit(fn).lower(*args).compile(compiler_options=FAST)(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_segment_ids_read_at_the_devices_offsets_are_left_alone():
    fn, args = under_test("segments-sharded", False)
    (decision,) = autofix_shardings(fn).lower(*args).rings
    assert not decision.applied
    assert decision.why.startswith("not provably safe: 'stablehlo.dynamic_slice' at " + em.__file__ + ":")
    assert "/ejkernel/" in decision.why, decision.why
