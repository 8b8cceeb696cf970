"""ring-reorder on ring programs published outside this project (tests/support/ring_published.py), through
`@autofix_shardings` with its defaults and with ring_reorder="zigzag" / "striped" forced, forward and under
jax.grad, on jax.make_mesh's default (Explicit) axes and on Auto axes:

- every decision is the one the program states: left balanced, rewritten, or refused naming an op and the
  user's line the program states (the line's text, so that the expectation says which line);
- whatever is decided, the program computes what jax.jit computes (to 1e-5; gradients too): a rewritten program is
  compiled and compared with jax.jit's, one left alone carries no sequence permutation.
"""

from __future__ import annotations

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardfix import autofix_shardings
from support import ring_published as rp

PERMUTATION = "shardfix.sequence_permutation"
BY_NAME = {p.name: p for p in rp.PROGRAMS}
OP = re.compile(r"'(stablehlo|func|sdy|chlo)\.[a-z_]+'")
SUPPORT = os.path.dirname(rp.__file__)
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
# Also run on Auto axes: programs the pass rewrites, and two it must refuse.
ON_AUTO = ["liu-blockwise", "flash-attn-jax-vjp", "docs-all-reduce-ring", "ring-flash-attn-causal"]


@functools.cache
def meshes():
    return {"explicit": rp.mesh(), "auto": rp.auto_mesh()}


@functools.cache
def target(name: str, mesh: str, grad: bool):
    """(function, arguments): the program, or the gradient with respect to its `wrt` of a loss that reads its
    result y (sum(y * w + y * y / 2): with sum(y * w) alone JAX drops y and keeps only the backward ring)."""
    p = BY_NAME[name]
    fn, args = p.build(meshes()[mesh])
    if not grad:
        return fn, args
    w = np.random.default_rng(7).standard_normal(jax.eval_shape(fn, *args).shape).astype(np.float32)

    def loss(*a):
        y = fn(*a)
        return jnp.sum(y * w + y * y / 2)

    return jax.grad(loss, argnums=p.wrt), args


@functools.cache
def lowered(name: str, mesh: str, grad: bool, strategy: str):
    fn, args = target(name, mesh, grad)
    return autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(*args)


@functools.cache
def reference(name: str, mesh: str, grad: bool):
    fn, args = target(name, mesh, grad)
    return jax.jit(fn).lower(*args).compile(compiler_options=FAST)(*args)


def describe(low) -> list[tuple[str, bool, str]]:
    return [(r.strategy, r.applied, r.why) for r in low.rings]


@functools.cache
def source_lines(name: str) -> list[str]:
    with open(os.path.join(SUPPORT, name)) as f:
        return f.read().split("\n")


def cited_line(why: str) -> str | None:
    """The text of the first line of the published programs' modules (support/ring_published*.py) the reason
    cites."""
    m = re.search(r"support/(ring_published\w*\.py):(\d+)", why)
    return source_lines(m.group(1))[int(m.group(2)) - 1] if m else None


def assert_refused(p: rp.Published, low, strategy: str = "auto"):
    """Every ring left alone as not provably safe, naming an op; the first reason cites the program's line."""
    assert low.rings, "no ring found"
    if strategy == "striped" and all(not r.applied and "is not a multiple of cp*cp*stripe" in r.why
                                     for r in low.rings):
        return  # no stripe keeps whole the units the kernel reads: left alone before any proof
    for r in low.rings:
        assert not r.applied and r.why.startswith("not provably safe"), describe(low)
        assert OP.search(r.why), r.why
    why = low.rings[0].why
    assert p.why in why, why
    line = cited_line(why)
    if p.at:
        assert line is not None and p.at in line, f"{why}\n cites {line!r}, expected the line with {p.at!r}"
    else:  # the region itself is cited, at the user's call of the shard_map (here, in this file)
        assert "'sdy.manual_computation' at " in why and line is None and "test_ring_published.py:" in why, why
    assert PERMUTATION not in low.as_text()


CASES = [(p.name, grad) for p in rp.PROGRAMS for grad in ((False, True) if p.grad else (False,))]


@pytest.mark.parametrize("name", [p.name for p in rp.PROGRAMS])
def test_decision_under_defaults(name):
    p = BY_NAME[name]
    low = lowered(name, "explicit", False, "auto")
    if p.expect == "refused":
        assert_refused(p, low)
    elif p.expect == "balanced":
        assert low.rings and not any(r.applied for r in low.rings), describe(low)
        for r in low.rings:
            assert r.why.startswith("balanced as written"), r.why
        assert PERMUTATION not in low.as_text()
    else:
        assert low.rings and all(r.applied for r in low.rings), describe(low)


@pytest.mark.parametrize("strategy", ["zigzag", "striped"])
@pytest.mark.parametrize("name", [p.name for p in rp.PROGRAMS])
def test_decision_for_a_forced_layout(name, strategy):
    p = BY_NAME[name]
    low = lowered(name, "explicit", False, strategy)
    if p.forced:
        assert low.rings and all(r.applied and r.strategy.startswith(strategy) for r in low.rings), describe(low)
    else:
        assert_refused(p, low, strategy)


@pytest.mark.parametrize("name", [n for n, grad in CASES if grad])
def test_gradient_rings_refused_or_rewritten_together(name):
    """Under jax.grad the forward and backward rings of a program are rewritten together or left alone together,
    a refusal naming an op (the backward of a refused forward is refused with it)."""
    for strategy in ("auto", "zigzag"):
        low = lowered(name, "explicit", True, strategy)
        assert low.rings, "no ring found"
        applied = {r.applied for r in low.rings}
        assert len(applied) == 1, describe(low)
        for r in low.rings:  # left alone: refused naming an op, or not worth it (a cost decision)
            assert r.applied or not r.why.startswith("not provably safe") or OP.search(r.why), r.why


RUNS = ([(n, "explicit", g, s) for n, g in CASES for s in ("auto", "zigzag", "striped")]
        + [(n, "auto", g, s) for n, g in CASES if n in ON_AUTO for s in ("auto", "zigzag", "striped")])


@pytest.mark.parametrize("name,mesh,grad,strategy", RUNS)
def test_results_equal_jax_jit(name, mesh, grad, strategy):
    low = lowered(name, mesh, grad, strategy)
    if not any(r.applied for r in low.rings):
        # left alone: no permutation in the program (what runs is jax.jit's program, its shardings aside)
        assert PERMUTATION not in low.as_text()
        return
    if strategy == "zigzag" and _program(low) == _program(lowered(name, mesh, grad, "auto")):
        return  # the program the defaults made (they chose zigzag), compared already
    fn, args = target(name, mesh, grad)
    got = low.compile(compiler_options=FAST)(*args)
    want = reference(name, mesh, grad)
    wrong = []
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if not np.allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True):
            wrong.append(f"max difference {np.nanmax(np.abs(a - b)):.3g}")
    assert not wrong, f"SOUNDNESS: {name} ({mesh}, grad={grad}, {strategy}) rewritten {describe(low)}: {wrong}"


def _program(low) -> str:
    """The patched module's text, less the stripe a zigzag permutation's marker records (unused by zigzag)."""
    return re.sub(r'(strategy = "zigzag", stripe = )\d+', r"\g<1>0", low.as_text())


def _dense(q, k, v, causal: bool):
    s = jnp.einsum("bqd,bkd->bqk", q, k) * (q.shape[-1] ** -0.5)
    if causal:
        s = jnp.where(jnp.tril(jnp.ones((q.shape[1],) * 2, bool)), s, -jnp.inf)
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)


PORTS = {"ring-flash-attn-causal": (True, None), "ring-flash-attn-zigzag": (True, rp.zigzag_order),
         "flash-attn-jax-ring-causal": (True, None), "ejkernel-pallas-ring-causal": (True, None),
         "striped-attention": (True, rp.striped_order), "te-load-balanced-ring": (True, rp.zigzag_order),
         "liu-blockwise": (True, None), "rolled-ring-bidirectional": (True, None)}


def test_the_ports_compute_attention():
    """The attention programs compute (causal) attention, in the token order their users feed them: the ports
    follow the published algorithms, so what the pass is judged on is what those kernels compute."""
    mesh = meshes()["explicit"]
    q, k, v = (np.asarray(x) for x in rp.qkv(mesh))
    for name, (causal, order) in PORTS.items():
        fn, _ = target(name, "explicit", False)
        perm = np.arange(rp.S) if order is None else order(mesh.shape["cp"])
        args = [jax.device_put(x[:, perm], jax.NamedSharding(mesh, rp.SEQ)) for x in (q, k, v)]
        got = np.asarray(jax.jit(fn).lower(*args).compile(compiler_options=FAST)(*args))
        want = np.asarray(_dense(q, k, v, causal))[:, perm]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)


@functools.cache
def around_ring():
    return rp.around_ring(meshes()["auto"])


@pytest.mark.parametrize("name", sorted(rp.around_ring(rp.auto_mesh())[0]))
def test_model_code_around_a_rewritten_ring_equals_jax_jit(name):
    """Next-token shifts, rolls, cumulative sums, argmax over the sequence, a token shift between two ring layers,
    a refused ring beside or before it, a scan over layers: the ring is rewritten under the defaults where stated,
    and the permutations hoisted around it never cross such code."""
    fns, args = around_ring()
    fn, expected = fns[name]
    low = autofix_shardings(fn, on_fix="ignore").lower(*args)
    assert sorted(r.applied for r in low.rings) == expected, describe(low)
    if not any(expected):
        assert PERMUTATION not in low.as_text()
        return
    got = low.compile(compiler_options=FAST)(*args)
    want = jax.jit(fn).lower(*args).compile(compiler_options=FAST)(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5, err_msg=f"SOUNDNESS: {name}")
