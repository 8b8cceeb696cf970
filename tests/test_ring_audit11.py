"""Soundness audit of ring-reorder with ring programs in styles the other ring suites do not use
(tests/support/ring_audit11.py; 8 CPU devices, cp = 8 and S = 128 unless a program says otherwise).

Every program, through `@autofix_shardings` with its defaults and with `ring_reorder="zigzag"` (a layout asked,
still only where proved), must compute what jax.jit computes (to 1e-5 in float32, 2e-2 for the bfloat16 one), and
so must the gradient of sum(y ** 2) of the differentiated ones. A program whose result depends on where tokens sit
(`refuse`) must be left alone under every layout: no ring decision applied, no permutation in the module.

What the audit found, on jax 0.12 and 0.10.2 alike (every result equal to jax.jit's; no crash):
- rewritten when a layout is asked (zigzag and striped): a ring passing q and its accumulator (k, v staying),
  both directions unrolled, k and v stacked in one array, uint32 / int16 / 2-D iota positions, float position ids
  passed in and carried with k, -inf masks with a guarded shift, a window written |2 (q - k) - (w - 1)| <= w - 1,
  a mask by positions modulo 12, a log-sum-exp carry, lax.max with the output normalised every step, bfloat16
  inputs, RoPE angles computed from positions in the kernel, packed documents from replicated boundaries, k passed
  transposed, the result transposed, a psum of the result weighted by global positions (the reduction runs in
  another order: equal to 2e-7 relative), positions from a jitted helper also called outside the region, RoPE
  tables [S, D / 2] sharded like the tokens, int8 positions doubled in int8 (wrapping: the int32 positions before
  the convert are the ones rewritten); the backward rings of the q ring, the float position ids, the in-kernel
  RoPE and the transposed k with their forward (the float ids' gradient, also equal, is not compared here, to
  keep the file fast). The defaults leave these alone (no skip: balanced as written).
- rewritten by the defaults (zigzag): the blockwise kernels (chunk pairs skipped by lax.cond on chunk positions),
  one passing q and its accumulators instead of k and v, under jax.vmap over heads, inside lax.scan over layers,
  with check_vma=True, with the step under jax.checkpoint, two layers pooled 128 -> 64 or rolled by one token
  between them, the operand also summed cumulatively outside the region, a (cp, dp) mesh with the ring on the
  first axis, a partially manual region (axis_names={"cp"}) on Explicit axes, a region in a branch of lax.cond
  (the other branch's refused region left alone), the whole layer under jax.checkpoint (the forward region
  rewritten; the one the backward recomputes refused with the backward). A jitted causal body called by a proved
  region and by a refused one is rewritten in the first only.
- left alone with a reason: the unguarded -inf shift, the mask multiplying the exponentials, tril offsets by
  block distance, positions spelled c * 20 + j, c * 17 + j, 2 (c n + j), reversed within a block, as a cumulative
  sum of ones or a float iota, a slice or row of a global arange addressed by the device index, a block skipped
  by its extremes (a whole block read as one run), the output flattened, q passed flattened, an all_gather
  inside, k/v shorter than q, the sequence on ("cp", "dp"), an [S, S] bias table sharded on its rows, a
  data-dependent trip count, every block merged twice, flash-attention's full / masked / skip lax.switch by chunk
  positions (with a positional or a local-tril diagonal mask: correct under zigzag, but not proved), the
  plain-autodiff backward of the blockwise kernels and of most one-block ones; and every must-refuse program.
- Rings whose collective_permute sends blocks 2 or 3 devices along are not found as rings at all (no decision):
  left alone, but silently.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardfix import autofix_shardings
from support.ring_audit11 import AUDIT

PERMUTATION = "shardfix.sequence_permutation"
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

# Programs the pass rewrites under zigzag (observed); the others are left alone under every layout. Both kinds are
# lowered in batches (one batch a mesh and kind); a batch where something is rewritten is compiled and compared with
# jax.jit's, one where nothing is must hold no permutation (its module is jax.jit's).
REWRITTEN = {
    "q-ring-causal", "bidirectional-unrolled", "stacked-kv", "positions-uint32", "positions-broadcasted-iota",
    "positions-float-data", "mask-neg-inf-guarded", "mask-neg-1e9", "mask-documents", "mask-window-abs",
    "mask-modulo-12", "blockwise-chunks", "blockwise-chunks-window", "blockwise-remat", "lse-carry",
    "lax-max-normalised", "bf16-inputs", "remat-step", "vmap-heads", "two-ring-layers", "scan-over-layers",
    "check-vma", "ring-first-axis", "auto-axes-q-ring", "pos-uint32-wrapping-window20", "pos-int16-window20",
    "send-first", "layout-k-transposed", "layout-out-transposed", "layout-psum-position-weights", "rope-on-the-fly",
    "packed-documents", "pooled-between-layers", "shifted-pairs-between-layers", "operand-read-outside",
    "shared-jitted-helper", "shared-body-one-refused", "sharded-rope-tables", "int8-doubled-positions",
    "q-ring-blockwise", "ring-in-cond", "remat-whole-layer", "partial-manual-explicit"}
# Of those, the ones the defaults rewrite too (zigzag, the tile count's choice): the blockwise kernels.
DEFAULTS = {"blockwise-chunks", "blockwise-remat", "vmap-heads", "scan-over-layers", "check-vma",
            "pooled-between-layers", "shifted-pairs-between-layers", "operand-read-outside",
            "q-ring-blockwise", "ring-in-cond", "remat-whole-layer", "partial-manual-explicit"}
# Gradients compared: those whose backward the pass rewrites under zigzag (the others' backward rings are left
# alone, so their gradient program is jax.jit's), and one must-refuse program.
GRAD = ["q-ring-causal", "rope-on-the-fly", "layout-k-transposed", "stacked-kv", "lse-carry", "lax-max-normalised",
        "blockwise-chunks", "refuse-cond-skip-block-index"]
# Rings the detector does not find (blocks sent 2 or 3 devices along): no decision, nothing rewritten.
UNDETECTED = {"ring-shift3", "refuse-dilated-ring-shift2"}


@functools.cache
def built(name):
    return AUDIT[name].build()


def target(name: str, grad: bool):
    fn, args = built(name)
    if grad:
        return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) ** 2), argnums=(0, 1, 2)), args
    return fn, args


@functools.cache
def lowered(name: str, grad: bool, strategy: str):
    fn, args = target(name, grad)
    return autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(*args)


def describe(low):
    return [(r.applied, r.strategy, r.why[:200]) for r in low.rings]


def _batches():
    groups: dict = {}
    for name in AUDIT:
        mesh = jax.tree.leaves(built(name)[1])[0].sharding.mesh
        kind = "defaults" if name in DEFAULTS else "asked" if name in REWRITTEN else "left"
        groups.setdefault((id(mesh), kind), []).append(name)
    return {f"mesh{i}-{key[1]}": tuple(names) for i, (key, names) in enumerate(groups.items())}


BATCHES = _batches()


def _combined(names):
    fns = [target(n, False)[0] for n in names]
    return (lambda all_args: [f(*a) for f, a in zip(fns, all_args)]), [target(n, False)[1] for n in names]


def _assert_equal(name, got, want):
    tol = 2e-2 if AUDIT[name].bf16 else 1e-5
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol,
                                   err_msg=f"SOUNDNESS: {name}")


@functools.cache
def _reference(batch):
    fn, args = _combined(BATCHES[batch])
    return jax.jit(fn).lower(args).compile(compiler_options=FAST)(args)


@functools.cache
def _batch_lowered(batch, strategy):
    fn, args = _combined(BATCHES[batch])
    return autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(args), args


def _text(low):
    return re.sub(r'(strategy = "zigzag", stripe = )\d+', r"\g<1>0", low.as_text())


@pytest.mark.parametrize("strategy", ["auto", "zigzag"])
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_forward_results_equal_jax_jit(batch, strategy):
    low, args = _batch_lowered(batch, strategy)
    if not any(r.applied for r in low.rings):
        assert PERMUTATION not in low.as_text()
        return
    if strategy == "auto" and _text(low) == _text(_batch_lowered(batch, "zigzag")[0]):
        low = _batch_lowered(batch, "zigzag")[0]  # the same program: compiled once
    got = _compiled(batch, low)(args)
    for name, g, w in zip(BATCHES[batch], got, _reference(batch)):
        _assert_equal(name, g, w)


_COMPILED: dict = {}


def _compiled(batch, low):
    key = (batch, id(low))
    if key not in _COMPILED:
        _COMPILED[key] = low.compile(compiler_options=FAST)
    return _COMPILED[key]


def test_gradients_equal_jax_jit():
    """The gradients whose backward rings the pass rewrites under zigzag, in one program, against jax.jit's."""
    names = [n for n in GRAD if not AUDIT[n].refuse]
    fns = [target(n, True)[0] for n in names]
    args = [target(n, True)[1] for n in names]

    def fn(all_args):
        return [f(*a) for f, a in zip(fns, all_args)]

    want = jax.jit(fn).lower(args).compile(compiler_options=FAST)(args)
    low = autofix_shardings(fn, ring_reorder="zigzag", on_fix="ignore").lower(args)
    assert len(low.rings) == 2 * len(names) and all(r.applied for r in low.rings), describe(low)
    for name, g, w in zip(names, low.compile(compiler_options=FAST)(args), want):
        _assert_equal(name, g, w)


@pytest.mark.parametrize("name", [n for n in GRAD if AUDIT[n].refuse])
def test_gradient_of_a_must_refuse_program_is_left_alone(name):
    for strategy in ("auto", "zigzag"):
        low = lowered(name, True, strategy)
        assert low.rings and not any(r.applied for r in low.rings), describe(low)
        assert PERMUTATION not in low.as_text()  # the program is jax.jit's


@pytest.mark.parametrize("name", [n for n, a in AUDIT.items() if a.refuse])
def test_must_refuse_programs_are_left_alone(name):
    for strategy in ("auto", "zigzag", "striped"):
        low = lowered(name, False, strategy)
        if name in UNDETECTED:
            assert not low.rings, describe(low)
            # ... and said, at the region, with what the permute does instead
            step = 3 if name == "ring-shift3" else 2
            assert any(f'sends each block {step} devices along "cp" (device i to i + {step}), not to the next one'
                       in remark.message for remark in low.report.remarks), low.report.remarks
        else:
            assert low.rings, "no ring found"
            for r in low.rings:
                assert not r.applied, describe(low)
                assert r.why.startswith(("not provably safe", "sequence length")), r.why
        assert PERMUTATION not in low.as_text()


@pytest.mark.parametrize("name", ["blockwise-chunks", "vmap-heads", "scan-over-layers", "check-vma",
                                  "pooled-between-layers", "shifted-pairs-between-layers", "operand-read-outside",
                                  "q-ring-blockwise", "remat-whole-layer", "partial-manual-explicit"])
def test_blockwise_programs_are_rewritten_by_the_defaults(name):
    """The programs above whose comparison is meaningful under the defaults: every ring rewritten (zigzag)."""
    low = lowered(name, False, "auto")
    assert low.rings and all(r.applied and r.strategy == "zigzag" for r in low.rings), describe(low)


def test_ring_regions_in_the_branches_of_a_cond():
    """The proved branch's region is rewritten, the refused branch's left alone."""
    low = lowered("ring-in-cond", False, "auto")
    assert sorted(r.applied for r in low.rings) == [False, True], describe(low)


def test_gradient_of_a_layer_under_checkpoint():
    """jax.checkpoint around the whole ring layer: the forward region is rewritten, the one the backward
    recomputes is refused with the backward (their group), and the gradient is jax.jit's."""
    fn, args = target("remat-whole-layer", True)
    want = jax.jit(fn).lower(*args).compile(compiler_options=FAST)(*args)
    low = lowered("remat-whole-layer", True, "auto")
    assert sorted(r.applied for r in low.rings) == [False, False, True], describe(low)
    _assert_equal("remat-whole-layer", low.compile(compiler_options=FAST)(*args), want)


def test_one_jitted_body_in_a_proved_and_a_refused_region():
    """The refused region keeps the body as written while the proved one gets its rewritten copy."""
    low = lowered("shared-body-one-refused", False, "zigzag")
    assert sorted(r.applied for r in low.rings) == [False, True], describe(low)
