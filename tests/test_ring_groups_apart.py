"""Ring regions linked to a refused one, proved apart from it (prove.py `_prove_apart`), and backward rings that a
custom_vjp wrote, refused for their own reason.

A safe ring that reads a refused ring's output (or feeds a refused ring) by a value sharded along the sequence is
rewritten on its own: that value is permuted before it and its result restored after it, so the refused ring,
left as written, sees what it saw. Checked against jax.jit under the defaults and forced layouts, forward and
under jax.grad (the safe ring a custom_vjp, the refused one differentiated by plain autodiff). Regions that pass
each other per-device values (a forward and its custom_vjp backward, through the softmax statistics) stay together:
the forward of a custom_vjp whose backward is refused is left alone with it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardfix import autofix_shardings
from support import ring_user_kernels as uk
from support import ring_user_refusals as ur
from support.ring_user_programs import meshes, qkv

PERMUTATION = "shardfix.sequence_permutation"
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
CP = 4
SPEC = jax.sharding.PartitionSpec("dp", "cp", None)
# causal ring attention over keys sorted along the sequence: refused at the sort
REFUSED_AT = "k = jnp.sort(k, axis=1)"


@functools.cache
def _mesh():
    return meshes()["explicit"]


def _ring(body):
    return jax.shard_map(body, mesh=_mesh(), in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)


def _programs():
    safe = _ring(uk.vjp_ring(CP, uk.causal))
    refused = _ring(ur.sorted_keys(CP))
    return {"after-a-refused-ring": lambda q, k, v: safe(refused(q, k, v), k, v),
            "before-a-refused-ring": lambda q, k, v: refused(safe(q, k, v), k, v)}


def _grad(fn):
    w = np.random.default_rng(7).standard_normal((2, 64, 8)).astype(np.float32)

    def loss(q, k, v):
        y = fn(q, k, v)
        return jnp.sum(y * w + y * y / 2)

    return jax.grad(loss, argnums=(0, 1, 2))


def _refused_line() -> str:
    import inspect
    lines, first = inspect.getsourcelines(ur.sorted_keys)
    return f"{ur.__file__}:{first + next(i for i, text in enumerate(lines) if REFUSED_AT in text)}"


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
@pytest.mark.parametrize("name", ["after-a-refused-ring", "before-a-refused-ring"])
def test_a_safe_ring_linked_to_a_refused_one_by_a_sequence_value_is_rewritten_on_its_own(name, grad):
    fn = _programs()[name]
    if grad:
        fn = _grad(fn)
    args = qkv(_mesh())
    want = jax.jit(fn).lower(*args).compile(compiler_options=FAST)(*args)
    for strategy in ("auto", "zigzag", "striped"):
        low = autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(*args)
        refused = [r for r in low.rings if r.why.startswith("not provably safe")]
        rewritten = [r for r in low.rings if r.applied]
        # the other ring (two regions under jax.grad) left alone, for its own reason at its own line
        assert len(refused) == (2 if grad else 1), [(r.applied, r.why) for r in low.rings]
        assert refused[0].why.startswith(f"not provably safe: 'stablehlo.sort' at {_refused_line()} "), refused[0].why
        # the custom_vjp ring (two regions under jax.grad): rewritten, or under the defaults left as balanced
        if strategy == "auto" and not rewritten:
            assert all("balanced" in r.why for r in low.rings if r not in refused), [r.why for r in low.rings]
            continue
        assert len(rewritten) == (2 if grad else 1), [(r.applied, r.why) for r in low.rings]
        got = low.compile(compiler_options=FAST)(*args)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5,
                                       err_msg=f"SOUNDNESS: {name} {strategy}")


def test_a_custom_vjp_backward_refused_for_its_own_reason_says_so_and_keeps_its_forward():
    """A custom_vjp (called in the shard_map body, so JAX names its backward region a transpose) whose backward
    masks each block with the positions of another block (the wrong ring coordinate): the backward is refused for
    that, not told to write a custom_vjp, and its forward, which hands it the softmax statistics (per-device
    values), is left alone with it."""
    import inspect

    fn = _ring(uk.vjp_ring(CP, uk.causal, backward_source=1))
    args = qkv(_mesh())
    lines, first = inspect.getsourcelines(_grad)
    call = f"{__file__}:{first + next(i for i, text in enumerate(lines) if 'y = fn(q, k, v)' in text)}"
    for strategy in ("auto", "zigzag"):
        low = autofix_shardings(_grad(fn), ring_reorder=strategy, on_fix="ignore").lower(*args)
        whys = [r.why for r in low.rings]
        assert len(whys) == 2 and not any(r.applied for r in low.rings), whys
        own = ("'stablehlo.select' at " f"{call} combines data of different tokens (blocks or positions) elementwise, "
               "in the backward of a custom_vjp this ring region's body calls (JAX keeps no source line for a "
               "custom_vjp backward's ops)")
        assert sorted(whys) == sorted([f"not provably safe: {own}", "not provably safe: reordered together with the "
                                       f"ring region at {call}, which is not provably safe ({own})"]), whys
        assert PERMUTATION not in low.as_text()
