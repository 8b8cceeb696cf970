"""Audit of loops that run once (read as straight-line code) and of the per-op table, against jax.jit (8 CPU
devices, dp=2 x cp=4, one-block-a-step causal rings with positions from axis_index).

- A while loop's trip count is read from its condition `i < n` and the body's `i + s`. Where `n` (or `s`) is a
  loop-carried value that the body changes, the loop runs another number of trips than `(n0 - i0) / s0`: read
  as one trip (straight-line code) or as two, the trips it runs besides are never looked at, and a mask they
  compute with another block's positions is rewritten as if they never ran. Forced zigzag, under the defaults
  (a blockwise kernel with chunk skips, so the defaults pick zigzag), and in a custom_vjp backward under
  jax.grad. Likewise unsigned integers read as exact ones: a counter started at uint32 0 - 1 is read as -1, so a
  loop whose unsigned `i < 0` never holds is read as one trip; `uint32(i) - 2 < 100` is decided at compile time
  as always true, where it fails at steps 0 and 1; a counter started at int8(300) (44) is read as 300, so a loop
  that runs once is read as never running.
- Loops of one trip in the spellings that hold: fori_loop(3, 4), lax.while_loop with a counter stepping past its
  bound, lax.scan of length 1 stacking its output, scan(reverse=True, unroll=3) with a step-0 reset, a one-trip
  loop inside the ring loop and the ring loop inside a one-trip loop; and the look-alikes that must stay refused
  (a reset that reads the inner one-trip counter, so it resets at every ring step; a reset at the trip's second
  step; k sent twice inside the trip).
- Positions narrowed to int8 (S = 256): an integer convert is read as the identity in position arithmetic, and the
  rewrite decodes the wrapped number (striped: wrong result; zigzag: OverflowError at compile time); and
  hoist-permutations computes an int8 iota between two ring layers permuted in int8 (the same two outcomes).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from shardfix import autofix_shardings
from support import ring_user_kernels as ruk
from test_ring_audit5 import MESH, SPEC, _max_error, _placed

CP, B, S, D = 4, 2, 32, 8


def _assert_keeps_results(f, args, strategy: str = "auto", tolerance: float = 1e-5) -> None:
    """`f` through @autofix_shardings (ring_reorder=`strategy`) computes what jax.jit computes, to `tolerance`."""
    fixed = autofix_shardings(f, on_fix="ignore", ring_reorder=strategy)
    decisions = fixed.lower(*args).rings
    error = _max_error(fixed(*args), jax.jit(f)(*args))
    assert error <= tolerance, (error, [(r.strategy, r.applied, r.why) for r in decisions])


def _ring(body):
    return jax.shard_map(body, mesh=MESH, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)


def _pos(c, n):
    return c * n + jnp.arange(n)


def _init(q):
    m, l = ruk.row_stats(q, ruk.NEG)
    return m, l, jnp.zeros_like(q)


def _finish(state):
    m, l, o = state
    return o / l[..., None]


def _step(q, me, i, state, k, v, merge=ruk.merge_online, source=None):
    """Ring step i: merge the block held (coordinate `source`, (me - i) % cp unless given), pass k, v on."""
    n = q.shape[1]
    c = (me - i) % CP if source is None else source
    keep = _pos(me, n)[:, None] >= _pos(c, n)[None, :]
    state = merge(state, jnp.where(keep, ruk.scores(q, k), ruk.NEG), v, i)
    return (state,) + tuple(lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v))


def _steps(q, me, carry, steps, merge=ruk.merge_online):
    for t in steps:
        carry = _step(q, me, t, *carry, merge=merge)
    return carry


def _reset_at(t):
    return lambda acc, s, v, _: ruk.merge_reset(acc, s, v, t)


# ---------------------------------------------------------------------------------------------------------------
# The bound of `i < n` carried and changed by the body.


def _bound_rewritten(q, k, v):
    """`while i < n` with n carried, 1 at the start and set to 2 by the body: two trips, each a whole ring; the
    second (i = 1) masks each block with the positions of the block three hops away."""
    me = lax.axis_index("cp")

    def body(c):
        i, _, state, k, v = c
        for j in range(CP):
            state, k, v = _step(q, me, j, state, k, v, source=(me - j - 3 * i) % CP)
        return i + 1, jnp.int32(2), state, k, v

    return _finish(lax.while_loop(lambda c: c[0] < c[1], body, (0, 1, _init(q), k, v))[2])


def _bound_stepping(q, k, v):
    """`while i < n`, i advancing by 2 and n by 1 a trip, from (0, 4): four trips of two ring steps where the
    counter says two; steps 4..7 mask with the source one hop off (`where(t >= cp, 1, 0)`)."""
    me = lax.axis_index("cp")

    def body(c):
        i, n, state, k, v = c
        for j in range(2):
            t = i + j
            state, k, v = _step(q, me, t, state, k, v, source=(me - t + jnp.where(t >= CP, 1, 0)) % CP)
        return i + 2, n + 1, state, k, v

    return _finish(lax.while_loop(lambda c: c[0] < c[1], body, (0, 4, _init(q), k, v))[2])


def _step_carried(q, k, v):
    """`while i < 4: i += s; s += 1` from (0, 1): i = 0, 1, 3, then 6: three trips of one ring step (the fourth
    block never arrives) where the step's starting value (1) says four."""
    me = lax.axis_index("cp")

    def body(c):
        i, s, t, *carry = c
        return (i + s, s + 1, t + 1) + _step(q, me, t, *carry)

    return _finish(lax.while_loop(lambda c: c[0] < CP, body, (0, 1, 0, _init(q), k, v))[3])


@pytest.mark.parametrize("body", [_bound_rewritten, _bound_stepping, _step_carried],
                         ids=["set-to-2", "advancing", "step-carried"])
def test_loop_whose_bound_or_step_the_body_changes_keeps_results(body):
    f = _ring(body)
    q, k, v = _placed(*[(B, S, D)] * 3)
    _assert_keeps_results(f, (q, k, v), strategy="zigzag")


def _blockwise_bound_rewritten(q, k, v, chunk=2):
    """Liu et al.'s blockwise shape (chunk pairs skipped by lax.cond on their first positions) wrapped in `while t < n`
    with n carried, set from 1 to 2 by the body: the second trip's chunk positions are three hops off. The skip
    makes the defaults pick zigzag."""
    n, me = q.shape[1], lax.axis_index("cp")
    per = n // chunk

    def chunks(x):
        return jnp.moveaxis(x.reshape((x.shape[0], per, chunk) + x.shape[2:]), 1, 0)

    def unchunk(x):
        return jnp.moveaxis(x, 0, 1).reshape((x.shape[1], n) + x.shape[3:])

    def ring_step(i, carry, trip):
        acc, k, v = carry
        k_first = ((me - i - 3 * trip) % CP) * per

        def q_step(_, xs):
            qi, acc_i, a = xs

            def kv_step(acc_i, ys):
                kj, vj, b = ys
                qf, kf = (me * per + a) * chunk, (k_first + b) * chunk
                keep = (qf + jnp.arange(chunk))[:, None] >= (kf + jnp.arange(chunk))[None, :]
                run = lambda x: ruk.merge_online(x, jnp.where(keep, ruk.scores(qi, kj), ruk.NEG), vj, i)
                return lax.cond(qf + chunk - 1 >= kf, run, lambda x: x, acc_i), None

            return None, lax.scan(kv_step, acc_i, (chunks(k), chunks(v), jnp.arange(per)))[0]

        _, acc = lax.scan(q_step, None, (chunks(q), tuple(chunks(a) for a in acc), jnp.arange(per)))
        return (tuple(unchunk(a) for a in acc),) + tuple(lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v))

    def trip(c):
        t, _, *carry = c
        return (t + 1, jnp.int32(2)) + lax.fori_loop(0, CP, lambda i, x: ring_step(i, x, t), tuple(carry))

    return _finish(lax.while_loop(lambda c: c[0] < c[1], trip, (0, 1, _init(q), k, v))[2])


def test_blockwise_loop_whose_bound_the_body_changes_keeps_results_under_defaults():
    f = _ring(_blockwise_bound_rewritten)
    q, k, v = _placed(*[(B, S, D)] * 3)
    _assert_keeps_results(f, (q, k, v))


def _vjp_backward_bound_rewritten():
    """A custom_vjp ring: forward one fori_loop(0, 1) trip of four ring steps; backward `while i < n` with n carried
    (1, set to 2 by the body), each trip a whole ring, the second masking with blocks three hops off."""
    def masked(q, k, me, c):
        n = q.shape[1]
        return jnp.where(_pos(me, n)[:, None] >= _pos(c, n)[None, :], ruk.scores(q, k), ruk.NEG)

    def forward(q, k, v):
        me = lax.axis_index("cp")

        def step(t, carry):
            acc, k, v = carry
            acc = ruk.merge_online(acc, masked(q, k, me, (me - t) % CP), v, t)
            return (acc,) + tuple(lax.ppermute(x, "cp", ruk.ring(CP)) for x in (k, v))

        def trip(i, carry):
            for t in range(CP):
                carry = step(i + t, carry)
            return carry

        m, l, o = lax.fori_loop(0, 1, trip, (_init(q), k, v))[0]
        out = o / l[..., None]
        return out, (q, k, v, out, m + jnp.log(l))

    def backward(res, do):
        q, k, v, out, lse = res
        me = lax.axis_index("cp")
        delta = jnp.sum(do * out, axis=-1)

        def step(t, carry, off):
            dq, k, v, dk, dv = carry
            p = jnp.exp(masked(q, k, me, (me - t + off) % CP) - lse[..., None])
            ds = p * (jnp.einsum("bqd,bkd->bqk", do, v) - delta[..., None]) / jnp.sqrt(jnp.float32(D))
            dq = dq + jnp.einsum("bqk,bkd->bqd", ds, k)
            dk = dk + jnp.einsum("bqk,bqd->bkd", ds, q)
            dv = dv + jnp.einsum("bqk,bqd->bkd", p, do)
            return (dq,) + tuple(lax.ppermute(x, "cp", ruk.ring(CP)) for x in (k, v, dk, dv))

        def trip(c):
            i, _, *carry = c
            carry = tuple(carry)
            for t in range(CP):
                carry = step(t, carry, 3 * i)
            return (i + 1, jnp.int32(2)) + carry

        zeros = (jnp.zeros_like(q), k, v, jnp.zeros_like(k), jnp.zeros_like(v))
        _, _, dq, _, _, dk, dv = lax.while_loop(lambda c: c[0] < c[1], trip, (0, 1) + zeros)
        return dq, dk, dv

    return ruk.with_backward(forward, backward)


def test_custom_vjp_backward_loop_whose_bound_the_body_changes_keeps_gradients():
    f = _ring(_vjp_backward_bound_rewritten())
    q, k, v, w = _placed(*[(B, S, D)] * 4)
    grad = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * w), argnums=(0, 1, 2))
    _assert_keeps_results(grad, (q, k, v), strategy="zigzag", tolerance=1e-4)


def _unsigned_counter_below_zero(q, k, v):
    """i = uint32(0) - uint32(1) (4294967295); `while i < 0` (an unsigned compare): the loop of three ring steps
    never runs, and the step after it masks the device's own block with the positions of block me - 3. Read as
    exact integers, i starts at -1 and the loop runs once."""
    me = lax.axis_index("cp")

    def body(c):
        i, *carry = c
        return (i + jnp.uint32(1),) + _steps(q, me, tuple(carry), range(CP - 1))

    start = jnp.uint32(0) - jnp.uint32(1)
    _, *carry = lax.while_loop(lambda c: c[0] < jnp.uint32(0), body, (start, _init(q), k, v))
    return _finish(_step(q, me, CP - 1, *carry)[0])


def test_unsigned_loop_counter_keeps_results():
    f = _ring(_unsigned_counter_below_zero)
    q, k, v = _placed(*[(B, S, D)] * 3)
    _assert_keeps_results(f, (q, k, v), strategy="zigzag")


def _narrowed_counter_start(q, k, v):
    """i0 = int8(me * 0 + 300), 44 once it wraps; `while i < 45`: one trip moving k and v one hop, then a whole
    ring that masks as if they were at home. Read as exact integers, i0 = 300 and the loop never runs."""
    me = lax.axis_index("cp")

    def body(c):
        i, k, v = c
        return (i + jnp.int8(1),) + tuple(lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v))

    start = (me * 0 + 300).astype(jnp.int8)
    _, k, v = lax.while_loop(lambda c: c[0] < jnp.int8(45), body, (start, k, v))
    return _finish(_steps(q, me, (_init(q), k, v), range(CP))[0])


def test_loop_counter_started_in_a_narrow_type_keeps_results():
    f = _ring(_narrowed_counter_start)
    q, k, v = _placed(*[(B, S, D)] * 3)
    _assert_keeps_results(f, (q, k, v), strategy="zigzag")


def _unsigned_reset(q, k, v):
    """A fori_loop ring whose merge starts afresh (all of m, l, o) where `uint32(i) - 2 < 100` fails: in uint32 at
    steps 0 and 1 (i - 2 wraps), so the own block and the next are dropped. Read as exact integers, i - 2 < 100
    always holds and the select is decided at compile time as the plain merge."""
    me = lax.axis_index("cp")

    def merge(acc, s, v, i):
        keep = (i.astype(jnp.uint32) - jnp.uint32(2)) < jnp.uint32(100)
        merged = ruk.merge_online(acc, s, v, i)
        m = jnp.max(s, axis=-1)
        p = jnp.exp(s - m[..., None])
        fresh = (m, jnp.sum(p, axis=-1), ruk.apply(p, v))
        return tuple(jnp.where(keep, a, b) for a, b in zip(merged, fresh))

    return _finish(lax.fori_loop(0, CP, lambda i, c: _step(q, me, i, *c, merge=merge), (_init(q), k, v))[0])


def test_select_on_an_unsigned_difference_keeps_results():
    f = _ring(_unsigned_reset)
    q, k, v = _placed(*[(B, S, D)] * 3)
    _assert_keeps_results(f, (q, k, v), strategy="zigzag")


# ---------------------------------------------------------------------------------------------------------------
# One trip, in the spellings that hold.


def _fori_from_3(q, k, v):
    """fori_loop(3, 4): the counter starts at 3; the trip's first step resets the state where `i - 3 == 0`."""
    me = lax.axis_index("cp")

    def body(i, carry):
        carry = _step(q, me, 0, *carry, merge=_reset_at(i - 3))
        return _steps(q, me, carry, range(1, CP))

    return _finish(lax.fori_loop(3, 4, body, (_init(q), k, v))[0])


def _while_past_bound(q, k, v):
    """i = 0; while i < 3: (a whole ring); i += 5."""
    me = lax.axis_index("cp")

    def body(c):
        i, *carry = c
        return (i + 5,) + _steps(q, me, tuple(carry), [i + t for t in range(CP)])

    return _finish(lax.while_loop(lambda c: c[0] < 3, body, (0, _init(q), k, v))[1])


def _scan_of_one_stacked(q, k, v):
    me = lax.axis_index("cp")

    def body(carry, i):
        carry = _steps(q, me, carry, [i + t for t in range(CP)])
        return carry, _finish(carry[0])

    return lax.scan(body, (_init(q), k, v), jnp.arange(1))[1][0]


def _reversed_scan_unrolled_reset(q, k, v):
    """lax.scan(reverse=True, unroll=3) over 4 steps: the leftover step first, then one trip of three; the step is
    3 - x and the reset is at step 0."""
    me = lax.axis_index("cp")

    def body(carry, x):
        t = CP - 1 - x
        return _step(q, me, t, *carry, merge=ruk.merge_reset), None

    return _finish(lax.scan(body, (_init(q), k, v), jnp.arange(CP), unroll=CP - 1, reverse=True)[0][0])


def _one_trip_inside_ring_loop(q, k, v):
    """The ring's fori_loop; each step a fori_loop(0, 1), the reset reading the outer step."""
    me = lax.axis_index("cp")

    def step(t, carry):
        return lax.fori_loop(0, 1, lambda j, c: _step(q, me, t + j, *c, merge=_reset_at(t + j)), carry)

    return _finish(lax.fori_loop(0, CP, step, (_init(q), k, v))[0])


def _ring_loop_inside_one_trip(q, k, v):
    me = lax.axis_index("cp")

    def trip(j, carry):
        return lax.fori_loop(0, CP, lambda t, c: _step(q, me, t + j, *c), carry)

    return _finish(lax.fori_loop(0, 1, trip, (_init(q), k, v))[0])


HELD = {"fori-3-4-reset": _fori_from_3, "while-past-bound": _while_past_bound, "scan-of-one-stacked":
        _scan_of_one_stacked, "reversed-scan-unroll3-reset": _reversed_scan_unrolled_reset,
        "one-trip-inside-ring-loop": _one_trip_inside_ring_loop, "ring-loop-inside-one-trip":
        _ring_loop_inside_one_trip}


@pytest.mark.parametrize("name", sorted(HELD))
def test_one_trip_loop_is_rewritten_and_keeps_results(name):
    f = _ring(HELD[name])
    q, k, v = _placed(*[(B, S, D)] * 3)
    fixed = autofix_shardings(f, on_fix="ignore", ring_reorder="zigzag")
    decisions = fixed.lower(q, k, v).rings
    assert [(r.strategy, r.applied) for r in decisions] == [("zigzag", True)], [r.why for r in decisions]
    error = _max_error(fixed(q, k, v), jax.jit(f)(q, k, v))
    assert error <= 1e-5, error


# ---------------------------------------------------------------------------------------------------------------
# One trip, look-alikes that compute something else once reordered.


def _reset_by_inner_counter(q, k, v):
    """The reset reads the one-trip loop's own counter, 0 at every ring step: each step starts afresh."""
    me = lax.axis_index("cp")

    def step(t, carry):
        return lax.fori_loop(0, 1, lambda j, c: _step(q, me, t, *c, merge=_reset_at(j)), carry)

    return _finish(lax.fori_loop(0, CP, step, (_init(q), k, v))[0])


def _reset_at_second_step(q, k, v):
    me = lax.axis_index("cp")

    def body(i, carry):
        carry = _step(q, me, 0, *carry)
        carry = _step(q, me, 1, *carry, merge=_reset_at(i))
        return _steps(q, me, carry, range(2, CP))

    return _finish(lax.fori_loop(0, 1, body, (_init(q), k, v))[0])


def _k_sent_twice(q, k, v):
    me = lax.axis_index("cp")

    def body(i, carry):
        state, k, v = _steps(q, me, carry, range(2))
        return _steps(q, me, (state, lax.ppermute(k, "cp", ruk.ring(CP)), v), range(2, CP))

    return _finish(lax.fori_loop(0, 1, body, (_init(q), k, v))[0])


REFUSED = {"reset-by-inner-counter": (_reset_by_inner_counter, "replaces a running sum or max the loop carries"),
           "reset-at-second-step": (_reset_at_second_step, "has not folded in every block"),
           "k-sent-twice": (_k_sent_twice, "combines data of different tokens")}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_one_trip_look_alike_is_left_as_written(name):
    body, reason = REFUSED[name]
    f = _ring(body)
    q, k, v = _placed(*[(B, S, D)] * 3)
    fixed = autofix_shardings(f, on_fix="ignore", ring_reorder="zigzag")
    decisions = fixed.lower(q, k, v).rings
    assert [r.applied for r in decisions] == [False] and reason in decisions[0].why, [r.why for r in decisions]
    np.testing.assert_array_equal(np.asarray(fixed(q, k, v)), np.asarray(jax.jit(f)(q, k, v)))


# ---------------------------------------------------------------------------------------------------------------
# The op table: an integer convert is folded as the identity in position arithmetic, narrowing ones included.


def _int8_positions(q, k, v):
    """Positions `(c * n + arange(n)).astype(int8)` at S = 256: tokens 128.. wrap to negative numbers, and the
    mask compares the wrapped numbers (a function of each token's position, the same in every layout)."""
    n, me = q.shape[1], lax.axis_index("cp")

    def pos8(c):
        return (c * n + jnp.arange(n)).astype(jnp.int8)

    def step(i, carry):
        state, k, v = carry
        keep = pos8(me)[:, None] >= pos8((me - i) % CP)[None, :]
        state = ruk.merge_online(state, jnp.where(keep, ruk.scores(q, k), ruk.NEG), v, i)
        return (state,) + tuple(lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v))

    return _finish(lax.fori_loop(0, CP, step, (_init(q), k, v))[0])


@pytest.mark.parametrize("strategy", ["striped", "zigzag"])
def test_positions_narrowed_to_int8_keep_results(strategy):
    """The rewrite decodes coordinate and index from the wrapped int8 number (divide / remainder by n in int8):
    striped is off by 2.6; zigzag raises OverflowError building the constant 224 in int8."""
    f = _ring(_int8_positions)
    q, k, v = _placed(*[(B, 256, D)] * 3)
    _assert_keeps_results(f, (q, k, v), strategy=strategy)


@pytest.mark.parametrize("length", [128, 256])
def test_positions_in_int8_are_rewritten_where_they_are_exact(length):
    """Positions that int8 holds (S = 128: 0..127) are rewritten in int8; at S = 256 the convert to int8 is data
    on the int32 positions, which are rewritten before it: both proved, both equal to jax.jit."""
    f = _ring(_int8_positions)
    q, k, v = _placed(*[(B, length, D)] * 3)
    fixed = autofix_shardings(f, on_fix="ignore", ring_reorder="zigzag")
    decisions = [(r.strategy, r.applied) for r in fixed.lower(q, k, v).rings]
    assert decisions == [("zigzag", True)]
    assert _max_error(fixed(q, k, v), jax.jit(f)(q, k, v)) <= 1e-5


@pytest.mark.parametrize("strategy", ["striped", "zigzag"])
def test_int8_iota_between_ring_layers_keeps_results(strategy):
    """hoist-permutations computes an integer iota along the sequence in permuted order in the iota's own type:
    lax.iota(int8, 256) wraps, and its permuted copy is built from int8 arithmetic on the wrapped numbers (striped
    off by 0.45; zigzag raises OverflowError for the constant 224)."""
    layer = _ring(ruk.one_block_ring(CP, ruk.causal))

    def model(q, k, v):
        h = layer(q, k, v)
        every7 = (lax.iota(jnp.int8, h.shape[1]) % 7 == 0)[None, :, None]
        return layer(jnp.where(every7, h, 2 * h) + q, k, v)

    q, k, v = _placed(*[(B, 256, D)] * 3)
    _assert_keeps_results(model, (q, k, v), strategy=strategy)
