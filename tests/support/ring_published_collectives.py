"""Published rings that are collectives and matmuls (JAX's shard_map tutorial, the JAX scaling book), in our own
words: every one makes its result depend on where tokens sit, so ring-reorder must refuse them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from support.ring_published_common import shift

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
