"""What @autofix_shardings records while JAX differentiates a ring shard_map (ring/ties.py, shardfix.jit._jax's
autodiff ties): which result of the original shard_map each cotangent operand of the backward region differentiates,
which results had a symbolically zero cotangent, and which results the forward region still computes after JAX
dropped those nobody reads. The module alone does not say (two results of one type look alike); these tests fail
where JAX's shard_map autodiff rules move and the record goes missing or wrong."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardfix import autofix_shardings
from shardfix.jit import tracing
from shardfix.ring import ties
from support import ring_user_kernels as uk
from support.ring_user_programs import grad_of_two_results, meshes

SPEC = jax.sharding.PartitionSpec("dp", "cp", None)
_NAME = re.compile(r'loc\("([^"]*)"')


def _two_results(mesh):
    """A ring with two results of one type: z (a per-token function of q and k) and y (v rolled over tokens)."""
    def body(q, k, v):
        z = q * jnp.tanh(k)
        y = jnp.concatenate([v[:, -1:], v[:, :-1]], axis=1) * jnp.tanh(k)
        return z, y
    return jax.shard_map(body, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=(SPEC, SPEC))


def _args(mesh):
    rng = np.random.default_rng(0)
    return [jax.device_put(rng.standard_normal((2, 16, 4)).astype(np.float32), jax.NamedSharding(mesh, SPEC))
            for _ in range(3)]


def _ties_of(fun, args) -> tuple[list[ties.Tie], list[ties.Tie]]:
    """The forward and backward ties of the shard_map regions of jax.jit(fun)'s module, traced as
    @autofix_shardings traces (in a repair session)."""
    with tracing.repairing():
        module = jax.jit(fun).lower(*args).compiler_ir("stablehlo")
    found = [ties.of_location(name) for name in _region_names(module.operation)]
    return ([t for t in found if t is not None and t.role is ties.Role.FORWARD],
            [t for t in found if t is not None and t.role is ties.Role.BACKWARD])


def _region_names(op) -> list[str]:
    """The location name of each manual computation nested in `op`."""
    names = []
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                if inner.name == "sdy.manual_computation":
                    found = _NAME.search(str(inner.location))
                    names.append(found.group(1) if found else "")
                names += _region_names(inner)
    return names


@pytest.mark.parametrize("read, differentiated, zero", [
    ("y", {0: 1}, {0}),  # loss reads y only through its derivative, z is aux: the forward drops y
    ("z", {0: 0}, {1}),  # the other way round
    ("both", {0: 0, 1: 1}, set()),
])
def test_the_backward_names_the_results_its_cotangents_differentiate(read, differentiated, zero):
    mesh = meshes()["explicit"]
    f = _two_results(mesh)
    w = np.arange(2 * 16 * 4, dtype=np.float32).reshape(2, 16, 4)

    def loss(q, k, v):
        z, y = f(q, k, v)
        value = {"y": jnp.sum(y * w), "z": jnp.sum(z * w), "both": jnp.sum(z * w) + jnp.sum(y * y)}[read]
        return value, (z if read == "y" else y if read == "z" else None)

    with jax.set_mesh(mesh):
        forwards, backwards = _ties_of(jax.grad(loss, argnums=(0, 1, 2), has_aux=True), _args(mesh))
    assert len(backwards) == 1 and len(forwards) == 1, (forwards, backwards)
    backward, forward = backwards[0], forwards[0]
    assert backward.ring == forward.ring and backward.results == forward.results == 2
    assert backward.cotangents() == differentiated
    assert backward.zero == zero
    # the forward region computes the results whose values the program reads (aux, or y for y * y's derivative);
    # the others JAX dropped
    assert {j for j in forward.slots if j is not None} == {"y": {0}, "z": {1}, "both": {1}}[read], forward


def test_nothing_is_recorded_outside_a_repair_session():
    mesh = meshes()["explicit"]
    f = _two_results(mesh)

    def loss(q, k, v):
        z, y = f(q, k, v)
        return jnp.sum(y) + jnp.sum(z)

    with jax.set_mesh(mesh):
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*_args(mesh)).as_text(debug_info=True)
    assert ties.PREFIX not in text


def test_a_backward_of_a_result_made_by_the_same_expression_as_a_proved_one_is_refused_by_name():
    """The program of [audit2] (tests/test_ring_user_programs.py): one comprehension makes what z reads (q shifted
    over features) and what y sums (v shifted over tokens); the loss reads y only through its derivative and
    returns z. The refusal names the result the backward differentiates, which the forward does not compute."""
    jax.clear_caches()
    grad, args = grad_of_two_results(uk.same_expression_ring)
    low = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore").lower(*args)
    assert not any(r.applied for r in low.rings), [(r.applied, r.why) for r in low.rings]
    assert any("differentiates result 1 of the ring region at" in r.why and "operand 0 is its cotangent" in r.why
               for r in low.rings), [r.why for r in low.rings]
    for got, want in zip(jax.tree.leaves(low.compile()(*args)), jax.tree.leaves(jax.jit(grad)(*args))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_a_ring_nested_in_a_data_parallel_shard_map_is_tied_apart_from_it():
    """dp outer, cp inner: each shard_map JAX differentiates gets its own ties, the inner regions' (whose names
    are relative to the outer body's) apart from the outer's."""
    from support.ring_user_programs import PROGRAMS
    p = next(p for p in PROGRAMS if p.name == "grad-nested-fori-causal@auto")
    fn, args = p.build(meshes()[p.mesh])
    with jax.set_mesh(meshes()[p.mesh]):
        forwards, backwards = _ties_of(jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=p.wrt), args)
    assert len(forwards) == len(backwards) == 2, (forwards, backwards)
    assert {t.ring for t in forwards} == {t.ring for t in backwards} and len({t.ring for t in forwards}) == 2
    for t in backwards:
        assert t.cotangents() == {0: 0} and t.zero == frozenset()
    for t in forwards:
        assert [j for j in t.slots if j is not None] == [0]


INVARIANT = "and each is the same for any value of the running maxima its sums are shifted by"
# obligation (d) (ring/recompute.py): the backward's integer ops are loop counters, or move the forward's residuals
NONE = re.compile(r"of the positions it may recompute \(obligation \(d\)\): none of its (\d+) integer and predicate "
                  r"ops computes a position: (\d+) are functions of constants and its own loop counters alone")


def _whys(grad, args) -> list[str]:
    """ring-reorder's reasons for the lowered `grad`, none of whose rings it may rewrite."""
    low = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore").lower(*args)
    assert low.rings and not any(r.applied for r in low.rings), [(r.applied, r.why) for r in low.rings]
    return [r.why for r in low.rings]


@pytest.mark.parametrize("name", ["grad-fori-causal", "grad-blockwise-causal", "blockwise-causal-guarded",
                                  "grad-partial-blockwise-causal"])
def test_a_plain_autodiff_online_softmax_is_rewritten_with_its_backward(name):
    """An online-softmax ring (the registry's fori kernel, the blockwise one: running state cut into chunks, scans
    over q and kv chunks, a lax.cond skip, and the blockwise one shifting by m_safe = where(isfinite(m), m, 0) under
    -inf masks, and the partly manual one) differentiated by jax.grad: the cotangent is tied to the ring's one result,
    which is proved; o = acc / l with acc and l shifted by the same running maximum at every step (slot by slot
    through the nested loops and the skip), so the cotangent reaching the maximum is zero; and its backward
    recomputes no position (without jax.checkpoint its integer ops are the reversed loop counters and the hop
    bookkeeping, or slice the masks the forward saved out of their stack). So forward and backward are rewritten
    (prove._accept_autodiff), and the gradient is jax.jit's."""
    from support.ring_user_programs import PROGRAMS, blockwise
    if name == "blockwise-causal-guarded":
        fn, args = blockwise("causal", merge="guarded")(meshes()["explicit"])
        wrt = (0, 1, 2)
    else:
        p = next(p for p in PROGRAMS if p.name == name)
        fn, args = p.build(meshes()[p.mesh])
        wrt = p.wrt
    grad = jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=wrt)
    fixed = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore")
    low = fixed.lower(*args)
    assert len(low.rings) >= 2 and all(r.applied for r in low.rings), [(r.applied, r.why) for r in low.rings]
    for got, want in zip(fixed(*args), jax.jit(grad)(*args)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def _checkpointed_ring(mesh):
    """A causal online-softmax ring whose step is jax.checkpoint'ed: the backward recomputes the step's key
    positions from the forward's residual device index `me` (no partition_id of its own) and its own iota, and the
    causal compare from them."""
    def body(q, k, v):
        n = q.shape[1]
        me = jax.lax.axis_index("cp")  # _ME_LINE
        q_pos = (me * n + jnp.arange(n))[:, None]

        @jax.checkpoint
        def step(i, carry):
            acc, k, v = carry
            k_pos = (((me - i) % 4) * n + jnp.arange(n))[None, :]  # _K_POS_LINE
            s = jnp.where(q_pos >= k_pos, uk.scores(q, k), uk.NEG)  # _MASK_LINE
            acc = uk.merge_online(acc, s, v, i)
            return (acc,) + tuple(jax.lax.ppermute(t, "cp", uk.ring(4)) for t in (k, v))

        (_, l, o), _, _ = jax.lax.fori_loop(0, 4, step, (uk.row_stats(q, uk.NEG) + (jnp.zeros_like(q),), k, v))
        return o / l[..., None]
    return jax.shard_map(body, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith("# " + marker))


def test_a_checkpointed_ring_step_recomputes_positions_in_its_backward_named_at_their_lines():
    """Under jax.checkpoint the backward recomputes (me - i) % 4, the key positions and the causal compare from
    the forward's residual `me`: its forward is proved and passes the stabiliser check, and the reason names those
    ops at the user's lines (the key positions' line, the mask's, the max's tie compare on the masked scores) and
    the position sources (axis_index's partition_id, the iotas), not the loop counters. Its gradient is left as
    jax.jit computes it."""
    mesh = meshes()["explicit"]
    f = _checkpointed_ring(mesh)
    args = _args(mesh)
    grad = jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2))
    whys = _whys(grad, args)
    tied = [why for why in whys if INVARIANT in why and "recomputes positions, or values from them, at" in why]
    assert tied, whys
    recomputed = re.search(r"it recomputes positions, or values from them, at (.*?) \(from (.*?)\), which are "
                           r"not rewritten", tied[0])
    assert recomputed, tied[0]
    at, sources = recomputed.groups()
    k_pos, mask = f"{__file__}:{_line_of('_K_POS_LINE')}", f"{__file__}:{_line_of('_MASK_LINE')}"
    lines = dict(re.findall(r"(\S+:\d+) \(([^)]*)\)", at))
    assert "compare" in lines[mask].split(", "), at
    assert {"subtract", "remainder", "multiply", "add", "iota"} <= set(lines[k_pos].split(", ")), at
    # and the max's tie compare on the scores masked there (merge_online); not the loop counters' ops (JAX's lines)
    assert all(line.startswith((f"{__file__}:", uk.__file__ + ":")) for line in lines), at
    sources = dict(re.findall(r"(\S+:\d+) \(([^)]*)\)", sources))
    assert sources[f"{__file__}:{_line_of('_ME_LINE')}"] == "partition_id", sources
    assert "iota" in sources[k_pos], sources
    assert not NONE.search(tied[0])
    got = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore")(*args)
    for a, b in zip(got, jax.jit(grad)(*args)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def _softmax_ring(mesh, two_maxima: bool = False, with_max: bool = False):
    """An online softmax over the ring (no mask). `two_maxima`: l is shifted by a second running maximum, carried
    in a slot of its own, merged by an op of its own and folded from another floor, of the same scores as the one
    acc is shifted by (the same value as far as the algebra knows, so the forward is proved alike, but another
    maximum). `with_max`: the running maximum is a second result."""
    def body(q, k, v):
        def step(_, carry):
            m1, m2, l, o, k, v = carry
            s = uk.scores(q, k)
            m1_new = jnp.maximum(m1, jnp.max(s, axis=-1))
            m2_new = jnp.maximum(m2, jnp.max(s, axis=-1)) if two_maxima else m1_new
            o = o * jnp.exp(m1 - m1_new)[..., None] + uk.apply(jnp.exp(s - m1_new[..., None]), v)
            l = l * jnp.exp(m2 - m2_new) + jnp.sum(jnp.exp(s - m2_new[..., None]), axis=-1)
            k, v = (jax.lax.ppermute(t, "cp", uk.ring(4)) for t in (k, v))
            return m1_new, m2_new, l, o, k, v

        def step1(i, carry):  # one running maximum
            m, l, o, k, v = carry
            m, _, l, o, k, v = step(i, (m, m, l, o, k, v))
            return m, l, o, k, v

        m0, l0 = uk.row_stats(q, uk.NEG)
        if two_maxima:
            # the second maximum folded from another floor
            m, _, l, o, _, _ = jax.lax.fori_loop(0, 4, step, (m0, m0 * 2, l0, jnp.zeros_like(q), k, v))
        else:
            m, l, o, _, _ = jax.lax.fori_loop(0, 4, step1, (m0, l0, jnp.zeros_like(q), k, v))
        return (o / l[..., None], m) if with_max else o / l[..., None]

    out = (SPEC, jax.sharding.PartitionSpec("dp", "cp")) if with_max else SPEC
    return jax.shard_map(body, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=out, check_vma=False)


def test_sums_shifted_by_two_different_running_maxima_fail_the_stabiliser_check():
    """acc shifted by one running maximum, l by another of the same scores: the algebra proves the forward (the two
    hold the same value), but o = exp(m2 - m1)·F sends the two maxima opposite cotangents, split at ties by each
    one's fold; the check names the two maxima."""
    mesh = meshes()["explicit"]
    f = _softmax_ring(mesh, two_maxima=True)
    whys = _whys(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) ** 2), argnums=(0, 1, 2)), _args(mesh))
    assert any("which fails here: result 0 combines values shifted by two different running maxima (the running "
               "maximum carried in slot" in why and "the cotangents reaching them do not cancel" in why
               for why in whys), whys
    assert not any(INVARIANT in why for why in whys)


def test_a_running_maximum_differentiated_itself_fails_the_stabiliser_check():
    """The same kernel with its running maximum a second result the loss reads: o passes, m does not (its cotangent
    is the loss's, split at ties by the blocks' order); and the ring max of tests/test_ring_autodiff_ties.py, whose
    gradient the reorder changes by 3.0 at ties."""
    from test_ring_autodiff_ties import loss as max_loss, ring_max, tied_inputs
    mesh = meshes()["explicit"]
    f = _softmax_ring(mesh, with_max=True)

    def loss(q, k, v):
        o, m = f(q, k, v)
        return jnp.sum(o ** 2) + jnp.sum(m ** 2)

    def fails(result: int):
        return re.compile(rf"which fails here: result {result} varies with the running maximum carried in slot \d+ "
                          r"of the loop at [^ ]+ \(1 times it\): the cotangent reaching that maximum is not zero")

    whys = _whys(jax.grad(loss, argnums=(0, 1, 2)), _args(mesh))
    assert any(fails(1).search(why) for why in whys), whys
    whys = _whys(jax.grad(max_loss(ring_max(mesh)), argnums=1), tied_inputs(mesh))
    assert any(fails(0).search(why) for why in whys), whys


def test_the_stabiliser_check_reads_lse_and_softmax_forms_of_one_maximum():
    """stabiliser.invariant on functions as the analysis interns them: m + log(l) and acc / l with l (and acc)
    shifted by m are free of m; the same with l shifted by another maximum, or m alone, or exp(m), are not."""
    from shardfix.ring import stabiliser
    from shardfix.ring.analysis import FnTable
    from shardfix.ring.values import AggOp

    fns = FnTable()
    scores, weight = fns.intern(("operand", 0, 0, None)), fns.intern(("operand", 0, 1, None))
    one = fns.intern(("const", repr(1.0)))

    def complete(op, term, ident):
        fn = fns.intern(("complete", op, term, scores, len(fns.keys)))  # one fn per maximum, as two folds give
        stabiliser.note_complete(fns, fn, (ident, None))
        return fn

    def ew(name, *args):
        return fns.intern(("ew", f"stablehlo.{name}", "", args))

    m1, m2 = ("slot", "loop", 0, scores), ("slot", "loop", 1, scores)
    m = complete(AggOp.MAX, 0, m1)
    acc, l_same, l_other = (complete(AggOp.SSUM, weight, m1), complete(AggOp.SSUM, one, m1),
                            complete(AggOp.SSUM, one, m2))
    assert stabiliser.invariant(fns, ew("add", m, ew("log", l_same))) is None
    assert stabiliser.invariant(fns, ew("divide", acc, l_same)) is None
    assert stabiliser.invariant(fns, ew("multiply", ew("exponential", ew("negate", m)),
                                        ew("divide", l_same, ew("exponential", ew("negate", m))))) is not None
    assert "two different running maxima" in stabiliser.invariant(fns, ew("divide", acc, l_other))
    assert "two different running maxima" in stabiliser.invariant(fns, ew("add", m, ew("log", l_other)))
    assert "(1 times it)" in stabiliser.invariant(fns, m)
    assert "is scaled by exp of" in stabiliser.invariant(fns, ew("exponential", m))
    # a sum's shift variable lost at its loop (stabiliser.check_loop) names no maximum
    lost = complete(AggOp.SSUM, one, ("shift-of", "loop", 2, scores))
    fns.bound[("shift-of", "loop", 2, scores)] = None
    assert "can't name" in stabiliser.invariant(fns, ew("divide", acc, lost))



def test_one_function_made_by_a_maximum_per_chunk_of_tokens():
    """A function computed once per query chunk, each chunk with its own running maximum (a blockwise kernel's
    Python loop over chunks), names the map from each chunk's tokens to its maximum: acc / l and m + log(l) with
    the same map are free of every maximum; a map that pairs a chunk with another's maximum, two maxima of
    overlapping tokens (as two folds of the same rows give), tokens of other blocks or not known name none."""
    from shardfix.ring import stabiliser
    from shardfix.ring.analysis import FnTable
    from shardfix.ring.values import AggOp

    fns = FnTable()
    scores, weight = fns.intern(("operand", 0, 0, None)), fns.intern(("operand", 0, 1, None))
    one = fns.intern(("const", repr(1.0)))

    def complete(op, term, *reads):
        fn = fns.intern(("complete", op, term, scores, len(fns.keys)))
        for read in reads:
            stabiliser.note_complete(fns, fn, read)
        return fn

    def ew(name, *args):
        return fns.intern(("ew", f"stablehlo.{name}", "", args))

    a, b, c = (("slot", "loop", i, scores) for i in range(3))
    first, second, third = (0, 0, 7), (0, 8, 15), (0, 16, 23)
    chunks = ((a, first), (b, second))
    m, acc = complete(AggOp.MAX, 0, *chunks), complete(AggOp.SSUM, weight, *chunks)
    l = complete(AggOp.SSUM, one, *chunks)
    assert stabiliser.complete_ident(fns, l) == ("by-tokens", frozenset(chunks))
    assert stabiliser.invariant(fns, ew("divide", acc, l)) is None
    assert stabiliser.invariant(fns, ew("add", m, ew("log", l))) is None
    assert "(1 times it)" in stabiliser.invariant(fns, m)
    crossed = complete(AggOp.SSUM, one, (a, second), (b, first))
    assert "two different running maxima" in stabiliser.invariant(fns, ew("divide", acc, crossed))
    fewer = complete(AggOp.SSUM, one, (a, first))
    assert "two different running maxima" in stabiliser.invariant(fns, ew("divide", acc, fewer))
    # a span reaching over a later one of another maximum, past the one between them
    nested = complete(AggOp.SSUM, one, (a, (0, 0, 20)), (a, (0, 2, 4)), (b, (0, 8, 10)))
    overlapping = complete(AggOp.SSUM, one, (a, first), (b, (0, 7, 15)))
    elsewhere = complete(AggOp.SSUM, one, (a, first), (b, (1, 8, 15)))
    unknown = complete(AggOp.SSUM, one, (a, first), (b, None))
    for made in (nested, overlapping, elsewhere, unknown):
        assert stabiliser.complete_ident(fns, made) is None
        assert "can't name" in stabiliser.invariant(fns, ew("divide", made, made))
    # one maximum noted twice over the same tokens, beside a third chunk's: still a map
    again = complete(AggOp.SSUM, one, (a, first), (a, first), (c, third))
    assert stabiliser.complete_ident(fns, again) == ("by-tokens", frozenset({(a, first), (c, third)}))

@jax.jit
def _stopped_weights(s, m):
    """Block weights exp(s - stop_gradient(m)) made by a jitted helper (one jaxpr JAX traces once and whose
    derivative it caches, so a second trace meets the stop_gradient only in the helper's jaxpr)."""
    return jnp.exp(s - jax.lax.stop_gradient(m)[..., None])


_STOPPED_LINE = _stopped_weights.__wrapped__.__code__.co_firstlineno + 4


def test_a_stop_gradient_in_a_jitted_helper_fails_the_stabiliser_check():
    """An online softmax whose block weights are exp(s - stop_gradient(m_new)) from a jitted helper (the rescaling
    left to autodiff): its forward module is an online softmax's, but its gradient follows the blocks' order
    (tests/test_autodiff_stabiliser_audit.py); the check fails it naming the stop_gradient's line."""
    mesh = meshes()["explicit"]

    def body(q, k, v):
        def step(_, carry):
            m, l, o, k, v = carry
            s = uk.scores(q, k)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p, c = _stopped_weights(s, m_new), jnp.exp(m - m_new)
            l, o = l * c + p.sum(-1), o * c[..., None] + uk.apply(p, v)
            return (m_new, l, o) + tuple(jax.lax.ppermute(t, "cp", uk.ring(4)) for t in (k, v))

        _, l, o, _, _ = jax.lax.fori_loop(0, 4, step, uk.row_stats(q, uk.NEG) + (jnp.zeros_like(q), k, v))
        return o / l[..., None]

    f = jax.shard_map(body, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
    grad = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) ** 2), argnums=(0, 1, 2))
    rule = re.compile(r"which fails here: its derivative follows a rule the forward does not show \(stop_gradient at "
                      rf"[^ ]*test_autodiff_ties\.py:{_STOPPED_LINE}\b")
    whys = _whys(grad, _args(mesh))
    assert any(rule.search(why) and "jax.nn.softmax and other functions with such rules" in why for why in whys), whys
    assert not any(INVARIANT in why for why in whys)


def test_the_tie_records_the_derivative_rules_of_the_body_and_none_elsewhere():
    """Tie.rules: a shard_map whose body calls jax.nn.softmax (a custom_jvp function) records it in its forward and
    backward ties; two shard_maps of one program whose loops call the stop_gradient helper both record it (JAX
    linearizes the helper's jaxpr once and reuses it: only the jaxprs bound in the body show it the second time);
    the online softmax records none."""
    mesh = meshes()["explicit"]

    def body(q):
        return jax.lax.fori_loop(0, 2, lambda i, c: _stopped_weights(c, jnp.max(c, -1)), q)

    f, g = (jax.shard_map(body, mesh=mesh, in_specs=SPEC, out_specs=SPEC) for _ in range(2))
    forwards, backwards = _ties_of(jax.grad(lambda q: jnp.sum(f(q) ** 2) + jnp.sum(g(2 * q) ** 3)),
                                   _args(mesh)[:1])
    assert len(forwards) == len(backwards) == 2
    for t in forwards + backwards:
        assert t.rules == (f"stop_gradient at {__file__}:{_STOPPED_LINE}:23 (_stopped_weights)",), t.rules
    f = jax.shard_map(lambda q: jax.nn.softmax(q, axis=-1), mesh=mesh, in_specs=SPEC, out_specs=SPEC)
    forwards, backwards = _ties_of(jax.grad(lambda q: jnp.sum(f(q) ** 3)), _args(mesh)[:1])
    assert forwards and backwards
    for t in forwards + backwards:
        assert t.rules and all(re.fullmatch(r"(custom_jvp|stop_gradient) at .*test_autodiff_ties\.py:\d+.*", r)
                               for r in t.rules), t.rules
    forwards, backwards = _ties_of(jax.grad(lambda *a: jnp.sum(_softmax_ring(mesh)(*a) ** 2), argnums=(0, 1, 2)),
                                   _args(mesh))
    assert forwards and backwards and all(t.rules == () for t in forwards + backwards)


def test_a_ring_checked_after_another_of_the_same_shape_names_its_own_maximum():
    """The normaliser ring first, then an online softmax of the same shapes: the two rings' functions intern alike in
    the module's table, so the online softmax's complete sums were also noted with the normaliser's maximum; its
    check reads only the maxima of its own region and passes (forward and backward rewritten, the gradient
    jax.jit's), the normaliser's still fails by name."""
    import test_autodiff_stabiliser_audit as audit
    mesh = meshes()["explicit"]
    online, normaliser = (jax.shard_map(audit.KERNELS[name], mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC,
                                        check_vma=False) for name in ("online", "normaliser"))
    x = _args(mesh)[0]
    x = jax.device_put(np.random.default_rng(1).standard_normal((2, 32, 4)).astype(np.float32), x.sharding)

    def loss(q, k, v):
        first = normaliser(q, k, v)  # normaliser first
        second = online(q, k, v)  # online second
        return jnp.sum(second ** 2) + jnp.sum(first ** 2)

    grad = jax.grad(loss, argnums=(0, 1, 2))
    fixed = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore")
    low = fixed.lower(x, x, x)
    line, other = _line_of("online second"), _line_of("normaliser first")
    applied = [r for r in low.rings if r.applied]
    assert len(applied) == 2 and all(r.loc.line == line for r in applied), [(r.applied, r.why) for r in low.rings]
    assert any(f"at {__file__}:{other} " in r.why and "which fails here: result 0 is scaled by exp of" in r.why
               for r in low.rings if not r.applied), [r.why for r in low.rings]
    for got, want in zip(fixed(x, x, x), jax.jit(grad)(x, x, x)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


@jax.custom_jvp
def _exp_as_exp(x):
    return jnp.exp(x)


_exp_as_exp.defjvp(lambda primals, tangents: (jnp.exp(primals[0]), jnp.exp(primals[0]) * tangents[0]))


def test_two_rings_of_one_program_apart_from_their_derivative_rules_are_decided_apart():
    """An online softmax and the same kernel with its rescaling an exp under a custom_jvp that is exp's own, in one
    loss: the first is rewritten and the second keeps its refusal naming the rule (conservative: the rule is refused
    wherever it is). (The group memo's key holds each region's tie and rules; these two groups' structural keys
    differ already, so this does not reach the memo.)"""
    import test_autodiff_stabiliser_audit as audit
    mesh = meshes()["explicit"]
    ruled = audit._fori(audit._merge(rescale=lambda m0, m: _exp_as_exp(m0 - m)))
    online, stopped = (jax.shard_map(kernel, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
                       for kernel in (audit.KERNELS["online"], ruled))
    x = jax.device_put(np.random.default_rng(3).standard_normal((2, 32, 4)).astype(np.float32),
                       jax.NamedSharding(mesh, SPEC))

    def loss(q, k, v):
        first = online(q, k, v)  # online, first
        second = stopped(q, k, v)  # stopped, second
        return jnp.sum(first ** 2) + jnp.sum(second ** 2)

    grad = jax.grad(loss, argnums=(0, 1, 2))
    fixed = autofix_shardings(grad, ring_reorder="zigzag", on_fix="ignore")
    low = fixed.lower(x, x, x)
    first, second = _line_of("online, first"), _line_of("stopped, second")
    assert {r.loc.line for r in low.rings if r.applied} == {first}, [(r.applied, r.why) for r in low.rings]
    assert any("its derivative follows a rule the forward does not show (custom_jvp at" in r.why
               for r in low.rings if not r.applied), [r.why for r in low.rings]
    assert all(r.loc.line != first for r in low.rings if not r.applied)
    for got, want in zip(fixed(x, x, x), jax.jit(grad)(x, x, x)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


@jax.custom_jvp
def _exp_by_exps_rule(x):
    return jnp.exp(x)


def _exps_rule(primals, tangents):
    y = jnp.exp(primals[0])
    return y, tangents[0] * y  # exp's own rule, as JAX writes it (mul(g, ans)): the module is plain exp's


_exp_by_exps_rule.defjvp(_exps_rule)


def test_two_groups_of_one_program_equal_but_for_a_derivative_rule_are_decided_apart_by_the_group_memo():
    """The online softmax, then the same kernel with its rescaling an exp under a custom_jvp written as exp's own
    rule: the two groups (forward and backward each) are the same program, op for op, in the same surroundings, so
    the group memo (ring/memo.py) would hand the second the first's verdict but for the recorded rules in its key.
    The first is proved; the second keeps its own refusal naming the rule."""
    from shardfix.ring.detect import module_funcs
    from shardfix.ring.memo import GroupMemo
    from shardfix.ring.prove import prove_rings
    import test_autodiff_stabiliser_audit as audit
    mesh = meshes()["explicit"]
    ruled = audit._fori(audit._merge(rescale=lambda m0, m: _exp_by_exps_rule(m0 - m)))
    online, other = (jax.shard_map(kernel, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=False)
                     for kernel in (audit.KERNELS["online"], ruled))

    def loss(q, k, v):
        first = online(q, k, v)  # memo: online
        second = other(q, k, v)  # memo: ruled
        return jnp.sum(first ** 2) + jnp.sum(second ** 2)

    grad = jax.grad(loss, argnums=(0, 1, 2))  # kept: the ties live while JAX keeps what it traced
    with tracing.repairing():  # the module ring-reorder reads, tie scopes included
        module = jax.jit(grad).lower(*_args(mesh)).compiler_ir("stablehlo").operation
    groups: dict[int, list] = {}
    for verdict in prove_rings(module, analyse=False):
        groups.setdefault(verdict.group, []).append(verdict.ring)
    memo = GroupMemo(module_funcs(module))
    keys = [memo.key(group) for group in groups.values()]
    # the same key but for each region's tie, whose rules differ: what the memo alone tells the groups apart by
    assert len(keys) == 2 and [part[:-1] for part in keys[0]] == [part[:-1] for part in keys[1]], keys
    assert keys[0] != keys[1]
    verdicts = prove_rings(module)
    lines = {v.ring.loc.line for v in verdicts}
    assert lines == {_line_of("memo: online"), _line_of("memo: ruled")}, lines
    for v in verdicts:
        if v.ring.loc.line == _line_of("memo: online"):
            assert v.proved, v.why
        else:
            assert not v.proved
    rule = f"its derivative follows a rule the forward does not show (custom_jvp at {__file__}:"
    assert any(rule in v.why for v in verdicts if v.ring.loc.line == _line_of("memo: ruled")), [v.why for v in verdicts]


def test_the_tie_scopes_leave_no_trace_in_the_module_and_are_freed_with_the_program():
    """The compiled and printed module carries the names JAX gives without the recorder (the tie scopes are read
    by ring-reorder, then stripped), whether the rings are rewritten or left alone; and the registry holds a
    program's ties only while JAX keeps what it traced (jax.clear_caches frees them)."""
    import gc
    mesh = meshes()["explicit"]
    f, ring = _two_results(mesh), _softmax_ring(mesh)
    args = _args(mesh)
    for fun, applied in ((jax.grad(lambda q, k, v: jnp.sum(f(q, k, v)[0] ** 2), argnums=(0, 1, 2)), False),
                         (jax.grad(lambda q, k, v: jnp.sum(ring(q, k, v) ** 2), argnums=(0, 1, 2)), True)):
        low = autofix_shardings(fun, ring_reorder="zigzag", on_fix="ignore").lower(*args)
        assert all(r.applied == applied for r in low.rings), [(r.applied, r.why) for r in low.rings]
        assert ties.PREFIX not in low.as_text(debug_info=True)
        assert ties.PREFIX not in low.compile().as_text()
        want = jax.jit(fun).lower(*args).as_text(debug_info=True)
        assert {n for n in _NAME.findall(want) if "shard_map" in n} <= set(_NAME.findall(low.as_text(debug_info=True)))
    held = ties.recorded()
    assert held > 0
    del low, fun
    jax.clear_caches()
    gc.collect()
    assert ties.recorded() < held
