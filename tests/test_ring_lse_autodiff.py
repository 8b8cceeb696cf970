"""Plain jax.grad of ring kernels that merge each block's (out, lse), as ring-flash-attention does: the backward
JAX makes is rewritten with its forward where the merge's derivative is the derivative of the function the forward
proof found (stabiliser._lse_invariant), and left alone where it is not.

The merge's forward proof (logsum.py) shows that every step computes (out(A u B), lse(A u B)) in exact arithmetic,
in every case of the signs it splits on. What jax.grad computes differs from that function's derivative only at the
splits' ties, where the ops splitting there (max, min, abs) are differentiated by their kinks' rules: max and min
give each side half, abs gives the positive side all (its derivative at 0 is 1), and where such ops nest the halves
multiply. jnp.logaddexp differentiates by its own rule (a custom_jvp, exact), so its primal's max and abs are never
differentiated; the same formula written out is differentiated op by op, and at a tie between the state and the new
block all of the cotangent goes to the block that abs favours, which the layout decides; maxima nested at one tie
(max(max(lse, lse_blk), lse_blk)) split it 1/4 : 3/4. So a merge that differentiates max, min or abs is refused
(conservatively where one max alone would be exact). The tests hold both: the premise on the formulas, the kernels
reordered by hand before jax.grad on inputs where the blocks' lses tie, and what ring-reorder decides.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import autofix_shardings
from support import ring_user_lse as ul
from support.ring_user_programs import meshes, qkv, sharded, zigzag_layout

CP = 4
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _by_hand(a, b):
    return jnp.maximum(a, b) + jnp.log1p(jnp.exp(-jnp.abs(a - b)))


def _nested(a, b):
    m, n = jnp.maximum(jnp.maximum(a, b), b), jnp.minimum(a, b)  # refused here under plain jax.grad
    return m + jnp.log1p(jnp.exp(n - m))


def test_jnp_logaddexp_is_differentiated_by_its_rule_and_the_formula_written_out_is_not():
    """At a tie, jnp.logaddexp's derivative is (1/2, 1/2), the function's; the same formula differentiated op by op
    gives all of it to the second operand (max gives 1/2 each, abs' at 0 is 1), so swapping the operands, as a
    reorder swaps which block is the state, moves it to the other."""
    assert [float(g) for g in jax.grad(jnp.logaddexp, argnums=(0, 1))(1.5, 1.5)] == [0.5, 0.5]
    assert [float(g) for g in jax.grad(_by_hand, argnums=(0, 1))(1.5, 1.5)] == [0.0, 1.0]
    assert [float(g) for g in jax.grad(lambda a, b: _by_hand(b, a), argnums=(0, 1))(1.5, 1.5)] == [1.0, 0.0]
    # maxima nested at one tie: the halves multiply
    assert [float(g) for g in jax.grad(_nested, argnums=(0, 1))(1.5, 1.5)] == [0.375, 0.625]
    # away from ties they all agree
    for f in (_by_hand, _nested):
        np.testing.assert_allclose(jax.grad(f, argnums=(0, 1))(1.5, 0.25),
                                   jax.grad(jnp.logaddexp, argnums=(0, 1))(1.5, 0.25), rtol=1e-6)


def tied_qkv(mesh):
    """q and v random, every key the same vector: a row's scores all tie, so every block the causal mask leaves
    whole has the same lse, and merging one into a state that holds one such block is a tie."""
    q, _, v = qkv(mesh)
    k = np.broadcast_to(np.random.default_rng(5).standard_normal((1, 1, q.shape[-1])), q.shape).astype(np.float32)
    return q, jax.device_put(k, q.sharding), v


def _gradient_change_reordered_by_hand(merge: str) -> float:
    """max |gradient of sum(out ** 2) with the kernel run on the zigzag layout (its positions the zigzag ones),
    the gradient put back in order - jax.jit's as written|, on tied keys."""
    mesh = meshes()["explicit"]
    args = tied_qkv(mesh)
    order, zigzag = zigzag_layout(CP, args[0].shape[1])
    back = np.argsort(order)

    def loss(body):
        f = sharded(mesh, body, 3)
        return jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2)))

    want = loss(ul.lse_ring(CP, merge))(*args)
    permuted = [jax.device_put(np.asarray(x)[:, order], x.sharding) for x in args]
    got = loss(ul.lse_ring(CP, merge, positions=zigzag))(*permuted)
    return max(float(np.abs(np.asarray(g)[:, back] - np.asarray(w)).max()) for g, w in zip(got, want))


def _merge_nested(out, lse, out_b, lse_b, i):
    new = _nested(lse, lse_b)
    return out * jnp.exp(lse - new)[..., None] + out_b * jnp.exp(lse_b - new)[..., None], new


def test_reordered_by_hand_the_logaddexp_merge_keeps_its_gradient_at_ties_and_the_formulas_written_out_do_not():
    """The max form (one max, cancelled) keeps it too: its refusal is conservative."""
    ul.MERGES["nested"] = _merge_nested
    try:
        assert _gradient_change_reordered_by_hand("logaddexp") <= 1e-5
        assert _gradient_change_reordered_by_hand("max") <= 1e-5
        assert _gradient_change_reordered_by_hand("max-log1p") > 1e-2
        assert _gradient_change_reordered_by_hand("nested") > 5e-3
    finally:
        del ul.MERGES["nested"]


def _grad(fn):
    return jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=(0, 1, 2))


@pytest.mark.parametrize("merge, options", [
    ("logaddexp", {}), ("logaddexp", {"loop": "scan"}), ("guarded-logaddexp", {"init": "inf"}),
    ("reset-logaddexp", {}), ("logaddexp", {"block": ul.block_logsumexp}),
    ("guarded-logaddexp", {"init": "inf", "block": ul.block_logsumexp})])
def test_plain_grad_of_an_lse_merge_ring_is_rewritten_and_equals_jax_jit_at_ties(merge, options):
    """Forward and backward rings both rewritten under zigzag; the gradient equals jax.jit's on tied keys. A block's
    lse from jax.nn.logsumexp too: its stop_gradient holds constant the maximum it shifts by, which the function
    does not depend on, and its abs is of a sum holding exp(0) = 1, so neither changes the derivative."""
    mesh = meshes()["explicit"]
    grad = _grad(sharded(mesh, ul.lse_ring(CP, merge, **options), 3))
    args = tied_qkv(mesh)
    low = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore").lower(*args)
    assert len(low.rings) == 2 and all(r.applied for r in low.rings), [(r.applied, r.why) for r in low.rings]
    got = low.compile(compiler_options=FAST)(*args)
    want = jax.jit(grad).lower(*args).compile(compiler_options=FAST)(*args)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_blockwise_lse_kernel_under_plain_grad_is_rewritten_by_default_with_its_tiles():
    """The blockwise kernel (chunk pairs skipped by lax.cond) with the (out, lse) merge: under the defaults both
    rings take zigzag, 58 -> 34 tiles on the critical path (dp=2 x cp=4, four chunks a device), and the gradient
    equals jax.jit's on tied keys."""
    from support.ring_user_programs import blockwise

    mesh = meshes()["explicit"]
    fn, args = blockwise("causal", merge="lse")(mesh)
    grad = _grad(fn)
    args = tied_qkv(mesh)
    low = autofix_shardings(grad, on_fix="ignore").lower(*args)
    assert [(r.strategy, r.critical_before, r.critical_after) for r in low.rings] == [("zigzag", 58, 34)] * 2, \
        [(r.applied, r.why) for r in low.rings]
    got = low.compile(compiler_options=FAST)(*args)
    want = jax.jit(grad).lower(*args).compile(compiler_options=FAST)(*args)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def _lines(function, text: str) -> list[int]:
    import inspect
    lines, first = inspect.getsourcelines(function)
    return [first + i for i, line in enumerate(lines) if text in line]


@pytest.mark.parametrize("merge, function, names", [
    ("max-log1p", ul.merge_max_log1p, ("max", "abs")), ("max", ul.merge_max, ("max",)),
    ("nested", _nested, ("max", "min"))])
def test_a_merge_differentiating_max_min_or_abs_is_refused_under_plain_grad_naming_them(merge, function, names):
    """The formula written out, the max form (conservative) and nested maxima: the forward is proved and rewritten,
    the backward refused naming the ops at the user's line, and the gradient is jax.jit's."""
    mesh = meshes()["explicit"]
    ul.MERGES["nested"] = _merge_nested
    try:
        grad = _grad(sharded(mesh, ul.lse_ring(CP, merge), 3))
        fn = sharded(mesh, ul.lse_ring(CP, merge), 3)
    finally:
        del ul.MERGES["nested"]
    args = tied_qkv(mesh)
    low = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore").lower(*args)
    assert len(low.rings) == 2 and not any(r.applied for r in low.rings)
    lines = _lines(function, "refused here")
    source = function.__code__.co_filename
    assert any(f"merges log-sum-exps and JAX differentiates {names[0]} at {source}:" in r.why
               and all(any(f"{name} at {source}:{line}:" in r.why for line in lines) for name in names)
               and "max(max(lse, lse_blk), lse_blk)" in r.why
               and "merge with jnp.logaddexp, whose own derivative rule is exact" in r.why
               for r in low.rings), [r.why for r in low.rings]
    np.testing.assert_array_equal(np.asarray(low.compile()(*args)[1]), np.asarray(jax.jit(grad)(*args)[1]))
    # forward alone: the same function, proved and rewritten
    assert all(r.applied for r in autofix_shardings(fn, ring_reorder="zigzag", on_fix="ignore").lower(*args).rings)


@jax.custom_jvp
def _users_logaddexp(a, b):
    return jnp.logaddexp(a, b)


@_users_logaddexp.defjvp
def _users_logaddexp_rule(primals, tangents):
    (a, b), (ta, tb) = primals, tangents
    out = _users_logaddexp(a, b)
    return out, ta * jnp.exp(a - out) + tb * jnp.exp(b - out)


def test_a_users_own_custom_jvp_around_logaddexp_is_still_a_rule_the_module_does_not_show():
    """Only JAX's own logaddexp rule is known exact (by where JAX defined it): a user's custom_jvp, even one with
    the same rule, is a rule the module does not show, and the backward stays as written."""
    mesh = meshes()["explicit"]
    ul.MERGES["users-logaddexp"] = _users_merge
    try:
        grad = _grad(sharded(mesh, ul.lse_ring(CP, "users-logaddexp"), 3))
        args = qkv(mesh)
        low = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore").lower(*args)
    finally:
        del ul.MERGES["users-logaddexp"]
    assert len(low.rings) == 2 and not any(r.applied for r in low.rings)
    assert any("its derivative follows a rule the forward does not show (custom_jvp at" in r.why
               and "(_users_merge)" in r.why for r in low.rings), [r.why for r in low.rings]


def _users_merge(out, lse, out_b, lse_b, i):
    new = _users_logaddexp(lse, lse_b)
    return out * jnp.exp(lse - new)[..., None] + out_b * jnp.exp(lse_b - new)[..., None], new


def test_lse_invariant_asks_one_computation_per_maximum_that_may_cancel():
    """The check on the maxima logsum.py reads as numbers (stabiliser.note_lse_max): per function maximized, two
    computations over one coverage fail it, as does one over a loop's unknown coverage beside another anywhere;
    computations over different known coverages (the own block before the loop, another in it) pass."""
    from shardfix.ring import stabiliser
    from shardfix.ring.analysis import FnTable

    def verdict(reads):
        fns = FnTable()
        fns.owner = "ring"
        for read in reads:
            stabiliser.note_lse_max(fns, 7, read)
        return stabiliser._lse_invariant(fns, "ring")

    a, b = ("slot", "loop", 0, 7), ("slot", "loop", 1, 7)
    assert verdict([("{hop 0}", a), ("{hop i}", b)]) is None
    assert verdict([("{hop 0}", a), ("{hop 0}", a), (None, a)]) is None
    assert "computed by different ops may cancel" in verdict([("{hop 0}", a), ("{hop 0}", b)])
    assert "computed by different ops may cancel" in verdict([("{hop 0}", a), (None, b)])
    assert "can't name" in verdict([("{hop 0}", None)])
