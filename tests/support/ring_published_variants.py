"""ejkernel's Pallas ring as a user adapts it (online-softmax merge, global positions), with one published feature
each: masks and biases (T5 buckets, ALiBi, chunked local), ring direction, block skips, look-back by ring passes,
per-device statistics, dropout, a bidirectional ring."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from support.ring_published_common import NEG, online_merge, online_merge_biased, shift


def ejkernel_pallas_ring_online(cp: int, *, offset: bool = False, window: int | None = None, sinks: bool = False,
                                unroll: bool = True, carried: bool = True, init_from_q: bool = False):
    """ejkernel's Pallas TPU ring attention as above with the merge its splash kernel performs inside (online
    softmax across ring steps). As published: lax.scan(unroll=True), the kv source coordinate carried as
    `(kv_source - 1) % cp`, state initialised with jnp.zeros / jnp.full. `offset`: the mask compares q ids
    `arange(n) + device_idx * n - kv_source * n` with local kv ids (as published) rather than the two blocks'
    global positions; `unroll=False, carried=False, init_from_q=True`: the loop rolled, the source taken from the
    step (`(device_idx - i) % cp`) and the state made from q, as a user adapting it for shardfix would."""

    def body(q, k, v, *extra):
        device_idx = lax.axis_index("cp")
        b, n, d = q.shape
        base = jnp.arange(n, dtype=jnp.int32)

        def step(carry, iteration):
            state, k_cur, v_cur, kv_source = carry
            if not carried:
                kv_source = (device_idx - iteration) % cp
            if offset:
                q_ids, kv_ids = base + device_idx * n - kv_source * n, base
            else:
                q_ids, kv_ids = device_idx * n + base, kv_source * n + base
            mask = q_ids[:, None] >= kv_ids[None, :]
            if window is not None:
                mask &= q_ids[:, None] - window <= kv_ids[None, :]
            state = online_merge(state, q, k_cur, v_cur, mask)
            if sinks:  # the sink logit joins the softmax at iteration 0 only
                acc, m, l = state
                sink = jnp.where(iteration == 0, extra[0], -1e9)
                m_new = jnp.maximum(m, sink)
                corr = jnp.exp(m - m_new)
                state = acc * corr[..., None], m_new, l * corr + jnp.exp(sink - m_new)
            return (state, shift(k_cur, cp), shift(v_cur, cp), (kv_source - 1) % cp), None

        if init_from_q:
            zero = jnp.zeros_like(q[..., 0])
            init = (jnp.zeros_like(q), zero + NEG, zero)
        else:
            init = (jnp.zeros((b, n, d)), jnp.full((b, n), NEG), jnp.zeros((b, n)))
        start = (init, k, v, device_idx.astype(jnp.int32))
        ((acc, _, l), _, _, _), _ = lax.scan(step, start, xs=jnp.arange(cp), length=cp, unroll=unroll)
        return acc / l[..., None]

    return body


def rolled_ring(cp: int, *, direction: int = 1, source_step: int = -1, block_skip: bool = False,
                 row_sums: bool = False, dropout: bool = False, bidirectional: bool = False,
                 mask_fn: Callable | None = None, bias_fn: Callable | None = None, source_fn: Callable | None = None,
                 max_passes: int | None = None, passes_by_cond: bool = False):
    """ejkernel-online-rolled (the Pallas ring's algorithm as a user adapts it: a rolled scan, the source from the
    step, online softmax, global positions) with one change each, as users write them:
    - `direction`: the ring turns the other way (k, v sent down), and `source_step` the sign of the step in the
      source coordinate `(device_idx + source_step * i) % cp` (-direction is right; +direction is a kernel whose
      mask follows the other blocks than the ones it holds, still a program jax.jit computes);
    - `block_skip`: a block is skipped with lax.cond when its first key comes after the block's last query
      (ring-flash-attention's `step <= rank`, written with positions);
    - `row_sums`: the kernel also returns, a device, the sum of its softmax denominators (a per-device statistic,
      sharded like the devices, which depends on which tokens a device holds);
    - `dropout`: attention dropout with a key folded with the device index and the step (Liu et al.'s attn_pdrop);
    - `bidirectional`: k, v travel both ways, two blocks merged a step for cp/2 steps and the block opposite;
    - `mask_fn(q_pos, k_pos)` / `bias_fn(q_pos, k_pos)`: another mask, or a bias added to the scores, from the
      [n, n] global positions; `source_fn(device_idx, i)`: the source coordinate spelled another way;
    - `max_passes`: lucidrains/ring-attention-pytorch's `max_lookback_seq_len` -> `max_ring_passes`: only the
      blocks of the first ring passes are attended (the loop stops early, or `passes_by_cond`: later passes skipped
      with lax.cond on the pass), a look-back by blocks that holds only for contiguous tokens."""

    def body(q, k, v):
        device_idx = lax.axis_index("cp")
        b, n, d = q.shape
        base = jnp.arange(n, dtype=jnp.int32)
        q_pos = device_idx * n + base

        def merge(state, kb, vb, src, i):
            k_pos = src * n + base
            qp, kp = q_pos[:, None], k_pos[None, :]
            mask = qp >= kp if mask_fn is None else mask_fn(qp, kp)
            if bias_fn is not None:
                return online_merge_biased(state, q, kb, vb, mask, bias_fn(qp, kp))
            if dropout:
                key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), device_idx), i)
                mask &= jax.random.bernoulli(key, 0.9, (n, n))
            if not block_skip:
                return online_merge(state, q, kb, vb, mask)
            live = device_idx * n + n - 1 >= src * n
            return lax.cond(live, lambda st: online_merge(st, q, kb, vb, mask), lambda st: st, state)

        zero = jnp.zeros_like(q[..., 0])
        state = (jnp.zeros_like(q), zero + NEG, zero)
        if bidirectional:
            def step2(i, carry):
                state, ku, vu, kd, vd = carry
                state = merge(state, ku, vu, (device_idx - i) % cp, i)
                state = merge(state, kd, vd, (device_idx + i) % cp, i)
                return state, shift(ku, cp), shift(vu, cp), shift(kd, cp, -1), shift(vd, cp, -1)

            state = merge(state, k, v, device_idx, 0)
            start = (state, shift(k, cp), shift(v, cp), shift(k, cp, -1), shift(v, cp, -1))
            state, ku, vu, _, _ = lax.fori_loop(1, cp // 2, step2, start)
            state = merge(state, ku, vu, (device_idx - cp // 2) % cp, cp // 2)
        else:
            def step(carry, i):
                state, kc, vc = carry
                src = (device_idx + source_step * i) % cp if source_fn is None else source_fn(device_idx, i)
                if passes_by_cond:
                    state = lax.cond(i < max_passes, lambda st: merge(st, kc, vc, src, i), lambda st: st, state)
                else:
                    state = merge(state, kc, vc, src, i)
                return (state, shift(kc, cp, direction), shift(vc, cp, direction)), None

            trips = max_passes if max_passes is not None and not passes_by_cond else cp
            (state, _, _), _ = lax.scan(step, (state, k, v), xs=jnp.arange(trips))
        acc, _, l = state
        out = acc / l[..., None]
        if row_sums:
            return out, l.sum(axis=1, keepdims=True)
        return out

    return body


def t5_relative_bucket(relative_position, num_buckets: int = 8, max_distance: int = 32):
    """T5's causal relative-position bucket (Raffel et al.; flax / t5x `_relative_position_bucket`,
    bidirectional=False): exact buckets for small distances, logarithmic ones beyond."""
    n = jnp.maximum(-relative_position, 0)
    max_exact = num_buckets // 2
    large = max_exact + (jnp.log(n.astype(jnp.float32) / max_exact + 1e-6) / np.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(jnp.int32)
    return jnp.where(n < max_exact, n, jnp.minimum(large, num_buckets - 1))


T5_TABLE = np.linspace(-1.0, 1.0, 8, dtype=np.float32)  # a learned per-bucket bias, replicated


def t5_bias(qp, kp):
    return jnp.asarray(T5_TABLE)[t5_relative_bucket(kp - qp)]


def alibi_bias(qp, kp):
    """ALiBi (Press et al.): a per-head slope times the distance; one head here."""
    return -0.25 * (qp - kp).astype(jnp.float32)


def chunked_local(qp, kp):
    """Llama 4's chunked local attention: causal within chunks of 12 tokens."""
    return (qp >= kp) & (qp // 12 == kp // 12)
