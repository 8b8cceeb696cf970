"""Decide, for each group of ring regions, whether reordering the sequence keeps the program's results.

Regions are grouped when one passes another a per-device value (a result sharded over the ring axis together
with other axes, like the softmax statistics a forward attention hands its backward): such values are only
meaningful if both sides see the same order. Each region of a group is interpreted (analysis.py) with its
operands' abstract values; a group is proved when every region's results are complete functions of their own
tokens (or token-independent), and every per-device value flows only into the group's regions. Where a group is
refused, the regions it links to the refused one by values one permutes before and restores after (a result
sharded along the sequence) are proved apart from it (`_prove_apart`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from jaxlib.mlir import ir

from ..locations import SourceLoc
from . import coverage as cov_ops
from .analysis import Engine, Refusal, RingInfo, Shared, State
from .autodiff import (Liveness, differentiated, dropped_forward, is_transpose, made_by_autodiff, stabiliser_invariant,
                       tie, tied_pairs, unproved_cotangent)

AUTODIFF = ("is the backward that jax.grad made of a ring region without a custom_vjp: its forward is proved, but this "
            "backward is not: its own ops are no order-free merge (an online softmax's backward recomputes and "
            "compares the running maximum), and nothing in the program ties each cotangent to the result it "
            "differentiates, so it can't be proved from its forward either: give the kernel a custom_vjp whose "
            "backward is a ring of its own (as ejkernel's and Liu et al.'s kernels do), which is proved like any ring")
# the same, where JAX's record of the differentiation (ring/ties.py) names the results the cotangents differentiate
TIED = ("is the backward that jax.grad made of a ring region without a custom_vjp: its forward is proved, and so are "
        "the results its cotangents differentiate ({results} of {where}, as JAX recorded while differentiating), "
        "but not what rewriting this backward needs besides: that its gradient is the same whichever order the "
        "blocks arrive in (JAX splits a maximum's cotangent between tied operands by their order, so each running "
        "maximum must receive a cotangent that is zero, which fails here: {stabiliser}) and that the positions it "
        "recomputes are rewritten (obligation (d): {positions}): give the kernel a custom_vjp whose backward is a "
        "ring of its own (as ejkernel's and Liu et al.'s kernels do), which is proved like any ring")
# the same, where every differentiated result is the same for any value of the running maxima it is stabilised by
TIED_INVARIANT = (
    "is the backward that jax.grad made of a ring region without a custom_vjp: its forward is proved, and so are the "
    "results its cotangents differentiate ({results} of {where}, as JAX recorded while differentiating), and each "
    "is the same for any value of the running maxima its sums are shifted by (the cotangent reaching every running "
    "maximum is zero in exact arithmetic, so how JAX splits it at ties does not matter); of the positions it may "
    "recompute (obligation (d)): {positions}; it is not rewritten with its forward ({lacks}): give the kernel a "
    "custom_vjp whose backward is a ring of its own (as ejkernel's and Liu et al.'s kernels do), which is proved like "
    "any ring")
DROPPED = ("differentiates a ring region whose result the program dropped, so there is no forward to prove it from: "
           "use the forward's result (return it, or let the loss read it), or give the kernel a custom_vjp")
from .detect import RingRegion, axis_strides, find_ring_regions, module_funcs, module_meshes
from .dims import origin_across, readers_across, shape
from .finite import finite_constant
from .memo import GroupMemo
from .recompute import classify
from .rules import apply_rule
from .symbolic import Aff, Scope
from .values import CONST, FREE, Axis, Data, Index, Stack, Tok, canonical


@dataclass
class Verdict:
    ring: RingRegion
    proved: bool = False
    why: str = ""
    loc: SourceLoc = SourceLoc()
    sequence_operands: dict[int, int] = field(default_factory=dict)  # operand -> sequence dim
    sequence_results: dict[int, int] = field(default_factory=dict)  # result -> sequence dim
    length: int = 0  # global sequence length
    block: int = 0  # local tokens per device
    rewrites: list = field(default_factory=list)
    units: dict = field(default_factory=dict)  # (tokens, alignment) -> (op, calls) that relies on it
    group: int = 0
    # each result the proof covers, as a complete function of its tokens (fn ids of `fns`, the analysis's table):
    # what stabiliser.invariant reads
    result_fns: dict[int, int] = field(default_factory=dict)
    fns: object = None
    # what the analysis noted its maxima for (stabiliser.py): the region and which analysis of it (a group is
    # analysed again whole to accept a plain-autodiff backward, and each analysis names the maxima it carries)
    owner: object = None


_ANALYSES = itertools.count()


class _GroupRefusal(Exception):
    def __init__(self, refusal: Refusal, region: RingRegion):
        super().__init__(str(refusal))
        self.refusal, self.region = refusal, region


def prove_rings(module: ir.Operation, analyse: bool = True, callers: dict[str, int] | None = None,
                holders: set[str] | None = None) -> list[Verdict]:
    """A verdict per ring region (analysed only with `analyse`; otherwise just grouped). `callers`, `holders`: see
    find_ring_regions. The analyses' unknowns are named from the module alone (coverage.naming): the verdicts
    depend on the module, not on what the process analysed before."""
    with cov_ops.naming():
        return _prove_rings(module, analyse, callers, holders)


def _prove_rings(module: ir.Operation, analyse: bool, callers: dict[str, int] | None,
                 holders: set[str] | None) -> list[Verdict]:
    regions = find_ring_regions(module, callers, holders)
    funcs = module_funcs(module)
    verdicts = {id(r.region): Verdict(r) for r in regions}
    for r in regions:
        if r.structure:
            verdicts[id(r.region)].why = "; ".join(r.structure)
    analysable = [r for r in regions if not r.structure]
    rings = frozenset(r.region for r in regions)
    groups = _groups(analysable, rings)
    # One naming of functions and one memo of analysed calls for the whole module: regions that call the same
    # functions with the same abstract operands (the layers of a model) are analysed once. Operands are named by
    # their place in their group, so equal names never meet across groups, which share no values.
    shared = Shared(meshes=module_meshes(module), apply_rule=apply_rule, rings=rings)
    memo = GroupMemo(funcs) if analyse else None
    numbers = itertools.count()  # a group's regions proved apart from the rest (_prove_apart) get a number of their own
    for group in groups:
        index = next(numbers)
        for r in group:
            verdicts[id(r.region)].group = index
        if memo is None:
            continue
        # a group that is the same program as one proved, in the same surroundings, takes its verdict
        key = memo.key(group)
        carried = memo.get(key, group)
        if carried is not None:
            renumbered: dict[int, int] = {}
            for r, verdict in zip(group, carried):
                if verdict.group not in renumbered:
                    renumbered[verdict.group] = index if not renumbered else next(numbers)
                verdict.group = renumbered[verdict.group]
                verdicts[id(r.region)] = verdict
            continue
        _prove_group(group, funcs, verdicts, shared, numbers)
        memo.put(key, group, [verdicts[id(r.region)] for r in group])
    return [verdicts[id(r.region)] for r in regions]


def _groups(regions: list[RingRegion], rings: frozenset) -> list[list[RingRegion]]:
    """Regions linked by values one passes to another directly, in program order (producers first)."""
    by_op = {r.region: r for r in regions}
    parent = {id(r.region): id(r.region) for r in regions}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for r in regions:
        for operand in r.region.operands:
            owner = origin_across(operand, rings).owner
            if not isinstance(owner, ir.Block) and owner in by_op:
                parent[find(id(r.region))] = find(id(by_op[owner].region))
    grouped: dict[int, list] = {}
    for r in regions:
        grouped.setdefault(find(id(r.region)), []).append(r)
    return list(grouped.values())


def _prove_group(group: list[RingRegion], funcs, verdicts: dict, shared: Shared, numbers: Iterator[int]) -> None:
    members = {r.region for r in group}
    try:
        _prove_members(group, funcs, verdicts, members, shared, frozenset())
    except _GroupRefusal as first:
        lacks = _accept_autodiff(group, funcs, verdicts, members, shared)
        if lacks is None:
            return
        dropped = dropped_forward(group, shared.rings)
        unproved = unproved_cotangent(group, shared.rings) if dropped is not None else None
        if unproved is not None:  # JAX's record names the result
            dropped = unproved[0]
        e = _GroupRefusal(Refusal(unproved[1] if unproved else DROPPED, dropped.region), dropped) \
            if dropped is not None else \
            _autodiff_reason(group, funcs, verdicts, members, shared, first, lacks)
        _refuse_group(group, verdicts, e)
        _prove_apart(group, e.region, funcs, verdicts, shared, numbers)
        return
    for r in group:
        verdicts[id(r.region)].proved = True


def _prove_apart(group: list[RingRegion], refused: RingRegion, funcs, verdicts: dict, shared: Shared,
                 numbers: Iterator[int]) -> None:
    """The regions of a refused group but `refused`, each set of them still linked proved as a group of its own.
    Such a set, proved, is rewritten like any group: its sequence operands permuted and its results restored, or
    the same in every layout, or read only by its own regions, so the regions left alone see the values they saw,
    whatever values they hand it (the proof holds for any tokens). A per-device value it hands `refused` (residuals,
    softmax statistics) is checked as any value read outside a group: unless the same in every layout, the set is
    refused, as it must be (such a value is only right in the layout both sides see). A set refused again keeps its
    group's reason and is split again without the region refused."""
    rest = [r for r in group if r is not refused]
    for part in _groups(rest, shared.rings):
        kept = {id(r.region): verdicts[id(r.region)] for r in part}
        try:
            _prove_members(part, funcs, verdicts, {r.region for r in part}, shared, frozenset())
        except _GroupRefusal as e:
            verdicts.update(kept)
            _prove_apart(part, e.region, funcs, verdicts, shared, numbers)
            continue
        index = next(numbers)
        for r in part:
            verdicts[id(r.region)].proved = True
            verdicts[id(r.region)].group = index


def _autodiff_reason(group: list[RingRegion], funcs, verdicts: dict, members: set, shared: Shared,
                     first: "_GroupRefusal", lacks: str = "") -> "_GroupRefusal":
    """Why to refuse a group holding backward regions that JAX's autodiff made (autodiff.py): the forward's own
    reason where the forward is refused (what the user must change first), else, where the forward alone would be
    proved, that such a backward is not (the transpose of an online-softmax loop recomputes and compares the
    running maximum, which is no order-free merge, and nothing in the module ties each cotangent to the result it
    differentiates, so the backward can't be proved from its forward either: a second result read only through
    its derivative, made by the same code, would be rewritten with it); else the first reason found. The forward
    is proved here with the backwards' residuals set aside only to find that reason, never to accept anything."""
    forwards = [r for r in group if not is_transpose(r)]
    # a custom_vjp backward in a shard_map body is a transpose by name only: its own violation is its reason
    transposes = frozenset(r.region for r in group if is_transpose(r) and made_by_autodiff(r, forwards))
    if is_transpose(first.region) and first.region.region not in transposes and first.refusal.op is not None \
            and not first.refusal.user_loc():
        refusal = Refusal(f"{first.refusal}, in the backward of a custom_vjp this ring region's body calls (JAX "
                          "keeps no source line for a custom_vjp backward's ops)", first.refusal.op,
                          first.refusal.calls)
        first = _GroupRefusal(refusal, first.region)
    if not transposes or not forwards:
        return first
    try:
        _prove_members(group, funcs, verdicts, members, shared, transposes)
    except _GroupRefusal as forward:
        return forward
    # where JAX's record of the differentiation says which results a backward differentiates: one of them not
    # proved is the exact reason
    unproved = unproved_cotangent(group, shared.rings)
    if unproved is not None:
        return _GroupRefusal(Refusal(unproved[1], unproved[0].region), unproved[0])
    region = next(r for r in group if r.region in transposes)
    tied = differentiated(group)
    if tied is not None:
        results, forward = tied
        where = f"the ring region at {forward.loc}" if forward is not None and forward.loc else "its ring region"
        named = ("result " if len(results) == 1 else "results ") + ", ".join(map(str, results))
        verdict = verdicts.get(id(forward.region)) if forward is not None else None
        backwards = [r for r in group if r.region in transposes]
        why = stabiliser_invariant(verdict, backwards)
        # (d), for the reason only: what each backward's integer ops depend on (recompute.py)
        positions = "; ".join(_recomputed(r, forwards, funcs, shared.rings) for r in backwards)
        text = TIED.format(results=named, where=where, stabiliser=why, positions=positions) if why else \
            TIED_INVARIANT.format(results=named, where=where, positions=positions, lacks=lacks)
        return _GroupRefusal(Refusal(text, region.region), region)
    return _GroupRefusal(Refusal(AUTODIFF, region.region), region)


def _accept_autodiff(group: list[RingRegion], funcs, verdicts: dict, members: set, shared: Shared) -> str | None:
    """Prove a group of forward regions and the backward regions JAX's autodiff made of them (no custom_vjp), and
    mark it proved, where: every backward is tied to a forward of the group (ring/ties.py) and reads, besides the
    cotangents of that forward's proved results (laid out as those results), only the forward's residuals and
    operands (`_tied_operands`); the forwards are proved with every op interpreted, residuals included, so that the
    rewrite reads every position the forward reads alike (its residuals are those of the rewritten forward); every
    differentiated result is free of the running maxima that stabilise it, and no derivative rule the module does
    not show is in the rings' bodies (autodiff.stabiliser_invariant); and no backward computes a position or
    anything the walk of its integer ops can't tell (recompute.py; under jax.checkpoint it recomputes them).

    Why that is sound: the rewritten forward F' satisfies F'(P x) = P F(x) for any tokens, so its derivative is the
    P-conjugate of F's; the backward's code is the transpose of F's linearisation, which reads the primal only
    through the residuals (it computes no position of its own), so fed F''s residuals it is the transpose of F''s
    linearisation; permuting its cotangents and restoring its results then gives F's gradient. The stabiliser check
    covers the points where autodiff's derivative is not the function's (ties in a running maximum). None where
    the group is accepted; else what fails first (the group is then refused for the reason _autodiff_reason finds,
    which tells it)."""
    transposes = [r for r in group if is_transpose(r)]
    forwards = [r for r in group if not is_transpose(r)]
    pairs = tied_pairs(forwards, transposes)
    if pairs is None:
        return "not every region of its group is tied to a ring JAX differentiated"
    try:
        _prove_members(group, funcs, verdicts, members, shared, frozenset(r.region for r in transposes), whole=True)
    except _GroupRefusal as e:
        return e.refusal.describe(e.region.loc)
    for forward, backwards in pairs:
        why = stabiliser_invariant(verdicts[id(forward.region)], backwards)
        if why is not None:
            return f"the stabiliser check fails: {why}"
    for r in transposes:
        try:
            found = classify(r, forwards, funcs, shared.rings)
        except (ValueError, KeyError, IndexError, TypeError) as e:
            return f"the walk of its integer ops can't tell whether it computes positions ({e})"
        if found.positions or found.unknown:
            return "it computes positions of its own, or something the walk of its integer ops can't tell"
    for r in group:
        verdicts[id(r.region)].proved = True
    return None


def _recomputed(backward: RingRegion, forwards: list[RingRegion], funcs, rings: frozenset) -> str:
    """Obligation (d)'s sentence for one backward region (recompute.py); the walk meeting IR it does not expect
    (a call naming no function, an operand of no known kind) says so rather than fail the pass over a reason."""
    try:
        return classify(backward, forwards, funcs, rings).reason()
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return f"whether it computes positions, which the walk of its integer ops can't tell ({e})"


def _prove_members(group: list[RingRegion], funcs, verdicts: dict, members: set, shared: Shared,
                   backwards: frozenset, whole: bool = False) -> None:
    """Prove the group's regions in order; those in `backwards` are transposes of its forwards (_transposed_region).
    `whole`: the forwards are interpreted whole, residuals included, and each backward's operands are checked
    against its tie (_tied_operands), as _accept_autodiff needs; else only what the forwards' proved results need
    is interpreted and the cotangents are matched by type (for a refusal's reason)."""
    produced: dict = {}  # region result value -> abstract value (per-device values for the group's consumers)
    block = None
    primal: list = []  # the proved results of forward regions whose transposes are in the group
    forwarded: set = set()  # the operands of those forward regions (JAX hands some to the transposes as well)
    residual_sets: dict = {}  # forward region -> the results of it only the transposes read
    for place, r in enumerate(group):
        verdict = verdicts[id(r.region)] = Verdict(r, group=verdicts[id(r.region)].group)
        if r.region in backwards:
            _transposed_region(r, verdict, produced, members, block, shared.rings)
            if whole:
                _tied_operands(r, group, verdicts, residual_sets, forwarded, produced, shared.rings)
            else:
                _match_cotangents(r, primal, forwarded, produced, shared.rings)
        else:
            residuals = _prove_region(r, place, funcs, verdict, produced, members, shared, backwards, whole)
            residual_sets[r.region] = residuals
            block = verdict.block
            if backwards:
                primal += [(r, j) for j in range(len(r.region.results)) if j not in residuals]
                forwarded |= {origin_across(v, shared.rings) for v in r.region.operands}


def _tied_operands(r: RingRegion, group: list[RingRegion], verdicts: dict, residual_sets: dict, forwarded: set,
                   produced: dict, rings: frozenset) -> None:
    """Each operand of the backward `r` that JAX recorded as the cotangent of result j of its ring is laid out as
    the forward region's result that is j (same type and sharding, permuted alike), which the forward's proof
    covers (not a residual); every other per-device operand is a result of that forward region (a residual) or an
    operand of a forward region of the group."""
    tied = tie(r)
    forward = next(f for f in group if not is_transpose(f) and (t := tie(f)) is not None and t.ring == tied.ring)
    slots, fv, bv = tie(forward).slots, verdicts[id(forward.region)], verdicts[id(r.region)]
    ins, outs = r.in_shardings(), forward.out_shardings()
    local_shapes = [shape(a) for a in r.region.regions[0].blocks[0].arguments]
    for i, operand in enumerate(r.region.operands):
        source = origin_across(operand, rings)
        j = tied.slots[i]
        if j is not None:
            k = next((k for k, s in enumerate(slots) if s == j), None)
            if k is None or k in residual_sets[forward.region] or source in produced \
                    or str(forward.region.results[k].type) != str(operand.type) or str(outs[k]) != str(ins[i]) \
                    or fv.sequence_results.get(k) != bv.sequence_operands.get(i):
                raise _GroupRefusal(Refusal(f"operand {i} is the cotangent of result {j} of its ring, which the "
                                            "forward region does not hand on as a proved result laid out alike",
                                            r.region), r)
            continue
        owner = source.owner if isinstance(source, ir.OpResult) else None
        if source in forwarded or (owner is not None and owner == forward.region) \
                or classify_sharding(ins[i], r.axis, local_shapes[i]) is None:
            continue
        raise _GroupRefusal(Refusal(f"operand {i} is a per-device value that is neither a residual of its forward "
                                    "region nor one of the forward's operands", r.region), r)


def _match_cotangents(r: RingRegion, primal: list, forwarded: set, produced: dict, rings: frozenset) -> None:
    """The transpose differentiates the forward's results: each cotangent it reads must be that of a proved
    result (same type and layout). A forward whose results the program dropped (a loss whose derivative doesn't
    read them) leaves the transpose with the linear part of ops that are nowhere else in the program: nothing
    about them is proved."""
    available = list(primal)
    ins = r.in_shardings()
    for i, operand in enumerate(r.region.operands):
        source = origin_across(operand, rings)
        if source in produced or source in forwarded:
            continue
        match = next((p for p in available if str(p[0].region.results[p[1]].type) == str(operand.type)
                      and str(p[0].out_shardings()[p[1]]) == str(ins[i])), None)
        if match is None:
            raise _GroupRefusal(Refusal(f"{DROPPED} (operand {i} is the cotangent of a result read only through "
                                        "its derivative)", r.region), r)
        available.remove(match)


def _refuse_group(group: list[RingRegion], verdicts: dict, e: "_GroupRefusal") -> None:
    for r in group:
        v = verdicts[id(r.region)]
        v.proved = False
        v.why = e.refusal.describe(e.region.loc) if r is e.region else \
            f"reordered together with the ring region at {e.region.loc or 'an unknown location'}, which is not " \
            f"provably safe ({e.refusal.describe(e.region.loc)})"
        v.loc = (e.refusal.user_loc() or r.loc) if r is e.region and e.refusal.op is not None else r.loc


def _transposed_region(r: RingRegion, verdict: Verdict, produced: dict, members: set, block: int | None,
                       rings: frozenset) -> None:
    """A transpose of the group's forward (autodiff.py): its sequence operands (cotangents, forward operands JAX
    forwards) are permuted and its sequence results (cotangents of sequence operands) restored; residuals pass
    in the forward's layout; anything else per-device is refused."""
    seq_in, block, length = _sequence_operands(r, produced, rings, block, per_device_refused=True)
    seq_out: dict = {}
    for j, sharding in enumerate(r.out_shardings()):
        local = _local_shape(r, j)
        kind = classify_sharding(sharding, r.axis, local)
        if kind is None:
            continue
        result = r.region.results[j]
        if kind[0] == "sequence" and local[kind[1]] == block:
            seq_out[j] = kind[1]
            continue
        if any(reader not in members for reader in readers_across(result, rings)):
            raise _GroupRefusal(Refusal(f"result {j} is a per-device value that ops outside the ring regions read",
                                        r.region), r)
        from .autodiff import OPAQUE
        produced[result] = OPAQUE
    verdict.block, verdict.length = block, length
    verdict.sequence_operands, verdict.sequence_results = seq_in, seq_out


def _sequence_operands(r: RingRegion, produced: dict, rings: frozenset, block: int | None = None,
                       per_device_refused: bool = False) -> tuple[dict, int, int | None]:
    """(sequence operand -> its sequence dim, tokens a device, tokens in all) of a region, skipping per-device
    values a region of the group produced (they come in the layout this region will see); `per_device_refused`:
    any other per-device operand is refused; `block`: the length the group's regions already have."""
    local_shapes = [shape(a) for a in r.region.regions[0].blocks[0].arguments]
    seq_in: dict = {}
    length = None
    for i, sharding in enumerate(r.in_shardings()):
        if origin_across(r.region.operands[i], rings) in produced:
            continue
        kind = classify_sharding(sharding, r.axis, local_shapes[i])
        if kind is None:
            continue
        if kind[0] != "sequence":
            if per_device_refused:
                raise _GroupRefusal(Refusal(f"operand {i} is a per-device value over the ring axis \"{r.axis}\" "
                                            "that no reordered ring region produces", r.region), r)
            continue
        dim = kind[1]
        if block is not None and local_shapes[i][dim] != block:
            raise _GroupRefusal(Refusal(f"has sequence operands of different lengths ({block} and "
                                        f"{local_shapes[i][dim]} tokens a device)", r.region), r)
        block = local_shapes[i][dim]
        length = shape(r.region.operands[i])[dim]
        seq_in[i] = dim
    if block is None or not seq_in:
        raise _GroupRefusal(Refusal(f"no operand is sharded on the ring axis \"{r.axis}\" along a sequence dim",
                                    r.region), r)
    return seq_in, block, length


def _ring_info(r: RingRegion, block: int) -> RingInfo:
    strides = axis_strides(r.mesh)
    others = tuple((name, strides[name], size) for name, size in r.mesh.axes if name != r.axis)
    return RingInfo(r.axis, r.cp, block, strides[r.axis], others)


def _prove_region(r: RingRegion, place: int, funcs, verdict: Verdict, produced: dict, members: set,
                  shared: Shared, backwards: frozenset = frozenset(), whole: bool = False) -> set:
    body = r.region.regions[0].blocks[0]
    local_shapes = [shape(a) for a in body.arguments]
    ins, outs = r.in_shardings(), r.out_shardings()
    seq_in, block, length = _sequence_operands(r, produced, shared.rings)
    verdict.block, verdict.length, verdict.sequence_operands = block, length, seq_in
    # `whole`: residuals are interpreted only where they read positions the results' proof computes (rewritten
    # there, as any read of them); one that computes positions of its own refuses
    state = State(_ring_info(r, block), funcs, shared, strict_residuals=whole)
    # the maxima its aggregates are made from are noted for this analysis of it (stabiliser.py)
    verdict.owner = state.fns.owner = (r.region, next(_ANALYSES))
    # results only JAX's transposes read (residuals) need no proof: interpret what the others depend on
    residuals = {j for j, result in enumerate(r.region.results)
                 if all(reader in backwards for reader in readers_across(result, shared.rings))} if backwards else set()
    liveness = Liveness(body, set(range(len(r.region.results))) - residuals) if residuals else None
    engine = Engine(state, Scope(r.cp, {}, mesh_axes=tuple(r.mesh.axes)), liveness)
    args = []
    for i, sharding in enumerate(ins):
        local = local_shapes[i]
        source = origin_across(r.region.operands[i], shared.rings)
        # an input may hold infinities (a -inf mask bias); a constant the region closes over is read for them
        fn = state.fns.intern(("operand", place, i, finite_constant(source)))
        if source in produced:
            args.append(produced[source])
        elif i in seq_in:
            dims = tuple(Tok("t", 1) if d == seq_in[i] else (FREE if n > 1 else CONST) for d, n in enumerate(local))
            args.append(canonical(Data(local, dims, (("t", Axis(Aff(), Aff())),), fn)))
        elif classify_sharding(sharding, r.axis, local) is None:
            args.append(Data(local, tuple(FREE if n > 1 else CONST for n in local), (), fn))
        else:
            raise _GroupRefusal(Refusal(f"operand {i} is a per-device value over the ring axis \"{r.axis}\" "
                                        "that no reordered ring region produces", r.region), r)
    try:
        results = engine.run_block(body, args)
        if state.obligations:
            first = state.obligations[0]
            raise Refusal(first.message, first.op, first.calls)
    except Refusal as refusal:
        raise _GroupRefusal(refusal, r) from None
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as error:
        # a construct the analysis doesn't model: the region is left as it is, never the user's program broken
        raise _GroupRefusal(Refusal(f"holds something the analysis could not follow ({type(error).__name__}: "
                                    f"{error})", r.region), r) from None
    verdict.rewrites = list(state.rewrites.values())
    verdict.units = dict(state.units)
    _check_results(r, engine, results, outs, verdict, produced, members, residuals, shared.rings)
    return residuals


def classify_sharding(sharding, axis: str, local) -> tuple | None:
    """None: replicated over the ring axis; ("sequence", dim): the ring axis alone on a dim holding more than one
    token a device; ("device", dim): anything else (a per-device value)."""
    for d, dim in enumerate(sharding.dims):
        names = [a.name for a in dim.axes]
        if axis in names:
            if names == [axis] and not dim.axes[0].is_sub_axis and local[d] > 1:
                return "sequence", d
            return "device", d
    if any(a.name == axis for a in sharding.replicated + sharding.unreduced):
        return None
    return None


def _check_results(r: RingRegion, engine: Engine, results: list, outs, verdict: Verdict, produced: dict,
                   members: set, residuals: set, rings: frozenset) -> None:
    from .algebra import try_complete
    seq_out = {}
    for j, (value, sharding) in enumerate(zip(results, outs)):
        result = r.region.results[j]
        if j in residuals:  # read by transposed regions only, in the layout this region makes them
            if engine.state.strict_residuals and isinstance(value, Index) and not value.expr.is_const:
                # positions handed on to the backward (the mask a jnp.where saves): returning them reads them, so
                # they are rewritten as any read of them is (where they are computed from the ring coordinate, or
                # here), and the backward meets the new layout's positions, as the forward's results do
                terminator = list(r.region.regions[0].blocks[0].operations)[-1].operation
                try:
                    engine.resolve(value, terminator, j)
                except Refusal as refusal:
                    raise _GroupRefusal(refusal, r) from None
                verdict.rewrites = list(engine.state.rewrites.values())
                verdict.units = dict(engine.state.units)
            produced[result] = value
            continue
        if isinstance(value, Data):
            value = try_complete(engine, value)
            if value.agg is None:
                verdict.result_fns[j] = value.fn
                verdict.fns = engine.fns
        kind = classify_sharding(sharding, r.axis, _local_shape(r, j))
        where = f"result {j}"
        if kind is None:
            if not _layout_free(engine, value):
                _refuse_result(r, j, f"{where} is replicated over \"{r.axis}\" but depends on which tokens a device "
                               "holds")
            continue
        if kind[0] == "sequence":
            try:
                _check_sequence_result(r, j, engine, value, kind[1], verdict.block, where)
                seq_out[j] = kind[1]
                continue
            except _GroupRefusal:
                # not the tokens of the dim the ring axis shards: a per-device value (the residuals JAX passes
                # from a forward to its backward), if only the group's regions read it
                if not result.uses or any(reader not in members for reader in readers_across(result, rings)):
                    raise
        produced[result] = value
        if _layout_free(engine, value):
            continue  # the same on every layout: any reader sees what it saw before
        for user in readers_across(result, rings):
            if user not in members:
                name = user.name if hasattr(user, "name") else "an op"
                _refuse_result(r, j, f"{where} is a per-device value that '{name}' outside the ring regions reads "
                               "(it would see the reordered layout)")
    verdict.sequence_results = seq_out


def _local_shape(r: RingRegion, j: int):
    body = r.region.regions[0].blocks[0]
    ops = list(body.operations)
    return shape(ops[-1].operation.operands[j])


def _layout_free(engine: Engine, value) -> bool:
    """The value is the same whichever layout the tokens have."""
    return _is_invariant(value) and not (isinstance(value, Data) and engine.fns.depends(value.fn))


def _is_invariant(value) -> bool:
    if isinstance(value, Index):
        from .symbolic import Coord, Pid, PidDiv
        return not any(isinstance(a, (Coord, Pid, PidDiv)) for a in value.expr.free_atoms())
    return isinstance(value, Data) and value.is_invariant


def _refuse_result(r: RingRegion, j: int, message: str, place: tuple | None = None) -> None:
    """Refuse the region for its result j, citing `place` (op, calls) or else the op of the body that makes the
    result (the region itself where the body returns one of its arguments)."""
    if place is None:
        owner = list(r.region.regions[0].blocks[0].operations)[-1].operation.operands[j].owner
        place = (None, ()) if isinstance(owner, ir.Block) else (getattr(owner, "operation", owner), ())
    op, calls = place
    raise _GroupRefusal(Refusal(message, op or r.region, calls if op is not None else ()), r)


def _check_sequence_result(r: RingRegion, j: int, engine: Engine, value, dim: int, block: int, where: str) -> None:
    if not isinstance(value, Data):
        _refuse_result(r, j, f"{where} is sharded on the sequence but computed from the device index")
    if value.agg is not None:
        _refuse_result(r, j, f"{where} is a merge over ring blocks that has not folded in every block: a ring that "
                       f"runs fewer steps than its {engine.ring.cp} devices, or skips a block, leaves tokens out, and "
                       f"which tokens those are changes with the layout; merge one block at each of the "
                       f"{engine.ring.cp} ring steps")
    if any(isinstance(role, Stack) for role in value.dims):
        _refuse_result(r, j, f"{where} holds a buffer stacked by a loop")
    toks = [(d, role) for d, role in enumerate(value.dims) if isinstance(role, Tok)]
    if len(toks) != 1 or toks[0][0] != dim or toks[0][1].stride != 1:
        _refuse_result(r, j, f"{where} does not hold its own tokens along its sequence dim")
    axis = value.axis_map[toks[0][1].axis]
    if len(value.axes) > 1:
        _refuse_result(r, j, f"{where} depends on the token at a fixed place of a block (a position read as one "
                       "number, like the block's first position), which the reorder changes: compute it from "
                       "each token's own position instead")
    hop = axis.hop
    if not hop.is_const or hop.const % engine.ring.cp or axis.offset != Aff() or value.shape[dim] != block:
        _refuse_result(r, j, f"{where} holds the tokens of another block (or only some of its own): a block that "
                       f"travels comes home after {engine.ring.cp} ring steps")
    if engine.fns.depends(value.fn):
        # cited where the step counter is first read as data (a temperature `1 + 0.1 * i`, a bias per step)
        _refuse_result(r, j, f"{where} depends on the ring step, not only on tokens: a value computed from the "
                       "loop's step counter (a temperature, bias or weight per step) meets the tokens of the block "
                       "that step brings, and which block that is changes with the layout; compute it from the "
                       "tokens' positions instead", engine.fns.read_at.get(value.fn))


def unit_problem(verdict: Verdict, strategy: str, stripe: int) -> tuple[str, SourceLoc] | None:
    """Why the units of tokens the region's positions and skips rely on would be split by the permutation, and the
    op relying on them (None: they stay whole)."""
    block = verdict.block
    for (unit, alignment), (op, calls) in sorted(verdict.units.items(), key=lambda t: t[0]):
        why = None
        if unit == block and (strategy == "zigzag" or stripe % unit):
            why = (f"reads a whole {block}-token block as one run of positions (a ring coordinate compared, or a "
                   "table sliced a block at a time), which a reordered block no longer is: use each token's own "
                   "position (coordinate * block + index) instead")
        elif strategy == "zigzag" and (block % 2 or (block // 2) % unit):
            why = (f"reads positions of units of {unit} tokens, which would straddle the two zigzag halves of the "
                   f"{block}-token block (the half is {block / 2:g} tokens)")
        elif strategy == "striped" and stripe % unit:
            why = f"reads positions of units of {unit} tokens, which are not a whole part of the {stripe}-token stripe"
        elif alignment % unit:
            why = f"reads positions of units of {unit} tokens that start at offsets not multiples of {unit}"
        if why is not None:
            refusal = Refusal(why, op, calls)
            return refusal.describe(verdict.ring.loc), refusal.user_loc() or verdict.ring.loc
    return None


__all__ = ["Verdict", "classify_sharding", "prove_rings", "unit_problem"]
