"""Ring programs whose results depend on where each token sits, as users write them by mistake or on purpose: a
reorder of the sequence would change what they compute, so ring-reorder must leave every one alone and say why,
naming the op and one of the lines marked `# refused here`. Per-device bodies over q, k, v [batch, n, dim] (some
with more arguments), for jax.shard_map over "cp"."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from support.ring_user_kernels import NEG, finish, init_state, merge_online, ring, scores


def _positions(me, n):
    return me * n + jnp.arange(n)


def all_gather_into_buffer(cp: int):
    """An all-gather with ppermute: every visiting block written into a buffer at its source's offset."""
    def body(q, k, v):
        n = k.shape[1]
        me = lax.axis_index("cp")

        def step(i, carry):
            buf, blk = carry
            buf = lax.dynamic_update_slice_in_dim(buf, blk, ((me - i) % cp) * n, axis=1)  # refused here
            return buf, lax.ppermute(blk, "cp", ring(cp))

        buf, _ = lax.fori_loop(0, cp, step, (jnp.zeros((k.shape[0], n * cp, k.shape[2])), k))
        return q + buf.mean(axis=1, keepdims=True) + buf[:, :n]  # refused here
    return body


def all_reduce_by_hops(cp: int):
    """An all-reduce with ppermute: each token summed with the tokens at the same place on every device."""
    def body(q, k, v):
        def step(i, carry):
            acc, blk = carry
            blk = lax.ppermute(blk, "cp", ring(cp))
            return acc + blk, blk  # refused here
        acc, _ = lax.fori_loop(0, cp - 1, step, (q, q))
        return acc
    return body


def _attention(cp, q, k, v, me):
    n = q.shape[1]
    q_pos = _positions(me, n)

    def step(i, carry):
        acc, k, v = carry
        k_pos = _positions((me - i) % cp, n)
        s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
        return merge_online(acc, s, v, i), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

    acc, _, _ = lax.fori_loop(0, cp, step, (init_state(q, "online"), k, v))
    return finish(acc, "online")


def attention_then_cumsum(cp: int):
    """Causal ring attention, then a running sum over the sequence (a cumulative feature)."""
    def body(q, k, v):
        out = _attention(cp, q, k, v, lax.axis_index("cp"))
        return jnp.cumsum(out, axis=1)  # refused here
    return body


def sorted_keys(cp: int):
    """Keys sorted along the sequence before the ring (top-k style routing)."""
    def body(q, k, v):
        k = jnp.sort(k, axis=1)  # refused here
        return _attention(cp, q, k, v, lax.axis_index("cp"))
    return body


def device_keyed_dropout(cp: int):
    """Attention dropout whose key is folded with the device index (a different mask on every device)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        key = jax.random.fold_in(jax.random.key(0), me)  # refused here
        q_pos = _positions(me, n)

        def step(i, carry):
            acc, k, v = carry
            k_pos = _positions((me - i) % cp, n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.9, s.shape)  # refused here
            s = jnp.where(keep, s, NEG)  # refused here
            return merge_online(acc, s, v, i), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (init_state(q, "online"), k, v))
        return finish(acc, "online")
    return body


def hop_keyed_dropout(cp: int):
    """Attention dropout keyed by the ring step only: the same mask pattern over local indices on every device."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(i, carry):
            acc, k, v = carry
            k_pos = _positions((me - i) % cp, n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            keep = jax.random.bernoulli(jax.random.fold_in(jax.random.key(1), i), 0.9, s.shape)  # refused here
            s = jnp.where(keep, s, NEG)  # refused here
            return merge_online(acc, s, v, i), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (init_state(q, "online"), k, v))
        return finish(acc, "online")
    return body


def coordinate_skip(cp: int):
    """A visiting block skipped when its source device comes after this one (right only when blocks are
    contiguous)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(i, carry):
            acc, k, v = carry
            src = (me - i) % cp
            k_pos = _positions(src, n)

            def run(acc):
                s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
                return merge_online(acc, s, v, i)

            acc = lax.cond(src <= me, run, lambda a: a, acc)  # refused here
            return acc, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (init_state(q, "online"), k, v))
        return finish(acc, "online")
    return body


def block_end_skip(cp: int):
    """A visiting block skipped when its first key comes after the last query, the last query's position
    extrapolated from the block's start (`start + n - 1`): true of contiguous blocks only."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_start = me * n
        q_pos = q_start + jnp.arange(n)

        def step(i, carry):
            acc, k, v = carry
            k_start = ((me - i) % cp) * n
            k_pos = k_start + jnp.arange(n)

            def run(acc):
                s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
                return merge_online(acc, s, v, i)

            acc = lax.cond(q_start + n - 1 >= k_start, run, lambda a: a, acc)  # refused here
            return acc, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (init_state(q, "online"), k, v))
        return finish(acc, "online")
    return body


def positions_left_behind(cp: int):
    """Position ids passed as data, but only k and v travel: every visiting block is masked with this device's
    key positions."""
    def body(q, k, v, q_pos, k_pos):
        def step(i, carry):
            acc, k, v = carry
            s = jnp.where(q_pos[:, :, None] >= k_pos[:, None, :], scores(q, k), NEG)  # refused here
            return merge_online(acc, s, v, i), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (init_state(q, "online"), k, v))
        return finish(acc, "online")
    return body


def ring_one_step_short(cp: int):
    """The loop stops one step early: the last block never arrives (its tokens are left out)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(i, carry):
            acc, k, v = carry
            k_pos = _positions((me - i) % cp, n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            return merge_online(acc, s, v, i), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp - 1, step, (init_state(q, "online"), k, v))  # refused here
        return finish(acc, "online")  # refused here
    return body


def ring_one_step_short_unrolled(cp: int):
    """A running sum of attention-weighted values over a ring unrolled by a Python loop that stops one step early:
    the last block never arrives."""
    def body(q, k, v):
        acc = jnp.zeros_like(q)
        for _ in range(cp - 1):
            acc = acc + jnp.exp(scores(q, k) - 4.0) @ v  # refused here
            k, v = lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))
        return acc
    return body


def last_block_wins(cp: int):
    """Each step's block output replaces the previous one at the last step: keeps only the block that arrives
    last, which depends on which tokens a device holds."""
    def body(q, k, v):
        def step(i, carry):
            out, k, v = carry
            blk = jnp.exp(scores(q, k) - 4.0) @ v
            out = jnp.where(i == cp - 1, blk, out + 0.0 * blk)  # refused here
            return out, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        out, _, _ = lax.fori_loop(0, cp, step, (jnp.zeros_like(q), k, v))
        return out
    return body


def decaying_merge(cp: int):
    """A running average that halves the weight of earlier blocks: the result depends on the order blocks come."""
    def body(q, k, v):
        def step(i, carry):
            out, k, v = carry
            blk = jnp.exp(scores(q, k) - 4.0) @ v
            out = 0.5 * out + blk  # refused here
            return out, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        out, _, _ = lax.fori_loop(0, cp, step, (jnp.zeros_like(q), k, v))
        return out
    return body


def rope_by_local_index(cp: int):
    """RoPE angles from the local index (a bug: every device rotates as if it held the first tokens)."""
    def body(q, k, v):
        n, half = q.shape[1], q.shape[-1] // 2
        angles = jnp.arange(n)[:, None] * (1.0 / 10000.0 ** (jnp.arange(half) / half))[None, :]  # refused here
        cos, sin = jnp.cos(angles), jnp.sin(angles)

        def rot(x):
            return jnp.concatenate([x[..., :half] * cos - x[..., half:] * sin,  # refused here
                                    x[..., :half] * sin + x[..., half:] * cos], axis=-1)  # refused here

        return _attention(cp, rot(q), rot(k), v, lax.axis_index("cp"))
    return body


def reversed_tokens(cp: int):
    """The sequence reversed inside the ring region (a right-to-left model)."""
    def body(q, k, v):
        return _attention(cp, q[:, ::-1], k[:, ::-1], v[:, ::-1], lax.axis_index("cp"))  # refused here
    return body


def causal_conv_before(cp: int):
    """A short causal convolution along the sequence (Mamba-style) before the ring."""
    def body(q, k, v):
        kernel = jnp.array([0.5, 0.3, 0.2], jnp.float32)
        padded = jnp.pad(q, ((0, 0), (2, 0), (0, 0)))  # refused here
        q = sum(kernel[j] * padded[:, j:j + q.shape[1]] for j in range(3))  # refused here
        return _attention(cp, q, k, v, lax.axis_index("cp"))
    return body


def hop_versus_coordinate_skip(cp: int):
    """A block skipped when the step count exceeds the device index (the contiguous causal skip, by coordinates)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(i, carry):
            acc, k, v = carry
            k_pos = _positions((me - i) % cp, n)

            def run(acc):
                s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
                return merge_online(acc, s, v, i)

            acc = lax.cond(i <= me, run, lambda a: a, acc)  # refused here
            return acc, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (init_state(q, "online"), k, v))
        return finish(acc, "online")
    return body


def all_gather_concatenate(cp: int):
    """An all-gather with ppermute as the shard_map docs write one: the blocks concatenated in arrival order."""
    def body(q, k, v):
        blocks, cur = [k], k
        for _ in range(cp - 1):
            cur = lax.ppermute(cur, "cp", ring(cp, -1))
            blocks.append(cur)
        everything = jnp.concatenate(blocks, axis=1)  # refused here
        return q + jnp.einsum("bqd,bkd->bqd", q, everything) / everything.shape[1]  # refused here
    return body


def block_first_key_sink(cp: int):
    """Windowed attention where the first key of every block is always visible ("landmark" tokens at the block
    starts): a block start is a place in the layout, not a position a token keeps."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(i, carry):
            acc, k, v = carry
            k_start = ((me - i) % cp) * n
            k_pos = k_start + jnp.arange(n)
            window = (q_pos[:, None] >= k_pos[None, :]) & (q_pos[:, None] - k_pos[None, :] < 8)
            keep = window | (k_pos[None, :] == k_start)  # refused here
            s = jnp.where(keep, scores(q, k), NEG)  # refused here
            return merge_online(acc, s, v, i), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (init_state(q, "online"), k, v))
        return finish(acc, "online")
    return body


def neighbour_position_skip(cp: int):
    """Blocks attended (unmasked) where causal, or everywhere on a device whose next device's block starts before
    position 20 (tested in floating point): a function of positions, but of a token outside the two blocks it
    skips, which is another token in each layout (zigzag: devices 0, 1 and 3 would attend everything, not 0 and 3)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)
        next_first = (((me + 1) % cp) * n).astype(jnp.float32)

        def step(i, carry):
            acc, k, v = carry
            k_pos = _positions((me - i) % cp, n)

            def run(acc):
                return merge_online(acc, scores(q, k), v, i)

            live = (q_pos[-1] >= k_pos[0]) | (next_first < 20.0)
            acc = lax.cond(live, run, lambda a: a, acc)  # refused here
            return acc, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (init_state(q, "online"), k, v))
        return finish(acc, "online")
    return body


REFUSALS = (all_gather_concatenate, block_first_key_sink, all_gather_into_buffer, all_reduce_by_hops, attention_then_cumsum, sorted_keys, device_keyed_dropout,
            hop_keyed_dropout, coordinate_skip, block_end_skip, ring_one_step_short, ring_one_step_short_unrolled,
            last_block_wins, decaying_merge,
            rope_by_local_index, reversed_tokens, causal_conv_before, hop_versus_coordinate_skip, neighbour_position_skip)
