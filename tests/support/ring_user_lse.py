"""Ring attention written flash-attention style: each ring step computes one block's normalised output and
log-sum-exp (out_blk, lse_blk) per query row, and merges them into the running (out, lse), as ring-flash-attention,
flash_attn_jax and ejkernel do. Per-device bodies f(q, k, v) over [batch, n, dim] for jax.shard_map over "cp",
positions from `axis_index * n + arange(n)`, the causal mask from them; a future block masked (every block
computed) or skipped with lax.cond on the blocks' positions.

Merge spellings that are order-free (the fold over blocks is a log-sum-exp, however written):
  logaddexp   lse' = jnp.logaddexp(lse, lse_b); out' = out e^(lse - lse') + out_b e^(lse_b - lse')
  sigmoid     out' = out - sigmoid(lse_b - lse) (out - out_b); lse' = lse - log_sigmoid(lse - lse_b)
  max         m = max(lse, lse_b); lse' = m + log(e^(lse - m) + e^(lse_b - m)), out rescaled as for logaddexp
  softplus    lse' = lse + softplus(lse_b - lse), out as for sigmoid
  max-log1p   lse' = max(lse, lse_b) + log1p(e^-|lse - lse_b|) (jnp.logaddexp's formula written out: under plain
              jax.grad its derivative at a tie is not the function's, so its backward is refused; so is the max
              form's, conservatively: a max differentiated at a tie is exact alone, not where maxima nest)
and the state started at -inf with a guard (`where(isneginf(lse), block, merged)`, ejkernel) or from the first block
(a step-0 reset): with the logaddexp form; the sigmoid and softplus forms under a guard or reset are refused, since
the block they take may have rows of masked keys alone (lse -1e30), which the next such merge cancels to 0. Look-alikes that are not order-free (the line marked `# refused here` is the one refused)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from support.ring_user_kernels import NEG, ring, scores


def block(q, k, v, keep):
    """One block as a flash kernel returns it: (softmax-weighted output, log-sum-exp per query row)."""
    s = jnp.where(keep, scores(q, k), NEG)
    m = jnp.max(s, axis=-1)
    p = jnp.exp(s - m[..., None])
    l = jnp.sum(p, axis=-1)
    out = jnp.einsum("bqk,bkd->bqd", p, v) / l[..., None]
    return out, m + jnp.log(l)


def block_logsumexp(q, k, v, keep):
    """`block` with the lse from jax.nn.logsumexp and the weights normalised by it."""
    s = jnp.where(keep, scores(q, k), NEG)
    lse = jax.nn.logsumexp(s, axis=-1)
    return jnp.einsum("bqk,bkd->bqd", jnp.exp(s - lse[..., None]), v), lse


# ---------------------------------------------------------------------------------------------------------------
# Merges of one block (out_b, lse_b) into the state (out, lse); i: the ring step.


def merge_logaddexp(out, lse, out_b, lse_b, i):
    lse_new = jnp.logaddexp(lse, lse_b)
    return out * jnp.exp(lse - lse_new)[..., None] + out_b * jnp.exp(lse_b - lse_new)[..., None], lse_new


def merge_sigmoid(out, lse, out_b, lse_b, i):
    out = out - jax.nn.sigmoid(lse_b - lse)[..., None] * (out - out_b)
    return out, lse - jax.nn.log_sigmoid(lse - lse_b)


def merge_max(out, lse, out_b, lse_b, i):
    m = jnp.maximum(lse, lse_b)  # refused here under plain jax.grad
    lse_new = m + jnp.log(jnp.exp(lse - m) + jnp.exp(lse_b - m))
    return out * jnp.exp(lse - lse_new)[..., None] + out_b * jnp.exp(lse_b - lse_new)[..., None], lse_new


def merge_max_log1p(out, lse, out_b, lse_b, i):
    """jnp.logaddexp's formula written out. The same function, so the forward is proved; but jax.grad
    differentiates it op by op, and abs has derivative 1 at 0 where max has 1/2: where lse and lse_b tie, all of
    the cotangent goes to lse_b, so which block is the state and which the new one decides the gradient."""
    m = jnp.maximum(lse, lse_b)  # refused here under plain jax.grad
    lse_new = m + jnp.log1p(jnp.exp(-jnp.abs(lse - lse_b)))  # refused here under plain jax.grad
    return out * jnp.exp(lse - lse_new)[..., None] + out_b * jnp.exp(lse_b - lse_new)[..., None], lse_new


def merge_softplus(out, lse, out_b, lse_b, i):
    out = out - jax.nn.sigmoid(lse_b - lse)[..., None] * (out - out_b)
    return out, lse + jax.nn.softplus(lse_b - lse)


def guarded(merge):
    """ejkernel's `_update_out_and_lse`: where nothing is merged yet (lse == -inf), the block as it is."""
    def merged(out, lse, out_b, lse_b, i):
        new_out, new_lse = merge(out, lse, out_b, lse_b, i)
        first = jnp.isneginf(lse)
        return jnp.where(first[..., None], out_b, new_out), jnp.where(first, lse_b, new_lse)  # refused here
    return merged


def reset(merge):
    """The state taken from the first block (step 0), merged after."""
    def merged(out, lse, out_b, lse_b, i):
        new_out, new_lse = merge(out, lse, out_b, lse_b, i)
        return jnp.where(i == 0, out_b, new_out), jnp.where(i == 0, lse_b, new_lse)  # refused here
    return merged


# Look-alikes: not order-free.


def merge_decayed(out, lse, out_b, lse_b, i):
    """An exponential moving average of the blocks' outputs: later blocks weigh more."""
    out = 0.9 * out + 0.1 * out_b  # refused here
    return out, jnp.logaddexp(lse, lse_b)


def merge_hop_weighted(out, lse, out_b, lse_b, i):
    """The blocks' outputs averaged with a weight read from the step counter."""
    w = 1.0 / (i + 1.0)  # refused here
    return out * (1.0 - w) + out_b * w, jnp.logaddexp(lse, lse_b)  # refused here


def merge_latest(out, lse, out_b, lse_b, i):
    """The latest block kept, its lse merged: the output is that of whichever block came last."""
    return out_b, jnp.logaddexp(lse, lse_b)  # refused here


def merge_argmax(out, lse, out_b, lse_b, i):
    """The output of the block with the largest lse kept (a hard max for the soft one)."""
    better = lse_b > lse  # refused here
    return jnp.where(better[..., None], out_b, out), jnp.maximum(lse, lse_b)  # refused here


MERGES = {"logaddexp": merge_logaddexp, "sigmoid": merge_sigmoid, "max": merge_max, "softplus": merge_softplus,
          "max-log1p": merge_max_log1p,
          "guarded-logaddexp": guarded(merge_logaddexp), "guarded-sigmoid": guarded(merge_softplus),
          "reset-logaddexp": reset(merge_logaddexp), "reset-sigmoid": reset(merge_sigmoid),
          "decayed": merge_decayed, "hop-weighted": merge_hop_weighted, "latest": merge_latest,
          "argmax": merge_argmax}


# ---------------------------------------------------------------------------------------------------------------
# The ring.


def contiguous(c, n):
    return c * n + jnp.arange(n)


def lse_ring(cp: int, merge: str, *, skip: bool = False, init: str = "neg", loop: str = "fori", first: str = "loop",
             positions=contiguous, block=block):
    """Causal ring attention that merges per-block (out, lse). `skip`: a block wholly in the future skipped with
    lax.cond on the blocks' first and last positions (else masked, every block computed); `init`: the state's lse
    from -inf ("inf") or a finite very negative number ("neg"); `first`: "loop" (every block merged in the loop)
    or "peeled" (the own block computed before the loop, as ring-flash-attention does, the loop merging the other
    cp - 1); `loop`: "fori" or "scan"; `positions(c, n)`: the positions of block c's tokens (the layout; contiguous
    as written); `block`: what computes a block's (out, lse). A merge that is not order-free is refused where the loop carries its state (the marked line)."""
    fold = MERGES[merge]

    def body(q, k, v):
        b, n, d = q.shape
        me = lax.axis_index("cp")
        q_pos = positions(me, n)

        def attend(state, k, v, i):
            k_pos = positions((me - i) % cp, n)
            out_b, lse_b = block(q, k, v, q_pos[:, None] >= k_pos[None, :])
            return fold(*state, out_b, lse_b, i)

        def step(i, carry):
            state, k, v = carry
            if skip:
                live = me * n + n - 1 >= ((me - i) % cp) * n  # contiguous blocks: a block wholly ahead
                state = lax.cond(live, lambda st: attend(st, k, v, i), lambda st: st, state)
            else:
                state = attend(state, k, v, i)
            return state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        start = 0
        if first == "peeled":
            state = block(q, k, v, q_pos[:, None] >= q_pos[None, :])
            k, v = (lax.ppermute(t, "cp", ring(cp)) for t in (k, v))
            start = 1
        else:
            state = (jnp.zeros_like(q), jnp.full((b, n), -jnp.inf if init == "inf" else NEG, q.dtype))
        carry = (state, k, v)
        if loop == "fori":
            carry = lax.fori_loop(start, cp, step, carry)  # refused here
        else:
            carry = lax.scan(lambda c, i: (step(i, c), None), carry, jnp.arange(start, cp))[0]  # refused here
        return carry[0][0]

    return body


def lse_ring_vjp(cp: int, merge: str):
    """lse_ring(cp, merge) with a custom_vjp: the backward recomputes each block's probabilities from the final
    lse, dk and dv travelling with k and v."""
    def forward(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            (out, lse), k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            out_b, lse_b = block(q, k, v, q_pos[:, None] >= k_pos[None, :])
            return MERGES[merge](out, lse, out_b, lse_b, i), lax.ppermute(k, "cp", ring(cp)), \
                lax.ppermute(v, "cp", ring(cp))

        b, _, d = q.shape
        (out, lse), _, _ = lax.fori_loop(0, cp, step, ((jnp.zeros_like(q), jnp.full((b, n), NEG, q.dtype)), k, v))
        return out, (q, k, v, out, lse)

    def backward(res, do):
        q, k, v, out, lse = res
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)
        delta = jnp.sum(do * out, axis=-1)
        scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))

        def step(i, carry):
            dq, k, v, dk, dv = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            p = jnp.exp(s - lse[..., None])
            ds = p * (jnp.einsum("bqd,bkd->bqk", do, v) - delta[..., None]) * scale
            dq = dq + jnp.einsum("bqk,bkd->bqd", ds, k)
            dk = dk + jnp.einsum("bqk,bqd->bkd", ds, q)
            dv = dv + jnp.einsum("bqk,bqd->bkd", p, do)
            return (dq,) + tuple(lax.ppermute(t, "cp", ring(cp)) for t in (k, v, dk, dv))

        dq, _, _, dk, dv = lax.fori_loop(0, cp, step, (jnp.zeros_like(q), k, v, jnp.zeros_like(k),
                                                      jnp.zeros_like(v)))
        return dq, dk, dv

    @jax.custom_vjp
    def attention(q, k, v):
        return forward(q, k, v)[0]

    attention.defvjp(forward, backward)
    return attention


def hard_max_ring(cp: int, positions=contiguous):
    """A ring that keeps the larger lse (a hard max for logaddexp) and rescales the outputs to it: each block's
    output weighs by its own lse against the largest, so the result depends on how the keys are cut into blocks."""
    def body(q, k, v):
        b, n, _ = q.shape
        me = lax.axis_index("cp")
        q_pos = positions(me, n)

        def step(i, carry):
            (out, lse), k, v = carry
            k_pos = positions((me - i) % cp, n)
            out_b, lse_b = block(q, k, v, q_pos[:, None] >= k_pos[None, :])
            lse_new = jnp.maximum(lse, lse_b)  # refused here
            out = out * jnp.exp(lse - lse_new)[..., None] + out_b * jnp.exp(lse_b - lse_new)[..., None]  # refused here
            return (out, lse_new), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        state = (jnp.zeros_like(q), jnp.full((b, n), NEG, q.dtype))
        (out, _), _, _ = lax.fori_loop(0, cp, step, (state, k, v))  # refused here
        return out

    return body
