"""Buffers a loop fills slice by slice (lax.dynamic_update_slice at the iteration's offset) inside a ring region.

At iteration k such a buffer holds its init with the slices of iterations 0..k-1 written. The analysis models only
the slice iteration k writes, which still holds the init's: a body may read that slice back (a kernel updating its
running state in place, a few query rows at a time), nothing else of the buffer. An earlier iteration's slice read
back is a recurrence along the block (a running sum over a block's own tokens): it was read as the init's slice,
and the region was rewritten with results off by 3 to 6. Such reads are refused, naming the read; results stay
jax.jit's. Slices wider than one token are filled as runs of tokens, so the in-place row kernel is rewritten
(tests/support/ring_user_programs.py `rows-*`), and equal to jax.jit here in both layouts, forward and jax.grad.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from support import ring_user_kernels as uk
from support.ring_check import decisions_of_equal_run, normal_args

CP, S, D = 8, 64, 8
SPEC = P("dp", "cp", None)
READS = ("reads a buffer the loop fills slice by slice other than by slicing out the part it writes at that "
         "iteration (an earlier iteration's slice, read back, makes a recurrence along the block, which the "
         "reorder changes)")


def _ring_total(k):
    """A ring region: every block of k summed around the ring."""
    def step(i, carry):
        k, total = carry
        return lax.ppermute(k, "cp", uk.ring(CP)), total + jnp.sum(k)
    return lax.fori_loop(0, CP, step, (k, jnp.zeros_like(k[0, 0, 0])))[1]


def _filled(read: str, width: int, init: str):
    """x + the ring's total, through a buffer filled `width` tokens an iteration, each slice written from the one
    `read` says: "previous" (the slice written before: a running sum along the block), "next" (not written yet),
    "whole" (the whole buffer summed)."""
    def body(x, k):
        n = x.shape[1]
        total = _ring_total(k)

        def row(a, buf):
            cur = lax.dynamic_slice_in_dim(x, a * width, width, axis=1)
            if read == "previous":
                got = lax.dynamic_slice_in_dim(buf, jnp.maximum(a - 1, 0) * width, width, axis=1)
            elif read == "next":
                got = lax.dynamic_slice_in_dim(buf, jnp.minimum(a + 1, n // width - 1) * width, width, axis=1)
            else:
                got = jnp.zeros_like(cur) + jnp.sum(buf)
            return lax.dynamic_update_slice_in_dim(buf, got + cur, a * width, axis=1)

        buf = lax.fori_loop(0, n // width, row, jnp.zeros_like(x) if init == "zeros" else x)
        return buf + total
    return body


def _mesh():
    return jax.make_mesh((1, CP), ("dp", "cp"))


def _args(mesh, count: int):
    return normal_args(mesh, SPEC, (1, S, D), count)


_check = decisions_of_equal_run


@pytest.mark.parametrize("init", ["zeros", "data"])
@pytest.mark.parametrize("width", [1, 2])
@pytest.mark.parametrize("read", ["previous", "next", "whole"])
def test_a_filled_buffer_read_other_than_at_the_slice_written_is_refused(read, width, init):
    mesh = _mesh()
    fn = jax.shard_map(_filled(read, width, init), mesh=mesh, in_specs=(SPEC,) * 2, out_specs=SPEC,
                       check_vma=False)
    (ring,) = _check(fn, _args(mesh, 2), mesh, "zigzag")
    assert not ring.applied
    if init == "zeros":  # (one that starts as the tokens' data is refused earlier, where it is added to them)
        assert READS in ring.why, ring.why


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
@pytest.mark.parametrize("rows", [2, 4])
def test_state_updated_in_place_rows_at_a_time_is_rewritten(rows, grad, strategy):
    mesh = _mesh()
    fn = jax.shard_map(uk.rows_ring(CP, rows, uk.causal), mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC,
                       check_vma=False)
    if grad:
        w = np.random.default_rng(1).standard_normal((1, S, D)).astype(np.float32)

        def loss(*a, f=fn):
            y = f(*a)
            return jnp.sum(y * w + y * y / 2)
        fn = jax.grad(loss, argnums=(0, 1, 2))
    rings = _check(fn, _args(mesh, 3), mesh, strategy)
    assert len(rings) == (2 if grad else 1) and all(r.applied for r in rings), [r.why for r in rings]


def _half_merged(kept: str, rows: int = 2):
    """A ring over the query rows `rows` at a time, a state (running max, running sum) updated in place where the
    merge changes only one of the two and writes the other back as it read it (kept="max": the max is written back,
    kept="sum": the sum is) or, kept="swapped", writes each slice read into the other buffer (the sum's slice, with
    the step's block added, into the max's buffer; the max's slice into the sum's)."""
    def body(q, k):
        n = q.shape[1]

        def step(i, carry):
            state, k = carry

            def row(a, state):
                qa = lax.dynamic_slice_in_dim(q, a * rows, rows, axis=1)
                s = jnp.einsum("bqd,bkd->bqk", qa, k)
                m0, t0 = (lax.dynamic_slice_in_dim(x, a * rows, rows, axis=1) for x in state)
                if kept == "max":
                    new = (m0, t0 + jnp.sum(jnp.tanh(s), axis=-1))
                elif kept == "sum":
                    new = (jnp.maximum(m0, jnp.max(s, axis=-1)), t0)
                else:
                    new = (t0 + jnp.sum(jnp.tanh(s), axis=-1), m0)
                return tuple(lax.dynamic_update_slice_in_dim(x, y, a * rows, axis=1) for x, y in zip(state, new))

            state = lax.fori_loop(0, n // rows, row, state)
            return state, lax.ppermute(k, "cp", uk.ring(CP))

        init = (jnp.full(q.shape[:2], -1.0, q.dtype), jnp.zeros(q.shape[:2], q.dtype))
        (m, t), _ = lax.fori_loop(0, CP, step, (init, k))
        return q * m[..., None] + t[..., None]
    return body


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
@pytest.mark.parametrize("kept", ["max", "sum"])
def test_a_slice_written_back_as_read_leaves_its_buffer_as_it_was(kept, grad, strategy):
    """A merge that updates only part of the state in place writes the rest back unchanged:
    `dynamic_update_slice(x, dynamic_slice(x, s), s)` leaves x as it was, so that buffer keeps its init and the ring
    is rewritten (it was refused: "fills a buffer with slices wider than one element"), forward and jax.grad, unless
    the gradient splits a running maximum's ties."""
    mesh = _mesh()
    fn = jax.shard_map(_half_merged(kept), mesh=mesh, in_specs=(SPEC,) * 2, out_specs=SPEC, check_vma=False)
    if grad:
        fn = jax.grad(lambda q, k, f=fn: jnp.sum(f(q, k) ** 2), argnums=(0, 1))
    rings = _check(fn, _args(mesh, 2), mesh, strategy)
    if grad and kept == "sum":
        # the result reads the running maximum itself: JAX splits its cotangent between tied blocks by their order
        assert not any(r.applied for r in rings)
        assert "each running maximum must receive a cotangent that is zero" in rings[-1].why, rings[-1].why
    else:
        assert len(rings) == (2 if grad else 1) and all(r.applied for r in rings), [r.why for r in rings]


def test_a_slice_written_into_another_buffer_is_not_taken_for_one_written_back():
    """Each slice read out of one buffer and written into the other at the same place: not a write that leaves its
    buffer as it was. The sum's buffer, filled with the max's start, then starts the next ring step's sum from it."""
    mesh = _mesh()
    fn = jax.shard_map(_half_merged("swapped"), mesh=mesh, in_specs=(SPEC,) * 2, out_specs=SPEC, check_vma=False)
    (ring,) = _check(fn, _args(mesh, 2), mesh, "zigzag")
    assert not ring.applied
    assert "adds data to a partial aggregate" in ring.why, ring.why


@pytest.mark.parametrize("use", ["scaled", "selected"])
def test_a_buffer_computed_with_right_after_a_write_is_refused_with_its_reason(use):
    """The buffer a dynamic_update_slice returns, multiplied or selected from before the loop gets it back: refused,
    saying so (it was refused as "holds something the analysis could not follow (AttributeError: ...)")."""
    def body(x, k):
        total = _ring_total(k)

        def row(a, buf):
            got = lax.dynamic_slice_in_dim(buf, a * 2, 2, axis=1)
            cur = lax.dynamic_slice_in_dim(x, a * 2, 2, axis=1)
            written = lax.dynamic_update_slice_in_dim(buf, got + cur, a * 2, axis=1)
            return written * 2.0 if use == "scaled" else jnp.where(a % 2 == 0, written, buf)

        return lax.fori_loop(0, x.shape[1] // 2, row, jnp.zeros_like(x)) + total

    mesh = _mesh()
    fn = jax.shard_map(body, mesh=mesh, in_specs=(SPEC,) * 2, out_specs=SPEC, check_vma=False)
    (ring,) = _check(fn, _args(mesh, 2), mesh, "zigzag")
    assert not ring.applied
    assert ("computes with a buffer the loop fills slice by slice right after writing a slice of it" in ring.why
            and "'stablehlo." + ("multiply" if use == "scaled" else "select") + "'" in ring.why), ring.why
