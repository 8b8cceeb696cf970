"""Ring programs written as users write them (jax.shard_map, lax.ppermute rings, fori_loop / scan / unrolled loops,
online softmax, custom_vjp and plain autodiff), each declaring what ring-reorder must do with it.

A program is built on a mesh with axes ("dp", "cp") and gives (function, arguments); `Program.expect` says what
`@autofix_shardings` with its defaults must decide, `Program.strategies` which explicit `ring_reorder=` values must
rewrite it, and a refused program names the lines one of which the refusal must cite (the lines of its source that
carry a `# refused here` comment). Every program, rewritten or not, must compute what jax.jit computes.

Global shapes are tiny: [batch 2, sequence 64, dim 8] (heads 2 where a kernel has heads), cp = 4 (or 8).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from support import ring_user_kernels as uk

B, S, D = 2, 64, 8
SEQ = P("dp", "cp")
REFUSED_HERE = "# refused here"


@dataclass(frozen=True)
class Program:
    """name: unique; build(mesh) -> (fn, args); mesh: "explicit" (jax.make_mesh's default axes, dp=2 x cp=4),
    "auto" (the same with Auto axes) or "cp8" (dp=1 x cp=8, Explicit); grad: the test differentiates
    sum(fn(*args) * w) with respect to the arguments in `wrt`.

    expect, under the decorator's defaults:
      "rewritten"  every ring is rewritten (any layout);
      "balanced"   every ring is left alone, proved but not worth it: the reason contains `reason`;
      "proved"     either of the two (the layout choice rests on the cost model; the proof must hold);
      "refused"    every ring is left alone as not provably safe, the reason names an op and one of the lines
                   marked `# refused here` in `source` (the function whose lines are searched);
    strategies: explicit ring_reorder values under which every ring must be rewritten."""

    name: str
    build: Callable
    expect: str
    strategies: tuple[str, ...] = ()
    reason: str = ""
    mesh: str = "explicit"
    grad: bool = False
    wrt: tuple[int, ...] = (0, 1, 2)
    source: Callable | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)

    def refused_lines(self) -> list[int]:
        """Line numbers (in this file or ring_user_kernels.py) marked `# refused here` in `source`."""
        lines, first = inspect.getsourcelines(self.source)
        return [first + i for i, line in enumerate(lines) if REFUSED_HERE in line]


def meshes() -> dict:
    auto = (jax.sharding.AxisType.Auto,) * 2
    return {"explicit": jax.make_mesh((2, 4), ("dp", "cp")),
            "auto": jax.make_mesh((2, 4), ("dp", "cp"), axis_types=auto),
            "cp8": jax.make_mesh((1, 8), ("dp", "cp"))}


def grad_of_two_results(body):
    """jax.grad of a loss that reads body's second result y only through its derivative and returns its first, z,
    beside the gradient (Explicit axes, cp = 4), and the arguments."""
    mesh = meshes()["explicit"]
    spec = P("dp", "cp", None)
    f = jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 3, out_specs=(spec, spec), check_vma=False)
    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal((2, 32, 8)).astype(np.float32), NamedSharding(mesh, spec))
            for _ in range(3)]
    w = rng.standard_normal((2, 32, 8)).astype(np.float32)

    def loss(q, k, v):
        z, y = f(q, k, v)
        return jnp.sum(y * w), z

    return jax.grad(loss, argnums=(0, 1, 2), has_aux=True), args


# ---------------------------------------------------------------------------------------------------------------
# Arguments.


def _normal(*shape, seed: int):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def qkv(mesh, heads: bool = False, seed: int = 0):
    """q, k, v: [B, S, D] (or [B, S, 2, D]) sharded batch on dp, sequence on cp."""
    shape = (B, S, 2, D) if heads else (B, S, D)
    spec = P("dp", "cp", None, None) if heads else P("dp", "cp", None)
    return tuple(jax.device_put(_normal(*shape, seed=seed + i), NamedSharding(mesh, spec)) for i in range(3))


def sequence_ints(mesh, values: np.ndarray):
    """An int32 [B, S] array sharded like the sequence (positions, segment ids)."""
    return jax.device_put(np.broadcast_to(values.astype(np.int32), (B, S)).copy(), NamedSharding(mesh, SEQ))


def replicated(mesh, value):
    return jax.device_put(np.asarray(value), NamedSharding(mesh, P()))


def segments() -> np.ndarray:
    """Three documents of unequal lengths, crossing device boundaries."""
    return np.repeat(np.arange(3), [21, 30, 13])


def rope_table(dim: int = D):
    """cos and sin [S, dim / 2] of the rotary angles, as models precompute them."""
    half = dim // 2
    angles = np.arange(S)[:, None] * (1.0 / 10000.0 ** (np.arange(half) / half))[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def zigzag_layout(cp: int, length: int):
    """The zigzag layout of `length` tokens over cp devices (device r holds chunks r and 2cp - 1 - r): the order of
    the tokens, and the positions of block c's n tokens in it (for kernels reordered by hand)."""
    chunks = np.arange(length).reshape(2 * cp, -1)
    order = np.concatenate([np.concatenate([chunks[r], chunks[2 * cp - 1 - r]]) for r in range(cp)])

    def positions(c, n):
        half, j = n // 2, jnp.arange(n)
        return jnp.where(j < half, c * half + j, (2 * cp - 1 - c) * half + j - half)

    return order, positions


def spec3():
    return P("dp", "cp", None)


def sharded(mesh, body, n_seq: int, n_rep: int = 0, n_ints: int = 0, heads: bool = False, check_vma=False,
            out_specs=None):
    """jax.shard_map of body(*seq, *ints, *replicated): `n_seq` float sequence arrays, `n_ints` int [B, S] sequence
    arrays, `n_rep` replicated arrays."""
    spec = P("dp", "cp", None, None) if heads else spec3()
    in_specs = (spec,) * n_seq + (SEQ,) * n_ints + (P(),) * n_rep
    fn = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=spec if out_specs is None else out_specs,
                       check_vma=check_vma)
    fn.__wrapped_body__ = body
    return fn


# ---------------------------------------------------------------------------------------------------------------
# One block a ring step: the kernel of ring_user_kernels.one_block_ring with each mask and merge.


def one_block(mask: str, loop: str = "fori", merge: str = "online", positions: str = "iota", heads: bool = False,
              seg: bool = False, rope: bool = False, offset: bool = False, sink_logit: bool = False,
              direction: int = 1):
    """A builder for uk.one_block_ring with the given options; arguments: q, k, v [, q_pos, k_pos][, segment ids]
    [, cos, sin][, offset][, sink logit]."""

    def build(mesh):
        cp = mesh.shape["cp"]
        kernel = uk.one_block_ring(cp, uk.MASKS[mask], loop=loop, merge=merge, positions=positions, seg=seg,
                                   rope=rope, offset=offset, sink_logit=sink_logit, direction=direction)
        args = list(qkv(mesh, heads))
        ints, reps = 0, 0
        if positions == "data":
            args += [sequence_ints(mesh, np.arange(S))] * 2
            ints += 2
        if seg:
            args.append(sequence_ints(mesh, segments()))
            ints += 1
        if rope:
            args += [replicated(mesh, t) for t in rope_table()]
            reps += 2
        if offset:
            args.append(replicated(mesh, np.int32(37)))
            reps += 1
        if sink_logit:
            args.append(replicated(mesh, np.float32(0.5)))
            reps += 1
        return sharded(mesh, kernel, 3, n_rep=reps, n_ints=ints, heads=heads), tuple(args)

    return build


def blockwise(mask: str, chunk: int = 4, merge: str = "online", seg: bool = False, heads: bool = False,
              key_skip=None):
    """A builder for uk.blockwise_ring with mask `mask` and its chunk-skip predicate."""

    def build(mesh):
        cp = mesh.shape["cp"]
        kernel = uk.blockwise_ring(cp, chunk, uk.MASKS[mask], uk.LIVE[mask], merge=merge, seg=seg, key_skip=key_skip)
        args = qkv(mesh, heads)
        if seg:
            return sharded(mesh, kernel, 3, n_ints=1, heads=heads), args + (sequence_ints(mesh, segments()),)
        return sharded(mesh, kernel, 3, heads=heads), args

    return build



def blockwise_python(mask: str, chunk: int = 8, merge: str = "online"):
    """A builder for uk.blockwise_python_ring (Python loops over the chunks, a running maximum per q chunk)."""

    def build(mesh):
        kernel = uk.blockwise_python_ring(mesh.shape["cp"], chunk, uk.MASKS[mask], uk.LIVE[mask], merge=merge)
        return sharded(mesh, kernel, 3), qkv(mesh)

    return build

def rows(mask: str, rows: int = 4, merge: str = "online"):
    """A builder for uk.rows_ring (the queries a few rows at a time, the state updated in place)."""

    def build(mesh):
        return sharded(mesh, uk.rows_ring(mesh.shape["cp"], rows, uk.MASKS[mask], merge=merge), 3), qkv(mesh)

    return build


def refusal(make, positions: bool = False):
    """A builder for a body of ring_user_refusals (`positions`: it also takes q and k position ids as data)."""

    def build(mesh):
        body = make(mesh.shape["cp"])
        args = qkv(mesh)
        if positions:
            pos = sequence_ints(mesh, np.arange(S))
            return sharded(mesh, body, 3, n_ints=2), args + (pos, pos)
        return sharded(mesh, body, 3), args

    return build


def lse(merge: str, vjp: bool = False, **options):
    """A builder for ring_user_lse.lse_ring (flash-attention style (out, lse) merges), or its custom_vjp kernel."""
    from support import ring_user_lse as ul

    def build(mesh):
        cp = mesh.shape["cp"]
        body = ul.lse_ring_vjp(cp, merge) if vjp else ul.lse_ring(cp, merge, **options)
        return sharded(mesh, body, 3), qkv(mesh)

    return build


def vjp(mask: str, direction: int = 1):
    """A builder for uk.vjp_ring (custom_vjp) with mask `mask`."""

    def build(mesh):
        return sharded(mesh, uk.vjp_ring(mesh.shape["cp"], uk.MASKS[mask], direction), 3), qkv(mesh)

    return build


def project_kernel(kind: str, partial: bool = False):
    """This project's own custom_vjp kernels (tests/support/ring_kernels.py): "fori" or "scan" (blockwise)."""
    from support import ring_kernels

    def build(mesh):
        cp = mesh.shape["cp"]
        kernel = (ring_kernels.fori_ring_attention("cp", cp) if kind == "fori"
                  else ring_kernels.scan_ring_attention("cp", cp, 4))
        return ring_kernels.sharded(kernel, mesh, partial=partial), qkv(mesh)

    return build


def nested(inner_build):
    """The same body under two shard_maps: the outer manual over dp (a data-parallel wrapper), the inner over cp."""

    def build(mesh):
        fn, args = inner_build(mesh)
        # inside the outer map the context mesh has dp manual: the inner map takes it from there
        inner = jax.shard_map(_unwrap(fn), in_specs=_specs(args, ("cp",)), out_specs=P(None, "cp", None),
                              axis_names={"cp"}, check_vma=False)
        outer = jax.shard_map(inner, mesh=mesh, in_specs=_specs(args, ("dp",)), out_specs=P("dp", None, None),
                              axis_names={"dp"}, check_vma=False)
        return outer, args

    return build


def partial_manual(inner_build):
    """The same body in a shard_map manual over cp only (dp left to the partitioner)."""

    def build(mesh):
        fn, args = inner_build(mesh)
        return jax.shard_map(_unwrap(fn), mesh=mesh, in_specs=_specs(args, ("cp",)), out_specs=P(None, "cp", None),
                             axis_names={"cp"}, check_vma=False), args

    return build


def _unwrap(shard_mapped):
    """The per-device body of a function made by `sharded` (kept on it by `sharded`)."""
    return shard_mapped.__wrapped_body__


def _specs(args, axes):
    """in_specs for args, each sequence array split on the given axes only ("dp": batch, "cp": sequence); scalars
    and the RoPE tables [S, D / 2] replicated."""
    out = []
    for a in args:
        if a.ndim == 0 or a.shape == (S, D // 2):
            out.append(P())
        else:
            dims = ["dp" if "dp" in axes else None, "cp" if "cp" in axes else None] + [None] * (a.ndim - 2)
            out.append(P(*dims))
    return tuple(out)


def two_layers(inner_build):
    """Two ring layers in one program, the second attending over the first's output (a residual stack)."""

    def build(mesh):
        fn, args = inner_build(mesh)

        def f(q, k, v, *rest):
            x = q + fn(q, k, v, *rest)
            return x + fn(x, k, v, *rest)

        return f, args

    return build


def psum_loss(inner_build):
    """A loss summed over the sequence inside the region (psum over cp): a number the order doesn't change."""

    def build(mesh):
        fn, args = inner_build(mesh)
        body = _unwrap(fn)

        def loss_body(*a):
            return jax.lax.psum(jnp.sum(body(*a) ** 2, axis=(1, 2)), "cp")

        return jax.shard_map(loss_body, mesh=mesh, in_specs=_specs(args, ("dp", "cp")), out_specs=P("dp"),
                             check_vma=False), args

    return build


# ---------------------------------------------------------------------------------------------------------------
# The registry.

BOTH = ("zigzag", "striped")
ZIGZAG = ("zigzag",)


def _registry() -> list[Program]:
    from support import ring_user_refusals as ur

    out: list[Program] = []

    def add(name, build, expect, strategies=(), **kw):
        out.append(Program(name, build, expect, tuple(strategies), **kw))

    # One block a step, no skip: every device computes every block whatever the layout. Proved; the layout
    # choice is the cost model's; an explicit layout must be applied.
    for mask in ("causal", "window8", "window40", "alibi", "prefix20", "chunked24", "sinks"):
        add(f"fori-{mask}", one_block(mask), "proved", BOTH if mask == "causal" else ZIGZAG)
    add("scan-causal", one_block("causal", loop="scan"), "proved", ZIGZAG)
    add("unrolled-causal", one_block("causal", loop="unrolled"), "proved", ZIGZAG)
    add("fori-causal-heads", one_block("causal", heads=True), "proved", ZIGZAG)
    add("fori-causal-segments", one_block("causal", seg=True), "proved", ZIGZAG)
    add("fori-causal-rope-table", one_block("causal", rope=True), "proved", ZIGZAG)
    add("fori-causal-prefill-offset", one_block("causal", offset=True), "proved", ZIGZAG)
    add("fori-causal-guarded", one_block("causal", merge="guarded"), "proved", ZIGZAG)
    add("fori-causal-step0-reset", one_block("causal", merge="reset"), "proved", ZIGZAG)
    add("fori-sinks-softmax-aux", one_block("sinks", sink_logit=True), "proved", ZIGZAG)
    add("fori-causal-softmax-aux", one_block("causal", sink_logit=True), "proved", ZIGZAG)
    add("fori-chunked16-block-diagonal", one_block("chunked16"), "proved", ZIGZAG)
    add("scan-window40", one_block("window40", loop="scan"), "proved", ZIGZAG)
    add("scan-alibi-heads", one_block("alibi", loop="scan", heads=True), "proved", ZIGZAG)
    add("fori-window8-data-positions", one_block("window8", positions="data"), "proved", ZIGZAG)
    add("fori-causal-data-positions", one_block("causal", positions="data"), "proved", BOTH)
    add("fori-causal-reverse-ring", one_block("causal", direction=-1), "proved", ZIGZAG)
    add("scan-prefix20-guarded", one_block("prefix20", loop="scan", merge="guarded"), "proved", ZIGZAG)
    add("fori-chunked24-segments", one_block("chunked24", seg=True), "proved", ZIGZAG)
    add("fori-alibi-rope-table", one_block("alibi", rope=True), "proved", ZIGZAG)
    add("fori-window40-prefill-offset", one_block("window40", offset=True), "proved", ZIGZAG)
    add("fori-sinks-step0-reset", one_block("sinks", merge="reset"), "proved", ZIGZAG)
    add("unrolled-window40", one_block("window40", loop="unrolled"), "proved", ZIGZAG)
    add("fori-bidirectional", one_block("none"), "balanced", reason="balanced")
    add("fori-bidirectional-segments", one_block("none", seg=True), "balanced", reason="balanced")
    add("scan-bidirectional-heads", one_block("none", loop="scan", heads=True), "balanced", reason="balanced")

    # Blockwise: chunk pairs skipped by positions. The causal ones pay for a reorder.
    for mask in ("causal", "alibi", "window40", "prefix20", "chunked16", "sinks"):
        add(f"blockwise-{mask}", blockwise(mask), "rewritten" if mask in ("causal", "alibi") else "proved",
            BOTH if mask in ("causal", "window40", "chunked16") else ZIGZAG)
    add("blockwise-window8", blockwise("window8"), "balanced", reason="balanced")
    add("blockwise-causal-segments", blockwise("causal", seg=True), "rewritten", BOTH)
    add("blockwise-causal-guarded", blockwise("causal", merge="guarded"), "rewritten", ZIGZAG)
    add("blockwise-causal-chunk8", blockwise("causal", chunk=8), "rewritten", ZIGZAG)
    add("blockwise-python-causal", blockwise_python("causal"), "rewritten", ZIGZAG)
    # The queries a few rows at a time, the running state updated in place: no skip, so balanced as written.
    add("rows-causal", rows("causal"), "proved", BOTH)
    add("rows-alibi-guarded", rows("alibi", rows=2, merge="guarded"), "proved", ZIGZAG)

    # Other meshes: Auto axes; cp = 8.
    add("fori-causal@auto", one_block("causal"), "proved", ZIGZAG, mesh="auto")
    add("fori-window40@auto", one_block("window40"), "proved", ZIGZAG, mesh="auto")
    add("blockwise-causal@auto", blockwise("causal"), "rewritten", BOTH, mesh="auto")
    add("fori-causal@cp8", one_block("causal"), "proved", BOTH, mesh="cp8")
    add("blockwise-causal@cp8", blockwise("causal"), "rewritten", ZIGZAG, mesh="cp8")
    add("blockwise-window40@cp8", blockwise("window40"), "proved", ZIGZAG, mesh="cp8")
    add("blockwise-alibi@cp8", blockwise("alibi"), "rewritten", ZIGZAG, mesh="cp8")
    add("blockwise-prefix20@auto", blockwise("prefix20"), "proved", ZIGZAG, mesh="auto")
    add("fori-alibi@auto", one_block("alibi"), "proved", ZIGZAG, mesh="auto")
    add("fori-sinks@auto", one_block("sinks"), "proved", ZIGZAG, mesh="auto")
    add("fori-causal-segments@auto", one_block("causal", seg=True), "proved", ZIGZAG, mesh="auto")
    add("fori-causal-rope-table@auto", one_block("causal", rope=True), "proved", ZIGZAG, mesh="auto")
    add("fori-prefix20@cp8", one_block("prefix20"), "proved", ZIGZAG, mesh="cp8")
    add("fori-chunked24@cp8", one_block("chunked24"), "proved", ZIGZAG, mesh="cp8")
    add("fori-window8@cp8", one_block("window8"), "proved", ZIGZAG, mesh="cp8")
    add("fori-causal-guarded@cp8", one_block("causal", merge="guarded"), "proved", ZIGZAG, mesh="cp8")
    add("fori-bidirectional@cp8", one_block("none"), "balanced", reason="balanced", mesh="cp8")

    # Other structures: nested shard_map (dp outer, cp inner), partially manual, two layers, a loss in the region.
    add("nested-fori-causal", nested(one_block("causal")), "proved", ZIGZAG)
    add("nested-blockwise-causal", nested(blockwise("causal")), "rewritten", BOTH)
    add("partial-fori-causal", partial_manual(one_block("causal")), "proved", ZIGZAG)
    add("partial-blockwise-causal", partial_manual(blockwise("causal")), "rewritten", ZIGZAG)
    add("two-layers-blockwise-causal", two_layers(blockwise("causal")), "rewritten", ZIGZAG)
    add("two-layers-fori-window40", two_layers(one_block("window40")), "proved", ZIGZAG)
    add("psum-loss-blockwise-causal", psum_loss(blockwise("causal")), "rewritten", ZIGZAG)

    # Training: plain autodiff (jax.grad through the ring's loops): the forward is proved, and the backward JAX made
    # is rewritten with it (prove._accept_autodiff: tied to the forward's proved result, free of the running
    # maxima, recomputing no position), under zigzag, and striped too for one program of each loop form and mesh
    # (a backward's compile is the registry's dearest). Under the defaults the blockwise causal pairs are rewritten:
    # the backward's skips read the predicates its forward saved, which the tile count follows (58 -> 34 tiles
    # each); the rest are balanced or the saving doesn't pay for the permutations.
    # (Under jax.checkpoint the backward recomputes positions and is left alone: tests/test_autodiff_ties.py.)
    for name, build, mesh in (
            ("fori-causal", one_block("causal"), "explicit"),
            ("fori-window40", one_block("window40"), "explicit"),
            ("fori-alibi", one_block("alibi"), "explicit"),
            ("fori-causal-segments", one_block("causal", seg=True), "explicit"),
            ("fori-causal-rope-table", one_block("causal", rope=True), "explicit"),
            ("fori-causal-step0-reset", one_block("causal", merge="reset"), "explicit"),
            ("fori-causal-prefill-offset", one_block("causal", offset=True), "explicit"),
            ("fori-sinks-softmax-aux", one_block("sinks", sink_logit=True), "explicit"),
            ("fori-prefix20", one_block("prefix20"), "explicit"),
            ("fori-chunked16", one_block("chunked16"), "explicit"),
            ("blockwise-causal", blockwise("causal"), "explicit"),
            ("blockwise-window40", blockwise("window40"), "explicit"),
            # skips JAX's partial evaluation decides partly ahead of the q chunks' loop (`kf < p`, `qf // w`), the
            # positions stacked as data: still functions of the two chunks' positions (ring/branches.py)
            ("blockwise-prefix20", blockwise("prefix20"), "explicit"),
            ("blockwise-chunked16", blockwise("chunked16"), "explicit"),
            ("blockwise-sinks", blockwise("sinks"), "explicit"),
            ("blockwise-causal-segments", blockwise("causal", seg=True), "explicit"),
            ("blockwise-causal@auto", blockwise("causal"), "auto"),
            ("fori-causal@cp8", one_block("causal"), "cp8"),
            ("nested-blockwise-causal", nested(blockwise("causal")), "explicit"),
            ("nested-fori-causal@auto", nested(one_block("causal")), "auto"),
            ("partial-blockwise-causal", partial_manual(blockwise("causal")), "explicit"),
            # the chunk loops written in Python: one running maximum per q chunk, each its own tokens' (the
            # maxima differ by chunk, and each chunk's output is free of its own: stabiliser.complete_ident)
            ("blockwise-python-causal", blockwise_python("causal"), "explicit"),
            ("blockwise-python-causal-guarded", blockwise_python("causal", merge="guarded"), "explicit"),
            # the state updated in place a few rows at a time: its buffers handed to jnp's update helpers
            ("rows-causal", rows("causal"), "explicit")):
        both = name in ("fori-causal", "blockwise-causal", "blockwise-causal@auto", "nested-fori-causal@auto",
                        "rows-causal")
        pays = name.startswith(("blockwise-causal", "nested-blockwise", "partial-blockwise", "blockwise-python"))
        add(f"grad-{name}", build, "rewritten" if pays else "proved", BOTH if both else ZIGZAG, grad=True, mesh=mesh)

    add("grad-nested-vjp-causal@auto", nested(vjp("causal")), "proved", ZIGZAG, grad=True, mesh="auto")
    # Training: custom_vjp kernels (forward and backward rings).
    for mask in ("causal", "window40", "alibi"):
        add(f"vjp-{mask}", vjp(mask), "proved", ZIGZAG, grad=True)
    add("vjp-causal-reverse-ring", vjp("causal", direction=-1), "proved", ZIGZAG, grad=True)
    add("vjp-causal-forward-only", vjp("causal"), "proved", ZIGZAG)
    add("vjp-causal@auto", vjp("causal"), "proved", ZIGZAG, grad=True, mesh="auto")
    add("project-fori-vjp", project_kernel("fori"), "proved", ZIGZAG, grad=True)
    add("project-scan-vjp", project_kernel("scan"), "rewritten", BOTH, grad=True)
    add("project-scan-vjp@auto", project_kernel("scan"), "rewritten", ZIGZAG, grad=True, mesh="auto")
    add("project-scan-vjp-partial", project_kernel("scan", partial=True), "rewritten", ZIGZAG, grad=True)

    # Must be left alone.
    for make in ur.REFUSALS:
        add(f"refuse-{make.__name__.replace('_', '-')}", refusal(make), "refused", source=make)
    add("refuse-positions-left-behind", refusal(ur.positions_left_behind, positions=True), "refused",
        source=ur.positions_left_behind)
    # Spelled as published kernels spell them (ring_user_variants): state from jnp.full, a carried or ppermuted
    # source coordinate, a window `q - w <= k`; proved. Their look-alikes that depend on where tokens sit: refused.
    from support import ring_user_variants as uv
    for name, mesh in (("full-init", "explicit"), ("full-init", "auto"), ("full-init-window20", "explicit"),
                       ("full-init-every5", "explicit"),
                       ("carried-source", "explicit"), ("ppermuted-source", "auto"),
                       ("carried-source-window20", "cp8"), ("carried-source-plus-cp", "explicit"),
                       ("carried-source-plus-cp", "cp8"), ("scan-unroll2", "explicit"), ("scan-unroll2", "cp8"),
                       ("scan-unroll3", "explicit"), ("scan-unroll3", "cp8"), ("scan-unroll3-reset", "explicit"),
                       ("scan-unroll3-reset", "cp8"), ("two-steps-an-iteration", "auto"),
                       ("carried-source-plus-dp", "explicit"), ("carried-source-mod-2cp", "cp8")):
        # the spellings proved since the analysis reads coordinates modulo the ring size and loops that run
        # several ring steps an iteration: under both layouts
        wide = name in ("carried-source-plus-cp", "carried-source-plus-dp", "carried-source-mod-2cp", "scan-unroll2",
                        "scan-unroll3", "scan-unroll3-reset", "two-steps-an-iteration")
        add(f"variant-{name}" + ("" if mesh == "explicit" else f"@{mesh}"), refusal(uv.ACCEPTED[name]), "proved",
            BOTH if wide else ZIGZAG, mesh=mesh)
    add("variant-vjp-scan-unroll2", refusal(uv.ACCEPTED["vjp-scan-unroll2"]), "proved", BOTH, grad=True)
    # a loop of one trip whose residual slots only the backward reads: forward and backward rewritten
    add("grad-variant-scan-unroll3-reset", refusal(uv.ACCEPTED["scan-unroll3-reset"]), "proved", BOTH, grad=True)
    for make in uv.REFUSALS:
        add(f"refuse-{make.__name__.replace('_', '-')}", refusal(make), "refused", source=make)
    # k, v sent both ways around the ring (two blocks a step, the opposite one after the loop)
    add("bidirectional-ring-causal@cp8", refusal(uv.bidirectional), "proved", BOTH, mesh="cp8")
    # plain autodiff: the masks of the merges outside the loop (the own block's, the opposite one's) are residuals
    # of positions, rewritten where the forward returns them
    add("grad-bidirectional-ring-causal@cp8", refusal(uv.bidirectional), "proved", BOTH, grad=True, mesh="cp8")
    add("refuse-bidirectional-forgets-opposite", refusal(uv.bidirectional_forgets_opposite), "refused",
        source=uv.bidirectional)
    # Flash-attention style merges of each block's (out, lse) (ring_user_lse): order-free however spelled, proved
    # by their algebra; look-alikes that are not order-free, refused.
    from support import ring_user_lse as ul
    for name, merge, options, layouts in (
            ("logaddexp", "logaddexp", {}, BOTH), ("max-log", "max", {}, ZIGZAG),
            ("logaddexp-peeled", "logaddexp", {"first": "peeled"}, ZIGZAG),
            ("logaddexp-inf", "logaddexp", {"init": "inf"}, ZIGZAG),
            ("guarded-logaddexp-inf", "guarded-logaddexp", {"init": "inf"}, ZIGZAG),
            ("step0-reset-logaddexp", "reset-logaddexp", {}, ZIGZAG),
            ("scan-max-log-inf", "max", {"loop": "scan", "init": "inf"}, ZIGZAG)):
        add(f"lse-{name}", lse(merge, **options), "proved", layouts)
    add("lse-logaddexp@auto", lse("logaddexp"), "proved", ZIGZAG, mesh="auto")
    add("blockwise-causal-lse", blockwise("causal", merge="lse"), "rewritten", BOTH)
    add("blockwise-causal-lse@cp8", blockwise("causal", merge="lse"), "rewritten", ZIGZAG, mesh="cp8")
    add("vjp-lse-logaddexp", lse("logaddexp", vjp=True), "proved", BOTH, grad=True)
    add("vjp-lse-max-log", lse("max", vjp=True), "proved", ZIGZAG, grad=True)
    # Plain jax.grad of the merges: jnp.logaddexp's custom_jvp rule is its function's derivative, so the backward
    # differentiates what the forward proof found; a merge that differentiates max, min or abs at a tie need not
    # (the formula written out, maxima nested: tests/test_ring_lse_autodiff.py), and is refused
    for name, merge, options, layouts in (
            ("logaddexp", "logaddexp", {}, BOTH),
            ("guarded-logaddexp-inf", "guarded-logaddexp", {"init": "inf"}, ZIGZAG)):
        add(f"grad-lse-{name}", lse(merge, **options), "proved", layouts, grad=True)
    add("grad-refuse-lse-max-log", lse("max"), "refused", grad=True, source=ul.merge_max)
    add("grad-blockwise-causal-lse", blockwise("causal", merge="lse"), "rewritten", BOTH, grad=True)
    add("lse-max-log1p", lse("max-log1p"), "proved", ZIGZAG)
    add("grad-refuse-lse-max-log1p", lse("max-log1p"), "refused", grad=True, source=ul.merge_max_log1p)
    for name, merge, options, source in (
            ("decayed", "decayed", {}, ul.merge_decayed), ("hop-weighted", "hop-weighted", {}, ul.merge_hop_weighted),
            ("argmax", "argmax", {}, ul.merge_argmax), ("latest", "latest", {}, ul.lse_ring),
            # a start of -1e30 cancelled to 0 (or -inf - -inf): the first block's lse lost, in every layout at
            # another block
            ("sigmoid-sentinel-start", "sigmoid", {}, ul.lse_ring),
            ("sigmoid-unguarded-inf", "sigmoid", {"init": "inf"}, ul.lse_ring),
            ("guard-on-sentinel-start", "guarded-sigmoid", {}, ul.guarded),
            # the block a guard or a step-0 reset takes as the state may hold masked keys alone (lse -1e30): the
            # next sigmoid/softplus merge cancels it to 0 (here the first block is the own one, whose diagonal is
            # never masked, which the proof does not know)
            ("guarded-sigmoid-inf", "guarded-sigmoid", {"init": "inf"}, ul.guarded),
            ("step0-reset-sigmoid", "reset-sigmoid", {}, ul.reset),
            # so may the block computed before the loop, the state's start (the own block here, as
            # ring-flash-attention does; with k, v sent ahead, not the own one: tests/test_ring_audit_lse.py)
            ("sigmoid-peeled", "sigmoid", {"first": "peeled"}, ul.lse_ring),
            ("softplus-peeled", "softplus", {"first": "peeled"}, ul.lse_ring)):
        add(f"refuse-lse-{name}", lse(merge, **options), "refused", source=source)
    add("refuse-lse-hard-max-of-lses", refusal(ul.hard_max_ring), "refused", source=ul.hard_max_ring)
    add("grad-refuse-attention-then-cumsum", refusal(ur.attention_then_cumsum), "refused", grad=True,
        source=ur.attention_then_cumsum)
    add("grad-refuse-coordinate-skip", refusal(ur.coordinate_skip), "refused", grad=True,
        source=ur.coordinate_skip)
    # the prefix-LM skip with the keys' data or-ed in, stacked ahead of the loop like `kf < p`: token data
    add("grad-refuse-blockwise-key-data-skip", blockwise("prefix20", key_skip=lambda kj: kj[0, 0, 0] > 0),
        "refused", grad=True, source=uk.blockwise_ring)
    return out


PROGRAMS = _registry()
