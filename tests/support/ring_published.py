"""Ring programs published outside this project, each rewritten in our own words after the algorithm its source
gives (JAX's shard_map tutorial, the JAX scaling book, ejkernel's Pallas TPU ring attention, ring-flash-attention,
flash_attn_jax, striped attention, TransformerEngine's load-balanced context parallelism), and what
ring-reorder must do with each.

Every program runs on a (dp=2, cp=4) mesh, its ring on "cp", at tiny sizes: attention on q, k, v [B=2, S=64, D=8]
sharded P("dp", "cp", None) (16 tokens a device); matmuls on [64 x 64] @ [64 x 8] (every operand sharded on "cp"
has 16 rows a device there, so the analysis looks into the region rather than stopping at unequal lengths).
Programs named "...-lse-by-hand" are the same kernels with the block's log-sum-exp written out as flash kernels
compute it (row max + log row sum) instead of jax.nn.logsumexp, whose internals the analysis stops at.

Expectations (`Published.expect`) under `@autofix_shardings`' defaults:
  "balanced"  proved, left alone because it gains nothing (no skipped work: non-causal, or a mask with no skip);
  "refused"   left alone as not provably safe, the reason naming an op and the user's line whose text contains
              `at` ("" where the reason cites the region itself), in words containing `why`;
  "rewritten" reordered.
`forced`: whether ring_reorder="zigzag" / "striped" must rewrite it (False: they must refuse it as above).
Whatever is decided, every program must compute what jax.jit computes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

B, S, D = 2, 64, 8
SEQ = P("dp", "cp", None)
NEG = -1e30  # a finite masked logit, as splash / flash kernels use (a fully masked row gets lse ~ NEG)


@dataclass(frozen=True)
class Published:
    name: str
    source: str  # where the algorithm comes from
    build: Callable  # mesh -> (fn, args)
    kernel: Callable | tuple[Callable, ...]  # the published kernel the program follows
    expect: str  # "balanced" | "refused" | "rewritten"
    forced: bool = False  # ring_reorder="zigzag"/"striped" must rewrite it (else they must refuse it)
    grad: bool = False  # also checked under jax.grad of sum(fn(*args) * w)
    wrt: tuple[int, ...] = (0, 1, 2)
    at: str = ""  # refused: text of the user's line the reason must cite ("" where the region itself is cited)
    why: str = ""  # refused: words the reason must contain



def mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("dp", "cp"))


def auto_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces.


def _normal(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _put(m, x, spec):
    return jax.device_put(x, NamedSharding(m, spec))


def qkv(m):
    return tuple(_put(m, _normal((B, S, D), seed), SEQ) for seed in range(3))


def shift(x, cp: int, d: int = 1):
    """Every device sends x to the device d steps up the ring."""
    return lax.ppermute(x, "cp", [(i, (i + d) % cp) for i in range(cp)])


def block_attention(q, k, v, mask=None, sink=None, by_hand: bool = False):
    """(softmax(q k^T / sqrt(d)) v, log-sum-exp per query) of one pair of blocks: what flash-attention kernels
    return; `sink`: one more logit per query in the denominator (attention sinks); `by_hand`: the log-sum-exp
    written out as flash kernels compute it (row max + log of the row sum) rather than jax.nn.logsumexp."""
    s = jnp.einsum("bqd,bkd->bqk", q, k) * (q.shape[-1] ** -0.5)
    if mask is not None:
        s = jnp.where(mask, s, NEG)
    if by_hand:
        m = s.max(-1)
        lse = m + jnp.log(jnp.exp(s - m[..., None]).sum(-1))
    else:
        lse = jax.nn.logsumexp(s, axis=-1)
    if sink is not None:
        lse = jnp.logaddexp(lse, sink)
    return jnp.einsum("bqk,bkd->bqd", jnp.exp(s - lse[..., None]), v), lse


def local_causal(n: int):
    """flash-attn's causal=True on one block: by local indices."""
    i = jnp.arange(n)
    return i[:, None] >= i[None, :]


def shard_map(m, body, in_specs, out_specs):
    return jax.shard_map(body, mesh=m, in_specs=in_specs, out_specs=out_specs, check_vma=False)


# ---------------------------------------------------------------------------------------------------------------
# JAX's shard_map tutorial (docs.jax.dev/en/latest/notebooks/shard_map.html): collectives written with ppermute.


def psum_scatter_ring(cp: int):
    """The tutorial's `psum_scatter` in terms of ppermute (tiled): each step sends the block received last step one
    device down the ring and adds the one it receives. Here the scattered dim is the sequence."""

    def body(x):
        idx = lax.axis_index("cp")
        b, n, d = x.shape
        blocks = jnp.moveaxis(x.reshape(b, cp, n // cp, d), 1, 0)
        for i in range(1, cp):
            update = shift(blocks[(idx + i) % cp], cp, -1)
            blocks = blocks.at[(idx + i + 1) % cp].add(update)
        return blocks[idx]

    return body


def all_gather_ring(cp: int):
    """The tutorial's all_gather "in terms of ppermute, the reverse of psum_scatter": each step passes the block
    received last step on and writes it into the slot of the device it came from."""

    def body(x):
        idx = lax.axis_index("cp")
        out = jnp.zeros((cp,) + x.shape, x.dtype).at[idx].set(x)
        blk = x
        for i in range(1, cp):
            blk = shift(blk, cp)
            out = out.at[(idx - i) % cp].set(blk)
        b, n, d = x.shape
        return jnp.moveaxis(out, 0, 1).reshape(b, cp * n, d)

    return body


def all_reduce_ring(cp: int):
    """A psum written with ppermute (the tutorial's ring, summing instead of scattering): every device adds each
    block that passes it to its own, token by token."""

    def body(x):
        acc, blk = x, x
        for _ in range(1, cp):
            blk = shift(blk, cp)
            acc = acc + blk
        return acc

    return body


def matmul_allgather_overlapped(cp: int):
    """The tutorial's `matmul_allgather_overlapped`: lhs rows and rhs rows (the contracting dim) sharded; rhs
    travels the ring and meets the lhs columns its source coordinate selects."""

    def body(lhs_block, rhs_block):
        idx = lax.axis_index("cp")
        nb = lhs_block.shape[1] // cp

        def lhs_blocks(i):
            return lax.dynamic_slice_in_dim(lhs_block, i * nb, nb, 1)

        out_block = lhs_blocks(idx) @ rhs_block
        for i in range(1, cp):
            rhs_block = shift(rhs_block, cp)
            out_block += lhs_blocks((idx - i) % cp) @ rhs_block
        return out_block

    return body


def matmul_allgather_overlapped_bidi(cp: int):
    """The tutorial's bidirectional version: rhs halves go both ways round the ring, each step's two half-products
    made one matmul by padding both operands onto complementary halves and adding them."""

    def body(lhs_block, rhs_block):
        idx = lax.axis_index("cp")
        nb = lhs_block.shape[1] // cp // 2

        def lhs_blocks(i, hi):
            return lax.dynamic_slice_in_dim(lhs_block, (2 * i + hi) * nb, nb, 1)

        def block_matmul(rhs_lo, rhs_hi, i_lo, i_hi):
            lhs_lo = jnp.pad(lhs_blocks(i_lo, 0), [(0, 0), (0, nb)])
            lhs_hi = jnp.pad(lhs_blocks(i_hi, 1), [(0, 0), (nb, 0)])
            rhs_lo = jnp.pad(rhs_lo, [(0, nb), (0, 0)])
            rhs_hi = jnp.pad(rhs_hi, [(nb, 0), (0, 0)])
            return (lhs_lo + lhs_hi) @ (rhs_lo + rhs_hi)

        rhs_lo, rhs_hi = jnp.split(rhs_block, 2, axis=0)
        out_block = block_matmul(rhs_lo, rhs_hi, idx, idx)
        for i in range(1, cp):
            rhs_lo = shift(rhs_lo, cp, 1)
            rhs_hi = shift(rhs_hi, cp, -1)
            out_block += block_matmul(rhs_lo, rhs_hi, (idx - i) % cp, (idx + i) % cp)
        return out_block

    return body


def matmul_psumscatter_overlapped(cp: int):
    """The tutorial's `matmul_psumscatter_overlapped`: both operands sharded on the contracting dim, the partial
    products of the output block a device owns travel the ring and are summed on the way."""

    def body(lhs_block, rhs_block):
        idx = lax.axis_index("cp")
        lhs_block = lhs_block.reshape(cp, -1, lhs_block.shape[1])
        out_summand = lhs_block[(idx + 1) % cp] @ rhs_block
        for i in range(1, cp):
            out_summand = shift(out_summand, cp, -1)
            out_summand += lhs_block[(idx + i + 1) % cp] @ rhs_block
        return out_summand

    return body


def matmul_psumscatter_overlapped_bidi(cp: int):
    """The tutorial's bidirectional reduce-scatter matmul: two half-blocks travel opposite ways, concatenated at
    the end."""

    def body(lhs_block, rhs_block):
        idx = lax.axis_index("cp")
        nb = lhs_block.shape[0] // cp // 2

        def lhs_blocks(i, hi):
            return lax.dynamic_slice_in_dim(lhs_block, (2 * i + hi) * nb, nb, 0)

        lo = lhs_blocks((idx - 1) % cp, 0) @ rhs_block
        hi = lhs_blocks((idx + 1) % cp, 1) @ rhs_block
        for i in range(1, cp):
            lo = shift(lo, cp, 1)
            hi = shift(hi, cp, -1)
            lo += lhs_blocks((idx - i - 1) % cp, 0) @ rhs_block
            hi += lhs_blocks((idx + i + 1) % cp, 1) @ rhs_block
        return jnp.concatenate([lo, hi])

    return body


def spmd_pipeline(cp: int, layers: int, micro: int, k: int):
    """The tutorial's SPMD (GPipe) pipeline over the ring axis as stages: each stage applies its layers to the
    state, stage 0 feeds microbatches in, the last stage collects outputs, the state shifts one stage a step."""

    def stage_fn(wb, x):
        return jax.nn.relu(x @ wb[0] + wb[1])

    def body(ws, bs, inputs):
        stage = lax.axis_index("cp")
        inputs = inputs.reshape(k, micro, -1)
        n_micro = k * cp
        outputs = jnp.zeros_like(inputs) * jnp.nan
        state = jnp.zeros((layers // cp, micro, inputs.shape[-1])) * jnp.nan
        for i in range(n_micro + layers - 1):
            state = state.at[0].set(jnp.where(stage == 0, inputs[i % k], state[0]))
            state = jax.vmap(stage_fn)((ws, bs), state)
            outputs = outputs.at[(i - layers + 1) % k].set(
                jnp.where(stage == cp - 1, state[-1], outputs[(i - layers + 1) % k]))
            state = jnp.roll(state, +1, axis=0).at[0].set(shift(state[-1], cp))
            if (i % k) == (-1 % k):
                inputs = shift(inputs, cp)
            if ((i - layers + 1) % k) == (-1 % k):
                outputs = shift(outputs, cp)
        outputs = shift(outputs, cp)
        return outputs.reshape(k * micro, -1)

    return body


# ---------------------------------------------------------------------------------------------------------------
# The JAX scaling book ("How to Think About TPUs", chapter "Programming TPUs in JAX"): collective matmul.


def collective_matmul_contracting(cp: int):
    """`collective_matmul_allgather_lhs_contracting`: A[B_X, D_Y] @ W[D, F_Y]; A's contracting shard travels
    left around the ring, meeting the rows of W its position selects; fori_loop(unroll=True) over cp - 1 steps and
    a last chunk after the loop."""

    def body(lhs, rhs):
        idx = lax.axis_index("cp")
        chunk = lhs.shape[1]

        def f(i, carry):
            accum, lhs = carry
            rhs_chunk = lax.dynamic_slice_in_dim(rhs, (idx + i) % cp * chunk, chunk)
            update = lhs @ rhs_chunk
            lhs = shift(lhs, cp, -1)
            return accum + update, lhs

        accum = jnp.zeros((lhs.shape[0], rhs.shape[1]), lhs.dtype)
        accum, lhs = lax.fori_loop(0, cp - 1, f, (accum, lhs), unroll=True)
        rhs_chunk = lax.dynamic_slice_in_dim(rhs, (idx + cp - 1) % cp * chunk, chunk)
        return accum + lhs @ rhs_chunk

    return body


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


def online_merge(state, q, k, v, mask):
    """One block into the running (acc, max, sum) of the online softmax (what splash / flash kernels do inside)."""
    acc, m, l = state
    s = jnp.einsum("bqd,bkd->bqk", q, k) * (q.shape[-1] ** -0.5)
    s = jnp.where(mask, s, NEG)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.exp(s - m_new[..., None])
    corr = jnp.exp(m - m_new)
    return acc * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v), m_new, l * corr + p.sum(-1)


def online_merge_biased(state, q, k, v, mask, bias):
    """online_merge with a bias (ALiBi, relative position buckets) added to the scores."""
    acc, m, l = state
    s = jnp.einsum("bqd,bkd->bqk", q, k) * (q.shape[-1] ** -0.5) + bias
    s = jnp.where(mask, s, NEG)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.exp(s - m_new[..., None])
    corr = jnp.exp(m - m_new)
    return acc * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v), m_new, l * corr + p.sum(-1)


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


# ---------------------------------------------------------------------------------------------------------------
# Builders: (fn, args) on a mesh.


def attention(make, **kw):
    def build(m):
        body = make(m.shape["cp"], **kw)
        return shard_map(m, body, (SEQ,) * 3, SEQ), qkv(m)

    return build


def attention_with_sink(make, **kw):
    def build(m):
        body = make(m.shape["cp"], sinks=True, **kw)
        sink = _put(m, np.float32(0.5), P())
        return shard_map(m, body, (SEQ,) * 3 + (P(),), SEQ), qkv(m) + (sink,)

    return build


def layout_ring(positions, order):
    """A kernel written for the layout the user put tokens in: the model permutes tokens on the host before the
    ring (the published code permutes its input tokens), so the program is the ring alone, fed permuted q, k, v."""

    def build(m):
        cp = m.shape["cp"]
        perm = order(cp)
        args = tuple(_put(m, np.asarray(x)[:, perm], SEQ) for x in qkv(m))
        return shard_map(m, online_softmax_ring(cp, positions(cp)), (SEQ,) * 3, SEQ), args

    return build


def two_outputs(make, **kw):
    def build(m):
        body = make(m.shape["cp"], **kw)
        return shard_map(m, body, (SEQ,) * 3, (SEQ, P("dp", "cp"))), qkv(m)

    return build


def one_input(make):
    def build(m):
        return shard_map(m, make(m.shape["cp"]), (SEQ,), SEQ), qkv(m)[:1]

    return build


def gathered(make):
    def build(m):
        return shard_map(m, make(m.shape["cp"]), (SEQ,), P("dp", None, None)), qkv(m)[:1]

    return build


def matmul(make, lhs_spec, rhs_spec, out_spec, lhs_shape=(64, 64), rhs_shape=(64, 8)):
    def build(m):
        args = (_put(m, _normal(lhs_shape, 10), lhs_spec), _put(m, _normal(rhs_shape, 11), rhs_spec))
        return shard_map(m, make(m.shape["cp"]), (lhs_spec, rhs_spec), out_spec), args

    return build


def pipeline(m):
    cp = m.shape["cp"]
    layers, micro, k, feats = cp, 2, 2, D
    ws = _put(m, _normal((layers, feats, feats), 12) / np.sqrt(feats), P("cp"))
    bs = _put(m, _normal((layers, feats), 13), P("cp"))
    inputs = _put(m, _normal((k * micro * cp, feats), 14), P("cp"))
    body = spmd_pipeline(cp, layers, micro, k)
    return shard_map(m, body, (P("cp"), P("cp"), P("cp")), P("cp")), (ws, bs, inputs)


ROLLED = dict(unroll=False, carried=False, init_from_q=True)
JAX_DOCS = "JAX shard_map tutorial (docs.jax.dev/en/latest/notebooks/shard_map.html)"
PROGRAMS = [
    Published("docs-psum-scatter-ring", JAX_DOCS + ", psum_scatter via ppermute", one_input(psum_scatter_ring),
              psum_scatter_ring, "refused", grad=True, wrt=(0,),
              at='update = shift(blocks[(idx + i) % cp], cp, -1)', why='addresses data by the device index'),
    Published("docs-all-gather-ring", JAX_DOCS + ", all_gather via ppermute", gathered(all_gather_ring),
              all_gather_ring, "refused",
              at='.at[idx].set(x)', why='scatters by index along the data'),
    Published("docs-all-reduce-ring", JAX_DOCS + ", ppermute ring summing", one_input(all_reduce_ring),
              all_reduce_ring, "refused", grad=True, wrt=(0,),
              at='acc = acc + blk', why='combines data of different tokens'),
    Published("docs-matmul-allgather", JAX_DOCS + ", matmul_allgather_overlapped",
              matmul(matmul_allgather_overlapped, P("cp", None), P("cp", None), P("cp", None)),
              matmul_allgather_overlapped, "refused", grad=True, wrt=(0, 1),
              at='lax.dynamic_slice_in_dim(lhs_block, i * nb, nb, 1)', why='addresses data by the device index'),
    Published("docs-matmul-allgather-bidi", JAX_DOCS + ", matmul_allgather_overlapped_bidi",
              matmul(matmul_allgather_overlapped_bidi, P("cp", None), P("cp", None), P("cp", None)),
              matmul_allgather_overlapped_bidi, "refused",
              at='(2 * i + hi) * nb, nb, 1)', why='addresses data by the device index'),
    Published("docs-matmul-psumscatter", JAX_DOCS + ", matmul_psumscatter_overlapped",
              matmul(matmul_psumscatter_overlapped, P(None, "cp"), P("cp", None), P("cp", None)),
              matmul_psumscatter_overlapped, "refused", grad=True, wrt=(0, 1),
              at='out_summand = lhs_block[(idx + 1) % cp] @ rhs_block', why='addresses data by the device index'),
    Published("docs-matmul-psumscatter-bidi", JAX_DOCS + ", matmul_psumscatter_overlapped_bidi",
              matmul(matmul_psumscatter_overlapped_bidi, P(None, "cp"), P("cp", None), P("cp", None)),
              matmul_psumscatter_overlapped_bidi, "refused",
              at='(2 * i + hi) * nb, nb, 0)', why='addresses data by the device index'),
    Published("docs-spmd-pipeline", JAX_DOCS + ", spmd_pipeline (GPipe)", pipeline,
              spmd_pipeline, "refused",
              at='', why='no reordered ring region produces'),
    Published("scaling-book-collective-matmul", "JAX scaling book, collective_matmul_allgather_lhs_contracting",
              matmul(collective_matmul_contracting, P("dp", "cp"), P(None, "cp"), P("dp", "cp"),
                     lhs_shape=(16, 64), rhs_shape=(64, 64)),
              collective_matmul_contracting, "refused", grad=True, wrt=(0, 1),
              at='rhs_chunk = lax.dynamic_slice_in_dim(rhs, (idx + i) % cp * chunk, chunk)', why='addresses data by the device index'),
    Published("ring-flash-attn-causal", "zhuzilin/ring-flash-attention ring_flash_attn_forward (causal)",
              attention(ring_flash_attn, causal=True), ring_flash_attn, "refused", grad=True,
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ring-flash-attn-full", "zhuzilin/ring-flash-attention ring_flash_attn_forward (causal=False)",
              attention(ring_flash_attn, causal=False), ring_flash_attn, "refused", grad=True,
              at='lse = jax.nn.logsumexp(s, axis=-1)', why='not an order-free merge'),
    Published("ring-flash-attn-zigzag", "zhuzilin/ring-flash-attention zigzag_ring_flash_attn_forward",
              attention(zigzag_ring_flash_attn), zigzag_ring_flash_attn, "refused", grad=True,
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("flash-attn-jax-ring-causal", "nshepperd/flash_attn_jax ring_attention.ring_fwd (causal)",
              attention(flash_attn_jax_ring, causal=True), flash_attn_jax_ring, "refused", grad=True,
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("flash-attn-jax-ring-full", "nshepperd/flash_attn_jax ring_attention.ring_fwd (non-causal)",
              attention(flash_attn_jax_ring, causal=False), flash_attn_jax_ring, "refused",
              grad=True,
              at='lse = jax.nn.logsumexp(s, axis=-1)', why='not an order-free merge'),
    Published("ejkernel-pallas-ring-causal", "ejkernel kernels/_pallas/tpu/ring_attention (causal)",
              attention(ejkernel_pallas_ring), ejkernel_pallas_ring, "refused", grad=True,
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ejkernel-pallas-ring-window", "ejkernel kernels/_pallas/tpu/ring_attention (causal, window 20)",
              attention(ejkernel_pallas_ring, window=20), ejkernel_pallas_ring, "refused",
              grad=True,
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ejkernel-pallas-ring-sinks", "ejkernel kernels/_pallas/tpu/ring_attention (causal, sinks)",
              attention_with_sink(ejkernel_pallas_ring), ejkernel_pallas_ring, "refused",
              grad=True, wrt=(0, 1, 2, 3),
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("striped-attention", "Brandon et al. 2023, Striped Attention (on Liu et al.'s JAX RingAttention)",
              layout_ring(striped_positions, striped_order), (online_softmax_ring, striped_positions), "refused", grad=True,
              at='s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)', why='is not the place of a token'),
    Published("te-load-balanced-ring", "TransformerEngine / MaxText load-balanced CP (reorder_causal_load_balancing)",
              layout_ring(zigzag_positions, zigzag_order), (online_softmax_ring, zigzag_positions), "refused", grad=True,
              at='s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)', why='is not the place of a token'),
    Published("ring-flash-attn-full-lse-by-hand", "ring-flash-attn-full, block lse written out",
              attention(ring_flash_attn, causal=False, by_hand=True), ring_flash_attn, "refused",
             
              at='lse = m + jnp.log(', why='not an order-free merge'),
    Published("ring-flash-attn-causal-lse-by-hand", "ring-flash-attn-causal, block lse written out",
              attention(ring_flash_attn, causal=True, by_hand=True), ring_flash_attn, "refused",
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ring-flash-attn-zigzag-lse-by-hand", "ring-flash-attn-zigzag, block lse written out",
              attention(zigzag_ring_flash_attn, by_hand=True), zigzag_ring_flash_attn, "refused",
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("flash-attn-jax-ring-causal-lse-by-hand", "flash-attn-jax-ring-causal, block lse written out",
              attention(flash_attn_jax_ring, causal=True, by_hand=True), flash_attn_jax_ring, "refused",
             
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("flash-attn-jax-ring-full-lse-by-hand", "flash-attn-jax-ring-full, block lse written out",
              attention(flash_attn_jax_ring, causal=False, by_hand=True), flash_attn_jax_ring, "refused",
              at='lse = m + jnp.log(', why='not an order-free merge'),
    Published("ejkernel-pallas-ring-causal-lse-by-hand", "ejkernel-pallas-ring-causal, block lse written out",
              attention(ejkernel_pallas_ring, by_hand=True), ejkernel_pallas_ring, "refused",
             
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ejkernel-pallas-ring-online", "ejkernel-pallas-ring-causal, merged by online softmax, global positions",
              attention(ejkernel_pallas_ring_online), ejkernel_pallas_ring_online, "refused", grad=True,
              at='m_new = jnp.maximum(m, s.max(-1))', why='not an order-free merge'),
    Published("ejkernel-pallas-ring-online-offset", "ejkernel-pallas-ring-online, the published q-id offset mask",
              attention(ejkernel_pallas_ring_online, offset=True), ejkernel_pallas_ring_online, "refused",
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ejkernel-online-rolled", "ejkernel-pallas-ring-online, rolled, source from the step, state from q",
              attention(ejkernel_pallas_ring_online, **ROLLED), ejkernel_pallas_ring_online, "balanced",
              forced=True, grad=True),
    Published("ejkernel-online-rolled-offset", "ejkernel-online-rolled with the published q-id offset mask",
              attention(ejkernel_pallas_ring_online, offset=True, **ROLLED), ejkernel_pallas_ring_online,
              "refused",
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ejkernel-online-rolled-window", "ejkernel-online-rolled, causal sliding window 20",
              attention(ejkernel_pallas_ring_online, window=20, **ROLLED), ejkernel_pallas_ring_online, "refused",
              at='mask &= q_ids[:, None] - window <= kv_ids[None, :]', why='is not the place of a token'),
    Published("ejkernel-online-rolled-sinks", "ejkernel-online-rolled, a sink logit at iteration 0",
              attention_with_sink(ejkernel_pallas_ring_online, **ROLLED), ejkernel_pallas_ring_online, "refused",
              at='m_new = jnp.maximum(m, sink)', why='maximum of different aggregates'),
    Published("flash-attn-jax-ring-online", "flash-attn-jax-ring-causal, travelling k_ix positions, online softmax",
              attention(flash_attn_jax_ring_online), flash_attn_jax_ring_online, "refused", grad=True,
              at='lax.scan(f, init, None, cp)', why='loop-carried integer other than by a constant step'),
    Published("rolled-ring-down", "ejkernel-online-rolled, the ring turning the other way",
              attention(rolled_ring, direction=-1, source_step=1), rolled_ring, "balanced", forced=True,
              grad=True),
    Published("rolled-ring-mismatched-source", "ejkernel-online-rolled sending down, sources computed as if up",
              attention(rolled_ring, direction=-1, source_step=-1), rolled_ring, "refused",
              at="s = jnp.where(mask, s, NEG)", why="combines data of different tokens"),
    Published("rolled-ring-block-skip", "ejkernel-online-rolled, future blocks skipped by lax.cond on positions",
              attention(rolled_ring, block_skip=True), rolled_ring, "refused",
              at="return lax.cond(live,", why="reads a whole 16-token block as one run of positions"),
    Published("rolled-ring-row-sums", "ejkernel-online-rolled, also returning a device's softmax denominators",
              two_outputs(rolled_ring, row_sums=True), rolled_ring, "refused",
              at="", why="result 1 is a per-device value"),
    Published("rolled-ring-dropout", "ejkernel-online-rolled with dropout keyed by the device (Liu's attn_pdrop)",
              attention(rolled_ring, dropout=True), rolled_ring, "refused",
              at="key = jax.random.fold_in(", why="other than by an order-free merge"),
    Published("rolled-ring-bidirectional", "ejkernel-online-rolled, k and v travelling both ways",
              attention(rolled_ring, bidirectional=True), rolled_ring, "refused", grad=True,
              at="return acc * corr[..., None] +", why="adds two different aggregates"),
    Published("liu-blockwise", "Liu et al. blockwise RingAttention (ringattention_jax), chunk 4, causal skip",
              attention(blockwise_ring, chunk=4), blockwise_ring, "rewritten", forced=True, grad=True),
    Published("liu-blockwise-strict", "liu-blockwise skipping diagonal chunk pairs too (`>`)",
              attention(blockwise_ring, chunk=4, skip="strict"), blockwise_ring, "rewritten", forced=True),
    Published("liu-blockwise-coords", "liu-blockwise, the skip decided by ring coordinates and chunk counters",
              attention(blockwise_ring, chunk=4, skip="coords"), blockwise_ring, "refused",
              at="return lax.cond(live(qc, kc, me, src, qi, ki),", why="reads positions outside the two units"),
    Published("lucidrains-max-ring-passes", "lucidrains/ring-attention-pytorch max_lookback_seq_len (2 passes)",
              attention(rolled_ring, max_passes=2), rolled_ring, "refused",
              at="out = acc / l[..., None]", why="divides two partial aggregates"),
    Published("lucidrains-max-ring-passes-cond", "lucidrains max_ring_passes, later passes skipped by lax.cond",
              attention(rolled_ring, max_passes=2, passes_by_cond=True), rolled_ring, "refused",
              at="state = lax.cond(i < max_passes,", why="reads a whole 16-token block as one run of positions"),
    Published("rolled-ring-t5-bias", "ejkernel-online-rolled with T5's relative position bucket bias",
              attention(rolled_ring, bias_fn=t5_bias), (rolled_ring, t5_relative_bucket), "balanced",
              forced=True, grad=True),
    Published("rolled-ring-alibi", "ejkernel-online-rolled with ALiBi",
              attention(rolled_ring, bias_fn=alibi_bias), (rolled_ring, alibi_bias), "balanced", forced=True),
    Published("rolled-ring-chunked-local", "ejkernel-online-rolled with Llama 4's chunked local mask",
              attention(rolled_ring, mask_fn=chunked_local), (rolled_ring, chunked_local), "balanced", forced=True),
    Published("flash-attn-jax-vjp", "nshepperd/flash_attn_jax ring_fwd/ring_bwd custom_vjp, position masks",
              attention(vjp_ring), vjp_ring, "balanced", forced=True, grad=True),
]


# ---------------------------------------------------------------------------------------------------------------
# The blockwise ring inside the model code around it (on Auto axes: Explicit axes reject these sequence slices):
# what hoist-permutations must not move a sequence permutation across.


def _shift_right(y):
    """RWKV's token shift / a width-2 causal convolution's tap (Mamba, Griffin): each token sees its predecessor."""
    return jnp.pad(y, ((0, 0), (1, 0), (0, 0)))[:, :-1]


def around_ring(m):
    """{name: fn(q, k, v)} of model code around liu-blockwise, and the arguments."""
    ring, args = attention(blockwise_ring, chunk=4)(m)
    return {
        "next-token-loss": lambda q, k, v: jnp.mean((ring(q, k, v)[:, :-1] - v[:, 1:]) ** 2),
        "roll": lambda q, k, v: jnp.roll(ring(q, k, v), 1, axis=1),
        "cumsum": lambda q, k, v: jnp.cumsum(ring(q, k, v), axis=1),
        "argmax-over-sequence": lambda q, k, v: jnp.argmax(ring(q, k, v).sum(-1), axis=1),
        "token-shift-between-layers": lambda q, k, v: (lambda y: ring(y + _shift_right(y), k, v))(ring(q, k, v)),
    }, args
