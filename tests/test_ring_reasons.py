"""A ring left alone because of an integer type says so, at the user's line, in the user's terms.

Causal ring attention under jax.shard_map on jax.make_mesh((2, 4), ("dp", "cp")), written as users write it, with
one integer in a type the analysis can't read as exact numbers:
- a loop counted with an unsigned counter (`lax.fori_loop` over uint32 bounds, a `lax.while_loop` carrying a uint8
  counter), or with an int8 one that wraps before its bound: refused at the loop, saying so and to count with
  int32 (not "combines tokens with the token at one fixed place of a block", nor "a loop whose trip count is
  unknown");
- a chunk skip whose predicate compares positions converted to int8 / uint8 beyond what the type holds: refused at
  the convert, naming the type and the values it must hold (not "skips blocks by a predicate of token data");
- a second loop-carried integer (a block offset) kept in int8 that overflows: refused at its update, likewise (not
  "changes a loop-carried integer other than by a constant step");
- a merge reset decided by a uint32 difference that wraps below zero: refused at the difference (not "selects
  between partial results").
Each is only lowered: the decision, the op, the line and the text are what is checked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from shardfix import autofix_shardings
from support import ring_user_kernels as ruk

CP, B, D = 4, 2, 8
MESH = jax.make_mesh((2, CP), ("dp", "cp"))
SPEC = jax.sharding.PartitionSpec("dp", "cp", None)
INT32 = "count with a signed int32 counter (int32 bounds for lax.fori_loop, an int32 carry for lax.while_loop)"


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}"))


def _why(body, length: int = 32) -> str:
    """The one ring decision's reason, asserting it is a refusal."""
    fn = jax.shard_map(body, mesh=MESH, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
    x = jax.device_put(np.ones((B, length, D), np.float32), jax.NamedSharding(MESH, SPEC))
    (ring,) = autofix_shardings(fn, on_fix="ignore").lower(x, x, x).rings
    assert not ring.applied, ring.why
    return ring.why


def _refusal(op: str, marker: str, reason: str) -> str:
    return f"not provably safe: '{op}' at {__file__}:{_line(marker)} {reason}"


def _step(q, me, i, carry):
    """Ring step i of a causal one-block-a-step ring: merge the block held (coordinate (me - i) % cp), pass k, v."""
    state, k, v = carry
    n = q.shape[1]
    q_pos = me * n + jnp.arange(n)
    k_pos = ((me - i) % CP) * n + jnp.arange(n)
    s = jnp.where(q_pos[:, None] >= k_pos[None, :], ruk.scores(q, k), ruk.NEG)
    return (ruk.merge_online(state, s, v, i),) + tuple(lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v))


def _uint32_fori(q, k, v):
    me = lax.axis_index("cp")
    step = lambda i, c: _step(q, me, i.astype(jnp.int32), c)
    carry = lax.fori_loop(jnp.uint32(0), jnp.uint32(CP), step, (ruk.init_state(q, "online"), k, v))  # uint32 fori
    return ruk.finish(carry[0], "online")


def _uint8_while(q, k, v):
    me = lax.axis_index("cp")

    def body(c):
        i, carry = c
        return i + jnp.uint8(1), _step(q, me, i.astype(jnp.int32), carry)

    start = (jnp.uint8(0), (ruk.init_state(q, "online"), k, v))
    _, carry = lax.while_loop(lambda c: c[0] < jnp.uint8(CP), body, start)  # uint8 while
    return ruk.finish(carry[0], "online")


@pytest.mark.parametrize("body, marker, kind", [(_uint32_fori, "uint32 fori", "uint32"),
                                                (_uint8_while, "uint8 while", "uint8")])
def test_an_unsigned_loop_counter_is_named_at_the_loop(body, marker, kind):
    assert _why(body) == _refusal(
        "stablehlo.while", marker,
        f"counts its iterations with a {kind} counter: `i < n` on unsigned integers (where 0 - 1 is the largest) "
        f"gives no trip count the analysis reads, only a signed counter's does; {INT32}")


def _int8_counter_past_127(q, k, v):
    """A lax.while_loop counted in int8 from 10 by 120 while below 100: 10, then 130, which int8 holds as -126, then
    -6, then 114: three trips (a ring step each), the fourth step after the loop."""
    me = lax.axis_index("cp")

    def body(c):
        i, t, carry = c
        return i + jnp.int8(120), t + 1, _step(q, me, t, carry)

    start = (jnp.int8(10), 0, (ruk.init_state(q, "online"), k, v))
    _, t, carry = lax.while_loop(lambda c: c[0] < jnp.int8(100), body, start)  # int8 while
    return ruk.finish(_step(q, me, t, carry)[0], "online")


def test_a_loop_counter_that_wraps_before_its_bound_is_named_at_the_loop():
    assert _why(_int8_counter_past_127) == _refusal(
        "stablehlo.while", "int8 while",
        "counts its iterations with an int8 counter from 10 by 120 while below 100: it passes 127, the largest "
        f"int8, and wraps before it reaches its bound, so the loop's trip count is not the one its bounds say; {INT32}")


def _live_in(dtype):
    """Liu et al.'s chunk skip (the last q position against the first k position), compared in `dtype`."""
    def live(qf, kf, c):
        last_q = (qf + c - 1).astype(dtype)  # narrowed
        return last_q >= kf.astype(dtype)
    return live


@pytest.mark.parametrize("dtype, held", [(jnp.int8, "-128..127"), (jnp.uint8, "0..255")])
def test_a_skip_compared_in_a_narrow_type_is_named_at_the_convert(dtype, held):
    """512 tokens (128 a device, chunks of 64): the last q position of a chunk is 63..511."""
    body = ruk.blockwise_ring(CP, 64, ruk.causal, _live_in(dtype))
    kind = jnp.dtype(dtype).name
    assert _why(body, length=512) == _refusal(
        "stablehlo.convert", "narrowed",
        f"converts integers in 63..511 to {kind}, which holds only {held}: the result may wrap, and a wrapped number "
        "is no longer the position, chunk index or count it stands for; compute it in int32 (or a type that holds "
        "those values)")


def _steps(step, carry):
    """`carry = step(i, carry)` for i in 0..cp-1, in a lax.while_loop. (JAX 0.10 lowers a fori_loop of static
    bounds to a scan whose body is a function call, whose carried integers the analysis doesn't follow as numbers
    while it finds how they change: it knows no range for them to blame a narrow type with, and the refusal
    stays the analysis's own, "combines tokens with the token at one fixed place of a block".)"""
    def body(c):
        i, carry = c
        return i + 1, step(i, carry)

    return lax.while_loop(lambda c: c[0] < CP, body, (0, carry))[1]


def _int8_block_offset(q, k, v):
    """The block held's offset in the ring, in 48ths, carried in int8 beside the loop counter: 0, 48, 96, 144
    (which int8 holds as -112)."""
    me = lax.axis_index("cp")

    def body(i, c):
        offset, carry = c
        carry = _step(q, me, (offset // 48).astype(jnp.int32), carry)
        return offset + jnp.int8(48), carry  # int8 offset

    _, carry = _steps(body, (jnp.int8(0), (ruk.init_state(q, "online"), k, v)))
    return ruk.finish(carry[0], "online")


def test_a_second_loop_integer_that_overflows_its_type_is_named_at_its_update():
    assert _why(_int8_block_offset) == _refusal(
        "stablehlo.add", "int8 offset",
        "computes integers in 48..192 in int8, which holds only -128..127: the result may wrap, and a wrapped number "
        "is no longer the position, chunk index or count it stands for; compute it in int32 (or a type that holds "
        "those values)")


def _reset_unless_past_step_one(q, k, v):
    """The merge starts afresh wherever `uint32(i) - 2 < 100` fails (steps 0 and 1, where the difference wraps)."""
    me = lax.axis_index("cp")

    def merge(acc, s, v, i):
        merged = ruk.merge_online(acc, s, v, i)
        fresh = ruk.merge_online(ruk.init_state(v, "online"), s, v, i)
        past_one = (i.astype(jnp.uint32) - jnp.uint32(2)) < jnp.uint32(100)  # uint32 difference
        return tuple(jnp.where(past_one, a, b) for a, b in zip(merged, fresh))

    def step(i, carry):
        state, k, v = carry
        n = q.shape[1]
        keep = (me * n + jnp.arange(n))[:, None] >= (((me - i) % CP) * n + jnp.arange(n))[None, :]
        state = merge(state, jnp.where(keep, ruk.scores(q, k), ruk.NEG), v, i)
        return (state,) + tuple(lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v))

    return ruk.finish(_steps(step, (ruk.init_state(q, "online"), k, v))[0], "online")


def test_a_merge_selected_by_an_unsigned_difference_is_named_at_the_difference():
    """Not "selects between partial results ...": the select would be decided at compile time in int32."""
    assert _why(_reset_unless_past_step_one) == _refusal(
        "stablehlo.subtract", "uint32 difference",
        "computes integers in -2..1 in uint32, which holds only 0..4294967295: the result may wrap, and a wrapped "
        "number is no longer the position, chunk index or count it stands for; compute it in int32 (or a type that "
        "holds those values)")


def _keyed(bits: str):
    """The causal ring with a PRNG key split at each step beside it; its last draw scales the output (the same on
    every device: a number keyed by replicated values), or a score's bits read in 16-bit halves."""
    def body(q, k, v):
        me = lax.axis_index("cp")

        def step(i, carry):
            *carry, key = carry
            state, k, v = _step(q, me, i, carry)
            if bits == "halves":
                halves = lax.bitcast_convert_type(state[0], jnp.uint16)  # bits in halves
                state = (state[0] + 0 * halves.sum(-1).astype(state[0].dtype),) + state[1:]
            return state, k, v, jax.random.split(key)[0]

        state, _, _, key = lax.fori_loop(0, CP, step, (ruk.init_state(q, "online"), k, v, jax.random.key(7)))
        return ruk.finish(state, "online") * (1.0 + jax.random.uniform(key))
    return body


def test_a_number_drawn_from_a_replicated_key_is_the_same_in_every_layout():
    """jax.random.uniform makes its float from the key's uint32 bits (shift, or, bitcast_convert): a value the
    same on every device, which the reorder leaves as it is (zigzag asked: the ring computes every tile)."""
    fn = jax.shard_map(_keyed("whole"), mesh=MESH, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal((B, 32, D)).astype(np.float32), jax.NamedSharding(MESH, SPEC))
            for _ in range(3)]
    fixed = autofix_shardings(fn, ring_reorder="zigzag", on_fix="ignore")
    (ring,) = fixed.lower(*args).rings
    assert ring.applied, ring.why
    with jax.set_mesh(MESH):
        np.testing.assert_allclose(np.asarray(fixed(*args)), np.asarray(jax.jit(fn)(*args)), atol=1e-5, rtol=1e-5)


def test_bits_read_at_another_width_are_named_at_the_bitcast():
    assert _why(_keyed("halves")) == _refusal(
        "stablehlo.bitcast_convert", "bits in halves",
        "reinterprets the bits of each element as elements of another width, which adds or removes a dim: bitcast "
        "to a type of the same width")


def _three_cases(q, k, v):
    """Flash-attention style: each block attended in full (all keys before every query), masked (the device's
    own) or skipped (after every query), by a lax.switch on its position."""
    me = lax.axis_index("cp")
    n = q.shape[1]
    q_pos = me * n + jnp.arange(n)

    def step(i, carry):
        state, k, v = carry
        source = (me - i) % CP
        k_pos = source * n + jnp.arange(n)

        def full(state):
            return ruk.merge_online(state, ruk.scores(q, k), v, i)

        def masked(state):
            return ruk.merge_online(state, jnp.where(q_pos[:, None] >= k_pos[None, :], ruk.scores(q, k), ruk.NEG),
                                    v, i)

        case = jnp.where(source < me, 0, jnp.where(source == me, 1, 2))
        state = lax.switch(case, [full, masked, lambda s: s], state)  # three ways
        return (state,) + tuple(lax.ppermute(t, "cp", ruk.ring(CP)) for t in (k, v))

    state, _, _ = lax.fori_loop(0, CP, step, (ruk.init_state(q, "online"), k, v))
    return ruk.finish(state, "online")


def test_a_switch_between_ways_of_folding_a_block_says_what_is_proved_instead():
    assert _why(_three_cases) == _refusal(
        "stablehlo.case", "three ways",
        "chooses among 3 branches that compute different values (a lax.switch): what the analysis proves is a branch "
        "that skips a block beside one that folds it in, not several ways of folding it; fold every block one way (a "
        "tile whose keys are all kept is the masked tile with nothing masked) under lax.cond(skip, ...)")
