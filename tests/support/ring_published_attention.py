"""Published ring attention kernels in our own words (ring-flash-attention, flash_attn_jax, ejkernel's Pallas TPU
ring, Liu et al.'s blockwise RingAttention, striped attention, TransformerEngine's load-balanced layout)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from support.ring_published_common import NEG, S, block_attention, local_causal, online_merge, shift

# ---------------------------------------------------------------------------------------------------------------
# Ring attention as published.


def update_out_and_lse(out, lse, block_out, block_lse):
    """ring-flash-attention's merge of a block's (out, lse) into the running ones (utils.py, the sigmoid form of
    out' = e^(lse - lse') out + e^(blse - lse') bout, lse' = log(e^lse + e^blse))."""
    out = out - jax.nn.sigmoid(block_lse - lse)[..., None] * (out - block_out)
    lse = lse - jax.nn.log_sigmoid(lse - block_lse)
    return out, lse


def ring_flash_attn(cp: int, causal: bool, by_hand: bool = False):
    """zhuzilin/ring-flash-attention `ring_flash_attn_forward`: k, v go to the next rank each step; step 0 is
    causal within the block, a later step is computed only when `step <= rank` (the block came from an earlier
    rank), each block's (out, lse) merged by `update_out_and_lse`."""

    def body(q, k, v):
        rank = lax.axis_index("cp")
        out, lse = block_attention(q, k, v, local_causal(q.shape[1]) if causal else None, by_hand=by_hand)
        for step in range(1, cp):
            k, v = shift(k, cp), shift(v, cp)

            def compute(state, k=k, v=v):
                return update_out_and_lse(*state, *block_attention(q, k, v, by_hand=by_hand))

            if causal:
                out, lse = lax.cond(step <= rank, compute, lambda st: st, (out, lse))
            else:
                out, lse = compute((out, lse))
        return out

    return body


def zigzag_ring_flash_attn(cp: int, by_hand: bool = False):
    """ring-flash-attention's `zigzag_ring_flash_attn_forward`, on input the user has put in zigzag order itself
    (device r holds chunks r and 2cp-1-r): step 0 causal within the block; a block from an earlier rank is attended
    by every query with its first half of keys, one from a later rank by the second half of queries only, which
    is written back into that half of the output."""

    def body(q, k, v):
        rank = lax.axis_index("cp")
        half = q.shape[1] // 2
        out, lse = block_attention(q, k, v, local_causal(q.shape[1]), by_hand=by_hand)
        for step in range(1, cp):
            k, v = shift(k, cp), shift(v, cp)

            def first_keys(st, k=k, v=v):
                block = block_attention(q, k[:, :half], v[:, :half], by_hand=by_hand)
                return update_out_and_lse(*st, *block)

            def second_queries(st, k=k, v=v):
                o, l = st
                block = block_attention(q[:, half:], k, v, by_hand=by_hand)
                o2, l2 = update_out_and_lse(o[:, half:], l[:, half:], *block)
                return o.at[:, half:].set(o2), l.at[:, half:].set(l2)

            out, lse = lax.cond(step <= rank, first_keys, second_queries, (out, lse))
        return out

    return body


def flash_attn_jax_ring(cp: int, causal: bool, by_hand: bool = False):
    """nshepperd/flash_attn_jax `ring_fwd`: lax.scan over cp steps carrying (k, v, o, lse, k_ix); k_ix, the ring
    coordinate of the block held, travels with k and v; causal: lax.switch on (k_ix < q_ix) + (k_ix <= q_ix)
    between skip, causal within the block and full; merge by max/min and log1p."""

    def body(q, k, v):
        b, n, d = q.shape
        q_ix = lax.axis_index("cp")

        def f(c, _):
            k, v, o, lse, k_ix = c
            if causal:
                cmp = (k_ix < q_ix).astype(jnp.int32) + (k_ix <= q_ix).astype(jnp.int32)
                o2, lse2 = lax.switch(cmp, [
                    lambda: (jnp.zeros((b, n, d), q.dtype), jnp.full((b, n), -jnp.inf, jnp.float32)),
                    lambda: block_attention(q, k, v, local_causal(n), by_hand=by_hand),
                    lambda: block_attention(q, k, v, by_hand=by_hand)])
            else:
                o2, lse2 = block_attention(q, k, v, by_hand=by_hand)
            mx = jnp.maximum(lse, lse2)
            mn = jnp.minimum(lse, lse2)
            lse_new = jnp.log1p(jnp.exp(mn - mx)) + mx
            o = o * jnp.exp(lse - lse_new)[..., None] + o2 * jnp.exp(lse2 - lse_new)[..., None]
            k, v, k_ix = shift(k, cp), shift(v, cp), shift(k_ix, cp)
            return (k, v, o, lse_new, k_ix), None

        init = (k, v, jnp.zeros((b, n, d), jnp.float32), jnp.full((b, n), -jnp.inf, jnp.float32), q_ix)
        (_, _, o, _, _), _ = lax.scan(f, init, None, cp)
        return o.astype(q.dtype)

    return body


def ejkernel_pallas_ring(cp: int, sinks: bool = False, window: int | None = None, by_hand: bool = False):
    """ejkernel's Pallas TPU ring attention (kernels/_pallas/tpu/ring_attention), its splash kernel replaced by a
    dense block: lax.scan(unroll=True) over arange(cp), k and v sent up the ring, the source coordinate of the
    block held carried as `(kv_source - 1) % cp`; the causal / sliding-window mask compares q ids
    `arange(n) + device_idx * n - kv_source * n` with the block's local kv ids; `_update_out_and_lse` merges
    (sigmoid / softplus, the first block taken as it is where lse == -inf); sinks count at iteration 0 only."""

    def body(q, k, v, *extra):
        device_idx = lax.axis_index("cp")
        n = q.shape[1]
        base = jnp.arange(n, dtype=jnp.int32)

        def update(out, lse, block_out, block_lse):
            is_first = lse == -jnp.inf
            new_out = out - jax.nn.sigmoid(block_lse - lse)[..., None] * (out - block_out)
            new_lse = lse + jax.nn.softplus(block_lse - lse)
            return jnp.where(is_first[..., None], block_out, new_out), jnp.where(is_first, block_lse, new_lse)

        def step(carry, iteration):
            o_prev, lse_prev, k_cur, v_cur, kv_source = carry
            k_next, v_next = shift(k_cur, cp), shift(v_cur, cp)
            q_ids = base + device_idx * n - kv_source * n
            kv_ids = base
            mask = q_ids[:, None] >= kv_ids[None, :]
            if window is not None:
                mask &= (q_ids[:, None] - window <= kv_ids[None, :]) & (q_ids[:, None] + window >= kv_ids[None, :])
            sink = jnp.where(iteration == 0, extra[0], -1e9) if sinks else None
            out_cur, lse_cur = block_attention(q, k_cur, v_cur, mask, sink, by_hand=by_hand)
            o_next, lse_next = update(o_prev, lse_prev, out_cur, lse_cur)
            return (o_next, lse_next, k_next, v_next, (kv_source - 1) % cp), None

        init = (jnp.zeros(q.shape, jnp.float32), jnp.full(q.shape[:2], -jnp.inf, jnp.float32), k, v,
                device_idx.astype(jnp.int32))
        (o, _, _, _, _), _ = lax.scan(step, init, xs=jnp.arange(cp), length=cp, unroll=True)
        return o.astype(q.dtype)

    return body


def blockwise_ring(cp: int, chunk: int, *, skip: str = "liu"):
    """Liu et al.'s blockwise RingAttention (ringattention_jax: `_ring_attention_fwd` / `_blockwise_attention_fwd`)
    in our words: a fori_loop over ring steps; in each, a lax.scan over query chunks and an inner lax.scan over
    key chunks, a chunk pair computed or skipped with lax.cond on `below_or_on_diag` of the global chunk indices
    (`axis_index * (n // chunk) + chunk counter`), the mask from `chunk index * chunk + iota`, online softmax.
    `skip`: "liu" (last query of the chunk against the first key), "strict" (chunk indices compared with `>`:
    diagonal pairs skipped too, a different program, whose first rows see no key, that jax.jit computes all the
    same), "coords" (the skip decided by ring coordinates and local chunk counters, as flash_attn_jax's switch
    does by blocks: right for contiguous tokens only)."""

    def live(qc, kc, me, src, qi, ki):
        if skip == "strict":
            return qc > kc
        if skip == "coords":
            return (me > src) | ((me == src) & (qi >= ki))
        return (qc + 1) * chunk - 1 >= kc * chunk

    def body(q, k, v):
        me = lax.axis_index("cp")
        b, n, d = q.shape
        nc = n // chunk
        split = lambda x: jnp.moveaxis(x.reshape(b, nc, chunk, d), 1, 0)
        iota = jnp.arange(chunk)

        def hop(i, carry):
            acc, m, l, k, v = carry
            src = (me - i) % cp
            ks, vs = split(k), split(v)

            def q_chunk(_, xs):
                qb, a, mb, lb, qi = xs
                qc = me * nc + qi

                def k_chunk(state, ys):
                    kb, vb, ki = ys
                    kc = src * nc + ki
                    mask = (qc * chunk + iota)[:, None] >= (kc * chunk + iota)[None, :]
                    return lax.cond(live(qc, kc, me, src, qi, ki), lambda st: online_merge(st, qb, kb, vb, mask),
                                    lambda st: st, state), None

                (a, mb, lb), _ = lax.scan(k_chunk, (a, mb, lb), (ks, vs, jnp.arange(nc)))
                return None, (a, mb, lb)

            _, (a, mb, lb) = lax.scan(q_chunk, None, (split(q), split(acc), mb_split(m), mb_split(l), jnp.arange(nc)))
            join = lambda x: jnp.moveaxis(x, 0, 1).reshape((b, n) + x.shape[3:])
            return join(a), join(mb), join(lb), shift(k, cp), shift(v, cp)

        def mb_split(x):
            return jnp.moveaxis(x.reshape(b, nc, chunk), 1, 0)

        zero = jnp.zeros_like(q[..., 0])
        acc, _, l, _, _ = lax.fori_loop(0, cp, hop, (jnp.zeros_like(q), zero + NEG, zero, k, v))
        return acc / l[..., None]

    return body


def vjp_ring(cp: int):
    """flash_attn_jax's ring attention as a jax.custom_vjp (`ring_fwd` / `ring_bwd`), masks from global positions
    instead of its coordinate switch: the forward merges blocks by online softmax and saves (q, k, v, o, lse);
    the backward runs the ring again, each step ppermuting (dk, dv) and (k, v) together, adding the block's
    dq locally and its dk, dv to the accumulators that travel with their block; after cp steps one more
    ppermute brings dk, dv home."""

    def positions(c, n):
        return c * n + jnp.arange(n)

    def forward(q, k, v):
        me = lax.axis_index("cp")
        n = q.shape[1]

        def step(i, carry):
            state, k, v = carry
            mask = positions(me, n)[:, None] >= positions((me - i) % cp, n)[None, :]
            return online_merge(state, q, k, v, mask), shift(k, cp), shift(v, cp)

        zero = jnp.zeros_like(q[..., 0])
        (acc, m, l), _, _ = lax.fori_loop(0, cp, step, ((jnp.zeros_like(q), zero + NEG, zero), k, v))
        return acc / l[..., None], m + jnp.log(l)

    @jax.custom_vjp
    def attend(q, k, v):
        return forward(q, k, v)[0]

    def fwd(q, k, v):
        o, lse = forward(q, k, v)
        return o, (q, k, v, o, lse)

    def bwd(res, do):
        q, k, v, o, lse = res
        me = lax.axis_index("cp")
        n = q.shape[1]
        scale = q.shape[-1] ** -0.5
        delta = jnp.sum(do * o, axis=-1)

        def step(i, carry):
            k2, v2, dk2, dv2, dq = carry
            dk_next, dv_next = shift(dk2, cp), shift(dv2, cp)
            k_next, v_next = shift(k2, cp), shift(v2, cp)
            mask = positions(me, n)[:, None] >= positions((me - i) % cp, n)[None, :]
            s = jnp.einsum("bqd,bkd->bqk", q, k2) * scale
            p = jnp.where(mask, jnp.exp(s - lse[..., None]), 0.0)
            dv_blk = jnp.einsum("bqk,bqd->bkd", p, do)
            ds = p * (jnp.einsum("bqd,bkd->bqk", do, v2) - delta[..., None])
            dq = dq + jnp.einsum("bqk,bkd->bqd", ds, k2) * scale
            dk_blk = jnp.einsum("bqk,bqd->bkd", ds, q) * scale
            return k_next, v_next, shift(dk2 + dk_blk, cp), shift(dv2 + dv_blk, cp), dq

        _, _, dk, dv, dq = lax.fori_loop(0, cp, step, (k, v, jnp.zeros_like(k), jnp.zeros_like(v), jnp.zeros_like(q)))
        return dq, dk, dv

    attend.defvjp(fwd, bwd)
    return attend


def flash_attn_jax_ring_online(cp: int):
    """nshepperd/flash_attn_jax's ring as above (lax.scan, the block's coordinate k_ix travelling with k and v
    through ppermute), its causal mask taken from the global positions `k_ix * n + arange(n)` of the block held
    rather than a switch, merged by the online softmax."""

    def body(q, k, v):
        q_ix = lax.axis_index("cp")
        b, n, d = q.shape
        base = jnp.arange(n)
        q_pos = q_ix * n + base

        def f(c, _):
            state, k, v, k_ix = c
            k_pos = k_ix * n + base
            state = online_merge(state, q, k, v, q_pos[:, None] >= k_pos[None, :])
            return (state, shift(k, cp), shift(v, cp), shift(k_ix, cp)), None

        init = ((jnp.zeros((b, n, d)), jnp.full((b, n), NEG), jnp.zeros((b, n))), k, v, q_ix)
        ((acc, _, l), _, _, _), _ = lax.scan(f, init, None, cp)
        return acc / l[..., None]

    return body


def online_softmax_ring(cp: int, positions):
    """Liu et al.'s one-block-a-step ring (fori_loop, online softmax) with the causal mask taken from
    `positions(coordinate, n)`: the global index of each local token under the layout the user put tokens in."""

    def body(q, k, v):
        me = lax.axis_index("cp")
        n = q.shape[1]
        q_pos = positions(me, n)

        def step(i, carry):
            acc, m, l, k, v = carry
            k_pos = positions((me - i) % cp, n)
            s = jnp.einsum("bqd,bkd->bqk", q, k) * (q.shape[-1] ** -0.5)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.exp(s - m_new[..., None])
            corr = jnp.exp(m - m_new)
            acc = acc * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v)
            l = l * corr + p.sum(-1)
            return acc, m_new, l, shift(k, cp), shift(v, cp)

        b, _, d = q.shape
        init = (jnp.zeros((b, n, d)), jnp.full((b, n), NEG), jnp.zeros((b, n)), k, v)
        acc, _, l, _, _ = lax.fori_loop(0, cp, step, init)
        return acc / l[..., None]

    return body


def striped_positions(cp: int):
    """Striped attention (Brandon et al. 2023, built on Liu et al.'s JAX code): the model permutes tokens
    "b (n d) -> b (d n)" so device c holds tokens c, c + cp, c + 2cp, ...: local token j is global j * cp + c."""

    def positions(c, n):
        return jnp.arange(n) * cp + c

    return positions


def zigzag_positions(cp: int):
    """TransformerEngine's / MaxText's load-balanced context parallelism (`reorder_causal_load_balancing`): the
    model puts device r's chunks r and 2cp-1-r together, so the kernel's positions are those of the zigzag
    layout."""

    def positions(c, n):
        half = n // 2
        j = jnp.arange(n)
        return jnp.where(j < half, c * half + j, (2 * cp - 1 - c) * half + j - half)

    return positions


def striped_order(cp: int) -> np.ndarray:
    """The permutation of S tokens striped attention's model applies ("(n d) -> (d n)")."""
    return np.arange(S).reshape(S // cp, cp).T.reshape(-1)


def zigzag_order(cp: int) -> np.ndarray:
    chunks = np.arange(S).reshape(2 * cp, -1)
    return np.concatenate([np.concatenate([chunks[r], chunks[2 * cp - 1 - r]]) for r in range(cp)])
