"""Ring programs written as users write them (tests/support/ring_user_programs.py), each through
`@autofix_shardings` with its defaults and with the layouts it declares:

- every ring decision is the one the program declares: rewritten; left alone as balanced (proved, not worth a
  permutation); proved (either, as the cost model chooses); or refused, naming the op and the user's line that
  broke the proof (one of the lines the program marks `# refused here`);
- every program computes what jax.jit computes (to 1e-5; its gradients for the differentiated ones). To keep the
  suite fast the programs run in batches: one jitted function computes a batch of programs of one mesh, the same
  batch goes through the decorator (whose decisions must be the programs' own), and each program's results are
  compared with jax.jit's.
"""

from __future__ import annotations

import functools
import inspect
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardfix import autofix_shardings
from support import ring_user_variants as uv
from support.ring_user_programs import PROGRAMS, Program, grad_of_two_results, meshes, zigzag_layout

PERMUTATION = "shardfix.sequence_permutation"
BY_NAME = {p.name: p for p in PROGRAMS}
OP = re.compile(r"'(stablehlo|func|sdy|chlo)\.[a-z_]+'")
BATCH = 12
# The programs are tiny: what costs is compiling them. Both sides of every comparison compile with these options
# (XLA's CPU backend without its expensive LLVM passes takes a third of the time).
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@functools.cache
def _meshes():
    return meshes()


@functools.cache
def target(name: str):
    """(the function under test, its arguments): the program, or the gradient of a loss that reads its result
    (as training does: later layers read the attention's output), sum(y * w + y * y / 2)."""
    p = BY_NAME[name]
    fn, args = p.build(_meshes()[p.mesh])
    if not p.grad:
        return fn, args
    w = np.random.default_rng(7).standard_normal(jax.eval_shape(fn, *args).shape).astype(np.float32)
    return jax.grad(lambda *a: _loss(fn(*a), w), argnums=p.wrt), args


def _loss(y, w):
    return jnp.sum(y * w + y * y / 2)


@functools.cache
def lowered(name: str, strategy: str):
    fn, args = target(name)
    if BY_NAME[name].expect == "refused":
        # the lines a refusal cites come from tracebacks; a function JAX traced for another program first (its
        # PRNG's loop, say) keeps that program's
        jax.clear_caches()
    return autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(*args)


def describe(low) -> list[tuple[str, bool, str]]:
    return [(r.strategy, r.applied, r.why) for r in low.rings]


def assert_refused_at_marked_line(p: Program, low, strategy: str = "auto"):
    lines = p.refused_lines()
    for r in low.rings:
        assert not r.applied, describe(low)
        if strategy == "striped" and "is not a multiple of" in r.why:
            continue  # no stripe fits the units the program reads: refused before any proof
        assert r.why.startswith("not provably safe"), r.why
        assert OP.search(r.why), r.why
        cited = {int(n) for n in re.findall(r"ring_user_(?:refusals|kernels|programs|variants|lse)\.py:(\d+)", r.why)}
        if p.grad and not cited & set(lines):
            # a backward is paired with its forward only where every op of it carries the traceback of a proved
            # forward op; in a process that traced jnp's jitted helpers for another program first, their ops carry
            # that program's, so the backward is proved from its own ops and the first op refused is named
            assert cited, r.why
            continue
        assert cited & set(lines), f"{r.why}\n cites none of the marked lines {lines}"


# ---------------------------------------------------------------------------------------------------------------
# Decisions, program by program (lowering only).


@pytest.mark.parametrize("name", [p.name for p in PROGRAMS])
def test_decision_under_defaults(name):
    p = BY_NAME[name]
    low = lowered(name, "auto")
    assert low.rings, "no ring found"
    if p.expect == "rewritten":
        assert all(r.applied for r in low.rings), describe(low)
    elif p.expect == "balanced":
        assert not any(r.applied for r in low.rings), describe(low)
        for r in low.rings:
            assert not r.why.startswith("not provably safe") and p.reason in r.why, r.why
    elif p.expect == "proved":
        for r in low.rings:
            assert r.applied or not r.why.startswith("not provably safe"), r.why
    else:
        assert_refused_at_marked_line(p, low)
    if not any(r.applied for r in low.rings):
        assert PERMUTATION not in low.as_text()


@pytest.mark.parametrize("name,tiles", [("grad-blockwise-causal", (58, 34)), ("grad-nested-blockwise-causal", (58, 34)),
                                        ("grad-blockwise-python-causal", (15, 9)),
                                        ("grad-blockwise-python-causal-guarded", (15, 9))])
def test_plain_autodiff_backward_counted_with_the_predicates_its_forward_saved(name, tiles):
    """The backward JAX made of a blockwise kernel skips the chunk pairs its forward skipped, reading the case
    indices the forward saved (a residual, handed out of the forward's region and, nested, out of and into the dp
    shard_maps around the rings). The tile count runs the backward on the values the forward's count computed
    under each layout, so its skips are known, not data: forward and backward alike 58 -> 34 tiles (ideal 34) with
    four chunks a device, 15 -> 9 (ideal 9) with two, the chunk loops written in Python."""
    low = lowered(name, "auto")
    before, after = tiles
    assert [(r.applied, r.strategy, r.critical_before, r.critical_after, r.ideal, r.basis) for r in low.rings] == \
        [(True, "zigzag", before, after, float(after), "positions, hops and chunk indices")] * 2, describe(low)


@pytest.mark.parametrize("name,strategy", [(p.name, s) for p in PROGRAMS for s in p.strategies])
def test_decision_for_the_layout_asked(name, strategy):
    low = lowered(name, strategy)
    assert low.rings and all(r.applied and r.strategy.startswith(strategy) for r in low.rings), describe(low)


@pytest.mark.parametrize("name", [p.name for p in PROGRAMS if p.expect == "refused"])
def test_refused_whatever_the_layout_asked(name):
    for strategy in ("zigzag", "striped"):
        low = lowered(name, strategy)
        assert_refused_at_marked_line(BY_NAME[name], low, strategy)
        assert PERMUTATION not in low.as_text()


def test_backward_whose_forward_result_was_dropped_is_left_alone():
    """sum(y * w) reads y only through its derivative: JAX drops the forward's result from the program, and the
    backward holds the linear part of ops found nowhere else, so there is no forward to prove it from."""
    p = BY_NAME["grad-fori-causal"]
    fn, args = p.build(_meshes()[p.mesh])
    w = np.ones(jax.eval_shape(fn, *args).shape, np.float32)
    low = autofix_shardings(jax.grad(lambda *a: jnp.sum(fn(*a) * w), argnums=p.wrt), ring_reorder="zigzag",
                            on_fix="ignore").lower(*args)
    assert len(low.rings) == 2 and not any(r.applied for r in low.rings), describe(low)
    # JAX's record of the differentiation (ring/ties.py) names the result the backward differentiates
    assert any("differentiates result 0 of the ring region at" in r.why and "does not compute" in r.why
               for r in low.rings), describe(low)
    assert PERMUTATION not in low.as_text()


def _two_results(tail):
    """A causal ring that returns its attention z and a second result y = sum over hops of tail(v block, k block)."""
    from support import ring_user_kernels as uk

    def body(q, k, v):
        cp, n = 4, q.shape[1]
        me = jax.lax.axis_index("cp")
        q_pos = (me * n + jnp.arange(n))[:, None]

        def step(i, carry):
            acc, y, k, v = carry
            k_pos = (((me - i) % cp) * n + jnp.arange(n))[None, :]
            acc = uk.merge_online(acc, jnp.where(q_pos >= k_pos, uk.scores(q, k), uk.NEG), v, i)
            y = y + tail(v, k)
            k, v = (jax.lax.ppermute(t, "cp", uk.ring(cp)) for t in (k, v))
            return acc, y, k, v

        (_, l, o), y, _, _ = jax.lax.fori_loop(0, cp, step, (uk.row_stats(q, uk.NEG) + (jnp.zeros_like(q),),
                                                              jnp.zeros_like(v), k, v))
        return o / l[..., None], y

    return body


_LINEAR_TAIL = "lambda v, k: jnp.roll(v * jnp.tanh(k).mean(), 1, axis=1)"


def _assert_backward_left_alone(body) -> None:
    """body's z is read (returned beside the gradient), its y only through its derivative: nothing may be
    rewritten, under either layout."""
    grad, args = grad_of_two_results(body)

    for strategy in ("zigzag", "striped"):
        low = autofix_shardings(grad, ring_reorder=strategy, on_fix="ignore").lower(*args)
        assert len(low.rings) == 2 and not any(r.applied for r in low.rings), describe(low)
        assert PERMUTATION not in low.as_text()


@pytest.mark.parametrize("tail", [
    eval(_LINEAR_TAIL),  # linear in v: y's ops live in the backward only
    lambda v, k: jnp.exp(jnp.roll(v, 1, axis=1)) * 0.1,  # the roll runs in the forward, for a residual only
], ids=["linear", "residual"])
def test_backward_of_a_result_read_only_through_its_derivative_beside_a_proved_one_is_left_alone(tail):
    """z is read (returned beside the gradient); y, which rolls tokens within a block (what the reorder changes), is
    read only through its derivative. Only z's forward is proved, so the backward, which also differentiates y, is
    not the transpose of anything proved: it is left alone, and the forward with it."""
    _assert_backward_left_alone(_two_results(tail))


def test_backward_written_in_a_folder_named_jax_is_the_users(tmp_path):
    """The same program, in a user's module under a folder named `jax`: its frames are the user's, not JAX's
    machinery (which any transpose may contain), so the backward's ops still say where they were made."""
    namespace = dict(globals())
    source = textwrap.dedent(inspect.getsource(_two_results)) + f"\nTAIL = {_LINEAR_TAIL}\n"
    exec(compile(source, str(tmp_path / "jax" / "ring.py"), "exec"), namespace)
    _assert_backward_left_alone(namespace["_two_results"](namespace["TAIL"]))


def test_backward_without_tracebacks_in_its_locations_is_left_alone():
    """Where JAX leaves tracebacks out of the locations (jax_traceback_in_locations_limit=0), no op of a transpose
    says where it was made: it is not paired with the forward."""
    limit = jax.config.jax_traceback_in_locations_limit
    jax.config.update("jax_traceback_in_locations_limit", 0)
    try:
        _assert_backward_left_alone(_two_results(eval(_LINEAR_TAIL)))
    finally:
        jax.config.update("jax_traceback_in_locations_limit", limit)


def test_backward_of_a_result_made_by_the_same_expression_as_a_proved_one_is_left_alone():
    """As above, but one expression of one line (a comprehension) makes both what z reads (q shifted over features,
    which the reorder keeps) and what y sums (v shifted over tokens, which it changes): every op of the backward,
    which differentiates y only, carries the traceback of an op z depends on. The gradient must still be
    jax.jit's."""
    jax.clear_caches()  # a jaxpr JAX cached for an earlier program keeps that program's tracebacks
    from support import ring_user_kernels as uk

    grad, args = grad_of_two_results(uk.same_expression_ring)
    want = jax.jit(grad)(*args)
    for strategy in ("zigzag", "striped"):
        low = autofix_shardings(grad, ring_reorder=strategy, on_fix="ignore").lower(*args)
        for got, ref in zip(jax.tree.leaves(low.compile()(*args)), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5, err_msg=describe(low))


@pytest.mark.parametrize("name", sorted(uv.TWINS))
def test_refused_look_alike_would_compute_something_else_if_reordered(name):
    """Each accepted spelling and its refused look-alike, reordered by hand as the pass would with the proof off:
    tokens in the zigzag layout, every position the kernel computes from a coordinate rewritten to the zigzag
    positions, the result put back in order. The accepted spelling then computes what jax.jit computes; the
    look-alike does not, so its refusal is needed, not just cautious."""
    differences = _reordered_by_hand([lambda cp, zigzag, make=make: make(cp) if zigzag is None
                                      else make(cp, positions=zigzag) for make in uv.TWINS[name]])
    accepted, refused = differences
    assert accepted <= 1e-5 and refused > 1e-2, differences


def _reordered_by_hand(makes: list, finite: bool = False) -> list[float]:
    """For each make(cp, positions) -> per-device body (positions None: the kernel's own), max |the body run on
    the zigzag layout with the zigzag positions, its result put back in order - jax.jit's as written| (inf where
    it is nan and jax.jit's a number). `finite`: jax.jit's result must be all numbers (a difference, not two nans,
    tells the programs apart)."""
    from support.ring_user_programs import qkv, sharded

    mesh = _meshes()["explicit"]
    cp = mesh.shape["cp"]
    args = qkv(mesh)
    order, zigzag = zigzag_layout(cp, args[0].shape[1])
    permuted = [jax.device_put(np.asarray(x)[:, order], x.sharding) for x in args]
    differences = []
    for make in makes:
        want = np.asarray(jax.jit(sharded(mesh, make(cp, None), 3))(*args))
        assert not finite or np.isfinite(want).all()
        got = np.asarray(jax.jit(sharded(mesh, make(cp, zigzag), 3))(*permuted))[:, np.argsort(order)]
        gap = np.abs(got - want)
        differences.append(np.inf if np.isnan(gap).any() else float(gap.max()))
    return differences


def _lse(merge: str, **options):
    from support import ring_user_lse as ul
    return lambda cp, positions: ul.lse_ring(cp, merge, positions=positions, **options)


def _hard_max(cp, positions):
    from support import ring_user_lse as ul
    return ul.hard_max_ring(cp, positions)


# Each order-free (out, lse) merge beside its refused look-alike: make(cp, positions) -> per-device body.
LSE_TWINS = {
    "decayed-output": (_lse("logaddexp"), _lse("decayed")),
    "output-weighted-by-step": (_lse("logaddexp"), _lse("hop-weighted")),
    "output-of-largest-lse": (_lse("logaddexp"), _lse("argmax")),
    "latest-block-kept": (_lse("logaddexp"), _lse("latest")),
    "hard-max-of-lses": (_lse("max"), _hard_max),
    "sigmoid-from-a-sentinel-start": (_lse("logaddexp", first="peeled"), _lse("sigmoid")),
    "guard-on-a-sentinel-start": (_lse("guarded-logaddexp", init="inf"), _lse("guarded-sigmoid")),
}


@pytest.mark.parametrize("name", sorted(LSE_TWINS))
def test_refused_lse_merge_would_compute_something_else_if_reordered(name):
    """As above, for the flash-attention style merges of each block's (out, lse): the accepted spelling, reordered
    by hand to the zigzag layout, computes what jax.jit computes; its refused look-alike does not (the sigmoid form
    from a start of -1e30 too: its first merge cancels the start to an lse of 0, and which block that lse is
    wrongly given is the layout's; beside it, logaddexp from the block before the loop, which ring-reorder accepts
    where the scores are masked, unlike the sigmoid form from there)."""
    from support.ring_user_lse import contiguous

    differences = _reordered_by_hand([lambda cp, zigzag, make=make: make(cp, contiguous if zigzag is None else zigzag)
                                      for make in LSE_TWINS[name]], finite=True)
    accepted, refused = differences
    assert accepted <= 1e-5 and refused > 1e-2, differences


@pytest.mark.parametrize("axes", [("dp", "cp"), ("cp",)], ids=["one-ring-of-both-axes", "ring-along-cp"])
def test_sequence_split_on_two_mesh_axes_is_left_as_written(axes):
    """The sequence split on ("dp", "cp"), the ring over both axes or along "cp" within each "dp" group: the pass
    reorders along one mesh axis only, so it leaves these rings exactly as written, under the defaults and with a
    layout asked, and they compute what jax.jit computes."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = _meshes()["explicit"]
    spec = P(None, ("dp", "cp"), None)
    fn = jax.shard_map(uv.both_axes_ring(axes, (mesh.shape["dp"], mesh.shape["cp"])), mesh=mesh,
                       in_specs=(spec,) * 3, out_specs=spec, check_vma=False)
    rng = np.random.default_rng(3)
    args = [jax.device_put(rng.standard_normal((2, 64, 8)).astype(np.float32), NamedSharding(mesh, spec))
            for _ in range(3)]
    want = np.asarray(jax.jit(fn)(*args))
    for strategy in ("auto", "zigzag"):
        low = autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(*args)
        assert not any(r.applied for r in low.rings) and PERMUTATION not in low.as_text(), describe(low)
        np.testing.assert_allclose(np.asarray(low.compile(compiler_options=FAST)(*args)), want, atol=1e-5)


def test_registry_covers_every_kind():
    assert len(PROGRAMS) == len(BY_NAME) >= 80
    kinds = {"fori-", "scan-", "unrolled-", "blockwise-", "grad-", "vjp-", "nested-", "partial-", "refuse-", "@auto",
             "@cp8", "window8", "window40", "alibi", "prefix20", "chunked", "segments", "sinks", "rope-table",
             "prefill-offset", "guarded", "step0-reset", "bidirectional", "lse-", "blockwise-causal-lse",
             "refuse-lse-"}
    for kind in kinds:
        assert any(kind in name for name in BY_NAME), kind


# ---------------------------------------------------------------------------------------------------------------
# Results, in batches of programs of one mesh.


def _batches() -> list[tuple[str, tuple[str, ...]]]:
    """Programs of one mesh and one expectation together: where the defaults rewrite every program the zigzag
    batch is the same program (compiled once), where they rewrite none only the layouts asked are compiled, and
    refused programs are never compiled (what runs is jax.jit's program)."""
    out = []
    for mesh in ("explicit", "auto", "cp8"):
        for group, expects in (("rewritten", ("rewritten",)), ("proved", ("proved", "balanced")),
                               ("refused", ("refused",))):
            names = [p.name for p in PROGRAMS if p.mesh == mesh and p.expect in expects]
            out += [(f"{mesh}-{group}-{i // BATCH}", tuple(names[i:i + BATCH])) for i in range(0, len(names), BATCH)]
    return out


BATCHES = dict(_batches())


def _combined(names: tuple[str, ...]):
    fns = [target(n)[0] for n in names]
    return (lambda all_args: [f(*a) for f, a in zip(fns, all_args)]), [target(n)[1] for n in names]


@functools.cache
def references(batch: str):
    fn, args = _combined(BATCHES[batch])
    return jax.jit(fn).lower(args).compile(compiler_options=FAST)(args)


@functools.cache
def batch_lowered(batch: str, strategy: str):
    names = BATCHES[batch]
    if strategy == "striped":
        names = tuple(n for n in names if "striped" in BY_NAME[n].strategies)
    fn, args = _combined(names)
    return names, autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(args)


def _program(low) -> str:
    """The patched module's text, less the stripe a zigzag permutation's marker records (unused by zigzag)."""
    return re.sub(r'(strategy = "zigzag", stripe = )\d+', r"\g<1>0", low.as_text())


@pytest.mark.parametrize("strategy", ["auto", "zigzag", "striped"])
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_results_equal_jax_jit(batch, strategy):
    names, low = batch_lowered(batch, strategy)
    if not names:
        return
    # the batch decides what its programs decide alone
    alone = sorted(r.applied for n in names for r in lowered(n, strategy).rings)
    assert sorted(r.applied for r in low.rings) == alone, describe(low)
    if strategy == "zigzag" and _program(low) == _program(batch_lowered(batch, "auto")[1]):
        return  # the program the defaults made, already compared
    if not any(alone):
        assert PERMUTATION not in low.as_text()
        return
    got = low.compile(compiler_options=FAST)([target(n)[1] for n in names])
    want = dict(zip(BATCHES[batch], references(batch)))
    wrong = []
    for name, result in zip(names, got):
        for a, b in zip(jax.tree.leaves(result), jax.tree.leaves(want[name]), strict=True):
            if not np.allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5):
                wrong.append(f"{name}: max difference {np.max(np.abs(np.asarray(a) - np.asarray(b))):.3g}")
    assert not wrong, "SOUNDNESS: " + "; ".join(wrong)


def test_bfloat16_merge_state_is_proved_and_rewritten_to_bfloat16_precision():
    """A causal ring over bfloat16 q, k, v that stores its merge state in bfloat16 between steps
    (`.astype(q.dtype)`, the state made with jnp.full), the merge itself in float32: a float->float convert is the
    identity in exact arithmetic, so the merge is the online softmax, proved, and rewritten where a layout is asked.
    Compared with jax.jit's bfloat16 run to 2e-2: the reordered ring merges each query's blocks in another order and
    rounds the state to bfloat16 (a relative step of 2^-8) after every step, so the two may differ by a few
    bfloat16 steps of the O(1) outputs. (A truncating integer convert in the same place is refused:
    refuse-int-truncated-sum.)"""
    from support.ring_user_programs import qkv, sharded

    mesh = _meshes()["explicit"]
    fn = sharded(mesh, uv.bf16_state(mesh.shape["cp"], init="full"), 3)
    args = tuple(x.astype(jnp.bfloat16) for x in qkv(mesh))
    low = autofix_shardings(fn, on_fix="ignore").lower(*args)
    assert low.rings and all(not r.why.startswith("not provably safe") for r in low.rings), describe(low)
    low = autofix_shardings(fn, ring_reorder="zigzag", on_fix="ignore").lower(*args)
    assert low.rings and all(r.applied for r in low.rings), describe(low)
    got = np.asarray(low.compile(compiler_options=FAST)(*args), np.float32)
    want = np.asarray(jax.jit(fn).lower(*args).compile(compiler_options=FAST)(*args), np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_result_that_depends_on_the_ring_step_is_refused_in_the_users_words():
    """A temperature that grows with the ring step reaches the result (which keys meet which temperature changes
    with the layout): refused at the user's line that reads the step counter as a number, saying what depends on
    the step and what to do, without the analysis's own notation of the value."""
    p = BY_NAME["refuse-hop-temperature"]
    low = lowered(p.name, "auto")
    (ring_decision,) = low.rings
    (line,) = p.refused_lines()
    assert not ring_decision.applied and ring_decision.loc.line == line, ring_decision
    assert ring_decision.why == (
        f"not provably safe: 'stablehlo.convert' at {ring_decision.loc} result 0 depends on the ring step, not "
        "only on tokens: a value computed from the loop's step counter (a temperature, bias or weight per step) "
        "meets the tokens of the block that step brings, and which block that is changes with the layout; compute "
        "it from the tokens' positions instead")
    assert PERMUTATION not in low.as_text()


def test_ring_short_of_a_step_is_refused_at_the_users_last_merge():
    """An unrolled ring that stops one step early (no loop to count): the result misses a block; refused at the
    line of the last merge into it, saying what is left out and what to write."""
    p = BY_NAME["refuse-ring-one-step-short-unrolled"]
    (ring_decision,) = lowered(p.name, "auto").rings
    (line,) = p.refused_lines()
    assert ring_decision.loc.line == line, ring_decision
    assert ring_decision.why == (
        f"not provably safe: 'stablehlo.add' at {ring_decision.loc} result 0 is a merge over ring blocks that "
        "has not folded in every block: a ring that runs fewer steps than its 4 devices, or skips a block, leaves "
        "tokens out, and which tokens those are changes with the layout; merge one block at each of the 4 ring "
        "steps")


def test_skip_decided_in_floating_point_by_a_position_outside_its_blocks_is_refused_for_that():
    """A skip predicate held as data (a position tested in floating point) is accepted only where every position
    it reads is one of the two units' it skips (ring/branches.py); here one is the next device's first token."""
    (ring_decision,) = lowered("refuse-neighbour-position-skip", "auto").rings
    assert "skips blocks by a predicate that reads positions outside the two units it skips" in ring_decision.why, \
        ring_decision.why
