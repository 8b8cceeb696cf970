"""Ring programs published outside this project, each rewritten in our own words after the algorithm its source
gives (JAX's shard_map tutorial, the JAX scaling book, ejkernel's Pallas TPU ring attention, ring-flash-attention,
flash_attn_jax, striped attention, TransformerEngine's load-balanced context parallelism), and what
ring-reorder must do with each.

Every program runs on a (dp=2, cp=4) mesh, its ring on "cp", at tiny sizes: attention on q, k, v [B=2, S=64, D=8]
sharded P("dp", "cp", None) (16 tokens a device); matmuls on [64 x 64] @ [64 x 8] (every operand sharded on "cp"
has 16 rows a device there, so the analysis looks into the region rather than stopping at unequal lengths).
Programs named "...-lse-by-hand" are the same kernels with the block's log-sum-exp written out as flash kernels
compute it (row max + log row sum) instead of jax.nn.logsumexp; both are proved by the algebra of their (out, lse)
merges (logsum.py).

Expectations (`Published.expect`) under `@autofix_shardings`' defaults:
  "balanced"  proved, left alone because it gains nothing (no skipped work: non-causal, or a mask with no skip);
  "refused"   left alone as not provably safe, the reason naming an op and the user's line whose text contains
              `at` ("" where the reason cites the region itself), in words containing `why`;
  "rewritten" reordered.
`forced`: whether ring_reorder="zigzag" / "striped" must rewrite it (False: they must refuse it as above).
Whatever is decided, every program must compute what jax.jit computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from support.ring_published_collectives import (
    all_gather_ring, all_reduce_ring, collective_matmul_contracting, matmul_allgather_overlapped,
    matmul_allgather_overlapped_bidi, matmul_psumscatter_overlapped, matmul_psumscatter_overlapped_bidi,
    psum_scatter_ring, spmd_pipeline)
from support.ring_published_attention import (
    blockwise_ring, ejkernel_pallas_ring, flash_attn_jax_ring, flash_attn_jax_ring_online, online_softmax_ring,
    ring_flash_attn, striped_order, striped_positions, vjp_ring, zigzag_order, zigzag_positions,
    zigzag_ring_flash_attn)
from support.ring_published_common import D, S, SEQ, auto_mesh, mesh, normal, put, qkv, shard_map
from support.ring_published_variants import (
    alibi_bias, chunked_local, ejkernel_pallas_ring_online, rolled_ring, t5_bias, t5_relative_bucket)

__all__ = ["PROGRAMS", "Published", "S", "SEQ", "around_ring", "auto_mesh", "mesh", "qkv", "striped_order",
           "zigzag_order"]


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
        sink = put(m, np.float32(0.5), P())
        return shard_map(m, body, (SEQ,) * 3 + (P(),), SEQ), qkv(m) + (sink,)

    return build


def layout_ring(positions, order):
    """A kernel written for the layout the user put tokens in: the model permutes tokens on the host before the
    ring (the published code permutes its input tokens), so the program is the ring alone, fed permuted q, k, v."""

    def build(m):
        cp = m.shape["cp"]
        perm = order(cp)
        args = tuple(put(m, np.asarray(x)[:, perm], SEQ) for x in qkv(m))
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
        args = (put(m, normal(lhs_shape, 10), lhs_spec), put(m, normal(rhs_shape, 11), rhs_spec))
        return shard_map(m, make(m.shape["cp"]), (lhs_spec, rhs_spec), out_spec), args

    return build


def pipeline(m):
    cp = m.shape["cp"]
    layers, micro, k, feats = cp, 2, 2, D
    ws = put(m, normal((layers, feats, feats), 12) / np.sqrt(feats), P("cp"))
    bs = put(m, normal((layers, feats), 13), P("cp"))
    inputs = put(m, normal((k * micro * cp, feats), 14), P("cp"))
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
              at='rhs_chunk = lax.dynamic_slice_in_dim(rhs, (idx + i) % cp * chunk, chunk)',
              why='addresses data by the device index'),
    Published("ring-flash-attn-causal", "zhuzilin/ring-flash-attention ring_flash_attn_forward (causal)",
              attention(ring_flash_attn, causal=True), ring_flash_attn, "refused", grad=True,
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ring-flash-attn-full", "zhuzilin/ring-flash-attention ring_flash_attn_forward (causal=False)",
              attention(ring_flash_attn, causal=False), ring_flash_attn, "balanced", forced=True),
    Published("ring-flash-attn-zigzag", "zhuzilin/ring-flash-attention zigzag_ring_flash_attn_forward",
              attention(zigzag_ring_flash_attn), zigzag_ring_flash_attn, "refused",
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("flash-attn-jax-ring-causal", "nshepperd/flash_attn_jax ring_attention.ring_fwd (causal)",
              attention(flash_attn_jax_ring, causal=True), flash_attn_jax_ring, "refused", grad=True,
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("flash-attn-jax-ring-full", "nshepperd/flash_attn_jax ring_attention.ring_fwd (non-causal)",
              attention(flash_attn_jax_ring, causal=False), flash_attn_jax_ring, "balanced", forced=True,
              grad=True),
    Published("ejkernel-pallas-ring-causal", "ejkernel kernels/_pallas/tpu/ring_attention (causal)",
              attention(ejkernel_pallas_ring), ejkernel_pallas_ring, "refused", grad=True,
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ejkernel-pallas-ring-window", "ejkernel kernels/_pallas/tpu/ring_attention (causal, window 20)",
              attention(ejkernel_pallas_ring, window=20), ejkernel_pallas_ring, "refused",
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ejkernel-pallas-ring-sinks", "ejkernel kernels/_pallas/tpu/ring_attention (causal, sinks)",
              attention_with_sink(ejkernel_pallas_ring), ejkernel_pallas_ring, "refused",
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("striped-attention", "Brandon et al. 2023, Striped Attention (on Liu et al.'s JAX RingAttention)",
              layout_ring(striped_positions, striped_order), (online_softmax_ring, striped_positions), "refused",
              grad=True,
              at='s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)', why='is not the place of a token'),
    Published("te-load-balanced-ring", "TransformerEngine / MaxText load-balanced CP (zigzag put by the model)",
              layout_ring(zigzag_positions, zigzag_order), (online_softmax_ring, zigzag_positions), "refused",
              at='s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)', why='is not the place of a token'),
    Published("ring-flash-attn-full-lse-by-hand", "ring-flash-attn-full, block lse written out",
              attention(ring_flash_attn, causal=False, by_hand=True), ring_flash_attn, "balanced", forced=True),
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
              attention(flash_attn_jax_ring, causal=False, by_hand=True), flash_attn_jax_ring, "balanced",
              forced=True),
    Published("ejkernel-pallas-ring-causal-lse-by-hand", "ejkernel-pallas-ring-causal, block lse written out",
              attention(ejkernel_pallas_ring, by_hand=True), ejkernel_pallas_ring, "refused",
             
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ejkernel-pallas-ring-online", "ejkernel-pallas-ring-causal, merged by online softmax, global positions",
              attention(ejkernel_pallas_ring_online), ejkernel_pallas_ring_online, "balanced", forced=True,
              grad=True),
    Published("ejkernel-pallas-ring-online-offset", "ejkernel-pallas-ring-online, the published q-id offset mask",
              attention(ejkernel_pallas_ring_online, offset=True), ejkernel_pallas_ring_online, "refused",
              at='s = jnp.where(mask, s, NEG)', why='varies with local position'),
    Published("ejkernel-online-rolled", "ejkernel-pallas-ring-online, rolled, source from the step, state from q",
              attention(ejkernel_pallas_ring_online, **ROLLED), ejkernel_pallas_ring_online, "balanced",
              forced=True, grad=True),
    Published("ejkernel-online-rolled-offset", "ejkernel-online-rolled with the published q-id offset mask",
              attention(ejkernel_pallas_ring_online, offset=True, **ROLLED), ejkernel_pallas_ring_online,
              "refused",
              at='q_ids, kv_ids = base + device_idx * n - kv_source * n, base', why="subtracts a block's start"),
    Published("ejkernel-online-rolled-window", "ejkernel-online-rolled, causal sliding window 20",
              attention(ejkernel_pallas_ring_online, window=20, **ROLLED), ejkernel_pallas_ring_online, "balanced",
              forced=True),
    Published("ejkernel-pallas-ring-online-window", "ejkernel-pallas-ring-online, causal sliding window 20",
              attention(ejkernel_pallas_ring_online, window=20), ejkernel_pallas_ring_online, "balanced",
              forced=True),
    Published("ejkernel-online-rolled-carried", "ejkernel-pallas-ring-online rolled, its carried kv_source kept",
              attention(ejkernel_pallas_ring_online, unroll=False), ejkernel_pallas_ring_online, "balanced",
              forced=True),
    Published("ejkernel-online-rolled-sinks", "ejkernel-online-rolled, a sink logit at iteration 0",
              attention_with_sink(ejkernel_pallas_ring_online, **ROLLED), ejkernel_pallas_ring_online, "refused",
              at='m_new = jnp.maximum(m, sink)', why='maximum of different aggregates'),
    Published("flash-attn-jax-ring-online", "flash-attn-jax-ring-causal, travelling k_ix positions, online softmax",
              attention(flash_attn_jax_ring_online), flash_attn_jax_ring_online, "balanced", forced=True,
              grad=True),
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
              at="return out, l.sum(axis=1, keepdims=True)", why="result 1 is a per-device value"),
    Published("rolled-ring-dropout", "ejkernel-online-rolled with dropout keyed by the device (Liu's attn_pdrop)",
              attention(rolled_ring, dropout=True), rolled_ring, "refused",
              at="key = jax.random.fold_in(", why="a PRNG key folded with the device index"),
    Published("rolled-ring-bidirectional", "ejkernel-online-rolled, k and v travelling both ways",
              attention(rolled_ring, bidirectional=True), rolled_ring, "balanced", forced=True),
    Published("liu-blockwise", "Liu et al. blockwise RingAttention (ringattention_jax), chunk 4, causal skip",
              attention(blockwise_ring, chunk=4), blockwise_ring, "rewritten", forced=True, grad=True),
    Published("liu-blockwise-strict", "liu-blockwise skipping diagonal chunk pairs too (`>`)",
              attention(blockwise_ring, chunk=4, skip="strict"), blockwise_ring, "rewritten", forced=True),
    Published("liu-blockwise-coords", "liu-blockwise, the skip decided by ring coordinates and chunk counters",
              attention(blockwise_ring, chunk=4, skip="coords"), blockwise_ring, "refused",
              at="return lax.cond(live(qc, kc, me, src, qi, ki),",
              why="skips blocks by a predicate of loop counters or the ring step"),
    Published("lucidrains-max-ring-passes", "lucidrains/ring-attention-pytorch max_lookback_seq_len (2 passes)",
              attention(rolled_ring, max_passes=2), rolled_ring, "refused",
              at="(state, _, _), _ = lax.scan(step,", why="runs 2 of the 4 ring steps"),
    Published("lucidrains-max-ring-passes-cond", "lucidrains max_ring_passes, later passes skipped by lax.cond",
              attention(rolled_ring, max_passes=2, passes_by_cond=True), rolled_ring, "refused",
              at="state = lax.cond(i < max_passes,", why="skips blocks by a predicate of loop counters or the ring step"),
    Published("rolled-ring-where-source", "ejkernel-online-rolled, the source wrapped by hand (`where(s < 0, s + cp, s)`)",
              attention(rolled_ring, source_fn=lambda me, i: jnp.where(me - i < 0, me - i + 4, me - i)), rolled_ring,
              "balanced", forced=True),
    Published("rolled-ring-where-source-off-by-one", "rolled-ring-where-source wrapping by cp - 1",
              attention(rolled_ring, source_fn=lambda me, i: jnp.where(me - i < 0, me - i + 3, me - i)), rolled_ring,
              "refused", at="source_fn=lambda me, i: jnp.where(me - i < 0, me - i + 3, me - i)",
              why="is not the place of a token"),
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
    """({name: fn(q, k, v)} of model code around liu-blockwise, with the ring decisions expected in each, sorted),
    and the arguments: ring-flash-attention's causal ring (refused) beside it or chained to it, and the ring in a
    lax.scan over layers."""
    ring, args = attention(blockwise_ring, chunk=4)(m)
    refused, _ = attention(ring_flash_attn, causal=True)(m)
    weights = put(m, normal((3, 3, D, D), 15) / 3, P())

    def scan_layers(q, k, v):
        def layer(x, w):
            return x + ring(x @ w[0], x @ w[1], x @ w[2]), None

        return lax.scan(layer, q, weights)[0]

    one = [True]
    return {
        "next-token-loss": (lambda q, k, v: jnp.mean((ring(q, k, v)[:, :-1] - v[:, 1:]) ** 2), one),
        "roll": (lambda q, k, v: jnp.roll(ring(q, k, v), 1, axis=1), one),
        "cumsum": (lambda q, k, v: jnp.cumsum(ring(q, k, v), axis=1), one),
        "argmax-over-sequence": (lambda q, k, v: jnp.argmax(ring(q, k, v).sum(-1), axis=1), one),
        "token-shift-between-layers": (lambda q, k, v: (lambda y: ring(y + _shift_right(y), k, v))(ring(q, k, v)),
                                       [True, True]),
        "beside-a-refused-ring": (lambda q, k, v: ring(q, k, v) + refused(q, k, v), [False, True]),
        # chained to a refused ring by a sequence value: rewritten on its own (that value permuted, its result restored)
        "after-a-refused-ring": (lambda q, k, v: ring(refused(q, k, v), k, v), [False, True]),
        "scan-over-layers": (scan_layers, one),
    }, args
