"""Ring attention spelled as published kernels spell it, where an earlier analysis refused safe programs: the merge
state made with jnp.full / jnp.zeros rather than from q, the source coordinate carried from step to step
(`kv_source = (kv_source - 1) % cp`, ejkernel) or sent round the ring with its block (flash_attn_jax's `k_ix`), a
window written `q - w <= k`, the merge state kept in bfloat16 between steps (`.astype(q.dtype)`, as LWM runs Liu et
al.'s kernel), the carried source kept non-negative (`(kv_source + cp - 1) % cp`), the ring loop unrolled by two
(`lax.scan(..., unroll=2)`, or two ring steps an iteration by hand). Beside each, a program that looks alike but
whose result depends on where tokens sit, which ring-reorder must refuse (the line marked `# refused here`).
Per-device bodies f(q, k, v) over [batch, n, dim] for jax.shard_map over "cp"."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from support.ring_user_kernels import NEG, merge_online, merge_reset, per_row, ring, scores, with_backward


def _positions(c, n):
    return c * n + jnp.arange(n)


def _state(q, init: str):
    """(max, sum, acc) as published kernels make them (`full`: jnp.full / jnp.zeros of the block's shape) or from q
    (`q`: carrying q's sharding)."""
    b, n, d = q.shape
    if init == "full":
        return jnp.full((b, n), NEG), jnp.zeros((b, n)), jnp.zeros((b, n, d))
    zero = jnp.zeros_like(q[..., 0])
    return zero + NEG, zero, jnp.zeros_like(q)


def _finish(state):
    _, l, o = state
    return o / per_row(l, o)


def full_init(cp: int, window: int | None = None, every: int | None = None):
    """Causal ring attention, the state from jnp.full / jnp.zeros, in a fori_loop; `window`: a sliding window
    `q - window <= k`; `every`: keys whose position is a multiple of `every` hidden (`k % every != 0`) but from
    themselves."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(i, carry):
            state, k, v = carry
            k_pos = _positions((me - i) % cp, n)
            keep = q_pos[:, None] >= k_pos[None, :]
            if window is not None:
                keep &= q_pos[:, None] - window <= k_pos[None, :]
            if every is not None:
                keep &= (k_pos % every != 0)[None, :] | (q_pos[:, None] == k_pos[None, :])
            state = merge_online(state, jnp.where(keep, scores(q, k), NEG), v, i)
            return state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        state, _, _ = lax.fori_loop(0, cp, step, (_state(q, "full"), k, v))
        return _finish(state)
    return body


def carried_source(cp: int, travel: str = "carried", window: int | None = None, positions=_positions):
    """The visiting block's coordinate carried by the loop: `carried`, stepped as ejkernel does
    (`(kv_source - 1) % cp`, from `axis_index`); `plus-cp`, the same step kept non-negative before the modulo
    (`(kv_source + cp - 1) % cp`); `plus-dp`, plus a multiple of cp that the modulo drops
    (`(kv_source - 1 + cp * axis_index("dp")) % cp`); `mod-2cp`, modulo 2 cp first
    (`((kv_source - 1) % (2 * cp)) % cp`); `ppermuted`, sent round the ring with k and v (flash_attn_jax's `k_ix`).
    `window`: also a window `k_pos + window > q_pos`. `positions(c, n)`: the positions of block c's tokens (the
    layout; contiguous as written)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = positions(me, n)

        def step(carry, _):
            state, k, v, src = carry
            k_pos = positions(src, n)
            keep = q_pos[:, None] >= k_pos[None, :]
            if window is not None:
                keep &= k_pos[None, :] + window > q_pos[:, None]
            state = merge_online(state, jnp.where(keep, scores(q, k), NEG), v, 0)
            if travel == "ppermuted":
                src = lax.ppermute(src, "cp", ring(cp))
            elif travel == "plus-dp":  # a multiple of cp that the modulo drops, whatever it multiplies
                src = (src - 1 + cp * lax.axis_index("dp")) % cp
            elif travel == "mod-2cp":  # taken modulo a multiple of cp first
                src = ((src - 1) % (2 * cp)) % cp
            else:
                src = (src + cp - 1) % cp if travel == "plus-cp" else (src - 1) % cp
            return (state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp)), src), None

        (state, _, _, _), _ = lax.scan(step, (_state(q, "full"), k, v, me), None, length=cp)
        return _finish(state)
    return body


def unrolled_scan(cp: int, unroll: int = 2, positions=_positions, merge=merge_online):
    """Causal ring attention in a partially unrolled lax.scan over the ring steps (`unroll=2`: each iteration of
    the loop runs two ring steps, the step index read from the scanned `arange`; `unroll=3` on a ring of 4 or 8:
    the steps left over run after the loop, and on a ring of 4 the loop runs once; `merge`: how a block is folded
    in, given the step index)."""
    def body(q, k, v, finish=True):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = positions(me, n)

        def step(carry, i):
            state, k, v = carry
            keep = q_pos[:, None] >= positions((me - i) % cp, n)[None, :]
            state = merge(state, jnp.where(keep, scores(q, k), NEG), v, i)
            return (state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))), None

        (state, _, _), _ = lax.scan(step, (_state(q, "full"), k, v), jnp.arange(cp), unroll=unroll)
        return _finish(state) if finish else state
    return body


def two_steps_an_iteration(cp: int, positions=_positions):
    """The ring unrolled by two by hand: a fori_loop over cp / 2 iterations, each running ring steps 2t and
    2t + 1, the second block's source `(me - 2 * t - 1) % cp`."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = positions(me, n)

        def one(state, k, v, src):
            keep = q_pos[:, None] >= positions(src, n)[None, :]
            state = merge_online(state, jnp.where(keep, scores(q, k), NEG), v, 0)
            return state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        def step(t, carry):
            carry = one(*carry, (me - 2 * t) % cp)
            return one(*carry, (me - 2 * t - 1) % cp)

        state, _, _ = lax.fori_loop(0, cp // 2, step, (_state(q, "full"), k, v))
        return _finish(state)
    return body


def vjp_unrolled(cp: int):
    """A custom_vjp ring whose forward and backward are lax.scans unrolled by two (`unroll=2`); dk and dv travel
    with k and v and come home after the full ring."""
    def masked(q, k, me, i, n):
        keep = _positions(me, n)[:, None] >= _positions((me - i) % cp, n)[None, :]
        return jnp.where(keep, scores(q, k), NEG)

    def forward(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")

        def step(carry, i):
            state, k, v = carry
            state = merge_online(state, masked(q, k, me, i, n), v, i)
            return (state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))), None

        ((m, l, o), _, _), _ = lax.scan(step, (_state(q, "full"), k, v), jnp.arange(cp), unroll=2)
        out = o / per_row(l, o)
        return out, (q, k, v, out, m + jnp.log(l))

    def backward(res, do):
        q, k, v, out, lse = res
        n = q.shape[1]
        me = lax.axis_index("cp")
        delta = jnp.sum(do * out, axis=-1)
        scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))

        def step(carry, i):
            dq, k, v, dk, dv = carry
            p = jnp.exp(masked(q, k, me, i, n) - lse[..., None])
            ds = p * (jnp.einsum("bqd,bkd->bqk", do, v) - delta[..., None]) * scale
            dq = dq + jnp.einsum("bqk,bkd->bqd", ds, k)
            dk = dk + jnp.einsum("bqk,bqd->bkd", ds, q)
            dv = dv + jnp.einsum("bqk,bqd->bkd", p, do)
            return (dq,) + tuple(lax.ppermute(t, "cp", ring(cp)) for t in (k, v, dk, dv)), None

        zeros = (jnp.zeros_like(q), k, v, jnp.zeros_like(k), jnp.zeros_like(v))
        (dq, _, _, dk, dv), _ = lax.scan(step, zeros, jnp.arange(cp), unroll=2)
        return dq, dk, dv

    return with_backward(forward, backward)


def bf16_state(cp: int, init: str = "q"):
    """Causal ring attention over bfloat16 q, k, v, the merge done in float32 and the state stored back in
    bfloat16 every step (`.astype(q.dtype)`), as mixed-precision kernels do."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(i, carry):
            (m0, l0, o0), k, v = carry
            k_pos = _positions((me - i) % cp, n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k).astype(jnp.float32), NEG)
            m = jnp.maximum(m0.astype(jnp.float32), s.max(-1))
            p = jnp.exp(s - m[..., None])
            corr = jnp.exp(m0.astype(jnp.float32) - m)
            l = l0.astype(jnp.float32) * corr + p.sum(-1)
            o = o0.astype(jnp.float32) * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p.astype(q.dtype), v)
            state = (m.astype(q.dtype), l.astype(q.dtype), o.astype(q.dtype))
            return state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        state = tuple(x.astype(q.dtype) for x in _state(q, init))
        (_, l, o), _, _ = lax.fori_loop(0, cp, step, (state, k, v))
        return (o.astype(jnp.float32) / l.astype(jnp.float32)[..., None]).astype(q.dtype)
    return body


def both_axes_ring(axes: tuple[str, ...], sizes: tuple[int, ...]):
    """Causal ring attention over the sequence split on two mesh axes ("dp", "cp" of sizes `sizes`): with
    axes = ("dp", "cp") one ring of all the devices (`ppermute` and `axis_index` over both axes); with ("cp",) a
    ring along "cp" within each "dp" group, the group's place in the sequence from `axis_index("dp")`."""
    cp = sizes[1] if axes == ("cp",) else sizes[0] * sizes[1]

    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index(axes)
        base = lax.axis_index("dp") * cp if axes == ("cp",) else 0
        q_pos = _positions(base + me, n)

        def step(i, carry):
            state, k, v = carry
            keep = q_pos[:, None] >= _positions(base + (me - i) % cp, n)[None, :]
            state = merge_online(state, jnp.where(keep, scores(q, k), NEG), v, i)
            return state, lax.ppermute(k, axes, ring(cp)), lax.ppermute(v, axes, ring(cp))

        state, _, _ = lax.fori_loop(0, cp, step, (_state(q, "full"), k, v))
        return _finish(state)
    return body


# ---------------------------------------------------------------------------------------------------------------
# Look alike, but depend on where tokens sit: must be refused.


def int_truncated_sum(cp: int):
    """The softmax denominator truncated to an integer every step: each rescaled partial is floored, and which
    partials there are changes with the tokens a block holds."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(i, carry):
            (m0, l0, o0), k, v = carry
            k_pos = _positions((me - i) % cp, n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            m, l, o = merge_online((m0, l0, o0), s, v, i)
            l = l.astype(jnp.int32).astype(jnp.float32)  # refused here
            return (m, l, o), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        state, _, _ = lax.fori_loop(0, cp, step, (_state(q, "full"), k, v))
        return _finish(state)
    return body


def converted_decay(cp: int):
    """A running average that halves earlier blocks' weight, stored in bfloat16 between steps: the converts don't
    make the decay order-free."""
    def body(q, k, v):
        def step(i, carry):
            out, k, v = carry
            blk = jnp.exp(scores(q, k) - 4.0) @ v
            out = (0.5 * out.astype(jnp.float32) + blk).astype(jnp.bfloat16)  # refused here
            return out, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        out, _, _ = lax.fori_loop(0, cp, step, (jnp.zeros(q.shape, jnp.bfloat16), k, v))
        return out.astype(jnp.float32)
    return body


def carried_source_wrong_modulus(cp: int):
    """The carried source stepped modulo cp - 1: it stops naming the block held after the first wrap."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(carry, _):
            state, k, v, src = carry
            s = jnp.where(q_pos[:, None] >= _positions(src, n)[None, :], scores(q, k), NEG)
            state = merge_online(state, s, v, 0)
            src = (src - 1) % (cp - 1)
            return (state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp)), src), None

        (state, _, _, _), _ = lax.scan(step, (_state(q, "full"), k, v, me), None, length=cp)  # refused here
        return _finish(state)
    return body


def carried_source_wrong_way(cp: int):
    """The carried source stepped up while the blocks travel up too: it names the block two steps off."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(carry, _):
            state, k, v, src = carry
            keep = q_pos[:, None] >= _positions(src, n)[None, :]
            state = merge_online(state, jnp.where(keep, scores(q, k), NEG), v, 0)  # refused here
            src = (src + 1) % cp
            return (state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp)), src), None

        (state, _, _, _), _ = lax.scan(step, (_state(q, "full"), k, v, me), None, length=cp)
        return _finish(state)
    return body


def carried_source_two_behind(cp: int, positions=_positions):
    """The carried source stepped two ring steps (`(kv_source + cp - 2) % cp`) while the blocks travel one: from
    the second step on it names a block other than the one held."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = positions(me, n)

        def step(carry, _):
            state, k, v, src = carry
            keep = q_pos[:, None] >= positions(src, n)[None, :]  # refused here
            state = merge_online(state, jnp.where(keep, scores(q, k), NEG), v, 0)  # refused here
            src = (src + cp - 2) % cp
            return (state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp)), src), None

        (state, _, _, _), _ = lax.scan(step, (_state(q, "full"), k, v, me), None, length=cp)
        return _finish(state)
    return body


def unrolled_scan_double_step(cp: int, positions=_positions):
    """Unrolled by two, but the scanned step indices count in twos (`2 * arange(cp)`) while the blocks travel one
    ring step a step: every other block is masked with another block's positions."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = positions(me, n)

        def step(carry, i):
            state, k, v = carry
            keep = q_pos[:, None] >= positions((me - i) % cp, n)[None, :]  # refused here
            state = merge_online(state, jnp.where(keep, scores(q, k), NEG), v, i)  # refused here
            return (state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))), None

        (state, _, _), _ = lax.scan(step, (_state(q, "full"), k, v), 2 * jnp.arange(cp), unroll=2)
        return _finish(state)
    return body


def unrolled_scan_late_reset(cp: int, positions=_positions):
    """Unrolled by three as `unrolled_scan(cp, 3, merge=merge_reset)`, but the state starts afresh at ring step 1
    rather than 0: the device's own block, folded in at step 0, is dropped, and which tokens that drops depends on
    where they sit."""
    def body(q, k, v):
        _, l, o = unrolled_scan(cp, 3, positions, functools.partial(merge_reset, first=1))(q, k, v, finish=False)
        return o / per_row(l, o)  # refused here
    return body


def two_steps_an_iteration_same_source(cp: int, positions=_positions):
    """Unrolled by two by hand, but the second ring step of an iteration masks its block with the first one's
    source (`(me - 2 * t) % cp` twice): the second block is masked with another block's positions."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = positions(me, n)

        def one(state, k, v, src):  # merge_online written out, so that the merge a refusal names is here
            (m0, l0, o0), s = state, jnp.where(q_pos[:, None] >= positions(src, n)[None, :], scores(q, k), NEG)
            m = jnp.maximum(m0, s.max(-1))  # refused here
            p, corr = jnp.exp(s - m[..., None]), jnp.exp(m0 - m)
            state = m, l0 * corr + p.sum(-1), o0 * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v)
            return state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        def step(t, carry):
            carry = one(*carry, (me - 2 * t) % cp)
            return one(*carry, (me - 2 * t) % cp)

        state, _, _ = lax.fori_loop(0, cp // 2, step, (_state(q, "full"), k, v))
        return _finish(state)
    return body


def carried_source_skip(cp: int):
    """A block skipped when its carried source coordinate comes after this device's (flash_attn_jax's switch on
    the travelling `k_ix`): right only when blocks are contiguous."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(carry, _):
            state, k, v, src = carry
            keep = q_pos[:, None] >= _positions(src, n)[None, :]
            run = lambda st: merge_online(st, jnp.where(keep, scores(q, k), NEG), v, 0)  # noqa: E731
            state = lax.cond(src <= me, run, lambda st: st, state)  # refused here
            src = lax.ppermute(src, "cp", ring(cp))
            return (state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp)), src), None

        (state, _, _, _), _ = lax.scan(step, (_state(q, "full"), k, v, me), None, length=cp)
        return _finish(state)
    return body


def window_from_block_start(cp: int, window: int = 20):
    """A window measured from the visiting block's first position rather than each key's own: the block start is
    a place in the layout, which the reorder moves."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(i, carry):
            state, k, v = carry
            k_start = ((me - i) % cp) * n
            k_pos = k_start + jnp.arange(n)
            keep = (q_pos[:, None] >= k_pos[None, :]) & (q_pos[:, None] - window <= k_start)  # refused here
            state = merge_online(state, jnp.where(keep, scores(q, k), NEG), v, i)  # refused here
            return state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        state, _, _ = lax.fori_loop(0, cp, step, (_state(q, "full"), k, v))
        return _finish(state)
    return body


def window_by_local_index(cp: int, window: int = 6):
    """A window between q's local index and the key's global position (a bug: q's offset is left out)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(i, carry):
            state, k, v = carry
            k_pos = _positions((me - i) % cp, n)
            near = jnp.arange(n)[:, None] - window <= k_pos[None, :]  # refused here
            keep = (q_pos[:, None] >= k_pos[None, :]) & near  # refused here
            state = merge_online(state, jnp.where(keep, scores(q, k), NEG), v, i)  # refused here
            return state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        state, _, _ = lax.fori_loop(0, cp, step, (_state(q, "full"), k, v))
        return _finish(state)
    return body


def hop_temperature(cp: int):
    """Scores scaled by a temperature that grows with the ring step, in a lax.scan over the steps: which keys meet
    which temperature changes with the layout."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)

        def step(carry, i):
            state, k, v = carry
            keep = q_pos[:, None] >= _positions((me - i) % cp, n)[None, :]
            state = merge_online(state, jnp.where(keep, scores(q, k) * (1.0 + 0.1 * i), NEG), v, i)  # refused here
            return (state, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))), None

        (state, _, _), _ = lax.scan(step, (_state(q, "full"), k, v), jnp.arange(cp))
        return _finish(state)
    return body


def bidirectional(cp: int, forget_opposite: bool = False):
    """Causal ring attention with k, v sent both ways (as the shard_map tutorial's bidirectional collective matmul
    sends its blocks): the own block, then cp/2 - 1 steps that each merge the block from the device i up the ring
    and the one i down it, then the opposite block (cp/2 away) after the loop. `forget_opposite`: the opposite
    block is never merged (its tokens are left out)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = _positions(me, n)
        half = cp // 2

        def merge(state, k, v, source):
            keep = q_pos[:, None] >= _positions(source % cp, n)[None, :]
            return merge_online(state, jnp.where(keep, scores(q, k), NEG), v, 0)

        def step(i, carry):
            state, k_up, v_up, k_down, v_down = carry
            state = merge(merge(state, k_up, v_up, me - i), k_down, v_down, me + i)
            up, down = ring(cp), ring(cp, -1)
            return (state, lax.ppermute(k_up, "cp", up), lax.ppermute(v_up, "cp", up),
                    lax.ppermute(k_down, "cp", down), lax.ppermute(v_down, "cp", down))

        up, down = ring(cp), ring(cp, -1)
        carry = (merge(_state(q, "q"), k, v, me), lax.ppermute(k, "cp", up), lax.ppermute(v, "cp", up),
                 lax.ppermute(k, "cp", down), lax.ppermute(v, "cp", down))
        state, k_up, v_up, _, _ = lax.fori_loop(1, half, step, carry)
        if not forget_opposite:
            state = merge(state, k_up, v_up, me - half)
        _, l, o = state
        return o / per_row(l, o)  # refused here
    return body


def bidirectional_forgets_opposite(cp: int):
    return bidirectional(cp, forget_opposite=True)


ACCEPTED = {"full-init": full_init, "full-init-window20": lambda cp: full_init(cp, window=20),
            "full-init-every5": lambda cp: full_init(cp, every=5),
            "carried-source": carried_source, "ppermuted-source": lambda cp: carried_source(cp, "ppermuted"),
            "carried-source-window20": lambda cp: carried_source(cp, window=20),
            "carried-source-plus-cp": lambda cp: carried_source(cp, "plus-cp"),
            "carried-source-plus-dp": lambda cp: carried_source(cp, "plus-dp"),
            "carried-source-mod-2cp": lambda cp: carried_source(cp, "mod-2cp"),
            "scan-unroll2": unrolled_scan, "scan-unroll3": lambda cp: unrolled_scan(cp, 3),
            "scan-unroll3-reset": lambda cp: unrolled_scan(cp, 3, merge=merge_reset),
            "two-steps-an-iteration": two_steps_an_iteration,
            "vjp-scan-unroll2": vjp_unrolled}
REFUSALS = (int_truncated_sum, converted_decay, carried_source_wrong_modulus, carried_source_wrong_way,
            carried_source_skip, window_from_block_start, window_by_local_index, carried_source_two_behind,
            unrolled_scan_double_step, unrolled_scan_late_reset, two_steps_an_iteration_same_source,
            hop_temperature)
# Each accepted spelling beside its look-alike, as (accepted, refused) bodies taking the layout's positions: the
# look-alike's result changes when its tokens are reordered and its positions rewritten as the pass would.
TWINS = {"carried-source-plus-cp": (lambda cp, positions=_positions: carried_source(cp, "plus-cp",
                                                                                  positions=positions),
                                    carried_source_two_behind),
         "scan-unroll2": (unrolled_scan, unrolled_scan_double_step),
         "scan-unroll3-reset": (lambda cp, positions=_positions: unrolled_scan(cp, 3, positions, merge_reset),
                                unrolled_scan_late_reset),
         "two-steps-an-iteration": (two_steps_an_iteration, two_steps_an_iteration_same_source)}
