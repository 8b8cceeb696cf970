"""Ring attention kernels as users write them, with the masks and merges models use: per-device bodies for
jax.shard_map over a ring axis "cp", on q, k, v [batch, n, dim] (or [batch, n, heads, dim]).

- `one_block_ring`: one (q block, kv block) pair a ring step, positions from axis_index, any mask, one of four
  online-softmax merges, in a fori_loop, a lax.scan or an unrolled loop.
- `blockwise_ring`: Liu et al.'s shape: lax.scan over ring steps, lax.scan over q chunks and kv chunks, a chunk
  pair skipped with lax.cond when the mask hides it whole (decided by the chunks' global positions).
- `rows_ring`: one block a ring step, the queries taken a few rows at a time by a fori_loop that updates the
  running state in place (dynamic_slice / dynamic_update_slice).
- `vjp_ring`: a custom_vjp kernel with any mask: the backward recomputes each block from the forward's lse.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

NEG = -1e30


def ring(cp: int, direction: int = 1):
    return [(i, (i + direction) % cp) for i in range(cp)]


# ---------------------------------------------------------------------------------------------------------------
# Masks: (q positions [nq, 1], k positions [1, nk]) -> (keep, additive bias or None); `live`: whether a chunk pair
# (first q position, first k position, chunk length) has any visible pair.


def causal(qp, kp):
    return qp >= kp, None


def window(w):
    def mask(qp, kp):
        return (qp >= kp) & (qp - kp < w), None
    return mask


def alibi(qp, kp):
    return qp >= kp, -0.25 * (qp - kp).astype(jnp.float32)


def prefix_lm(p):
    def mask(qp, kp):
        return (qp >= kp) | (kp < p), None
    return mask


def chunked(c):
    """Llama-4 style local attention: causal within chunks of c tokens."""
    def mask(qp, kp):
        return (qp // c == kp // c) & (qp >= kp), None
    return mask


def sinks(n_sink, w):
    """StreamingLLM: a causal window plus the first n_sink tokens, always visible."""
    def mask(qp, kp):
        return (qp >= kp) & ((qp - kp < w) | (kp < n_sink)), None
    return mask


def bidirectional(qp, kp):
    return None, None


MASKS = {"causal": causal, "window8": window(8), "window40": window(40), "alibi": alibi, "prefix20": prefix_lm(20),
         "chunked24": chunked(24), "chunked16": chunked(16), "sinks": sinks(4, 8), "none": bidirectional}


def live_causal(qf, kf, c):
    return qf + c - 1 >= kf


def live_window(w):
    def live(qf, kf, c):
        return (qf + c - 1 >= kf) & (qf - (kf + c - 1) < w)
    return live


def live_prefix(p):
    def live(qf, kf, c):
        return (qf + c - 1 >= kf) | (kf < p)
    return live


def live_chunked(local):
    def live(qf, kf, c):
        return (qf // local == kf // local) & (qf + c - 1 >= kf)
    return live


def live_sinks(n_sink, w):
    def live(qf, kf, c):
        return (qf + c - 1 >= kf) & ((qf - (kf + c - 1) < w) | (kf < n_sink))
    return live


LIVE = {"causal": live_causal, "window8": live_window(8), "window40": live_window(40), "alibi": live_causal,
        "prefix20": live_prefix(20), "chunked16": live_chunked(16), "sinks": live_sinks(4, 8)}


# ---------------------------------------------------------------------------------------------------------------
# Pieces of attention on one block, for [b, n, d] and [b, n, h, d] alike.


def scores(q, k):
    spec = "bqd,bkd->bqk" if q.ndim == 3 else "bqhd,bkhd->bhqk"
    return jnp.einsum(spec, q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))


def apply(p, v):
    return jnp.einsum("bqk,bkd->bqd" if v.ndim == 3 else "bhqk,bkhd->bqhd", p, v)


def per_row(x, like):
    """A row statistic ([b, q] or [b, h, q]) broadcast onto an output like `like`."""
    return x[..., None] if like.ndim == 3 else jnp.swapaxes(x, 1, 2)[..., None]


def pair_mask(ids_q, ids_k, s):
    """Segment ids [b, nq], [b, nk] -> [b, nq, nk] (or [b, 1, nq, nk] for scores with heads)."""
    same = ids_q[:, :, None] == ids_k[:, None, :]
    return same if s.ndim == 3 else same[:, None]


def rotate(x, cos, sin):
    """RoPE on the last dim with cos/sin rows [n, d / 2] gathered for x's tokens."""
    half = x.shape[-1] // 2
    if x.ndim == 4:
        cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def row_stats(q, neg):
    """(row max, row sum) initial values, made from q so that they carry q's sharding (Explicit axes)."""
    zero = jnp.zeros_like(q[..., 0]) if q.ndim == 3 else jnp.zeros_like(jnp.swapaxes(q[..., 0], 1, 2))
    return zero + neg, zero


# ---------------------------------------------------------------------------------------------------------------
# Online-softmax merges of one block's scores into the running state.


def with_backward(forward, backward):
    """attention(q, k, v) = forward(q, k, v)[0], differentiated by `backward` (forward's second result, its
    residuals, and the output's cotangent -> dq, dk, dv): a custom_vjp ring kernel."""
    @jax.custom_vjp
    def attention(q, k, v):
        return forward(q, k, v)[0]

    attention.defvjp(forward, backward)
    return attention


def merge_online(acc, s, v, i):
    m0, l0, o0 = acc
    m = jnp.maximum(m0, jnp.max(s, axis=-1))
    p = jnp.exp(s - m[..., None])
    corr = jnp.exp(m0 - m)
    return m, l0 * corr + jnp.sum(p, axis=-1), o0 * per_row(corr, o0) + apply(p, v)


def merge_guarded(acc, s, v, i):
    """-inf masks; a row that has seen no key yet has max -inf: shift by 0 instead (as flash kernels do)."""
    m0, l0, o0 = acc
    m = jnp.maximum(m0, jnp.max(s, axis=-1))
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m_safe[..., None])
    corr = jnp.exp(m0 - m_safe)
    return m, l0 * corr + jnp.sum(p, axis=-1), o0 * per_row(corr, o0) + apply(p, v)


def merge_reset(acc, s, v, i, first=0):
    """The first ring step (`first`) starts the state afresh instead of rescaling the initial one."""
    m0, l0, o0 = acc
    m = jnp.maximum(m0, jnp.max(s, axis=-1))
    p = jnp.exp(s - m[..., None])
    corr = jnp.where(i == first, 0.0, jnp.exp(m0 - m))
    l = jnp.where(i == first, jnp.sum(p, axis=-1), l0 * corr + jnp.sum(p, axis=-1))
    return m, l, jnp.where(i == first, apply(p, v), o0 * per_row(corr, o0) + apply(p, v))


def merge_lse(acc, s, v, i):
    """ring-flash-attn's merge: each block's normalised output and log-sum-exp, combined by logaddexp."""
    lse0, out0 = acc
    m = jnp.max(s, axis=-1)
    p = jnp.exp(s - m[..., None])
    l = jnp.sum(p, axis=-1)
    out = apply(p, v) / per_row(l, out0)
    lse_b = m + jnp.log(l)
    lse = jnp.logaddexp(lse0, lse_b)
    return lse, out0 * per_row(jnp.exp(lse0 - lse), out0) + out * per_row(jnp.exp(lse_b - lse), out0)


MERGES = {"online": merge_online, "guarded": merge_guarded, "reset": merge_reset, "lse": merge_lse}


def init_state(q, merge: str):
    neg = -jnp.inf if merge == "guarded" else NEG
    m, l = row_stats(q, neg)
    if merge == "lse":
        return m, jnp.zeros_like(q)
    return m, l, jnp.zeros_like(q)


def finish(acc, merge: str, sink=None):
    if merge == "lse":
        return acc[1]
    m, l, o = acc
    if sink is not None:  # a learned sink logit in every row's denominator (gpt-oss's softmax_aux)
        l = l + jnp.exp(sink - m)
    return o / per_row(l, o)


# ---------------------------------------------------------------------------------------------------------------
# One block a ring step.


def one_block_ring(cp: int, mask, *, loop: str = "fori", merge: str = "online", positions: str = "iota",
                   seg: bool = False, rope: bool = False, offset: bool = False, sink_logit: bool = False,
                   direction: int = 1):
    """Body f(q, k, v[, q_pos, k_pos][, seg][, cos, sin][, start][, sink]). positions: "iota" (`me * n +
    arange(n)`, source `(me - i) % cp`), "lax" (`iota(n) + n * me`, source `rem(me - i + cp, cp)`) or "data"
    (position ids [b, n] passed in, the key ones travelling with k); start: a replicated offset added to every
    position (prefill after a cache); direction: which way blocks travel."""
    fold = MERGES[merge]
    neg = -jnp.inf if merge == "guarded" else NEG
    perm = ring(cp, direction)

    def body(q, k, v, *extra):
        extra = list(extra)
        data_pos = (extra.pop(0), extra.pop(0)) if positions == "data" else None
        ids = extra.pop(0) if seg else None
        cos_t, sin_t = (extra.pop(0), extra.pop(0)) if rope else (None, None)
        start = extra.pop(0) if offset else 0
        sink = extra.pop(0) if sink_logit else None
        n = q.shape[1]
        me = lax.axis_index("cp")

        def pos_of(c):
            if positions == "iota":
                return c * n + jnp.arange(n) + start
            return lax.iota(jnp.int32, n) + n * c + start

        def source(i):
            if positions == "lax":
                return lax.rem(me - direction * i + cp, cp)
            return (me - direction * i) % cp

        q_pos = data_pos[0][:, :, None] if data_pos else pos_of(me)[:, None]
        if rope:
            q = rotate(q, cos_t[q_pos[:, 0]], sin_t[q_pos[:, 0]])

        def step(i, carry):
            acc, k, v, k_ids, k_pos = carry
            if not data_pos:
                k_pos = pos_of(source(i))[None, :]
            kr = rotate(k, cos_t[k_pos[0]], sin_t[k_pos[0]]) if rope else k
            s = scores(q, kr)
            keep, bias = mask(q_pos, k_pos)
            if bias is not None:
                s = s + bias
            if seg:
                same = pair_mask(ids, k_ids, s)
                keep = same if keep is None else keep & same
            if keep is not None:
                s = jnp.where(keep, s, neg)
            acc = fold(acc, s, v, i)
            k, v = (lax.ppermute(t, "cp", perm) for t in (k, v))
            k_ids = lax.ppermute(k_ids, "cp", perm) if seg else None
            k_pos = lax.ppermute(k_pos, "cp", perm) if data_pos else None
            return acc, k, v, k_ids, k_pos

        carry = (init_state(q, merge), k, v, ids, data_pos[1][:, None, :] if data_pos else None)
        if loop == "fori":
            carry = lax.fori_loop(0, cp, step, carry)
        elif loop == "scan":
            carry = lax.scan(lambda c, i: (step(i, c), None), carry, jnp.arange(cp))[0]
        else:
            for i in range(cp):
                carry = step(i, carry)
        return finish(carry[0], merge, sink)

    return body


def rows_ring(cp: int, rows: int, mask, *, merge: str = "online"):
    """Body f(q, k, v) over [b, n, d]: lax.fori_loop over ring steps; inside a step, a lax.fori_loop over the
    queries `rows` at a time that slices them out (lax.dynamic_slice_in_dim) and updates the running state in
    place (lax.dynamic_update_slice_in_dim into the carried buffers), as hand-written kernels do."""
    fold = MERGES[merge]
    perm = ring(cp)

    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")

        def step(i, carry):
            acc, k, v = carry
            k_pos = (((me - i) % cp) * n + jnp.arange(n))[None, :]

            def row(a, acc):
                qa = lax.dynamic_slice_in_dim(q, a * rows, rows, axis=1)
                q_pos = (me * n + a * rows + jnp.arange(rows))[:, None]
                s = scores(qa, k)
                keep, bias = mask(q_pos, k_pos)
                if bias is not None:
                    s = s + bias
                if keep is not None:
                    s = jnp.where(keep, s, NEG)
                part = tuple(lax.dynamic_slice_in_dim(x, a * rows, rows, axis=1) for x in acc)
                part = fold(part, s, v, i)
                return tuple(lax.dynamic_update_slice_in_dim(x, y, a * rows, axis=1) for x, y in zip(acc, part))

            acc = lax.fori_loop(0, n // rows, row, acc)
            return acc, lax.ppermute(k, "cp", perm), lax.ppermute(v, "cp", perm)

        acc, _, _ = lax.fori_loop(0, cp, step, (init_state(q, merge), k, v))
        return finish(acc, merge)

    return body


# ---------------------------------------------------------------------------------------------------------------
# Blockwise, chunk pairs skipped.


def blockwise_ring(cp: int, chunk: int, mask, live, *, merge: str = "online", seg: bool = False, key_skip=None):
    """Body f(q, k, v[, seg]) over [b, n, d]: lax.scan over ring steps; inside a step, lax.scan over the q chunks
    (the running state cut into chunks alongside) and lax.scan over the kv chunks; a chunk pair runs under
    lax.cond(live(first q position, first k position, chunk)). Global chunk index = block start + counter.
    `key_skip(k chunk)`: a predicate of the keys' data or-ed into the skip (a skip decided by token data)."""
    fold = MERGES[merge]
    neg = -jnp.inf if merge == "guarded" else NEG

    def chunks(x):
        b, n = x.shape[:2]
        return jnp.moveaxis(x.reshape((b, n // chunk, chunk) + x.shape[2:]), 1, 0)

    def unchunk(x):
        return jnp.moveaxis(x, 0, 1).reshape((x.shape[1], x.shape[0] * x.shape[2]) + x.shape[3:])

    def body(q, k, v, *extra):
        ids = extra[0] if seg else None
        n = q.shape[1]
        per = n // chunk
        me = lax.axis_index("cp")
        q_first_chunk = me * per

        def ring_step(carry, i):
            acc, k, v, k_ids = carry
            k_first_chunk = ((me - i) % cp) * per
            kc, vc = chunks(k), chunks(v)
            kids = chunks(k_ids) if seg else jnp.zeros((per,), jnp.int32)

            def q_step(_, xs):
                qi, qids, acc_i, a = xs

                def kv_step(acc_i, ys):
                    kj, vj, kidj, b_ = ys
                    qf, kf = (q_first_chunk + a) * chunk, (k_first_chunk + b_) * chunk
                    q_pos, k_pos = qf + jnp.arange(chunk), kf + jnp.arange(chunk)

                    def run(acc_i):
                        s = scores(qi, kj)
                        keep, bias = mask(q_pos[:, None], k_pos[None, :])
                        if bias is not None:
                            s = s + bias
                        if seg:
                            keep = keep & pair_mask(qids, kidj, s)
                        return fold(acc_i, jnp.where(keep, s, neg), vj, i)

                    alive = live(qf, kf, chunk) if key_skip is None else live(qf, kf, chunk) | key_skip(kj)
                    return lax.cond(alive, run, lambda a_: a_, acc_i), None  # refused here

                acc_i, _ = lax.scan(kv_step, acc_i, (kc, vc, kids, jnp.arange(per)))
                return None, acc_i

            qids = chunks(ids) if seg else jnp.zeros((per,), jnp.int32)
            acc_c = tuple(chunks(a) for a in acc)
            _, acc_c = lax.scan(q_step, None, (chunks(q), qids, acc_c, jnp.arange(per)))
            acc = tuple(unchunk(a) for a in acc_c)
            k, v = (lax.ppermute(t, "cp", ring(cp)) for t in (k, v))
            k_ids = lax.ppermute(k_ids, "cp", ring(cp)) if seg else None
            return (acc, k, v, k_ids), None

        (acc, *_), _ = lax.scan(ring_step, (init_state(q, merge), k, v, ids), jnp.arange(cp))
        return finish(acc, merge)

    return body


def blockwise_python_ring(cp: int, chunk: int, mask, live, *, merge: str = "online"):
    """blockwise_ring with its chunk loops written as Python loops: inside a lax.fori_loop over ring steps, each q
    chunk keeps its own state (its own running maximum) in a tuple, every kv chunk folded into it under
    lax.cond(live(first q position, first k position, chunk)); the chunks' outputs concatenated at the end."""
    fold = MERGES[merge]
    neg = -jnp.inf if merge == "guarded" else NEG

    def body(q, k, v):
        n = q.shape[1]
        per = n // chunk
        me = lax.axis_index("cp")

        def piece(x, a):
            return x[:, a * chunk:(a + 1) * chunk]

        def ring_step(i, carry):
            states, k, v = carry
            source = (me - i) % cp
            out = []
            for a, acc in enumerate(states):
                qf = me * n + a * chunk
                for b in range(per):
                    kf = source * n + b * chunk
                    q_pos, k_pos = qf + jnp.arange(chunk), kf + jnp.arange(chunk)

                    def run(acc, qa=piece(q, a), kb=piece(k, b), vb=piece(v, b), q_pos=q_pos, k_pos=k_pos):
                        s = scores(qa, kb)
                        keep, bias = mask(q_pos[:, None], k_pos[None, :])
                        if bias is not None:
                            s = s + bias
                        return fold(acc, jnp.where(keep, s, neg), vb, i)

                    acc = lax.cond(live(qf, kf, chunk), run, lambda acc: acc, acc)
                out.append(acc)
            return tuple(out), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        states = tuple(init_state(piece(q, a), merge) for a in range(per))
        states, _, _ = lax.fori_loop(0, cp, ring_step, (states, k, v))
        return jnp.concatenate([finish(acc, merge) for acc in states], axis=1)

    return body


# ---------------------------------------------------------------------------------------------------------------
# custom_vjp: the backward recomputes each block from the forward's log-sum-exp; dk and dv travel with k and v.


def vjp_ring(cp: int, mask, direction: int = 1, backward_source: int | None = None):
    """Body f(q, k, v) over [b, n, d] with a custom_vjp; blocks travel `direction` around the ring.
    `backward_source`: the backward masks the block of coordinate (me + backward_source * i) % cp at step i (a bug
    where it isn't -direction: the mask follows other blocks than the ones the backward holds)."""
    perm = ring(cp, direction)

    def masked_scores(q, k, me, i, n, source: int = -direction):
        q_pos = me * n + jnp.arange(n)
        k_pos = ((me + source * i) % cp) * n + jnp.arange(n)
        keep, bias = mask(q_pos[:, None], k_pos[None, :])
        s = scores(q, k) if bias is None else scores(q, k) + bias
        return s if keep is None else jnp.where(keep, s, NEG)

    def forward(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")

        def step(i, carry):
            acc, k, v = carry
            acc = merge_online(acc, masked_scores(q, k, me, i, n), v, i)
            return acc, lax.ppermute(k, "cp", perm), lax.ppermute(v, "cp", perm)

        (m, l, o), _, _ = lax.fori_loop(0, cp, step, (init_state(q, "online"), k, v))
        out = o / l[..., None]
        return out, (q, k, v, out, m + jnp.log(l))

    def backward(res, do):
        q, k, v, out, lse = res
        n = q.shape[1]
        me = lax.axis_index("cp")
        delta = jnp.sum(do * out, axis=-1)
        scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))

        def step(i, carry):
            dq, k, v, dk, dv = carry
            p = jnp.exp(masked_scores(q, k, me, i, n, backward_source or -direction) - lse[..., None])
            ds = p * (jnp.einsum("bqd,bkd->bqk", do, v) - delta[..., None]) * scale
            dq = dq + jnp.einsum("bqk,bkd->bqd", ds, k)
            dk = dk + jnp.einsum("bqk,bqd->bkd", ds, q)
            dv = dv + jnp.einsum("bqk,bqd->bkd", p, do)
            return (dq,) + tuple(lax.ppermute(t, "cp", perm) for t in (k, v, dk, dv))

        dq, _, _, dk, dv = lax.fori_loop(0, cp, step, (jnp.zeros_like(q), k, v, jnp.zeros_like(k),
                                                      jnp.zeros_like(v)))
        return dq, dk, dv

    return with_backward(forward, backward)


def same_expression_ring(q, k, v):
    """A cp=4 causal ring (one block a step) with a second result y: one comprehension on one line makes both what
    the attention reads (q scaled and shifted over features, which the reorder keeps) and what y sums (v shifted
    over tokens, which it changes), so every op of a backward that differentiates y only carries the traceback of
    an op the attention result depends on. The shift is jnp.roll(t * tanh(u), 1, axis) in lax ops: JAX caches
    jnp.roll's jaxpr across programs, with the first program's tracebacks."""
    def shift(t, u, axis):
        s, n = lax.mul(t, lax.tanh(u)), t.shape[axis]
        return lax.concatenate([lax.slice_in_dim(s, n - 1, n, axis=axis), lax.slice_in_dim(s, 0, n - 1, axis=axis)],
                               axis)

    cp, n = 4, q.shape[1]
    me = lax.axis_index("cp")
    q_pos = (me * n + jnp.arange(n))[:, None]

    def step(i, carry):
        acc, y, k, v = carry
        k_pos = (((me - i) % cp) * n + jnp.arange(n))[None, :]
        qs, ys = [shift(t, u, axis) for t, u, axis in ((q, q, 2), (v, k, 1))]
        acc = merge_online(acc, jnp.where(q_pos >= k_pos, scores(qs, k), NEG), v, i)
        k, v = (lax.ppermute(t, "cp", ring(cp)) for t in (k, v))
        return acc, y + ys, k, v

    start = (row_stats(q, NEG) + (jnp.zeros_like(q),), jnp.zeros_like(v), k, v)
    (_, l, o), y, _, _ = lax.fori_loop(0, cp, step, start)
    return o / l[..., None], y
