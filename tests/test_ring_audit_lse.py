"""Audit of the flash-attention style (out, lse) merges ring-reorder accepts by their algebra (ring/logsum.py),
against jax.jit (8 CPU devices, dp=2 x cp=4).

The algebra is exact; three float effects it lets through change what a reordered ring computes:

- An lse update that is the log-sum-exp in exact arithmetic but overflows in floats where the two lses are far
  apart: `lse_b + log1p(exp(lse - lse_b))`, `lse_b - log(sigmoid(lse_b - lse))`. A block whose rows are all
  masked with -1e30 has lse_b = -1e30, so exp(lse - lse_b) = inf and lse becomes +inf from that step on (the
  output, merged with sigmoid(lse_b - lse), stays finite); large scores (|lse - lse_b| > 88) do the same. Which
  rows meet which block at which step is the layout, so the result changes: the forward's output on large scores,
  and the custom_vjp kernel's gradients (its backward reads the forward's lse) on plain random data.
- A state started at a moderately large sentinel (lse = -1e4) with the sigmoid form: `lse - log_sigmoid(lse -
  lse_b)` rounds at the first merge (ulp(1e4) ~ 1e-3), which the start check tolerates (it allows 1e-3 * (1 +
  |exact|)), and the first merge happens on other keys in each layout. Under the default ring_reorder ("auto"),
  in a blockwise kernel with chunk skips.
- A state whose first merged block is all masked: a step-0 reset or an isneginf guard takes (out_b, lse_b = -1e30)
  as the state, and the next merge in the sigmoid form cancels, lse - log_sigmoid(lse - lse_b) = -1e30 + 1e30 = 0
  instead of lse_b (the start check covers only the state's start, not a state of masked keys alone). A ring whose
  k, v are sent ahead before the loop (each device starts one or two blocks back) meets an all-masked block first on
  other rows in each layout: the lse changes (and the output, where two live blocks follow). So does a fold of the
  stacked blocks after the loop that starts from the last step's block (all masked for most rows).

A refusal of a hard max for the lse points at the (correct) output merge and calls it a constant weighting.
Guards (accepted and equal to jax.jit): stable spellings of the same merges on large scores (the sigmoid form from
the own block before the loop, not under a guard: see the third case), the logaddexp form
from a -1e4 sentinel under "auto" and after an all-masked first block, the custom_vjp logaddexp kernel's gradients.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import autofix_shardings
from support import ring_user_kernels as ruk
from support import ring_user_lse as ul

CP, B, S, D = 4, 2, 32, 8
MESH = jax.make_mesh((2, CP), ("dp", "cp"))
SPEC = P("dp", "cp", None)


def _args(scale: float = 1.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, S, D)).astype(np.float32) for _ in range(3))
    return tuple(jax.device_put(x, NamedSharding(MESH, SPEC)) for x in (q * scale, k, v))


def _ring(body):
    return jax.shard_map(body, mesh=MESH, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)


def _grad(f):
    return jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) ** 2), argnums=(0, 1, 2))


def _sound(f, strategy: str, args) -> list:
    """The ring decisions; where a ring is rewritten, the compiled result equals jax.jit's (relative 1e-5 where
    jax.jit's is finite, and finite there)."""
    low = autofix_shardings(f, on_fix="ignore", ring_reorder=strategy).lower(*args)
    decisions = [(r.applied, r.why) for r in low.rings]
    if any(applied for applied, _ in decisions):
        got, want = low.compile()(*args), jax.jit(f)(*args)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            finite = np.isfinite(b)
            assert np.isfinite(a[finite]).all(), ("non-finite where jax.jit is finite", decisions)
            error = float(np.max(np.abs(a - b)[finite] / (1.0 + np.abs(b[finite]))))
            assert error <= 1e-5, (error, decisions)
    return decisions


def _sig_out(out, lse, out_b, lse_b):
    return out - jax.nn.sigmoid(lse_b - lse)[..., None] * (out - out_b)


def merge_log1p(out, lse, out_b, lse_b, i):
    """The log-sum-exp as log1p of an unshifted exponential: overflows where lse - lse_b > 88."""
    return _sig_out(out, lse, out_b, lse_b), lse_b + jnp.log1p(jnp.exp(lse - lse_b))


def merge_log_of_sigmoid(out, lse, out_b, lse_b, i):
    """log_sigmoid spelled log(sigmoid(.)): sigmoid underflows to 0 where lse - lse_b > 88."""
    return _sig_out(out, lse, out_b, lse_b), lse_b - jnp.log(jax.nn.sigmoid(lse_b - lse))


def merge_stable(out, lse, out_b, lse_b, i):
    """The same algebra, shifted so that no exponential overflows: max + log1p(exp(-|lse - lse_b|))."""
    return _sig_out(out, lse, out_b, lse_b), jnp.maximum(lse, lse_b) + jnp.log1p(jnp.exp(-jnp.abs(lse - lse_b)))


def merge_hard_max(out, lse, out_b, lse_b, i):
    """A hard max for the lse, the output merged as the sigmoid form does."""
    out = _sig_out(out, lse, out_b, lse_b)
    return out, jnp.maximum(lse, lse_b)  # the wrong line


@pytest.mark.parametrize("merge", [merge_log1p, merge_log_of_sigmoid])
def test_overflowing_lse_update_keeps_jit_results_on_large_scores(monkeypatch, merge):
    monkeypatch.setitem(ul.MERGES, merge.__name__, merge)
    _sound(_ring(ul.lse_ring(CP, merge.__name__)), "zigzag", _args(60.0))


def test_overflowing_lse_update_keeps_custom_vjp_gradients(monkeypatch):
    """Random data: the -1e30 masked blocks alone make the forward's lse +inf on other rows in each layout, and
    the backward's probabilities exp(s - lse) with them."""
    monkeypatch.setitem(ul.MERGES, "log1p", merge_log1p)
    _sound(_grad(_ring(ul.lse_ring_vjp(CP, "log1p"))), "zigzag", _args())


def _blockwise_sentinel(monkeypatch, lse_update):
    """ruk.blockwise_ring (chunk skips: the tile count picks zigzag) merging (out, lse) per chunk pair, the state
    started at lse = -1e4."""
    def fold(acc, s, v, i):
        lse, out = acc
        m = jnp.max(s, axis=-1)
        p = jnp.exp(s - m[..., None])
        l = jnp.sum(p, axis=-1)
        out_b, lse_b = jnp.einsum("bqk,bkd->bqd", p, v) / l[..., None], m + jnp.log(l)
        return lse_update(lse, lse_b), _sig_out(out, lse, out_b, lse_b)

    monkeypatch.setitem(ruk.MERGES, "lse", fold)
    monkeypatch.setattr(ruk, "init_state", lambda q, merge: (jnp.zeros_like(q[..., 0]) - 1e4, jnp.zeros_like(q)))
    return _ring(ruk.blockwise_ring(CP, 4, ruk.MASKS["causal"], ruk.LIVE["causal"], merge="lse"))


def test_sigmoid_merge_from_a_1e4_sentinel_keeps_jit_results_by_default(monkeypatch):
    f = _blockwise_sentinel(monkeypatch, lambda lse, lse_b: lse - jax.nn.log_sigmoid(lse - lse_b))
    _sound(f, "auto", _args())


def _ring_sent_ahead(merge: str, hops: int, init: float | None, lse_out: bool):
    """ul.lse_ring's fori ring (every block masked, none skipped) with k, v sent `hops` steps before the loop: step
    i holds block me - hops - i. `init` None: the state is step 0's block, computed before the loop (all masked on
    the devices the hops wrap around). Returns the output, or the lse broadcast over the output's last dim."""
    def body(q, k, v):
        b, n, _ = q.shape
        me = jax.lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)
        for _ in range(hops):
            k, v = (jax.lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v))

        def attend(k, v, i):
            k_pos = ((me - hops - i) % CP) * n + jnp.arange(n)
            return ul.block(q, k, v, q_pos[:, None] >= k_pos[None, :])

        def step(i, carry):
            state, k, v = carry
            state = ul.MERGES[merge](*state, *attend(k, v, i), i)
            return state, jax.lax.ppermute(k, "cp", ruk.ring(CP)), jax.lax.ppermute(v, "cp", ruk.ring(CP))

        start = 0
        if init is None:
            state = attend(k, v, 0)
            k, v = (jax.lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v))
            start = 1
        else:
            state = (jnp.zeros_like(q), jnp.full((b, n), init, q.dtype))
        out, lse = jax.lax.fori_loop(start, CP, step, (state, k, v))[0]
        return jnp.broadcast_to(lse[..., None], out.shape) if lse_out else out

    return _ring(body)


@pytest.mark.parametrize("merge, hops, lse_out", [("guarded-sigmoid", 2, False), ("reset-sigmoid", 1, True)])
def test_sigmoid_merge_after_an_all_masked_first_block_keeps_jit_results(merge, hops, lse_out):
    init = -jnp.inf if merge.startswith("guarded") else ruk.NEG
    _sound(_ring_sent_ahead(merge, hops, init, lse_out), "zigzag", _args())


@pytest.mark.parametrize("merge", ["sigmoid", "softplus"])
def test_sigmoid_merge_from_a_block_before_the_loop_is_refused_where_masked(merge):
    """The state started from a block computed before the loop, of k, v sent a step ahead: all masked on device 0,
    whose lse -1e30 + log n the first sigmoid merge cancels to 0 (accepted, the lse was off by up to 3 under zigzag
    and striped). The own block before the loop (never all masked, which the proof does not know) is refused too
    where the scores are masked; the logaddexp form from the same start stays accepted (below)."""
    for f in (_ring_sent_ahead(merge, 1, None, True), _ring(ul.lse_ring(CP, merge, first="peeled"))):
        decisions = _sound(f, "zigzag", _args())
        assert decisions and not any(applied for applied, _ in decisions), decisions
        assert all("a block computed before the loop" in why for _, why in decisions), decisions


def test_sigmoid_fold_after_the_loop_from_the_last_block_keeps_jit_results():
    """The blocks stacked by the ring's scan and merged after it, last step first: the last step's block is all
    masked for most rows, so the fold's state starts as lse = -1e30 on rows that change with the layout."""
    def body(q, k, v):
        n = q.shape[1]
        me = jax.lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(carry, i):
            k, v = carry
            k_pos = ((me - i) % CP) * n + jnp.arange(n)
            block = ul.block(q, k, v, q_pos[:, None] >= k_pos[None, :])
            return tuple(jax.lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v)), block

        _, (outs, lses) = jax.lax.scan(step, (k, v), jnp.arange(CP))
        out, lse = outs[CP - 1], lses[CP - 1]
        for j in range(CP - 2, -1, -1):
            out, lse = ul.merge_sigmoid(out, lse, outs[j], lses[j], j)
        return out

    _sound(_ring(body), "zigzag", _args())


def test_refusal_of_a_hard_max_lse_names_the_lse_update(monkeypatch):
    monkeypatch.setitem(ul.MERGES, "hard-max-sigmoid", merge_hard_max)
    decisions = _sound(_ring(ul.lse_ring(CP, "hard-max-sigmoid")), "zigzag", _args())
    assert decisions and not any(applied for applied, _ in decisions), decisions
    lines, first = inspect.getsourcelines(merge_hard_max)
    wrong = first + next(i for i, line in enumerate(lines) if "# the wrong line" in line)
    assert all(f"test_ring_audit_lse.py:{wrong}" in why and "the constant 0.5" not in why for _, why in decisions), \
        decisions


# ---------------------------------------------------------------------------------------------------------------
# Guards: sound programs that must stay accepted (and equal to jax.jit).


def test_stable_spellings_stay_accepted_and_equal_on_large_scores(monkeypatch):
    """The max-shifted log1p, the guarded logaddexp, and the logaddexp form from the own block before the loop.
    The sigmoid form under a guard or from a block before the loop is refused where the scores are masked: the
    block may have rows of masked keys alone, which the next sigmoid merge cancels to 0."""
    monkeypatch.setitem(ul.MERGES, "stable", merge_stable)
    for f in (_ring(ul.lse_ring(CP, "stable")), _ring(ul.lse_ring(CP, "guarded-logaddexp", init="inf")),
              _ring(ul.lse_ring(CP, "logaddexp", first="peeled"))):
        decisions = _sound(f, "zigzag", _args(60.0))
        assert decisions and all(applied for applied, _ in decisions), decisions


def test_logaddexp_merge_from_a_1e4_sentinel_stays_accepted_by_default(monkeypatch):
    """The blockwise kernel with the logaddexp update from -1e4: exact in floats at the first merge."""
    f = _blockwise_sentinel(monkeypatch, jnp.logaddexp)
    decisions = _sound(f, "auto", _args())
    assert decisions and all(applied for applied, _ in decisions), decisions


@pytest.mark.parametrize("merge, init", [("reset-logaddexp", ruk.NEG), ("logaddexp", None)])
def test_logaddexp_after_an_all_masked_first_block_stays_accepted_and_equal(merge, init):
    decisions = _sound(_ring_sent_ahead(merge, 1, init, True), "zigzag", _args())
    assert decisions and all(applied for applied, _ in decisions), decisions


def test_custom_vjp_logaddexp_gradients_stay_equal():
    decisions = _sound(_grad(_ring(ul.lse_ring_vjp(CP, "logaddexp"))), "zigzag", _args())
    assert decisions and all(applied for applied, _ in decisions), decisions
