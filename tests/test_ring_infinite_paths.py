"""-inf reaching an unguarded online softmax's running max by paths other than a -inf constant: an additive bias
passed in as an input, finite constants whose sum or product overflows, exp of a finite number that overflows, an
integer bias converted to float16. With the max started at -inf, a row whose first block hides every key gets
exp(-inf - -inf) = nan for ever, and which rows those are depends on what each block holds: ring-reorder must
leave such a ring alone (or compute what jax.jit computes, nans included). Also a float16 running sum made with no
convert at all (float16 einsums), which overflows in one block order and not another. The guarded merge (shift by
where(isfinite(m), m, 0)) is order-free whatever the scores, and may be rewritten."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import autofix_shardings
from support.ring_user_kernels import merge_guarded, merge_online, ring

CP, B, S, D = 4, 2, 32, 8
SPEC = P("dp", "cp", None)
F32_MIN = float(np.finfo(np.float32).min)


def _strict(qp, kp):
    return qp > kp


# masked scores (s, q positions [n, 1], k positions [1, n], the key bias block [b, n] or None)
MASKED = {
    # a key-padding bias given as an input, -inf on keys 0..7
    "input_bias": lambda s, qp, kp, kb: s + kb[:, None, :],
    # a causal bias plus a padding-style bias, each the most negative float32: their sum is -inf
    "finfo_min_twice": lambda s, qp, kp, kb: s + jnp.where(_strict(qp, kp), 0.0, F32_MIN)
    + jnp.where(_strict(qp, kp), 0.0, F32_MIN),
    "finfo_min_scaled": lambda s, qp, kp, kb: jnp.where(_strict(qp, kp), s, F32_MIN) * 2.0,
    # a replicated key bias [S] gathered by the keys' positions (as RoPE's tables are), -inf on keys 0..7
    "replicated_bias": lambda s, qp, kp, kb: s + kb[kp],
    # 1 / 0: the mask's zeros make -inf
    "divide_by_zero": lambda s, qp, kp, kb: s - 1.0 / _strict(qp, kp).astype(jnp.float32) + 1.0,
    # -exp(100) is -inf in float32
    "exp_overflow": lambda s, qp, kp, kb: jnp.where(_strict(qp, kp), s, -jnp.exp(jnp.full((), 100.0) + 0 * s)),
}


def _native_merge(acc, s, v, i):
    """merge_online with every sum a float16 einsum: no convert anywhere (jnp.sum of float16 adds in float32)."""
    m0, l0, o0 = acc
    m = jnp.maximum(m0, jnp.max(s, axis=-1))
    p = jnp.exp(s - m[..., None])
    corr = jnp.exp(m0 - m)
    row = jnp.einsum("bqk,bko->bqo", p, jnp.ones(v.shape[:-1] + (1,), v.dtype))[..., 0]
    return m, l0 * corr + row, o0 * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v)


def _f32_row_sum_merge(acc, s, v, i):
    """The float16 output accumulator a float16 einsum, the row sum kept in float32."""
    m0, l0, o0 = acc
    m = jnp.maximum(m0, jnp.max(s, axis=-1))
    p = jnp.exp(s - m[..., None])
    corr = jnp.exp(m0 - m)
    return (m, l0 * corr.astype(jnp.float32) + jnp.sum(p, axis=-1, dtype=jnp.float32),
            o0 * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v))


def _kernel(masked, merge, dtype=jnp.float32, m0=-jnp.inf, with_bias=False, sum_dtype=None):
    def body(q, k, v, *bias):
        b, n, d = q.shape
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            state, k, v, kb = carry
            k_pos = ((me - i) % CP) * n + jnp.arange(n)
            s = jnp.einsum("bqd,bkd->bqk", q, k)
            state = merge(state, masked(s, q_pos[:, None], k_pos[None, :], kb), v, i)  # refused here
            kb = kb if kb is None or kb.ndim == 1 else lax.ppermute(kb, "cp", ring(CP))
            return state, lax.ppermute(k, "cp", ring(CP)), lax.ppermute(v, "cp", ring(CP)), kb

        state = (jnp.full((b, n), m0, dtype), jnp.zeros((b, n), sum_dtype or dtype), jnp.zeros((b, n, d), dtype))
        (_, l, o), _, _, _ = lax.fori_loop(0, CP, step, (state, k, v, bias[0] if with_bias else None))
        return (o.astype(l.dtype) / l[..., None]).astype(dtype)
    return body


def _run(body, args_np, specs, strategy):
    mesh = jax.make_mesh((2, CP), ("dp", "cp"))
    fn = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=SPEC, check_vma=False)
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args_np, specs)]
    low = autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(*args)
    return (low, np.asarray(jax.jit(fn)(*args), np.float32), np.asarray(low.compile()(*args), np.float32),
            [(r.strategy, r.applied, r.why) for r in low.rings])


def _qkv(dtype=np.float32):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((B, S, D)).astype(dtype) for _ in range(3)]


def _bias():
    bias = np.zeros((B, S), np.float32)
    bias[:, :8] = -np.inf  # the first contiguous block: every key device 0 sees first
    return bias


def _left_alone(low, want, got, decisions, tol=1e-5):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=f"SOUNDNESS: {decisions}")
    assert low.rings and not any(r.applied for r in low.rings), decisions
    assert all(r.why.startswith("not provably safe") for r in low.rings), decisions


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("bias", ["input_bias", "replicated_bias"])
def test_minus_infinity_bias_given_as_an_input_is_left_alone(bias, strategy):
    """A key bias sharded like k and sent round with it, or replicated and read at the keys' positions."""
    body = _kernel(MASKED[bias], merge_online, with_bias=True)
    table, spec = (_bias(), P("dp", "cp")) if bias == "input_bias" else (_bias()[0], P())
    low, want, got, decisions = _run(body, _qkv() + [table], (SPEC,) * 3 + (spec,), strategy)
    # jax.jit's nans: every row of device 0, whose own block (seen first) holds only masked keys
    assert np.flatnonzero(np.isnan(want[0, :, 0])).tolist() == list(range(8))
    _left_alone(low, want, got, decisions)


@pytest.mark.parametrize("masked", ["finfo_min_twice", "finfo_min_scaled", "exp_overflow", "divide_by_zero"])
def test_finite_numbers_that_overflow_to_minus_infinity_are_left_alone(masked):
    low, want, got, decisions = _run(_kernel(MASKED[masked], merge_online), _qkv(), (SPEC,) * 3, "zigzag")
    assert np.flatnonzero(np.isnan(want[0, :, 0])).tolist() == [0, 8, 16, 24]  # as with a -inf mask
    _left_alone(low, want, got, decisions)


def test_integer_bias_converted_to_float16_is_left_alone():
    """-(q + 100000) is finite as an int32 and -inf in float16."""
    def masked(s, qp, kp, kb):
        return s + (jnp.where(_strict(qp, kp), 0, -1) * (qp + 100000)).astype(s.dtype)

    body = _kernel(masked, _native_merge, dtype=jnp.float16)
    low, want, got, decisions = _run(body, _qkv(np.float16), (SPEC,) * 3, "zigzag")
    assert np.isnan(want).any()
    _left_alone(low, want, got, decisions, tol=2e-2)


@pytest.mark.parametrize("row_sum", ["float16", "float32"])
def test_float16_running_sum_made_without_converts_is_left_alone(row_sum):
    """q = 0 (every weight 1), v = +-10000 on chunks {0, 4} / {2, 6} of 8 chunks of 4 tokens: each contiguous block
    sums to +-40000 and alternates in sign, so no partial sum leaves float16's range (65504) in the ring order;
    zigzag's blocks are +40000, -40000, -40000, +40000 and two of one sign in a row overflow."""
    q = np.zeros((B, S, D), np.float16)
    v = np.zeros((B, S, D), np.float16)
    for chunk, sign in ((0, 1), (4, 1), (2, -1), (6, -1)):
        v[:, 4 * chunk:4 * chunk + 4] = sign * 10000
    merge, sum_dtype = (_native_merge, None) if row_sum == "float16" else (_f32_row_sum_merge, jnp.float32)
    body = _kernel(lambda s, qp, kp, kb: s, merge, dtype=jnp.float16, m0=-1e4, sum_dtype=sum_dtype)
    low, want, got, decisions = _run(body, [q, np.ones_like(q), v], (SPEC,) * 3, "zigzag")
    assert (want == 0).all()  # the float32 result
    _left_alone(low, want, got, decisions)


def test_guarded_merge_with_a_minus_infinity_input_bias_computes_what_jax_jit_computes():
    body = _kernel(MASKED["input_bias"], merge_guarded, with_bias=True)
    low, want, got, decisions = _run(body, _qkv() + [_bias()], (SPEC,) * 3 + (P("dp", "cp"),), "zigzag")
    assert low.rings, "no ring found"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True, err_msg=str(decisions))


def test_running_max_started_from_a_minus_infinity_input_is_left_alone():
    """The max started from a replicated input (an attention sink's logit, -inf: no sink), -inf masks, the ring
    unrolled: the start is no finite floor, whatever the analysis can see of its value."""
    def body(q, k, v, m0):
        b, n, d = q.shape
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)
        state = (jnp.broadcast_to(m0[:, None], (b, n)), jnp.zeros((b, n)), jnp.zeros((b, n, d)))
        for i in range(CP):
            k_pos = ((me - i) % CP) * n + jnp.arange(n)
            s = jnp.einsum("bqd,bkd->bqk", q, k)
            state = merge_online(state, jnp.where(_strict(q_pos[:, None], k_pos[None, :]), s, -jnp.inf), v, i)
            if i < CP - 1:
                k, v = lax.ppermute(k, "cp", ring(CP)), lax.ppermute(v, "cp", ring(CP))
        return state[2] / state[1][..., None]

    sink = np.full((B,), -np.inf, np.float32)
    low, want, got, decisions = _run(body, _qkv() + [sink], (SPEC,) * 3 + (P("dp"),), "zigzag")
    assert np.flatnonzero(np.isnan(want[0, :, 0])).tolist() == [0, 8, 16, 24]
    _left_alone(low, want, got, decisions)
