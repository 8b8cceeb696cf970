"""Ring programs in styles the other ring suites do not use, each a (function, arguments) pair built on its own
mesh, for comparing `@autofix_shardings` with jax.jit (tests/test_ring_audit11.py).

Per-device bodies take q, k, v [batch, n, dim] blocks of a sequence sharded on the ring axis "cp" (8 CPU devices:
cp = 8 and S = 128 unless a program says otherwise, so the sequence splits into 2 * cp units of 8 tokens).
`AUDIT[name]` is an Audit: build() -> (fn, args), whether the test differentiates sum(fn(*args) ** 2) with
respect to q, k, v, and whether the ring must be left alone (`refuse`: its result depends on where tokens sit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

B, S, D = 2, 128, 8
NEG = -1e30


def ring(cp: int, direction: int = 1):
    return [(i, (i + direction) % cp) for i in range(cp)]


def scores(q, k):
    return jnp.einsum("bqd,bkd->bqk", q, k) / np.float32(np.sqrt(q.shape[-1]))


def pv(p, v):
    return jnp.einsum("bqk,bkd->bqd", p, v)


def start(q, neg=NEG):
    zero = jnp.zeros_like(q[..., 0])
    return zero + neg, zero, jnp.zeros_like(q)


def online(acc, s, v):
    m0, l0, o0 = acc
    m = jnp.maximum(m0, jnp.max(s, axis=-1))
    p = jnp.exp(s - m[..., None])
    c = jnp.exp(m0 - m)
    return m, l0 * c + jnp.sum(p, axis=-1), o0 * c[..., None] + pv(p, v)


def done(acc):
    _, l, o = acc
    return o / l[..., None]


# ---------------------------------------------------------------------------------------------------------------
# Meshes and arguments.


@dataclass(frozen=True)
class Audit:
    build: Callable
    style: str
    grad: bool = False
    refuse: bool = False
    bf16: bool = False


_MESHES: dict = {}


def mesh(kind: str = "cp8"):
    if kind not in _MESHES:
        if kind == "cp8":
            _MESHES[kind] = jax.make_mesh((8,), ("cp",))
        elif kind == "cp-dp":  # the ring on the first axis
            _MESHES[kind] = jax.make_mesh((2, 4), ("cp", "dp"))
        elif kind == "dp-cp-auto":
            _MESHES[kind] = jax.make_mesh((2, 4), ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    return _MESHES[kind]


def spec(kind: str = "cp8"):
    return P(None, "cp", None) if kind == "cp8" else P("dp", "cp", None)


def normal(m, kind="cp8", n=3, seed=0, shape=(B, S, D), dtype=np.float32):
    rng = np.random.default_rng(seed)
    return tuple(jax.device_put(rng.standard_normal(shape).astype(np.float32).astype(dtype),
                                NamedSharding(m, spec(kind))) for _ in range(n))


def seq_ints(m, values, kind="cp8"):
    sp = P(None, "cp") if kind == "cp8" else P("dp", "cp")
    return jax.device_put(np.broadcast_to(np.asarray(values, np.int32), (B, S)).copy(), NamedSharding(m, sp))


def mapped(body, kind="cp8", n_seq=3, n_int=0, check_vma=False, out=None):
    m = mesh(kind)
    sp = spec(kind)
    isp = P(None, "cp") if kind == "cp8" else P("dp", "cp")
    return jax.shard_map(body, mesh=m, in_specs=(sp,) * n_seq + (isp,) * n_int,
                         out_specs=sp if out is None else out, check_vma=check_vma)


def plain(body, kind="cp8", **kw):
    """A builder for a body over q, k, v alone."""
    def build():
        return mapped(body, kind, **kw), normal(mesh(kind), kind)
    return build


# ---------------------------------------------------------------------------------------------------------------
# The ring passes q and its accumulator instead of k and v: after cp hops they come home.


def q_ring(cp=8):
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        k_pos = me * n + jnp.arange(n)

        def step(i, carry):
            q, acc = carry
            q_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            acc = online(acc, s, v)
            return lax.ppermute(q, "cp", ring(cp)), tuple(lax.ppermute(a, "cp", ring(cp)) for a in acc)

        _, acc = lax.fori_loop(0, cp, step, (q, start(q)))
        return done(acc)
    return body


# Both directions at once, unrolled: the own block, then i = 1..cp/2 hops each way (the opposite block once).
def bidirectional_unrolled(cp=8):
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def merge(acc, k, v, src):
            k_pos = (src % cp) * n + jnp.arange(n)
            return online(acc, jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG), v)

        acc = merge(start(q), k, v, me)
        kf, vf, kb, vb = k, v, k, v
        for i in range(1, cp // 2 + 1):
            kf, vf = (lax.ppermute(t, "cp", ring(cp, 1)) for t in (kf, vf))
            acc = merge(acc, kf, vf, me - i)
            if i < cp // 2:
                kb, vb = (lax.ppermute(t, "cp", ring(cp, -1)) for t in (kb, vb))
                acc = merge(acc, kb, vb, me + i)
        return done(acc)
    return body


# k and v sent as one stacked array.
def stacked_kv(cp=8):
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            acc, kv = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, kv[0]), NEG)
            return online(acc, s, kv[1]), lax.ppermute(kv, "cp", ring(cp))

        acc, _ = lax.fori_loop(0, cp, step, (start(q), jnp.stack([k, v])))
        return done(acc)
    return body


# ---------------------------------------------------------------------------------------------------------------
# Positions, written other ways.


def positions_uint32(cp=8):
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = (me * n + jnp.arange(n)).astype(jnp.uint32)

        def step(i, carry):
            acc, k, v = carry
            k_pos = (((me - i) % cp) * n + jnp.arange(n)).astype(jnp.uint32)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def positions_broadcasted_iota(cp=8):
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        rows = lax.broadcasted_iota(jnp.int32, (n, n), 0) + me * n

        def step(i, carry):
            acc, k, v = carry
            cols = jnp.broadcast_to(((me - i) % cp) * n + jnp.arange(n, dtype=jnp.int32), (n, n))
            s = jnp.where(rows >= cols, scores(q, k), NEG)
            return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def positions_float_data(cp=8):
    """Position ids passed in (data), read as float32 (an ALiBi slope and the causal test in floats), the key ids
    travelling in the carry with their block."""
    def body(q, k, v, qid, kid):
        qp = qid.astype(jnp.float32)[:, :, None]

        def step(i, carry):
            acc, k, v, kp = carry
            s = scores(q, k) - 0.1 * (qp - kp)
            s = jnp.where(qp >= kp, s, NEG)
            return (online(acc, s, v),) + tuple(lax.ppermute(t, "cp", ring(cp)) for t in (k, v, kp))

        acc, *_ = lax.fori_loop(0, cp, step, (start(q), k, v, kid.astype(jnp.float32)[:, None, :]))
        return done(acc)
    return body


def positions_carried(cp=8):
    """The key positions made once from axis_index and ppermuted in the carry with k and v."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(_, carry):
            acc, k, v, k_pos = carry
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            return (online(acc, s, v),) + tuple(lax.ppermute(t, "cp", ring(cp)) for t in (k, v, k_pos))

        acc, *_ = lax.fori_loop(0, cp, step, (start(q), k, v, q_pos))
        return done(acc)
    return body


# ---------------------------------------------------------------------------------------------------------------
# Masks, written other ways.


def mask_tril_offset(cp=8):
    """Causal as a lower triangle of the (q block, k block) tile shifted by the blocks' distance."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        r = lax.broadcasted_iota(jnp.int32, (n, n), 0)
        c = lax.broadcasted_iota(jnp.int32, (n, n), 1)

        def step(i, carry):
            acc, k, v = carry
            offset = (me - (me - i) % cp) * n  # tril(ones, k=offset)
            keep = c <= r + offset
            s = jnp.where(keep, scores(q, k), NEG)
            return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def mask_value(value, guarded=False):
    """Causal with a mask value of `value` (-inf or -1e9), the state starting at -inf; `guarded`: the shift
    guarded as flash kernels guard it."""
    def make(cp=8):
        def body(q, k, v):
            n = q.shape[1]
            me = lax.axis_index("cp")
            q_pos = me * n + jnp.arange(n)

            def step(i, carry):
                (m0, l0, o0), k, v = carry
                k_pos = ((me - i) % cp) * n + jnp.arange(n)
                s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), value)
                m = jnp.maximum(m0, s.max(-1))
                ms = jnp.where(jnp.isfinite(m), m, 0.0) if guarded else m
                p = jnp.exp(s - ms[..., None])
                c = jnp.exp(m0 - ms)
                acc = (m, l0 * c + p.sum(-1), o0 * c[..., None] + pv(p, v))
                return acc, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

            acc, _, _ = lax.fori_loop(0, cp, step, (start(q, -jnp.inf), k, v))
            return done(acc)
        return body
    return make


def mask_after_exp(cp=8):
    """The mask multiplies the exponentials (the max taken over every score, masked ones too)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            (m0, l0, o0), k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = scores(q, k)
            m = jnp.maximum(m0, s.max(-1))
            p = jnp.exp(s - m[..., None]) * (q_pos[:, None] >= k_pos[None, :]).astype(jnp.float32)
            c = jnp.exp(m0 - m)
            acc = (m, l0 * c + p.sum(-1), o0 * c[..., None] + pv(p, v))
            return acc, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def mask_documents(cp=8):
    """Document (segment-id) mask passed in, the key ids travelling with their block; causal by positions; the
    test spelled as a difference of ids."""
    def body(q, k, v, seg):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            acc, k, v, ks = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            keep = ((seg[:, :, None] - ks[:, None, :]) == 0) & (q_pos[:, None] >= k_pos[None, :])
            s = jnp.where(keep, scores(q, k), NEG)
            return (online(acc, s, v),) + tuple(lax.ppermute(t, "cp", ring(cp)) for t in (k, v, ks))

        acc, *_ = lax.fori_loop(0, cp, step, (start(q), k, v, seg))
        return done(acc)
    return body


def mask_window_abs(w=24):
    """Causal and a window of w in one comparison: |2 (q - k) - (w - 1)| <= w - 1."""
    def make(cp=8):
        def body(q, k, v):
            n = q.shape[1]
            me = lax.axis_index("cp")
            q_pos = me * n + jnp.arange(n)

            def step(i, carry):
                acc, k, v = carry
                k_pos = ((me - i) % cp) * n + jnp.arange(n)
                keep = jnp.abs(2 * (q_pos[:, None] - k_pos[None, :]) - (w - 1)) <= w - 1
                s = jnp.where(keep, scores(q, k), NEG)
                return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

            acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
            return done(acc)
        return body
    return make


def mask_modulo(mod=12):
    """A periodic mask by positions modulo `mod` (not a divisor of the 8-token units) within causal."""
    def make(cp=8):
        def body(q, k, v):
            n = q.shape[1]
            me = lax.axis_index("cp")
            q_pos = me * n + jnp.arange(n)

            def step(i, carry):
                acc, k, v = carry
                k_pos = ((me - i) % cp) * n + jnp.arange(n)
                keep = (q_pos[:, None] >= k_pos[None, :]) & ((q_pos[:, None] % mod) >= (k_pos[None, :] % mod))
                keep = keep | (q_pos[:, None] == k_pos[None, :])
                s = jnp.where(keep, scores(q, k), NEG)
                return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

            acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
            return done(acc)
        return body
    return make


def cond_skip_by_block_extremes(cp=8):
    """One block a step; the block skipped (lax.cond) when its first key comes after the last query."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            acc, k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)

            def run(acc):
                return online(acc, jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG), v)

            acc = lax.cond(k_pos[0] > q_pos[-1], lambda a: a, run, acc)
            return acc, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def cond_skip_by_block_index(cp=8):
    """MUST REFUSE: the block skipped when its ring coordinate is past the device's (k_block_idx > q_block_idx)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            acc, k, v = carry
            kb = (me - i) % cp
            k_pos = kb * n + jnp.arange(n)

            def run(acc):
                return online(acc, jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG), v)

            acc = lax.cond(kb > me, lambda a: a, run, acc)
            return acc, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


# ---------------------------------------------------------------------------------------------------------------
# Blockwise: chunk pairs skipped by lax.cond on chunk positions (the kind the defaults rewrite), written with a
# fori_loop over ring steps and Python loops over the chunks.


def blockwise_chunks(chunk=8, window=None, remat=False):
    def make(cp=8):
        def body(q, k, v):
            n = q.shape[1]
            me = lax.axis_index("cp")
            per = n // chunk

            def step(i, carry):
                accs, k, v = carry
                src = (me - i) % cp
                new = []
                for a in range(per):
                    acc = accs[a]
                    qa = q[:, a * chunk:(a + 1) * chunk]
                    qp = me * n + a * chunk + jnp.arange(chunk)
                    for b in range(per):
                        kp = src * n + b * chunk + jnp.arange(chunk)
                        kb, vb = k[:, b * chunk:(b + 1) * chunk], v[:, b * chunk:(b + 1) * chunk]

                        def run(acc, qa=qa, kb=kb, vb=vb, qp=qp, kp=kp):
                            d = qp[:, None] - kp[None, :]
                            keep = d >= 0 if window is None else (d >= 0) & (d < window)
                            return online(acc, jnp.where(keep, scores(qa, kb), NEG), vb)

                        live = kp[0] <= qp[-1]
                        if window is not None:
                            live = live & (qp[0] - kp[-1] < window)
                        acc = lax.cond(live, run, lambda x: x, acc)
                    new.append(acc)
                return tuple(new), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

            if remat:
                step = jax.checkpoint(step)
            accs = tuple(start(q[:, a * chunk:(a + 1) * chunk]) for a in range(per))
            accs, _, _ = lax.fori_loop(0, cp, step, (accs, k, v))
            return jnp.concatenate([done(a) for a in accs], axis=1)
        return body
    return make


# ---------------------------------------------------------------------------------------------------------------
# Online softmax, written other ways.


def lse_carry(cp=8):
    """A log-sum-exp carry instead of (max, sum): the unnormalised output rescaled by exp(lse_old - lse_new)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            (lse, o), k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            new = jnp.logaddexp(lse, jax.nn.logsumexp(s, axis=-1))
            o = o * jnp.exp(lse - new)[..., None] + pv(jnp.exp(s - new[..., None]), v)
            return (new, o), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        (lse, o), _, _ = lax.fori_loop(0, cp, step, ((jnp.zeros_like(q[..., 0]) + NEG, jnp.zeros_like(q)), k, v))
        return o
    return body


def lax_max_normalised(cp=8):
    """lax.max for the running max and the output normalised at every step (not at the end)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            (m0, l0, o0), k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            m = lax.max(m0, lax.reduce_max(s, axes=(2,)))
            p = jnp.exp(s - m[..., None])
            lc = l0 * jnp.exp(m0 - m)
            l = lc + p.sum(-1)
            o = (o0 * lc[..., None] + pv(p, v)) / l[..., None]
            return (m, l, o), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        (_, _, o), _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return o
    return body


def bf16_inputs(cp=8):
    """bfloat16 q, k, v; scores and the state in float32 (preferred_element_type), the output cast back."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            (m0, l0, o0), k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.einsum("bqd,bkd->bqk", q, k, preferred_element_type=jnp.float32) * 0.35
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)
            m = jnp.maximum(m0, s.max(-1))
            p = jnp.exp(s - m[..., None])
            c = jnp.exp(m0 - m)
            o = o0 * c[..., None] + jnp.einsum("bqk,bkd->bqd", p.astype(jnp.bfloat16), v,
                                               preferred_element_type=jnp.float32)
            return (m, l0 * c + p.sum(-1), o), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        z = jnp.zeros(q.shape[:2], jnp.float32)
        acc, _, _ = lax.fori_loop(0, cp, step, ((z + NEG, z, jnp.zeros(q.shape, jnp.float32)), k, v))
        return done(acc).astype(jnp.bfloat16)
    return body


def remat_step(cp=8):
    """The ring step under jax.checkpoint."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        @jax.checkpoint
        def step(i, carry):
            acc, k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def _causal(cp):
    """The plain causal fori ring (a building block of the structural programs)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            acc, k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


# ---------------------------------------------------------------------------------------------------------------
# Program structure.


def vmap_heads():
    """jax.vmap over a heads axis outside the shard_map (the blockwise causal kernel)."""
    def build():
        m = mesh()
        f = mapped(blockwise_chunks()(8))
        rng = np.random.default_rng(0)
        args = tuple(jax.device_put(rng.standard_normal((2, B, S, D)).astype(np.float32),
                                    NamedSharding(m, P(None, None, "cp", None))) for _ in range(3))
        return jax.vmap(f), args
    return build


def two_ring_layers():
    """A q-passing causal ring, then a blockwise windowed ring reading its output."""
    def build():
        a = mapped(q_ring(8))
        b = mapped(blockwise_chunks(window=20)(8))

        def f(q, k, v):
            x = q + a(q, k, v)
            return x + b(x, k, v)

        return f, normal(mesh())
    return build


def scan_over_layers():
    """The blockwise causal ring inside a lax.scan over three layers of weights."""
    def build():
        m = mesh()
        attn = mapped(blockwise_chunks()(8))
        w = jax.device_put(np.random.default_rng(5).standard_normal((3, D, D)).astype(np.float32) * 0.3,
                           NamedSharding(m, P()))

        def f(q, k, v):
            def layer(x, wl):
                return x + attn(x @ wl, k, v), None
            return lax.scan(layer, q, w)[0]

        return f, normal(m)
    return build


def checked_vma():
    """check_vma=True (the per-device state started from q so that it varies along cp like q)."""
    def build():
        return mapped(blockwise_chunks()(8), check_vma=True), normal(mesh())
    return build


def ring_on_first_axis():
    """Mesh (2, 4) with axes ("cp", "dp"): the ring on the first axis (cp = 2), the batch on dp."""
    def build():
        m = mesh("cp-dp")
        f = jax.shard_map(blockwise_chunks(chunk=8)(2), mesh=m, in_specs=(P("dp", "cp", None),) * 3,
                          out_specs=P("dp", "cp", None), check_vma=False)
        rng = np.random.default_rng(0)
        args = tuple(jax.device_put(rng.standard_normal((4, 64, D)).astype(np.float32),
                                    NamedSharding(m, P("dp", "cp", None))) for _ in range(3))
        return f, args
    return build


def auto_axes_dp_cp():
    """Auto axes dp=2 x cp=4, the q-passing ring."""
    def build():
        m = mesh("dp-cp-auto")
        f = jax.shard_map(q_ring(4), mesh=m, in_specs=(P("dp", "cp", None),) * 3, out_specs=P("dp", "cp", None),
                          check_vma=False)
        rng = np.random.default_rng(0)
        args = tuple(jax.device_put(rng.standard_normal((2, 64, D)).astype(np.float32),
                                    NamedSharding(m, P("dp", "cp", None))) for _ in range(3))
        return f, args
    return build


# ---------------------------------------------------------------------------------------------------------------
# Must be left alone: results that depend on where tokens sit.


def cumsum_across_devices(cp=8):
    """Causal attention plus a running sum of v over the sequence: the sums of the blocks of earlier devices
    (by ring coordinate) gathered around the ring, plus the local cumulative sum."""
    def body(q, k, v):
        me = lax.axis_index("cp")

        def step(i, carry):
            tot, blk = carry
            src = (me - i) % cp
            tot = tot + jnp.where(src < me, blk.sum(axis=1, keepdims=True), 0.0)
            return tot, lax.ppermute(blk, "cp", ring(cp))

        tot, _ = lax.fori_loop(0, cp, step, (jnp.zeros_like(v[:, :1]), v))
        return _causal(cp)(q, k, v) + (tot + jnp.cumsum(v, axis=1)) / 16.0
    return body


def dropout_fold_in_device(cp=8):
    """Dropout on the probabilities with a key folded with axis_index."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)
        key = jax.random.fold_in(jax.random.key(0), me)

        def step(i, carry):
            (m0, l0, o0), k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            m = jnp.maximum(m0, s.max(-1))
            p = jnp.exp(s - m[..., None])
            c = jnp.exp(m0 - m)
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.8, p.shape)
            o = o0 * c[..., None] + pv(jnp.where(keep, p / 0.8, 0.0), v)
            return (m, l0 * c + p.sum(-1), o), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def first_block_max(cp=8):
    """The first block's row max kept as a fixed shift, and added to the output (order-dependent)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            (mf, l0, o0), k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            mf = jnp.where(i == 0, s.max(-1), mf)
            p = jnp.exp(s - mf[..., None])
            return (mf, l0 + p.sum(-1), o0 + pv(p, v)), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        (mf, l, o), _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return o / l[..., None] + 0.01 * mf[..., None]
    return body


def coordinate_temperature(cp=8):
    """Devices with axis_index < 2 scale their scores (different math picked by the device coordinate)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            acc, k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = scores(q, k)
            s = jnp.where(me < 2, s * 1.5, s)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)
            return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def local_partial_kept(cp=8):
    """The output also carries the own block's partial attention (computed before the ring from global
    positions): tokens of other blocks are left out of that term."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)
        s = jnp.where(q_pos[:, None] >= q_pos[None, :], scores(q, k), NEG)
        local = done(online(start(q), s, v))
        return _causal(cp)(q, k, v) + 0.5 * local
    return body


def local_partial_only(cp=8):
    """The ring runs, but only the own block's partial (step 0) is returned."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            acc, first, k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            acc = online(acc, s, v)
            first = jax.tree.map(lambda a, f: jnp.where(i == 0, a, f), acc, first)
            return acc, first, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        _, first, _, _ = lax.fori_loop(0, cp, step, (start(q), start(q), k, v))
        return done(first)
    return body


# ---------------------------------------------------------------------------------------------------------------
# Positions spelled in ways that are not `c * n + j` (pseudo positions a user made up) or that reach it by another
# road. Each is a causal (or windowed) ring with one block a step; `positions(me_or_src, n)` gives a block's.


def custom_positions(positions, window=None, dtype=None, fixed=False):
    def make(cp=8):
        def body(q, k, v):
            n = q.shape[1]
            me = lax.axis_index("cp")
            q_pos = positions(me, n, cp)
            if dtype is not None:
                q_pos = q_pos.astype(dtype)

            def step(i, carry):
                acc, k, v = carry
                k_pos = positions((me - i) % cp, n, cp)
                if dtype is not None:
                    k_pos = k_pos.astype(dtype)
                d = q_pos[:, None] - k_pos[None, :]
                if dtype is not None and jnp.issubdtype(dtype, jnp.unsignedinteger):
                    keep = d < window  # a negative difference wraps to a huge one: masked
                elif window is None:
                    keep = d >= 0
                else:
                    keep = (d >= 0) & (d < window)
                s = jnp.where(keep, scores(q, k), NEG)
                return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

            acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
            return done(acc)
        return body
    return make


def _reversed(c, n, cp):  # the block's positions in reverse order: token j at c * n + n - 1 - j
    return c * n + (n - 1 - jnp.arange(n))


def _stride20(c, n, cp):  # blocks 20 apart (room for 4 separator tokens after each block)
    return c * 20 + jnp.arange(n)


def _plus_coordinate(c, n, cp):  # one separator token before each block: j + c (n + 1)
    return c * n + jnp.arange(n) + c


def _global_slice(c, n, cp):  # a slice of the global arange at the block's offset
    return lax.dynamic_slice(jnp.arange(cp * n), (c * n,), (n,))


def _table_row(c, n, cp):  # a row of the global arange reshaped to [cp, n]
    return jnp.arange(cp * n).reshape(cp, n)[c]


def _cumsum(c, n, cp):  # cumsum of ones
    return c * n + jnp.cumsum(jnp.ones(n, jnp.int32)) - 1


def _doubled(c, n, cp):  # even positions (a sequence downsampled by two)
    return 2 * (c * n + jnp.arange(n))


def _float_iota(c, n, cp):  # float positions
    return lax.iota(jnp.float32, n) + (c * n).astype(jnp.float32)


def send_first(cp=8):
    """The own block merged before the loop; each iteration sends first, then merges (fori_loop from 1)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def merge(acc, k, v, src):
            k_pos = src * n + jnp.arange(n)
            return online(acc, jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG), v)

        def step(i, carry):
            acc, k, v = carry
            k, v = lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))
            return merge(acc, k, v, (me - i + cp) % cp), k, v

        acc, _, _ = lax.fori_loop(1, cp, step, (merge(start(q), k, v, me), k, v))
        return done(acc)
    return body


def cond_skip_by_hop(cp=8):
    """MUST REFUSE: a block skipped when the hop count passes the device index (i > me: the block wrapped
    around the ring, i.e. it comes from a later device) -- right for contiguous blocks only."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            acc, k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)

            def run(acc):
                return online(acc, jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG), v)

            acc = lax.cond(i > me, lambda a: a, run, acc)
            return acc, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def first_token_of_block(cp=8):
    """MUST REFUSE: every query also attends to (adds) the value of the first token of its own block."""
    def body(q, k, v):
        return _causal(cp)(q, k, v) + 0.5 * v[:, :1]
    return body


def block_mean_bias(cp=8):
    """MUST REFUSE: each key block's mean score used as a per-block bias (a mean over a block's tokens, which
    reordering regroups)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            acc, k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = scores(q, k)
            s = s - 0.5 * jnp.mean(k, axis=(1, 2))[:, None, None]
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)
            return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def causal_big_block(cp=8):
    """blockwise_chunks with 24 tokens a device (S = 192) and chunks of 8: the middle chunk straddles the two
    halves zigzag would give a device."""
    def build():
        m = mesh()
        rng = np.random.default_rng(0)
        args = tuple(jax.device_put(rng.standard_normal((B, 192, D)).astype(np.float32),
                                    NamedSharding(m, spec())) for _ in range(3))
        return mapped(blockwise_chunks(chunk=8)(cp)), args
    return build


# ---------------------------------------------------------------------------------------------------------------
# Layouts of the region's operands and results other than [batch, sequence, dim] on both sides.


def _kv_transposed_body(cp=8):
    """k arrives as [batch, dim, n] (the sequence on its last dimension) and is transposed inside."""
    inner = _causal(cp)

    def body(q, kt, v):
        return inner(q, jnp.swapaxes(kt, 1, 2), v)
    return body


def kv_transposed():
    def build():
        m = mesh()
        q, k, v = normal(m)
        kt = jax.device_put(np.swapaxes(np.asarray(k), 1, 2), NamedSharding(m, P(None, None, "cp")))
        f = jax.shard_map(_kv_transposed_body(8), mesh=m, in_specs=(spec(), P(None, None, "cp"), spec()),
                          out_specs=spec(), check_vma=False)
        return f, (q, kt, v)
    return build


def out_transposed():
    """The result returned as [batch, dim, n], out_specs P(None, None, "cp")."""
    def build():
        m = mesh()
        inner = _causal(8)
        f = jax.shard_map(lambda q, k, v: jnp.swapaxes(inner(q, k, v), 1, 2), mesh=m, in_specs=(spec(),) * 3,
                          out_specs=P(None, None, "cp"), check_vma=False)
        return f, normal(m)
    return build


def out_flattened():
    """The result returned flattened to [batch, n * dim], out_specs P(None, "cp")."""
    def build():
        m = mesh()
        inner = _causal(8)
        f = jax.shard_map(lambda q, k, v: inner(q, k, v).reshape(q.shape[0], -1), mesh=m, in_specs=(spec(),) * 3,
                          out_specs=P(None, "cp"), check_vma=False)
        return f, normal(m)
    return build


def in_flattened():
    """q arrives flattened as [batch, S * dim] (P(None, "cp")) and is reshaped to [batch, n, dim] inside."""
    def build():
        m = mesh()
        inner = _causal(8)
        q, k, v = normal(m)
        qf = jax.device_put(np.asarray(q).reshape(B, S * D), NamedSharding(m, P(None, "cp")))
        f = jax.shard_map(lambda qf, k, v: inner(qf.reshape(k.shape), k, v), mesh=m,
                          in_specs=(P(None, "cp"), spec(), spec()), out_specs=spec(), check_vma=False)
        return f, (qf, k, v)
    return build


def out_all_gathered():
    """The result all-gathered along the sequence inside the region and returned replicated (out_specs P())."""
    def build():
        m = mesh()
        inner = _causal(8)
        f = jax.shard_map(lambda q, k, v: lax.all_gather(inner(q, k, v), "cp", axis=1, tiled=True), mesh=m,
                          in_specs=(spec(),) * 3, out_specs=P(), check_vma=False)
        return f, normal(m)
    return build


def out_psum_local_weights():
    """A loss summed over the sequence inside the region with weights by local index (arange(n)): the weights
    follow where tokens sit in a block."""
    def build():
        m = mesh()
        inner = _causal(8)

        def body(q, k, v):
            o = inner(q, k, v)
            w = jnp.arange(o.shape[1], dtype=jnp.float32)[None, :, None]
            return lax.psum(jnp.sum(o * w, axis=1), "cp")

        f = jax.shard_map(body, mesh=m, in_specs=(spec(),) * 3, out_specs=P(), check_vma=False)
        return f, normal(m)
    return build


def out_psum_position_weights():
    """The same with weights by global position (me * n + arange(n)): order-free."""
    def build():
        m = mesh()
        inner = _causal(8)

        def body(q, k, v):
            o = inner(q, k, v)
            n = o.shape[1]
            w = (lax.axis_index("cp") * n + jnp.arange(n)).astype(jnp.float32)[None, :, None]
            return lax.psum(jnp.sum(o * w, axis=1), "cp")

        f = jax.shard_map(body, mesh=m, in_specs=(spec(),) * 3, out_specs=P(), check_vma=False)
        return f, normal(m)
    return build


def seq_on_two_axes():
    """The sequence split over ("cp", "dp") (cp major, 8 blocks), the ring over cp only: positions
    (cp_index * 2 + dp_index) * n + j; a block travels among the blocks 2 apart."""
    def build():
        m = jax.make_mesh((4, 2), ("cp", "dp"))
        sp = P(None, ("cp", "dp"), None)

        def body(q, k, v):
            n = q.shape[1]
            me = lax.axis_index("cp")
            d = lax.axis_index("dp")
            q_pos = (me * 2 + d) * n + jnp.arange(n)

            def step(i, carry):
                acc, k, v = carry
                k_pos = (((me - i) % 4) * 2 + d) * n + jnp.arange(n)
                s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
                return online(acc, s, v), lax.ppermute(k, "cp", ring(4)), lax.ppermute(v, "cp", ring(4))

            acc, _, _ = lax.fori_loop(0, 4, step, (start(q), k, v))
            return done(acc)

        f = jax.shard_map(body, mesh=m, in_specs=(sp,) * 3, out_specs=sp, check_vma=False)
        rng = np.random.default_rng(0)
        args = tuple(jax.device_put(rng.standard_normal((B, S, D)).astype(np.float32), NamedSharding(m, sp))
                     for _ in range(3))
        return f, args
    return build


def seq_on_two_axes_blockwise():
    """seq_on_two_axes' layout with blockwise chunk skips (the kind the defaults rewrite)."""
    def build():
        m = jax.make_mesh((4, 2), ("cp", "dp"))
        sp = P(None, ("cp", "dp"), None)
        chunk = 4

        def body(q, k, v):
            n = q.shape[1]
            me = lax.axis_index("cp")
            d = lax.axis_index("dp")
            per = n // chunk

            def step(i, carry):
                accs, k, v = carry
                src = (me - i) % 4
                new = []
                for a in range(per):
                    acc = accs[a]
                    qa = q[:, a * chunk:(a + 1) * chunk]
                    qp = (me * 2 + d) * n + a * chunk + jnp.arange(chunk)
                    for b in range(per):
                        kp = (src * 2 + d) * n + b * chunk + jnp.arange(chunk)
                        kb, vb = k[:, b * chunk:(b + 1) * chunk], v[:, b * chunk:(b + 1) * chunk]

                        def run(acc, qa=qa, kb=kb, vb=vb, qp=qp, kp=kp):
                            return online(acc, jnp.where(qp[:, None] >= kp[None, :], scores(qa, kb), NEG), vb)

                        acc = lax.cond(kp[0] <= qp[-1], run, lambda x: x, acc)
                    new.append(acc)
                return tuple(new), lax.ppermute(k, "cp", ring(4)), lax.ppermute(v, "cp", ring(4))

            accs = tuple(start(q[:, a * chunk:(a + 1) * chunk]) for a in range(per))
            accs, _, _ = lax.fori_loop(0, 4, step, (accs, k, v))
            return jnp.concatenate([done(a) for a in accs], axis=1)

        f = jax.shard_map(body, mesh=m, in_specs=(sp,) * 3, out_specs=sp, check_vma=False)
        rng = np.random.default_rng(0)
        args = tuple(jax.device_put(rng.standard_normal((B, S, D)).astype(np.float32), NamedSharding(m, sp))
                     for _ in range(3))
        return f, args
    return build


# ---------------------------------------------------------------------------------------------------------------
# Rings of other shapes, and common kernels of published code.


def shifted_ring(shift, steps, cp=8):
    """Blocks sent `shift` devices along at each hop, for `steps` hops (shift 3: one cycle through all 8; shift
    2: two cycles of 4, so a device sees every other block: a dilated attention)."""
    def make(_cp=8):
        def body(q, k, v):
            n = q.shape[1]
            me = lax.axis_index("cp")
            q_pos = me * n + jnp.arange(n)

            def step(i, carry):
                acc, k, v = carry
                k_pos = ((me - shift * i) % cp) * n + jnp.arange(n)
                s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
                return online(acc, s, v), lax.ppermute(k, "cp", ring(cp, shift)), lax.ppermute(v, "cp", ring(cp, shift))

            acc, _, _ = lax.fori_loop(0, steps, step, (start(q), k, v))
            return done(acc)
        return body
    return make


def hardcoded_ring_size(cp_written=4):
    """MUST REFUSE: the kernel written for cp = 4 run on 8 devices (a ring of 8 permutes, 4 hops, positions of
    blocks modulo 4): half the keys are left behind."""
    def make(cp=8):
        def body(q, k, v):
            n = q.shape[1]
            me = lax.axis_index("cp")
            q_pos = me * n + jnp.arange(n)

            def step(i, carry):
                acc, k, v = carry
                k_pos = ((me - i) % cp_written) * n + jnp.arange(n)
                s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
                return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

            acc, _, _ = lax.fori_loop(0, cp_written, step, (start(q), k, v))
            return done(acc)
        return body
    return make


def twice_around(cp=8):
    """Every block merged twice (2 cp hops): the softmax is unchanged by counting each key twice."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(i, carry):
            acc, k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, 2 * cp, step, (start(q), k, v))
        return done(acc)
    return body


def three_cases(cp=8):
    """MUST REFUSE: the kernel many ring-attention codes write: by block index, a block before the device's is
    attended in full, the device's own with a local lower triangle, a later one skipped (lax.switch)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        tri = jnp.tril(jnp.ones((n, n), bool))

        def step(i, carry):
            acc, k, v = carry
            src = (me - i) % cp
            case = jnp.where(src < me, 0, jnp.where(src == me, 1, 2))
            acc = lax.switch(case, [lambda a: online(a, scores(q, k), v),
                                    lambda a: online(a, jnp.where(tri, scores(q, k), NEG), v),
                                    lambda a: a], acc)
            return acc, lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def rope_on_the_fly(cp=8):
    """RoPE angles computed from positions inside the kernel (float), k rotated after it arrives."""
    def body(q, k, v):
        n, d = q.shape[1], q.shape[2]
        me = lax.axis_index("cp")
        inv = 1.0 / (100.0 ** (jnp.arange(d // 2, dtype=jnp.float32) / (d // 2)))

        def rot(x, pos):
            ang = pos.astype(jnp.float32)[:, None] * inv[None, :]
            c, s_ = jnp.cos(ang), jnp.sin(ang)
            x1, x2 = x[..., : d // 2], x[..., d // 2:]
            return jnp.concatenate([x1 * c - x2 * s_, x1 * s_ + x2 * c], axis=-1)

        q_pos = me * n + jnp.arange(n)
        qr = rot(q, q_pos)

        def step(i, carry):
            acc, k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(qr, rot(k, k_pos)), NEG)
            return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


STARTS = np.array([0, 37, 70, 101], np.int32)


def packed_documents(cp=8):
    """Packed sequences: document boundaries passed in (replicated), a token's document counted from its
    position (sum(pos >= starts)), causal within documents."""
    def body(q, k, v, starts):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)
        q_doc = jnp.sum(q_pos[:, None] >= starts[None, :], axis=-1)

        def step(i, carry):
            acc, k, v = carry
            k_pos = ((me - i) % cp) * n + jnp.arange(n)
            k_doc = jnp.sum(k_pos[:, None] >= starts[None, :], axis=-1)
            keep = (q_doc[:, None] == k_doc[None, :]) & (q_pos[:, None] >= k_pos[None, :])
            s = jnp.where(keep, scores(q, k), NEG)
            return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def _packed():
    m = mesh()
    f = jax.shard_map(packed_documents(8), mesh=m, in_specs=(spec(),) * 3 + (P(),), out_specs=spec(),
                      check_vma=False)
    return f, normal(m) + (jax.device_put(STARTS, NamedSharding(m, P())),)


def cross_lengths():
    """Cross attention: q of 128 tokens, k and v of 64 (both on cp), causal by scaled positions."""
    def build():
        m = mesh()

        def body(q, k, v):
            n, nk = q.shape[1], k.shape[1]
            me = lax.axis_index("cp")
            q_pos = me * n + jnp.arange(n)

            def step(i, carry):
                acc, k, v = carry
                k_pos = 2 * (((me - i) % 8) * nk + jnp.arange(nk))
                s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
                return online(acc, s, v), lax.ppermute(k, "cp", ring(8)), lax.ppermute(v, "cp", ring(8))

            acc, _, _ = lax.fori_loop(0, 8, step, (start(q), k, v))
            return done(acc)

        q, = normal(m, n=1)
        k, v = normal(m, n=2, seed=3, shape=(B, 64, D))
        return mapped(body), (q, k, v)
    return build


def pooled_between_layers():
    """Two blockwise causal layers, the second on the sequence pooled by pairs of tokens (S 128 -> 64)."""
    def build():
        attn = mapped(blockwise_chunks(chunk=4)(8))

        def f(q, k, v):
            x = q + attn(q, k, v)
            pool = lambda t: t.reshape(t.shape[0], t.shape[1] // 2, 2, t.shape[2]).mean(axis=2)
            return attn(pool(x), pool(k), pool(v))

        return f, normal(mesh())
    return build


def _auto_blockwise():
    m = jax.make_mesh((8,), ("cp",), axis_types=(jax.sharding.AxisType.Auto,))
    f = jax.shard_map(blockwise_chunks()(8), mesh=m, in_specs=(spec(),) * 3, out_specs=spec(), check_vma=False)
    rng = np.random.default_rng(0)
    args = tuple(jax.device_put(rng.standard_normal((B, S, D)).astype(np.float32), NamedSharding(m, spec()))
                 for _ in range(3))
    return f, args


def shifted_pairs_between_layers():
    """Two blockwise causal layers, between them each token averaged with the next one (a shift by one token);
    Auto axes."""
    def build():
        attn, args = _auto_blockwise()

        def f(q, k, v):
            x = q + attn(q, k, v)
            x = 0.5 * (x + jnp.roll(x, -1, axis=1))
            return attn(x, k, v)

        return f, args
    return build


def operand_read_outside():
    """The region's operand is also read outside it by a cumulative sum over the sequence; Auto axes."""
    def build():
        attn, args = _auto_blockwise()

        def f(q, k, v):
            x = jnp.tanh(q)
            return attn(x, k, v) + jnp.cumsum(x, axis=1) / 10.0

        return f, args
    return build


# ---------------------------------------------------------------------------------------------------------------
# Shared jitted helpers and bodies.


@jax.jit
def block_positions(c):
    """A block's 16 positions (a jitted helper: a function the module calls, possibly from several places)."""
    return c * 16 + jnp.arange(16)


def shared_helper():
    """The blockwise-free causal ring with positions from a jitted helper, the helper also called outside the
    region (its result added to the output)."""
    def build():
        m = mesh()

        def body(q, k, v):
            me = lax.axis_index("cp")
            q_pos = block_positions(me)

            def step(i, carry):
                acc, k, v = carry
                k_pos = block_positions((me - i) % 8)
                s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
                return online(acc, s, v), lax.ppermute(k, "cp", ring(8)), lax.ppermute(v, "cp", ring(8))

            acc, _, _ = lax.fori_loop(0, 8, step, (start(q), k, v))
            return done(acc)

        attn = mapped(body)

        def f(q, k, v):
            outside = block_positions(jnp.int32(2)).astype(jnp.float32)
            return attn(q, k, v) + outside.sum() / 1000.0

        return f, normal(m)
    return build


@jax.jit
def _jitted_causal(q, k, v):
    return _causal(8)(q, k, v)


def shared_body_one_refused():
    """One jitted causal ring body called by two ring regions; the second also scales its queries by the device
    coordinate (refused), the first is proved."""
    def build():
        m = mesh()
        a = mapped(lambda q, k, v: _jitted_causal(q, k, v))

        def refused(q, k, v):
            me = lax.axis_index("cp")
            return _jitted_causal(jnp.where(me < 2, 1.5 * q, q), k, v)

        b = mapped(refused)

        def f(q, k, v):
            x = q + a(q, k, v)
            return x + b(x, k, v)

        return f, normal(m)
    return build


def data_trip_count():
    """The ring's trip count read from a replicated argument (8) by a while_loop."""
    def build():
        m = mesh()

        def body(q, k, v, steps):
            n = q.shape[1]
            me = lax.axis_index("cp")
            q_pos = me * n + jnp.arange(n)

            def step(carry):
                i, acc, k, v = carry
                k_pos = ((me - i) % 8) * n + jnp.arange(n)
                s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
                return i + 1, online(acc, s, v), lax.ppermute(k, "cp", ring(8)), lax.ppermute(v, "cp", ring(8))

            _, acc, _, _ = lax.while_loop(lambda c: c[0] < steps, step, (jnp.int32(0), start(q), k, v))
            return done(acc)

        f = jax.shard_map(body, mesh=m, in_specs=(spec(),) * 3 + (P(),), out_specs=spec(), check_vma=False)
        return f, normal(m) + (jax.device_put(np.int32(8), NamedSharding(m, P())),)
    return build


# ---------------------------------------------------------------------------------------------------------------
# Per-position tables sharded like the sequence, and wrapping integer positions.


def _rope_rows(d=D):
    half = d // 2
    ang = np.arange(S)[:, None] * (1.0 / 100.0 ** (np.arange(half) / half))[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def sharded_rope_tables():
    """cos / sin rows [S, D / 2] sharded on cp like the tokens: q and k rotated by their local rows before the
    ring (the rotated k travels)."""
    def build():
        m = mesh()

        def body(q, k, v, cos, sin):
            def rot(x):
                h = x.shape[-1] // 2
                return jnp.concatenate([x[..., :h] * cos - x[..., h:] * sin, x[..., :h] * sin + x[..., h:] * cos], -1)
            return _causal(8)(rot(q), rot(k), v)

        f = jax.shard_map(body, mesh=m, in_specs=(spec(),) * 3 + (P("cp", None),) * 2, out_specs=spec(),
                          check_vma=False)
        tables = tuple(jax.device_put(t, NamedSharding(m, P("cp", None))) for t in _rope_rows())
        return f, normal(m) + tables
    return build


def sharded_bias_table():
    """A learned [S, S] bias (query row, key column) sharded on its rows like the queries, its columns gathered by
    the visiting block's key positions."""
    def build():
        m = mesh()

        def body(q, k, v, table):
            n = q.shape[1]
            me = lax.axis_index("cp")
            q_pos = me * n + jnp.arange(n)

            def step(i, carry):
                acc, k, v = carry
                k_pos = ((me - i) % 8) * n + jnp.arange(n)
                s = scores(q, k) + table[:, k_pos][None]
                s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)
                return online(acc, s, v), lax.ppermute(k, "cp", ring(8)), lax.ppermute(v, "cp", ring(8))

            acc, _, _ = lax.fori_loop(0, 8, step, (start(q), k, v))
            return done(acc)

        f = jax.shard_map(body, mesh=m, in_specs=(spec(),) * 3 + (P("cp", None),), out_specs=spec(),
                          check_vma=False)
        table = jax.device_put(np.random.default_rng(9).standard_normal((S, S)).astype(np.float32),
                               NamedSharding(m, P("cp", None)))
        return f, normal(m) + (table,)
    return build


def int8_doubled_positions(cp=8):
    """Positions in int8 (0..127 fit), doubled in int8 (they wrap past 63), causal by the wrapped values."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = (me * n + jnp.arange(n)).astype(jnp.int8) * jnp.int8(2)

        def step(i, carry):
            acc, k, v = carry
            k_pos = (((me - i) % cp) * n + jnp.arange(n)).astype(jnp.int8) * jnp.int8(2)
            s = jnp.where(q_pos[:, None] >= k_pos[None, :], scores(q, k), NEG)
            return online(acc, s, v), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

        acc, _, _ = lax.fori_loop(0, cp, step, (start(q), k, v))
        return done(acc)
    return body


def q_ring_blockwise(chunk=8):
    """q and its accumulators travel (k, v stay), chunk pairs skipped by lax.cond on their positions."""
    def make(cp=8):
        def body(q, k, v):
            n = q.shape[1]
            me = lax.axis_index("cp")
            per = n // chunk

            def step(i, carry):
                q, accs = carry
                src = (me - i) % cp
                new = []
                for a in range(per):
                    acc = accs[a]
                    qa = q[:, a * chunk:(a + 1) * chunk]
                    qp = src * n + a * chunk + jnp.arange(chunk)
                    for b in range(per):
                        kp = me * n + b * chunk + jnp.arange(chunk)
                        kb, vb = k[:, b * chunk:(b + 1) * chunk], v[:, b * chunk:(b + 1) * chunk]

                        def run(acc, qa=qa, kb=kb, vb=vb, qp=qp, kp=kp):
                            return online(acc, jnp.where(qp[:, None] >= kp[None, :], scores(qa, kb), NEG), vb)

                        acc = lax.cond(kp[0] <= qp[-1], run, lambda x: x, acc)
                    new.append(acc)
                send = lambda t: lax.ppermute(t, "cp", ring(cp))
                return send(q), jax.tree.map(send, tuple(new))

            accs = tuple(start(q[:, a * chunk:(a + 1) * chunk]) for a in range(per))
            _, accs = lax.fori_loop(0, cp, step, (q, accs))
            return jnp.concatenate([done(a) for a in accs], axis=1)
        return body
    return make


def blockwise_three_cases(local_tril=False, chunk=8):
    """Flash-attention style chunk pairs: lax.switch by the chunks' positions between a full tile (every key
    before every query), a masked tile (the diagonal) and a skip. `local_tril`: the diagonal tile masked by a
    lower triangle of local indices (right where the two chunks start at the same position)."""
    def make(cp=8):
        def body(q, k, v):
            n = q.shape[1]
            me = lax.axis_index("cp")
            per = n // chunk
            tri = jnp.tril(jnp.ones((chunk, chunk), bool))

            def step(i, carry):
                accs, k, v = carry
                src = (me - i) % cp
                new = []
                for a in range(per):
                    acc = accs[a]
                    qa = q[:, a * chunk:(a + 1) * chunk]
                    qp = me * n + a * chunk + jnp.arange(chunk)
                    for b in range(per):
                        kp = src * n + b * chunk + jnp.arange(chunk)
                        kb, vb = k[:, b * chunk:(b + 1) * chunk], v[:, b * chunk:(b + 1) * chunk]

                        def full(acc, qa=qa, kb=kb, vb=vb):
                            return online(acc, scores(qa, kb), vb)

                        def masked(acc, qa=qa, kb=kb, vb=vb, qp=qp, kp=kp):
                            keep = tri if local_tril else qp[:, None] >= kp[None, :]
                            return online(acc, jnp.where(keep, scores(qa, kb), NEG), vb)

                        case = jnp.where(kp[-1] <= qp[0], 0, jnp.where(kp[0] > qp[-1], 2, 1))
                        acc = lax.switch(case, [full, masked, lambda x: x], acc)
                    new.append(acc)
                return tuple(new), lax.ppermute(k, "cp", ring(cp)), lax.ppermute(v, "cp", ring(cp))

            accs = tuple(start(q[:, a * chunk:(a + 1) * chunk]) for a in range(per))
            accs, _, _ = lax.fori_loop(0, cp, step, (accs, k, v))
            return jnp.concatenate([done(a) for a in accs], axis=1)
        return body
    return make


def ring_in_cond():
    """Two ring regions in the branches of a lax.cond on a replicated flag: the blockwise causal kernel and the
    coordinate-scaled (refused) one."""
    def build():
        m = mesh()
        a = mapped(blockwise_chunks()(8))
        b = mapped(coordinate_temperature(8))

        def f(q, k, v, flag):
            return lax.cond(flag > 0, a, b, q, k, v)

        return f, normal(m) + (jax.device_put(np.int32(1), NamedSharding(m, P())),)
    return build


def remat_whole_layer():
    """The whole blockwise ring layer under jax.checkpoint (the backward recomputes the forward region)."""
    def build():
        attn = jax.checkpoint(mapped(blockwise_chunks()(8)))

        def f(q, k, v):
            return attn(jnp.tanh(q), k, v) * 2.0

        return f, normal(mesh())
    return build


def partial_manual_explicit():
    """jax.shard_map manual over cp only (axis_names={"cp"}) on Explicit dp=2 x cp=4, the blockwise kernel, dp
    left to the partitioner."""
    def build():
        m = jax.make_mesh((2, 4), ("dp", "cp"))
        f = jax.shard_map(blockwise_chunks()(4), mesh=m, in_specs=(P(None, "cp", None),) * 3,
                          out_specs=P(None, "cp", None), axis_names={"cp"}, check_vma=False)
        rng = np.random.default_rng(0)
        args = tuple(jax.device_put(rng.standard_normal((B, 64, D)).astype(np.float32),
                                    NamedSharding(m, P("dp", "cp", None))) for _ in range(3))
        return f, args
    return build


# ---------------------------------------------------------------------------------------------------------------
# The registry.


def _seq(make, kind="cp8"):
    return plain(make(8 if kind == "cp8" else 4), kind)


def _data_positions():
    m = mesh()
    pos = seq_ints(m, np.arange(S))
    return mapped(positions_float_data(8), n_int=2), normal(m) + (pos, pos)


def _documents():
    m = mesh()
    seg = seq_ints(m, np.repeat(np.arange(4), [27, 40, 37, 24]))
    return mapped(mask_documents(8), n_int=1), normal(m) + (seg,)


def _bf16():
    m = mesh()
    return mapped(bf16_inputs(8)), normal(m, dtype=jnp.bfloat16)


AUDIT: dict[str, Audit] = {
    "q-ring-causal": Audit(_seq(q_ring), "ring passes q and the accumulator (k, v stay)", grad=True),
    "bidirectional-unrolled": Audit(_seq(bidirectional_unrolled), "two opposite rings, cp/2 hops, unrolled",
                                    grad=True),
    "stacked-kv": Audit(_seq(stacked_kv), "k and v as one stacked array", grad=True),
    "positions-uint32": Audit(_seq(positions_uint32), "positions in uint32"),
    "positions-broadcasted-iota": Audit(_seq(positions_broadcasted_iota), "2D broadcasted_iota / broadcast_to"),
    "positions-float-data": Audit(_data_positions, "position ids passed in, float32, carried with k", grad=True),
    "positions-carried": Audit(_seq(positions_carried), "positions from axis_index ppermuted in the carry"),
    "mask-tril-offset": Audit(_seq(mask_tril_offset), "tril of the tile shifted by (me - src) * n"),
    "mask-neg-inf-unguarded": Audit(_seq(mask_value(-jnp.inf)), "where(..., -inf), -inf start, no guard"),
    "mask-neg-inf-guarded": Audit(_seq(mask_value(-jnp.inf, guarded=True)), "where(..., -inf), guarded shift",
                                  grad=True),
    "mask-neg-1e9": Audit(_seq(mask_value(-1e9)), "where(..., -1e9), -inf start"),
    "mask-after-exp": Audit(_seq(mask_after_exp), "p multiplied by the mask after exp", grad=True),
    "mask-documents": Audit(_documents, "segment ids passed in, difference == 0, and causal"),
    "mask-window-abs": Audit(_seq(mask_window_abs()), "causal + window as one |2d - (w-1)| <= w-1"),
    "mask-modulo-12": Audit(_seq(mask_modulo()), "positions modulo 12 (not dividing a unit)"),
    "cond-skip-block-extremes": Audit(_seq(cond_skip_by_block_extremes), "lax.cond on first key > last query",
                                      grad=True),
    "blockwise-chunks": Audit(_seq(blockwise_chunks()), "fori ring, Python chunk loops, lax.cond skips",
                              grad=True),
    "blockwise-chunks-window": Audit(_seq(blockwise_chunks(window=20)), "as above with a window of 20"),
    "blockwise-remat": Audit(_seq(blockwise_chunks(remat=True)), "the blockwise step under jax.checkpoint",
                             grad=True),
    "lse-carry": Audit(_seq(lse_carry), "log-sum-exp carry, output rescaled by exp(lse - new)"),
    "lax-max-normalised": Audit(_seq(lax_max_normalised), "lax.max, normalised every step", grad=True),
    "bf16-inputs": Audit(_bf16, "bf16 q, k, v, float32 state", bf16=True),
    "remat-step": Audit(_seq(remat_step), "fori step under jax.checkpoint", grad=True),
    "vmap-heads": Audit(vmap_heads(), "jax.vmap over heads outside the shard_map"),
    "two-ring-layers": Audit(two_ring_layers(), "q-ring then blockwise window ring", grad=True),
    "scan-over-layers": Audit(scan_over_layers(), "blockwise ring inside lax.scan over layers", grad=True),
    "check-vma": Audit(checked_vma(), "shard_map(check_vma=True)"),
    "ring-first-axis": Audit(ring_on_first_axis(), "mesh (2, 4) ('cp', 'dp'), cp = 2"),
    "auto-axes-q-ring": Audit(auto_axes_dp_cp(), "Auto axes dp=2 x cp=4, q-passing ring"),
    "pos-reversed-iota": Audit(_seq(custom_positions(_reversed)), "positions c*n + (n-1-j) (reversed in a block)"),
    "pos-stride20-window24": Audit(_seq(custom_positions(_stride20, window=24)), "positions c*20 + j, window 24"),
    "pos-plus-coordinate-window20": Audit(_seq(custom_positions(_plus_coordinate, window=20)),
                                          "positions c*n + j + c, window 20"),
    "pos-global-dynamic-slice": Audit(_seq(custom_positions(_global_slice, window=20)),
                                      "dynamic_slice of a global arange at c*n, window 20", grad=True),
    "pos-table-row": Audit(_seq(custom_positions(_table_row, window=20)), "arange(S).reshape(cp, n)[c]"),
    "pos-cumsum-ones": Audit(_seq(custom_positions(_cumsum, window=20)), "c*n + cumsum(ones) - 1"),
    "pos-doubled-window40": Audit(_seq(custom_positions(_doubled, window=40)), "2 * (c*n + j), window 40"),
    "pos-float-iota-window20": Audit(_seq(custom_positions(_float_iota, window=20)), "float iota + c*n"),
    "pos-uint32-wrapping-window20": Audit(_seq(custom_positions(lambda c, n, cp: c * n + jnp.arange(n), window=20,
                                                                dtype=jnp.uint32)),
                                          "uint32 positions, window as (q - k) < 20 wrapping"),
    "pos-int16-window20": Audit(_seq(custom_positions(lambda c, n, cp: c * n + jnp.arange(n), window=20,
                                                      dtype=jnp.int16)), "int16 positions, window 20"),
    "send-first": Audit(_seq(send_first), "own block first; send then merge; fori_loop(1, cp)", grad=True),
    "blockwise-n24-chunk8": Audit(causal_big_block(), "24 tokens a device, chunks of 8 (straddling)"),
    "refuse-cond-skip-by-hop": Audit(_seq(cond_skip_by_hop), "lax.cond(i > me) skip", refuse=True),
    "refuse-first-token-of-block": Audit(_seq(first_token_of_block), "adds v[:, :1]", refuse=True),
    "refuse-block-mean-bias": Audit(_seq(block_mean_bias), "per-block mean of k as a bias", refuse=True),
    "layout-k-transposed": Audit(kv_transposed(), "k passed as [B, D, S], P(None, None, 'cp')", grad=True),
    "layout-out-transposed": Audit(out_transposed(), "result [B, D, n], out_specs P(None, None, 'cp')"),
    "layout-out-flattened": Audit(out_flattened(), "result [B, n*D], out_specs P(None, 'cp')"),
    "layout-q-flattened": Audit(in_flattened(), "q passed as [B, S*D], P(None, 'cp')"),
    "layout-out-all-gathered": Audit(out_all_gathered(), "all_gather(tiled) of the result, out_specs P()"),
    "layout-psum-position-weights": Audit(out_psum_position_weights(), "psum of sum(o * global position)"),
    "layout-seq-on-cp-dp": Audit(seq_on_two_axes(), "sequence on ('cp', 'dp'), ring over cp"),
    "layout-seq-on-cp-dp-blockwise": Audit(seq_on_two_axes_blockwise(), "same, blockwise chunk skips"),
    "refuse-psum-local-weights": Audit(out_psum_local_weights(), "psum of sum(o * arange(n))", refuse=True),
    "ring-shift3": Audit(_seq(shifted_ring(3, 8)), "blocks sent 3 devices along (one 8-cycle)"),
    "ring-twice-around": Audit(_seq(twice_around), "2 cp hops: every key merged twice"),
    "rope-on-the-fly": Audit(_seq(rope_on_the_fly), "RoPE angles from positions inside the kernel", grad=True),
    "packed-documents": Audit(_packed, "document of a token = sum(pos >= starts), starts replicated"),
    "cross-lengths": Audit(cross_lengths(), "q 128 tokens, k/v 64 tokens, both on cp"),
    "pooled-between-layers": Audit(pooled_between_layers(), "two blockwise layers, pooled 128 -> 64 between",
                                   grad=True),
    "shifted-pairs-between-layers": Audit(shifted_pairs_between_layers(), "two blockwise layers, roll by one between",
                                          grad=True),
    "operand-read-outside": Audit(operand_read_outside(), "operand also cumsum-ed outside the region", grad=True),
    "refuse-dilated-ring-shift2": Audit(_seq(shifted_ring(2, 4)), "shift 2: two 4-cycles, every other block",
                                        refuse=True),
    "refuse-hardcoded-cp4": Audit(_seq(hardcoded_ring_size()), "kernel for cp=4 on 8 devices", refuse=True),
    "refuse-three-cases": Audit(_seq(three_cases), "lax.switch on src <, ==, > me; local tril", refuse=True),
    "shared-jitted-helper": Audit(shared_helper(), "positions from a jitted helper also called outside"),
    "shared-body-one-refused": Audit(shared_body_one_refused(), "one jitted body in two regions, one refused"),
    "data-trip-count": Audit(data_trip_count(), "while_loop bound read from a replicated argument"),
    "sharded-rope-tables": Audit(sharded_rope_tables(), "cos/sin [S, D/2] sharded on cp, k pre-rotated"),
    "sharded-bias-table": Audit(sharded_bias_table(), "[S, S] bias sharded on rows, columns by k positions"),
    "int8-doubled-positions": Audit(_seq(int8_doubled_positions), "int8 positions doubled (wrapping)"),
    "q-ring-blockwise": Audit(_seq(q_ring_blockwise()), "q and accumulators travel, chunk skips by lax.cond"),
    "blockwise-three-cases": Audit(_seq(blockwise_three_cases()), "lax.switch full / masked / skip by chunk positions"),
    "blockwise-three-cases-local-tril": Audit(_seq(blockwise_three_cases(local_tril=True)),
                                              "same, the diagonal tile masked by a local tril"),
    "ring-in-cond": Audit(ring_in_cond(), "two ring regions in lax.cond branches, one refused"),
    "remat-whole-layer": Audit(remat_whole_layer(), "the whole ring layer under jax.checkpoint", grad=True),
    "partial-manual-explicit": Audit(partial_manual_explicit(), "axis_names={'cp'} on Explicit dp x cp"),
    # must be left alone
    "refuse-cumsum-across-devices": Audit(_seq(cumsum_across_devices), "cumulative sum over the sequence",
                                          refuse=True),
    "refuse-dropout-fold-in-device": Audit(_seq(dropout_fold_in_device), "dropout keyed by fold_in(axis_index)",
                                           refuse=True),
    "refuse-first-block-max": Audit(_seq(first_block_max), "first block's max kept and output", refuse=True),
    "refuse-coordinate-temperature": Audit(_seq(coordinate_temperature), "axis_index < 2 scales scores",
                                           refuse=True),
    "refuse-local-partial-kept": Audit(_seq(local_partial_kept), "own block's partial added to the output",
                                       refuse=True),
    "refuse-local-partial-only": Audit(_seq(local_partial_only), "only step 0's partial returned", refuse=True),
    "refuse-cond-skip-block-index": Audit(_seq(cond_skip_by_block_index), "lax.cond on src > me", refuse=True,
                                          grad=True),
}
