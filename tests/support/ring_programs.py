"""Ring programs as users write them (shard_map + ppermute loops), for the soundness suite: each either keeps its
results under a reorder of the sequence (and ring-reorder may rewrite it) or does not (and it must be refused).

Every builder takes a mesh with axes ("dp", "cp") and returns (function, example arguments, expectation), the
arguments sharded batch-on-dp, sequence-on-cp. The expectation is one outcome for every strategy, or a dict from
strategy to outcome: "reorder" (proved and rewritten), "refuse" (must not be rewritten: the reorder would change
its results), "unfit" (safe, but the strategy's layout doesn't fit the sequence length, so it is left alone).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

NEG = -1e30
SEQ = P("dp", "cp")


STRATEGIES = ("zigzag", "striped")


def expected(expectation: str | dict, strategy: str) -> str:
    """The outcome a builder's expectation states for one strategy."""
    return expectation if isinstance(expectation, str) else expectation[strategy]


def _ring(cp, direction=1):
    return [(i, (i + direction) % cp) for i in range(cp)]


def _arrays(mesh, length: int, *shapes, seed: int = 0, ints: int = 0):
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal((2, length) + s).astype(np.float32) for s in shapes]
    out += [np.broadcast_to(np.arange(length, dtype=np.int32), (2, length)).copy() for _ in range(ints)]
    return tuple(jax.device_put(x, NamedSharding(mesh, SEQ)) for x in out)


def _map(mesh, body, n_in: int, out_specs=SEQ, **kwargs):
    return jax.shard_map(body, mesh=mesh, in_specs=(SEQ,) * n_in, out_specs=out_specs, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Attention that keeps its results under a reorder.


def _block_attention(q, k, v, q_pos, k_pos):
    s = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    s = jnp.where(q_pos[:, :, None] >= k_pos[:, None, :], s, NEG)
    m = jnp.max(s, axis=-1)
    p = jnp.exp(s - m[..., None])
    return m, jnp.sum(p, axis=-1), jnp.einsum("bqk,bkd->bqd", p, v)


def _merge(acc, blk):
    m0, l0, o0 = acc
    m1, l1, o1 = blk
    m = jnp.maximum(m0, m1)
    a0, a1 = jnp.exp(m0 - m), jnp.exp(m1 - m)
    return m, l0 * a0 + l1 * a1, o0 * a0[..., None] + o1 * a1[..., None]


def _init(q):
    zero = q[..., 0] * 0
    return zero + NEG, zero, q * 0


def position_attention(mesh):
    """Causal mask from position ids that travel with k and v."""
    cp = mesh.shape["cp"]

    def body(q, k, v, q_pos, k_pos):
        def step(_, carry):
            acc, k, v, k_pos = carry
            acc = _merge(acc, _block_attention(q, k, v, q_pos, k_pos))
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v, k_pos))
        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (_init(q), k, v, k_pos))
        return o / l[..., None]

    return _map(mesh, body, 5), _arrays(mesh, 8 * cp, (8,), (8,), (8,), ints=2), "reorder"


def axis_index_attention(mesh):
    """Positions computed from the device index: the position reads get rewritten."""
    cp = mesh.shape["cp"]

    def body(q, k, v):
        n = q.shape[1]
        me = jax.lax.axis_index("cp")
        q_pos = jnp.broadcast_to(me * n + jnp.arange(n), q.shape[:2])

        def step(s, carry):
            acc, k, v = carry
            k_pos = jnp.broadcast_to(((me - s) % cp) * n + jnp.arange(n), q.shape[:2])
            acc = _merge(acc, _block_attention(q, k, v, q_pos, k_pos))
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v))
        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (_init(q), k, v))
        return o / l[..., None]

    return _map(mesh, body, 3), _arrays(mesh, 8 * cp, (8,), (8,), (8,)), "reorder"


def position_difference_attention(mesh):
    """Masks and biases computed from positions by arithmetic: a sliding window (`q - k < w`), ALiBi
    (`slope * (q - k)`), Llama-4 chunks (`q // c == k // c`) and a prefix (`k < p`), positions from axis_index.
    Each is a function of the two tokens' positions, right once the positions are."""
    cp = mesh.shape["cp"]

    def body(q, k, v):
        n = q.shape[1]
        me = jax.lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)

        def step(s, carry):
            acc, k, v = carry
            k_pos = ((me - s) % cp) * n + jnp.arange(n)
            qp, kp = q_pos[:, None], k_pos[None, :]
            keep = ((qp >= kp) & (qp - kp < 12) & (qp // 8 == kp // 8)) | (kp < 3)
            sc = jnp.einsum("bqd,bkd->bqk", q, k) - 0.25 * (qp - kp).astype(jnp.float32)
            sc = jnp.where(keep, sc, NEG)
            m = jnp.max(sc, axis=-1)
            p = jnp.exp(sc - m[..., None])
            acc = _merge(acc, (m, jnp.sum(p, axis=-1), jnp.einsum("bqk,bkd->bqd", p, v)))
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v))
        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (_init(q), k, v))
        return o / l[..., None]

    return _map(mesh, body, 3), _arrays(mesh, 8 * cp, (8,), (8,), (8,)), "reorder"


def _guarded_step(q, k, v, q_pos, k_pos, acc):
    """One block folded in with -inf masks and the flash kernels' guard: a row that has seen no key yet has
    max -inf and is shifted by 0 instead."""
    m0, l0, o0 = acc
    s = jnp.einsum("bqd,bkd->bqk", q, k)
    s = jnp.where(q_pos[:, :, None] >= k_pos[:, None, :], s, -jnp.inf)
    m_blk = jnp.max(s, axis=-1)
    m = jnp.maximum(m0, m_blk)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m_safe[..., None])
    corr = jnp.exp(m0 - m_safe)
    return (m, l0 * corr + jnp.sum(p, axis=-1), o0 * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v)), m_blk


def guarded_attention(mesh):
    """Causal attention whose merge is guarded against rows with every key masked so far (`m_safe`)."""
    cp = mesh.shape["cp"]

    def body(q, k, v, q_pos, k_pos):
        def step(_, carry):
            acc, k, v, k_pos = carry
            acc, _ = _guarded_step(q, k, v, q_pos, k_pos, acc)
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v, k_pos))
        m0 = jnp.full(q.shape[:2], -jnp.inf) + q[..., 0] * 0
        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, ((m0, m0 * 0, q * 0), k, v, k_pos))
        return o / l[..., None]

    return _map(mesh, body, 5), _arrays(mesh, 8 * cp, (8,), (8,), (8,), ints=2), "reorder"


def first_block_max(mesh):
    """The same, also keeping the maximum of the first block that had a visible key (a guard that picks a block,
    not a function of the merge state): which block comes first depends on the order."""
    cp = mesh.shape["cp"]

    def body(q, k, v, q_pos, k_pos):
        def step(_, carry):
            acc, first, k, v, k_pos = carry
            acc, m_blk = _guarded_step(q, k, v, q_pos, k_pos, acc)
            first = jnp.where(jnp.isfinite(first), first, m_blk)
            return (acc, first) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v, k_pos))
        m0 = jnp.full(q.shape[:2], -jnp.inf) + q[..., 0] * 0
        (m, l, o), first, *_ = jax.lax.fori_loop(0, cp, step, ((m0, m0 * 0, q * 0), m0, k, v, k_pos))
        return o / l[..., None] + first[..., None]

    return _map(mesh, body, 5), _arrays(mesh, 8 * cp, (8,), (8,), (8,), ints=2), "refuse"


def _rope_table(length: int, dim: int):
    angles = np.arange(length)[:, None] * (1.0 / 100.0 ** (np.arange(dim // 2) / (dim // 2)))[None, :]
    return jnp.asarray(np.cos(angles), jnp.float32), jnp.asarray(np.sin(angles), jnp.float32)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return jnp.concatenate([x[..., :half] * cos - x[..., half:] * sin, x[..., :half] * sin + x[..., half:] * cos],
                           axis=-1)


def rope_table_attention(mesh):
    """RoPE from a precomputed cos/sin table gathered by each token's position (from axis_index), on q and on
    each visiting block's keys."""
    cp = mesh.shape["cp"]

    def body(q, k, v):
        n = q.shape[1]
        cos, sin = _rope_table(n * cp, q.shape[-1])
        me = jax.lax.axis_index("cp")
        q_pos = me * n + jnp.arange(n)
        qr = _rotate(q, cos[q_pos], sin[q_pos])

        def step(s, carry):
            acc, k, v = carry
            k_pos = ((me - s) % cp) * n + jnp.arange(n)
            kr = _rotate(k, cos[k_pos], sin[k_pos])
            b = q.shape[0]
            acc = _merge(acc, _block_attention(qr, kr, v, jnp.broadcast_to(q_pos, (b, n)),
                                               jnp.broadcast_to(k_pos, (b, n))))
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v))
        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (_init(q), k, v))
        return o / l[..., None]

    return _map(mesh, body, 3), _arrays(mesh, 8 * cp, (8,), (8,), (8,)), "reorder"


def gather_tokens_by_position(mesh):
    """Keys of the own block picked by a position-derived index (`k[:, pos % n]`): an index into token data, so
    which token is picked depends on where tokens sit."""
    cp = mesh.shape["cp"]

    def body(x, k):
        n = x.shape[1]
        me = jax.lax.axis_index("cp")
        picked = x[:, (me * n + jnp.arange(n) + 1) % n]
        return picked + _ring_total(k, cp)

    return _map(mesh, body, 2), _arrays(mesh, 16, (4,), (4,)), "refuse"


def _segment_ids(mesh, length: int):
    ids = np.broadcast_to(np.repeat(np.arange(3), [length // 2 - 3, 5, length // 2 - 2]), (2, length))
    return jax.device_put(ids.astype(np.int32).copy(), NamedSharding(mesh, P("dp", None)))


def _segment_attention(mesh, piece: int):
    """Causal attention within documents, the segment ids passed whole (as LWM passes them) and sliced at each
    block's global position, `piece` tokens a slice."""
    cp = mesh.shape["cp"]

    def body(q, k, v, ids):
        n = q.shape[1]
        me = jax.lax.axis_index("cp")

        def ids_of(c):
            return jnp.concatenate([jax.lax.dynamic_slice(ids, (0, c * n + j), (ids.shape[0], piece))
                                    for j in range(0, n, piece)], axis=1)

        q_pos, q_ids = jnp.broadcast_to(me * n + jnp.arange(n), q.shape[:2]), ids_of(me)

        def step(s, carry):
            acc, k, v = carry
            src = (me - s) % cp
            k_pos, k_ids = jnp.broadcast_to(src * n + jnp.arange(n), q.shape[:2]), ids_of(src)
            same = q_ids[:, :, None] == k_ids[:, None, :]
            sc = jnp.where(same, jnp.einsum("bqd,bkd->bqk", q, k), NEG)
            sc = jnp.where(q_pos[:, :, None] >= k_pos[:, None, :], sc, NEG)
            m = jnp.max(sc, axis=-1)
            p = jnp.exp(sc - m[..., None])
            acc = _merge(acc, (m, jnp.sum(p, axis=-1), jnp.einsum("bqk,bkd->bqd", p, v)))
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v))
        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (_init(q), k, v))
        return o / l[..., None]

    fn = jax.shard_map(body, mesh=mesh, in_specs=(SEQ,) * 3 + (P("dp", None),), out_specs=SEQ, check_vma=False)
    return fn, _arrays(mesh, 8 * cp, (8,), (8,), (8,)) + (_segment_ids(mesh, 8 * cp),)


def segment_table_attention(mesh):
    """Segment ids sliced in runs of 4 tokens (half a zigzag chunk): each run stays whole (striped would need
    stripes of 4, which 32 tokens over 4 devices can't deal round-robin)."""
    return _segment_attention(mesh, 4) + ({"zigzag": "reorder", "striped": "unfit"},)


def segment_table_whole_block(mesh):
    """The same ids sliced a whole block at a time: after a reorder a block's tokens are not one run of
    positions, so the slice would pick other tokens' ids."""
    return _segment_attention(mesh, 8) + ({"zigzag": "refuse", "striped": "unfit"},)


def scan_chunk_attention(mesh, chunk: int = 4):
    """A blockwise kernel: lax.scan over ring steps, an inner scan over key chunks, a (query chunk, key chunk)
    pair skipped with lax.cond when every key of it lies after every query (positions from axis_index). Striped
    needs stripes of whole 4-token chunks, which 32 tokens over 4 devices can't deal round-robin."""
    cp = mesh.shape["cp"]

    def body(q, k, v):
        b, n, d = q.shape
        nq = nk = n // chunk
        me = jax.lax.axis_index("cp")
        qc = q.reshape(b, nq, chunk, d).swapaxes(0, 1)

        def ring_step(carry, s):
            acc, k, v = carry
            src = (me - s) % cp
            kc, vc = (t.reshape(b, nk, chunk, d).swapaxes(0, 1) for t in (k, v))

            def q_chunk(i, acc_i, qi):
                def kv_chunk(acc_i, xs):
                    kj, vj, j = xs
                    q_first = me * n + i * chunk
                    k_first = src * n + j * chunk
                    q_pos = jnp.broadcast_to(q_first + jnp.arange(chunk), (b, chunk))
                    k_pos = jnp.broadcast_to(k_first + jnp.arange(chunk), (b, chunk))
                    live = q_first + chunk - 1 >= k_first
                    acc_i = jax.lax.cond(live, lambda a: _merge(a, _block_attention(qi, kj, vj, q_pos, k_pos)),
                                         lambda a: a, acc_i)
                    return acc_i, None
                acc_i, _ = jax.lax.scan(kv_chunk, acc_i, (kc, vc, jnp.arange(nk)))
                return acc_i

            m, l, o = acc
            parts = [q_chunk(i, (m[:, i * chunk:(i + 1) * chunk], l[:, i * chunk:(i + 1) * chunk],
                                 o[:, i * chunk:(i + 1) * chunk]), qc[i]) for i in range(nq)]
            acc = tuple(jnp.concatenate([p[t] for p in parts], axis=1) for t in range(3))
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v)), None

        (acc, _, _), _ = jax.lax.scan(ring_step, (_init(q), k, v), jnp.arange(cp))
        m, l, o = acc
        return o / l[..., None]

    return _map(mesh, body, 3, check_vma=False), _arrays(mesh, 8 * cp, (8,), (8,), (8,)), \
        {"zigzag": "reorder", "striped": "unfit"}


def attention_loss(mesh):
    """Position attention whose squared error against targets is summed over the sequence with psum inside the
    region: a number that does not depend on the order of the tokens."""
    cp = mesh.shape["cp"]

    def body(q, k, v, q_pos, k_pos, y):
        def step(_, carry):
            acc, k, v, k_pos = carry
            acc = _merge(acc, _block_attention(q, k, v, q_pos, k_pos))
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v, k_pos))
        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (_init(q), k, v, k_pos))
        return jax.lax.psum(jnp.sum((o / l[..., None] - y) ** 2, axis=(1, 2)), "cp")

    q, k, v, y, pos, pos2 = _arrays(mesh, 8 * cp, (8,), (8,), (8,), (8,), ints=2)
    return _map(mesh, body, 6, out_specs=P("dp")), (q, k, v, pos, pos2, y), "reorder"


# ---------------------------------------------------------------------------------------------------------------
# Rings that don't keep their results under a reorder: refused.


def ring_all_gather(mesh):
    """An all-gather written as a ring: every device ends with the whole sequence, its blocks in device order."""
    cp = mesh.shape["cp"]

    def body(x):
        blocks, cur = [x], x
        for _ in range(cp - 1):
            cur = jax.lax.ppermute(cur, "cp", _ring(cp, -1))
            blocks.append(cur)
        return jnp.concatenate(blocks, axis=1)

    return _map(mesh, body, 1, out_specs=P("dp"), check_vma=False), _arrays(mesh, 16, (4,)), "refuse"


def ring_all_reduce(mesh):
    """x + ppermute(x) + ...: each token added to the tokens at the same place on other devices."""
    cp = mesh.shape["cp"]

    def body(x):
        total, cur = x, x
        for _ in range(cp - 1):
            cur = jax.lax.ppermute(cur, "cp", _ring(cp))
            total = total + cur
        return total

    return _map(mesh, body, 1), _arrays(mesh, 16, (4,)), "refuse"


def ring_reduce_scatter(mesh):
    """A reduce-scatter written with ppermute: the chunk a device adds is chosen by its axis_index."""
    cp = mesh.shape["cp"]

    def body(x):
        n = x.shape[1] // cp
        me = jax.lax.axis_index("cp")
        acc = jax.lax.dynamic_slice_in_dim(x, ((me + 1) % cp) * n, n, axis=1)
        for s in range(2, cp + 1):
            acc = jax.lax.ppermute(acc, "cp", _ring(cp))
            acc = acc + jax.lax.dynamic_slice_in_dim(x, ((me + s) % cp) * n, n, axis=1)
        return jnp.tile(acc, (1, cp, 1))

    return _map(mesh, body, 1), _arrays(mesh, 16, (4,)), "refuse"


def collective_matmul_all_gather(mesh):
    """The all-gather collective matmul of JAX's shard_map documentation (lhs sharded on the contracting dim):
    each step multiplies the visiting lhs block by the rhs rows its device index selects."""
    cp = mesh.shape["cp"]

    def body(x, w):
        n = x.shape[1]
        me = jax.lax.axis_index("cp")

        def step(i, carry):
            out, block = carry
            rows = jax.lax.dynamic_slice_in_dim(w, ((me + i) % cp) * n, n, axis=0)
            out = out + jnp.einsum("bsd,se->bde", block, rows)
            return out, jax.lax.ppermute(block, "cp", _ring(cp, -1))

        out, _ = jax.lax.fori_loop(0, cp, step, (jnp.zeros((x.shape[0], x.shape[2], w.shape[1]), x.dtype), x))
        return out

    x, = _arrays(mesh, 16, (4,))
    w = jax.device_put(np.random.default_rng(1).standard_normal((16, 3)).astype(np.float32),
                       NamedSharding(mesh, P()))
    fn = jax.shard_map(body, mesh=mesh, in_specs=(SEQ, P()), out_specs=P("dp"), check_vma=False)
    return fn, (x, w), "refuse"


def collective_matmul_reduce_scatter(mesh):
    """The reduce-scatter collective matmul: partial results travel and pick up one product per step."""
    cp = mesh.shape["cp"]

    def body(x, w):
        acc = x * w
        for _ in range(cp - 1):
            acc = jax.lax.ppermute(acc, "cp", _ring(cp)) + x * w
        return acc

    return _map(mesh, body, 2), _arrays(mesh, 16, (4,), (4,)), "refuse"


# The collective matmuls of JAX's shard_map documentation, as written there (lhs and rhs sharded on cp, blocks of the
# other operand addressed by the device index): a reorder of the sharded dim would change which block each step
# multiplies, so each must be refused.


def _docs_operands(mesh, lhs_spec, rhs_spec):
    rng = np.random.default_rng(3)
    lhs = jax.device_put(rng.standard_normal((16, 16)).astype(np.float32), NamedSharding(mesh, lhs_spec))
    rhs = jax.device_put(rng.standard_normal((16, 4)).astype(np.float32), NamedSharding(mesh, rhs_spec))
    return lhs, rhs


def docs_matmul_allgather(mesh):
    """All-gather collective matmul: rhs blocks travel, each multiplied by the lhs columns of its source device."""
    def body(lhs_block, rhs_block):
        size, idx = jax.lax.axis_size("cp"), jax.lax.axis_index("cp")
        width = lhs_block.shape[1] // size
        columns = lambda i: jax.lax.dynamic_slice_in_dim(lhs_block, i * width, width, 1)  # noqa: E731
        out = columns(idx) @ rhs_block
        for i in range(1, size):
            rhs_block = jax.lax.ppermute(rhs_block, "cp", _ring(size))
            out += columns((idx - i) % size) @ rhs_block
        return out

    fn = jax.shard_map(body, mesh=mesh, in_specs=(P("cp", None), P("cp", None)), out_specs=P("cp", None))
    return fn, _docs_operands(mesh, P("cp", None), P("cp", None)), "refuse"


def docs_matmul_allgather_bidirectional(mesh):
    """The same with the rhs block split in halves travelling both ways around the ring."""
    def body(lhs_block, rhs_block):
        size, idx = jax.lax.axis_size("cp"), jax.lax.axis_index("cp")
        half = lhs_block.shape[1] // size // 2
        columns = lambda i, hi: jax.lax.dynamic_slice_in_dim(lhs_block, (2 * i + hi) * half, half, 1)  # noqa

        def product(lo, hi, i_lo, i_hi):
            return columns(i_lo, 0) @ lo + columns(i_hi, 1) @ hi

        lo, hi = jnp.split(rhs_block, 2, axis=0)
        out = product(lo, hi, idx, idx)
        for i in range(1, size):
            lo = jax.lax.ppermute(lo, "cp", _ring(size))
            hi = jax.lax.ppermute(hi, "cp", _ring(size, -1))
            out += product(lo, hi, (idx - i) % size, (idx + i) % size)
        return out

    fn = jax.shard_map(body, mesh=mesh, in_specs=(P("cp", None), P("cp", None)), out_specs=P("cp", None))
    return fn, _docs_operands(mesh, P("cp", None), P("cp", None)), "refuse"


def docs_matmul_psum_scatter(mesh):
    """Reduce-scatter collective matmul: partial sums travel and pick up the product for their destination."""
    def body(lhs_block, rhs_block):
        size, idx = jax.lax.axis_size("cp"), jax.lax.axis_index("cp")
        rows = lhs_block.reshape(size, -1, lhs_block.shape[1])
        summand = rows[(idx + 1) % size] @ rhs_block
        for i in range(1, size):
            summand = jax.lax.ppermute(summand, "cp", _ring(size, -1))
            summand += rows[(idx + i + 1) % size] @ rhs_block
        return summand

    fn = jax.shard_map(body, mesh=mesh, in_specs=(P(None, "cp"), P("cp", None)), out_specs=P("cp", None))
    return fn, _docs_operands(mesh, P(None, "cp"), P("cp", None)), "refuse"


def _ring_total(k, cp):
    part = jnp.sum(k, axis=1, keepdims=True)
    total, cur = part, part
    for _ in range(cp - 1):
        cur = jax.lax.ppermute(cur, "cp", _ring(cp))
        total = total + cur
    return total


def block_start_offset(mesh):
    """Every token offset by its block's first position (`axis_index * n`): a position of one fixed token, which
    the reorder changes for the other tokens of the block."""
    cp = mesh.shape["cp"]

    def body(x, k):
        me = jax.lax.axis_index("cp")
        return x + _ring_total(k, cp) + (me * x.shape[1]).astype(jnp.float32)

    return _map(mesh, body, 2), _arrays(mesh, 16, (4,), (4,)), "refuse"


def coordinate_difference(mesh):
    """Each hop weighted by how far its source device is from this one (`me - src`): ring coordinates, not token
    positions."""
    cp = mesh.shape["cp"]

    def body(x, k):
        me = jax.lax.axis_index("cp")
        acc = x
        for s in range(1, cp):
            acc = acc + x * (me - (me - s) % cp).astype(jnp.float32)
        return acc + _ring_total(k, cp)

    return _map(mesh, body, 2), _arrays(mesh, 16, (4,), (4,)), "refuse"


def where_on_a_scalar(mesh):
    """A select on a scalar predicate from the device index (true on every device) and a visiting block's total
    that doesn't count: the result is the device's own tokens."""
    cp = mesh.shape["cp"]

    def body(x):
        visiting = jax.lax.ppermute(x, "cp", _ring(cp))
        return jnp.where(jax.lax.axis_index("cp") >= 0, x, 0.0) + 0.0 * visiting.sum()

    return _map(mesh, body, 1), _arrays(mesh, 16, (4,)), "reorder"


def contracted_ring_dim(mesh):
    """x_block @ w_block with w travelling: the sequence dim is contracted against other devices' blocks."""
    cp = mesh.shape["cp"]

    def body(x, w):
        acc, cur = jnp.zeros(x.shape[:1] + x.shape[2:] * 2, x.dtype), w
        for _ in range(cp):
            acc = acc + jnp.einsum("bsd,bse->bde", x, cur)
            cur = jax.lax.ppermute(cur, "cp", _ring(cp))
        return x + acc.sum(axis=1, keepdims=True)

    return _map(mesh, body, 2), _arrays(mesh, 16, (4,), (4,)), "refuse"


def cumsum_in_ring(mesh):
    """A cumulative sum along the sequence inside a ring."""
    cp = mesh.shape["cp"]

    def body(x, k):
        acc = jnp.cumsum(x, axis=1)
        for _ in range(cp):
            acc = acc + jnp.sum(k, axis=1, keepdims=True)
            k = jax.lax.ppermute(k, "cp", _ring(cp))
        return acc

    return _map(mesh, body, 2), _arrays(mesh, 16, (4,), (4,)), "refuse"


def reverse_in_ring(mesh):
    """Reversing the local sequence inside a ring."""
    cp = mesh.shape["cp"]

    def body(x, k):
        acc = x[:, ::-1]
        for _ in range(cp):
            acc = acc + jnp.sum(k, axis=1, keepdims=True)
            k = jax.lax.ppermute(k, "cp", _ring(cp))
        return acc

    return _map(mesh, body, 2), _arrays(mesh, 16, (4,), (4,)), "refuse"


def coordinate_skip(mesh):
    """A block skipped when its source device comes after this one: right only for the contiguous order."""
    cp = mesh.shape["cp"]

    def body(q, k, v, q_pos, k_pos):
        me = jax.lax.axis_index("cp")

        def step(s, carry):
            acc, k, v, k_pos = carry
            src = (me - s) % cp
            acc = jax.lax.cond(src <= me, lambda a: _merge(a, _block_attention(q, k, v, q_pos, k_pos)),
                               lambda a: a, acc)
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v, k_pos))
        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (_init(q), k, v, k_pos))
        return o / l[..., None]

    return _map(mesh, body, 5, check_vma=False), _arrays(mesh, 8 * cp, (8,), (8,), (8,), ints=2), "refuse"


def gathered_attention(mesh):
    """Keys gathered from every device by the ring, concatenated, then attended with a causal mask over the
    concatenated index (right only when the blocks arrive in sequence order)."""
    cp = mesh.shape["cp"]

    def body(q, k, v):
        n = q.shape[1]
        me = jax.lax.axis_index("cp")
        ks, vs, ck, cv = [k], [v], k, v
        for _ in range(cp - 1):
            ck, cv = (jax.lax.ppermute(t, "cp", _ring(cp, -1)) for t in (ck, cv))
            ks.append(ck)
            vs.append(cv)
        kk, vv = jnp.concatenate(ks, axis=1), jnp.concatenate(vs, axis=1)
        s = jnp.einsum("bqd,bkd->bqk", q, kk)
        visible = jnp.arange(n)[:, None] + me * n >= jnp.arange(n * cp)[None, :]
        s = jnp.where(visible, s, NEG)
        return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), vv)

    return _map(mesh, body, 3), _arrays(mesh, 16, (4,), (4,), (4,)), "refuse"


def attention_then_cumsum(mesh):
    """Attention that would be fine, followed by one order-sensitive op in the same region."""
    fn, args, _ = position_attention(mesh)
    cp = mesh.shape["cp"]

    def body(q, k, v, q_pos, k_pos):
        def step(_, carry):
            acc, k, v, k_pos = carry
            acc = _merge(acc, _block_attention(q, k, v, q_pos, k_pos))
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v, k_pos))
        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (_init(q), k, v, k_pos))
        return jnp.cumsum(o / l[..., None], axis=1)

    return _map(mesh, body, 5), args, "refuse"


def short_ring(mesh):
    """A ring that stops one step early: the last block never arrives."""
    cp = mesh.shape["cp"]

    def body(q, k, v, q_pos, k_pos):
        def step(_, carry):
            acc, k, v, k_pos = carry
            acc = _merge(acc, _block_attention(q, k, v, q_pos, k_pos))
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v, k_pos))
        (m, l, o), *_ = jax.lax.fori_loop(0, cp - 1, step, (_init(q), k, v, k_pos))
        return o / l[..., None]

    return _map(mesh, body, 5), _arrays(mesh, 8 * cp, (8,), (8,), (8,), ints=2), "refuse"


def positions_left_behind(mesh):
    """Key positions that don't travel with the keys: each block is masked with the wrong positions."""
    cp = mesh.shape["cp"]

    def body(q, k, v, q_pos, k_pos):
        def step(_, carry):
            acc, k, v = carry
            acc = _merge(acc, _block_attention(q, k, v, q_pos, k_pos))
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp)) for t in (k, v))
        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (_init(q), k, v))
        return o / l[..., None]

    return _map(mesh, body, 5), _arrays(mesh, 8 * cp, (8,), (8,), (8,), ints=2), "refuse"


def local_index_mask(mesh):
    """A mask by the local index (the first half of every device's block): follows places, not tokens."""
    cp = mesh.shape["cp"]

    def body(x, k):
        n = x.shape[1]
        keep = (jnp.arange(n) < n // 2)[None, :, None]
        acc = jnp.where(keep, x, 0.0)
        for _ in range(cp):
            acc = acc + jnp.sum(k, axis=1, keepdims=True)
            k = jax.lax.ppermute(k, "cp", _ring(cp))
        return acc

    return _map(mesh, body, 2), _arrays(mesh, 16, (4,), (4,)), "refuse"


def ring_total_sum(mesh):
    """Each block's total travels around the ring and is added up: every device ends with the global total, added
    to its own tokens (a function of each token and of all tokens)."""
    cp = mesh.shape["cp"]

    def body(x):
        part = jnp.sum(x, axis=1, keepdims=True)
        total, cur = part, part
        for _ in range(cp - 1):
            cur = jax.lax.ppermute(cur, "cp", _ring(cp))
            total = total + cur
        return x + total

    return _map(mesh, body, 1), _arrays(mesh, 16, (4,)), "reorder"


def shifted_neighbour(mesh):
    """One step of a ring used as a halo exchange: each token combined with the token at the same place on the
    previous device (a stencil across device boundaries)."""
    cp = mesh.shape["cp"]

    def body(x):
        return x - jax.lax.ppermute(x, "cp", _ring(cp))

    return _map(mesh, body, 1), _arrays(mesh, 16, (4,)), "refuse"


def reverse_ring_attention(mesh):
    """Keys travelling the other way around the ring, positions with them."""
    cp = mesh.shape["cp"]

    def body(q, k, v, q_pos, k_pos):
        def step(_, carry):
            acc, k, v, k_pos = carry
            acc = _merge(acc, _block_attention(q, k, v, q_pos, k_pos))
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", _ring(cp, -1)) for t in (k, v, k_pos))
        (m, l, o), *_ = jax.lax.fori_loop(0, cp, step, (_init(q), k, v, k_pos))
        return o / l[..., None]

    return _map(mesh, body, 5), _arrays(mesh, 8 * cp, (8,), (8,), (8,), ints=2), "reorder"


PROGRAMS = {f.__name__: f for f in (
    position_attention, axis_index_attention, scan_chunk_attention, attention_loss, ring_total_sum,
    reverse_ring_attention,
    ring_all_gather, ring_all_reduce, ring_reduce_scatter, collective_matmul_all_gather,
    collective_matmul_reduce_scatter, contracted_ring_dim, cumsum_in_ring, reverse_in_ring, coordinate_skip,
    gathered_attention, attention_then_cumsum, short_ring, positions_left_behind, local_index_mask,
    shifted_neighbour, docs_matmul_allgather, docs_matmul_allgather_bidirectional, docs_matmul_psum_scatter,
    where_on_a_scalar, position_difference_attention, block_start_offset, coordinate_difference, guarded_attention,
    first_block_max, rope_table_attention, gather_tokens_by_position, segment_table_attention,
    segment_table_whole_block)}
