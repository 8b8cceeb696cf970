"""ring-reorder: put the sequence into a load-balanced order (zigzag or striped) around causal ring regions, and
back after them, where the sequence-layout analysis proves the results stay the same (mode=auto), rewriting the
kernels' position arithmetic for the new order; or wherever the user says so (mode=force).

Options: strategy=auto|zigzag|striped; stripe=N tokens a stripe for striped (0, the default: the smallest stripe
that keeps whole every unit of tokens the kernel reads positions of, 1 when it reads none); mode=auto|force|off.

strategy=auto (the default, here as in @autofix_shardings and the plugin) lets the kernel's cost pick: the tiles
each device computes at each ring step are counted from the kernel's own skip conditionals (ring/cost.py) as
written and under every layout the proof allows (zigzag; striped with each stripe that keeps the kernel's units
whole), and the layout with the shortest critical path (ties: zigzag) is applied only when it saves more tiles than
the permutation costs. The permutation's cost model: it moves at most one local shard of each permuted tensor
(operands and results on the sequence), once; a ring step sends `sends` local shards and, the ring being worth
running, hides them behind a balanced step's tiles, so one shard moved costs at most (ideal tiles a step) /
(shards a step sends) tiles. The layout is applied when
    critical path as written - critical path with it  >  permuted tensors * ideal tiles a step / shards a step sends
(an upper bound: hoist-permutations then cancels most permutations between layers). Where hoist-permutations
runs right after this pass, the groups that don't pass that test are reordered all the same when, counted on
copies of the module run through both passes, the permutations left with them reordered cost fewer tiles (the
same cost a tensor) than they save together: a stack of layers pays for one permutation in and one out. A kernel
without skip conditionals computes every tile whatever the layout, and is left alone, as is one the count finds
balanced; so is one whose every skip decision depends on data (the count can't tell layouts apart). Only proved
regions are counted and rewritten.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from shardfix.ir import manual_axes_of, new_context
from shardfix.locations import SourceLoc
from shardfix.report import Remark, RingDecision
from shardfix.ring.cost import Counter, Tiles, Uncountable
from shardfix.ring.detect import MANUAL_HOLDERS, RingRegion, axis_strides, module_funcs
from shardfix.ring.hoist import Mover
from shardfix.ring.dims import handed_on
from shardfix.ring.permutation import REORDERED_ATTR, Permutations, permutations_in
from shardfix.ring.positions import Layout, apply_rewrites
from shardfix.ring.prove import Verdict, prove_rings, unit_problem
from shardfix.ring import ties
from shardfix.ring.structural import StructuralKeys

from . import Pass, PassContext


@dataclass(frozen=True)
class _Layout:
    """A layout chosen for a group of regions, and the tile figures of each region (by id of its op)."""

    strategy: str
    stripe: int
    figures: dict


@dataclass(frozen=True)
class RingReorder(Pass):
    name: ClassVar[str] = "ring-reorder"
    description: ClassVar[str] = "load-balance causal ring attention: reorder the sequence around ring regions"

    # auto, as the decorator and the plugin run it: the layout the kernel's tile count picks, where it pays
    strategy: Literal["auto", "zigzag", "striped"] = "auto"
    stripe: int = 0  # striped: tokens a stripe; 0: the smallest stripe the kernel's position units divide
    mode: Literal["auto", "force", "off"] = "auto"

    def apply(self, module: ir.Operation, ctx: PassContext) -> None:
        self._apply(module, ctx, None)

    def _apply(self, module: ir.Operation, ctx: PassContext, band: bool | None) -> None:
        """The pass; `band`: whether the groups whose layout doesn't pay for their own permutations are reordered
        (None: where hoist-permutations runs next and trials on copies say it pays: `_band_pays`)."""
        if self.mode == "off":
            return
        callers: dict[str, int] = {}  # func.call ops naming each function, counted while the rings are found
        holders: set[str] = set()  # the functions whose body holds a manual computation, found by the same walk
        verdicts = prove_rings(module, analyse=self.mode == "auto", callers=callers, holders=holders)
        groups: dict[int, list[Verdict]] = {}
        for verdict in verdicts:
            ring = verdict.ring
            if ring.axis is None:
                ctx.report.remarks.append(Remark(self.name, "collective_permutes without a ring: "
                                                 + "; ".join(ring.structure), ring.loc))
                continue
            groups.setdefault(verdict.group if not ring.structure else -1 - len(groups), []).append(verdict)
        chooser = _Chooser(self, module, verdicts) if self.strategy == "auto" and self.mode == "auto" else None
        applied: list[tuple[int, Verdict, _Layout]] = []  # (group's place, ...), reordered in group order
        left: list[tuple[int, list[RingDecision]]] = []  # (group's place, its decisions), said in group order
        bands: list[tuple[int, list[Verdict], _Band]] = []
        for place, group in enumerate(groups.values()):
            if chooser is not None:
                layout = chooser.choose(group)
                if isinstance(layout, _Band) and not any(self._problem(v, layout.layout.strategy,
                                                                       layout.layout.stripe)[0] for v in group):
                    bands.append((place, group, layout))
                    continue
                if isinstance(layout, _Band):
                    layout = layout.why
                if isinstance(layout, str):  # left as written, for this reason
                    left.append((place, [_decision(v, "auto", False, layout, chooser.figures(v)) for v in group]))
                    continue
            else:
                strategy = "zigzag" if self.strategy == "auto" else self.strategy
                layout = _Layout(strategy, self._stripe(group, strategy), {})
            problems = {id(v): self._problem(v, layout.strategy, layout.stripe) for v in group}
            blocking = next(((v, problems[id(v)]) for v in group if problems[id(v)][0]), None)
            if blocking is not None:
                first, (why, _) = blocking
                decisions = []
                for v in group:
                    reason, loc = problems[id(v)]
                    if not reason:
                        reason = (f"not provably safe: reordered together with the ring region at "
                                  f"{first.ring.loc or '?'}, which is not ({why})")
                    decisions.append(_told(v.ring.axis, _name(layout.strategy, layout.stripe), False, reason,
                                           loc or v.ring.loc))
                left.append((place, decisions))
                continue
            applied.extend((place, v, layout) for v in group)
        notes: dict[int, str] = {}  # id(verdict) -> what its decision adds (a band's)
        if bands:
            if band is None:
                band = self._band_pays(module, ctx, bands, bool(applied), notes)
            for place, group, b in bands:
                if band:
                    applied.extend((place, v, b.layout) for v in group)
                else:
                    left.append((place, [_decision(v, "auto", False, b.why + notes.get(id(v), ""),
                                                   chooser.figures(v)) for v in group]))
        for _, decisions in sorted(left, key=lambda t: t[0]):
            ctx.report.rings.extend(decisions)
        applied.sort(key=lambda t: t[0])  # (stable: a group's regions keep their order)
        reordered = [(v, layout) for _, v, layout in applied]
        copies: list[tuple[str, str]] = []
        if self.mode == "auto":
            apply_rewrites(module, [(v.rewrites, Layout(layout.strategy, layout.stripe, v.ring.cp, v.block))
                                    for v, layout in reordered if v.rewrites], callers, copies)
        with Permutations(module) as permutations:
            for v, layout in reordered:
                why = self._reorder(permutations, v, layout.strategy, layout.stripe)
                ctx.report.rings.append(_decision(v, _name(layout.strategy, layout.stripe), True,
                                                  why + notes.get(id(v), ""), layout.figures.get(id(v))))
        # the permutations go beside their regions, in bodies already listed; a function copied for its rewritten
        # reads holds what its original holds
        holders.update(copy for original, copy in copies if original in holders)
        ctx.handoff = (self, {MANUAL_HOLDERS: frozenset(holders)})

    def _band_pays(self, module: ir.Operation, ctx: PassContext, bands: list, others: bool, notes: dict) -> bool:
        """Whether to reorder the groups whose layout alone doesn't pay for their permutations (`bands`): only
        where hoist-permutations runs next (it cancels a layer's inverse permutation against the next layer's, and
        moves those of the inputs to the program's), and only where the permutations it would leave, with the
        bands reordered, cost fewer tiles than the bands save. Those are counted on copies of the module, each run
        through this pass and hoist-permutations: with the bands reordered, and (where other groups are
        reordered anyway, `others`) without. Says why in `notes` (id of verdict -> text)."""
        if getattr(ctx.next_pass, "name", None) != "hoist-permutations":
            return False
        saving = sum(b.saving for _, _, b in bands)
        per_tensor = max(b.per_tensor for _, _, b in bands)
        n = sum(len(group) for _, group, _ in bands)
        try:
            with_bands = self._permutations_left(module, True)
            without = self._permutations_left(module, False) if others else 0
        except Exception as e:  # an estimate's trial: whatever stops it leaves the rings as written, never the pass
            for _, group, _ in bands:
                for v in group:
                    notes[id(v)] = (f"; the permutations hoist-permutations would leave could not be counted "
                                    f"({type(e).__name__}: {e})")
            return False
        cost = max(with_bands - without, 0) * per_tensor
        pays = saving > cost
        for _, group, b in bands:
            for v in group:
                notes[id(v)] = (
                    f"; alone it would not pay for its own permutations ({b.why}), but hoist-permutations leaves "
                    f"permutations that cost about {cost:.1f} tiles, against {saving} tiles saved on the critical "
                    f"paths of the {n} ring region(s) reordered for this reason" if pays else
                    f"; nor after hoist-permutations: reordered, the {n} ring region(s) of this program that don't "
                    f"pay for their own permutations would save {saving} tiles and leave permutations that cost "
                    f"about {cost:.1f}")
        return pays

    def _permutations_left(self, module: ir.Operation, band: bool) -> int:
        """The tensors permuted in a copy of the module after this pass (bands reordered or not) and
        hoist-permutations. The copy lives in a context of its own: the trial leaves handles to its ops in the
        objects it made, and a handle to an erased op in the module's context could be mistaken for a new op made
        at the same address."""
        written = io.BytesIO()
        module.write_bytecode(written)
        with new_context(module.context.allow_unregistered_dialects):
            copy = ir.Module.parse(written.getvalue())
            trial = PassContext()
            self._apply(copy.operation, trial, band)
            Mover(copy.operation, trial.handoff[1][MANUAL_HOLDERS] if trial.handoff else None).run()
            return permutations_in(copy.operation)

    def _stripe(self, group: list[Verdict], strategy: str) -> int:
        """The stripe for a group: the one asked for, else the least common multiple of the units of tokens its
        kernels read positions of (so that no unit is split), 1 when they read none."""
        if strategy != "striped" or self.stripe:
            return self.stripe or 1
        return math.lcm(1, *(unit for v in group for unit, _ in v.units))

    def _problem(self, v: Verdict, strategy: str, stripe: int) -> tuple[str, SourceLoc | None]:
        """Why this region can't be reordered (empty when it can), and where to point the user."""
        region = v.ring.region
        if REORDERED_ATTR in region.attributes:
            return f"already reordered ({ir.StringAttr(region.attributes[REORDERED_ATTR]).value})", None
        if v.ring.structure:
            return "; ".join(v.ring.structure), None
        if self.mode == "auto" and not v.proved:
            return "not provably safe: " + v.why, v.loc or None
        if self.mode == "force" and not v.sequence_operands:
            v.sequence_operands, v.sequence_results = _force_plan(v.ring)
            if not v.sequence_operands:
                return f"no operand is sharded on the ring axis \"{v.ring.axis}\" along a sequence dim", None
        cp = v.ring.cp
        unit = 2 * cp if strategy == "zigzag" else cp * cp * stripe
        for index, dim in list(v.sequence_operands.items()) + list(v.sequence_results.items()):
            value = region.operands[index] if (index, dim) in v.sequence_operands.items() else region.results[index]
            length = ir.ShapedType(value.type).get_dim_size(dim)
            if length % unit:
                need = "2*cp" if strategy == "zigzag" else "cp*cp*stripe"
                return f"sequence length {length} is not a multiple of {need} = {unit}", None
        if self.mode == "auto":
            problem = unit_problem(v, strategy, stripe)
            if problem is not None:
                return f"not provably safe with {_name(strategy, stripe)}: {problem[0]}", problem[1]
        return "", None

    def _reorder(self, permutations: Permutations, v: Verdict, strategy: str, stripe: int) -> str:
        ring, region = v.ring, v.ring.region
        manual = tuple(sorted(manual_axes_of(region)))
        for index, dim in v.sequence_operands.items():
            _insert(permutations, ring, index, dim, False, strategy, stripe, manual)
        for index, dim in v.sequence_results.items():
            _insert(permutations, ring, index, dim, True, strategy, stripe, manual)
        region.attributes[REORDERED_ATTR] = ir.StringAttr.get(_name(strategy, stripe))
        why = (f"{len(v.sequence_operands)} operand(s) reordered, {len(v.sequence_results)} result(s) restored"
               + (f", {len(v.rewrites)} position read(s) rewritten" if v.rewrites and self.mode == "auto" else "")
               + (" (mode=force: safety analysis skipped)" if self.mode == "force" else ""))
        return why


@dataclass(frozen=True)
class _Band:
    """A group whose best layout shortens its critical path, but by no more tiles than its own permutations cost:
    left as written, unless the permutations hoist-permutations leaves with every such group reordered cost less
    (RingReorder._band_pays)."""

    layout: _Layout  # the best layout, with the figures of each region in it
    saving: int  # tiles it takes off the group's critical paths
    per_tensor: float  # what one tensor's permutation costs, in tiles (_permutation_tiles)
    why: str  # why the group is left as written, alone


def _name(strategy: str, stripe: int) -> str:
    return strategy if strategy != "striped" else f"striped{{stripe={stripe}}}"


def _decision(v: Verdict, strategy: str, applied: bool, why: str,
              figures: tuple[Tiles, Tiles] | None) -> RingDecision:
    if figures is None:
        return _told(v.ring.axis, strategy, applied, why, v.ring.loc)
    before, after = figures
    basis = "positions, hops and chunk indices" if not after.data_dependent and not before.data_dependent else (
        f"positions, hops and chunk indices; {before.data_dependent} of {before.decisions} skip decisions depend "
        "on data and are counted as computed")
    return _told(v.ring.axis, strategy, applied, why, v.ring.loc, before.critical, after.critical, before.ideal, basis)


def _told(axis: str, strategy: str, applied: bool, why: str, loc: SourceLoc, *figures) -> RingDecision:
    """A decision as the user reads it: the name scopes that tie a differentiated region to its backward
    (ring/ties.py) are shardfix's own, so a region JAX's location names by its name stack alone is named as JAX
    named it, in the reason too."""
    if not loc.file and loc.name:
        loc = replace(loc, name=ties.strip(loc.name))
    return RingDecision(axis, strategy, applied, ties.strip(why), loc, *figures)


class _Chooser:
    """Picks each group's layout from its kernels' tile counts (cost.py), one count per distinct kernel and
    layout: regions that are the same program (the layers of a model) share their counts."""

    def __init__(self, owner: RingReorder, module: ir.Operation, verdicts: list[Verdict]):
        self.owner = owner
        funcs = module_funcs(module)
        self.counter = Counter(funcs, {r.op for v in verdicts if v.proved for r in v.rewrites})
        self.keys = StructuralKeys(funcs)
        self.memo: dict = {}
        self.rings = {v.ring.region for v in verdicts}
        self._reads: dict = {}  # structural key -> the operands a region's skip decisions read
        self._figures: dict[int, tuple[Tiles, Tiles]] = {}

    def figures(self, v: Verdict) -> tuple[Tiles, Tiles] | None:
        return self._figures.get(id(v))

    def choose(self, group: list[Verdict]) -> "_Layout | _Band | str":
        """The layout for the group, or why it is left as written."""
        candidates = [("zigzag", 0)] + [("striped", s) for s in _stripes(group)]
        viable = [c for c in candidates if not any(self.owner._problem(v, *c)[0] for v in group)]
        if not viable:
            return _Layout("zigzag", 0, {})  # refused: the caller says why, as for zigzag
        feeds = self._feeds(group)
        before: dict[int, Tiles] = {}
        for v in group:
            try:
                tiles = self._count(v, None, feeds)
            except Uncountable as e:
                if str(e) != "no skip conditional":
                    return (f"the tiles could not be counted at compile time ({e}): left as written "
                            "(strategy=zigzag reorders it anyway)")
                continue
            if tiles.decisions:  # (a region counted only for what it hands on skips nothing itself)
                before[id(v)] = tiles
        if not before:
            return ("balanced as written: the ring has no skip conditional, so the kernel computes every tile and "
                    "every layout costs the same")
        counted = [v for v in group if id(v) in before]
        if all(before[id(v)].data_dependent == before[id(v)].decisions for v in counted):
            return ("every skip decision depends on data (positions or segment ids passed in), so the count can't "
                    "tell layouts apart: left as written (strategy=zigzag reorders it anyway)")
        after: dict = {}
        for c in viable:
            try:
                after[c] = {id(v): self._count(v, c, feeds) for v in counted}
            except Uncountable:
                continue
        if not after:
            return "no layout's tiles could be counted: left as written"
        best = min(after, key=lambda c: sum(t.critical for t in after[c].values()))  # ties: zigzag, then stripes
        for v in counted:
            self._figures[id(v)] = (before[id(v)], after[best][id(v)])
        was, now = (sum(t.critical for t in ts) for ts in (before.values(), after[best].values()))
        ideal = sum(t.ideal for t in before.values())
        cost = sum(_permutation_tiles(v, before[id(v)]) for v in counted)
        if was - now <= cost:
            figures = {id(v): self._figures[id(v)] for v in counted}
            for v in counted:
                self._figures[id(v)] = (before[id(v)], before[id(v)])
            if now >= was:
                return (f"balanced as written: {was} tiles on the critical path (ideal {ideal:g}), and no layout "
                        "shortens it")
            return _Band(_Layout(best[0], best[1], figures), was - now,
                         max(_permutation_tiles(v, before[id(v)], 1) for v in counted),
                         f"{_name(*best)} would shorten the critical path only from {was} to {now} tiles (ideal "
                         f"{ideal:g}), not by more than the permutation costs (about {cost:.1f} tiles)")
        return _Layout(best[0], best[1], {id(v): self._figures[id(v)] for v in counted})

    def _feeds(self, group: list[Verdict]) -> dict[int, dict[int, tuple[Verdict, int]]]:
        """For each region of the group, the operands its skip decisions read that are results of an earlier
        region of the group, handed on unchanged and laid out alike (a backward reading the predicates its
        forward saved): operand -> (that region's verdict, result index). The count then runs the backward on the
        values the forward's count computed under the same layout, as the rewritten program does."""
        regions = {}
        feeds: dict[int, dict[int, tuple[Verdict, int]]] = {}
        for v in group:
            ins = None
            key = self.keys.of_ring(v.ring)  # (the layers of a model: one region's walk for all)
            reads = self._reads.get(key)
            if reads is None:
                try:
                    reads = self.counter.reads(v.ring.region)
                except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError):
                    reads = []  # the count fails the same way below and says so
                self._reads[key] = reads
            for i in reads:
                source, entered, left = _handed_on(v.ring.region.operands[i], self.rings)
                if not isinstance(source, ir.OpResult):
                    continue
                u = regions.get(source.owner)
                if u is None:
                    continue
                k = source.result_number
                ins = ins or v.ring.in_shardings()
                # each device holds the same piece where it was handed on: out of the same enclosing
                # computations as into them, laid out alike at each
                if str(u.ring.out_shardings()[k]) == str(ins[i]) and entered == left[::-1]:
                    feeds.setdefault(id(v), {})[i] = (u, k)
            regions[v.ring.region] = v
        return feeds

    def _count(self, v: Verdict, layout: tuple[str, int] | None, feeds: dict | None = None) -> Tiles:
        """`v`'s tiles under `layout` (None: as written); `feeds` (_feeds) hand it operands an earlier region's
        count computed under the same layout."""
        ring = v.ring
        feeds = feeds or {}
        fed = feeds.get(id(v), {})
        keep = frozenset(k for f in feeds.values() for u, k in f.values() if u is v)
        given: dict[int, list] = {}
        sources = []
        for i, (u, k) in sorted(fed.items()):
            try:
                made = self._count(u, layout, feeds)
            except Uncountable:
                continue
            given[i] = [values.get(k) for values in made.kept]
            sources.append((i, id(made), k))  # the count's identity: its key stays with it in the memo
        key = (self.keys.of_ring(ring), layout, ring.cp, v.block, len(v.rewrites),
               tuple(sorted(v.sequence_operands.items())), keep, tuple(sources))
        found = self.memo.get(key)
        if found is None:
            stride = axis_strides(ring.mesh)[ring.axis]
            pids = [c * stride for c in range(ring.cp)]
            concrete = None if layout is None else (layout[0], layout[1], ring.cp, v.block)
            try:
                found = self.counter.count(ring.region, pids, v.rewrites, concrete,
                                           "contiguous" if layout is None else _name(*layout), given, keep)
            except Uncountable as e:
                found = e
            except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as e:
                # a construct the count doesn't model: the region is left as written, never the pass broken
                found = Uncountable(f"{type(e).__name__}: {e}")
            self.memo[key] = found
        if isinstance(found, Uncountable):
            raise found
        return found


def _handed_on(value: ir.Value, rings: set) -> tuple[ir.Value, list[str], list[str]]:
    """Where `value` comes from (dims.handed_on): the source, the shardings of the enclosing computations'
    operands it entered by (innermost first) and those of the results it left by (outermost first). A value that
    passed through another computation on the way (an operand crossed after a result) is said to come from
    nowhere: its pieces needn't be the source's."""
    source, crossed = handed_on(value, rings)
    kinds = [kind for kind, _, _ in crossed]
    if kinds != sorted(kinds):  # ("operand" < "result")
        return value, [], ["through another computation"]
    entered = [_sharding(op, "in_shardings", n) for kind, op, n in crossed if kind == "operand"]
    left = [_sharding(op, "out_shardings", n) for kind, op, n in crossed if kind == "result"]
    return source, entered, left


def _sharding(op: ir.Operation, name: str, n: int) -> str:
    return str(sdy.TensorShardingPerValueAttr(op.attributes[name]).shardings[n])


def _stripes(group: list[Verdict]) -> list[int]:
    """Every stripe that keeps the group's units whole and divides each device's block into cp stripes or more."""
    unit = math.lcm(1, *(u for v in group for u, _ in v.units))
    cp = group[0].ring.cp
    blocks = {v.block for v in group}
    return [s for s in range(unit, min(blocks) // cp + 1, unit) if all(b % (cp * s) == 0 for b in blocks)]


def _permutation_tiles(v: Verdict, tiles: Tiles, tensors: int | None = None) -> float:
    """What the permutation costs, in tiles: one local shard of each permuted tensor (`tensors`, else the region's
    own), a shard costing what a balanced step's tiles hide of the ring's own sends (ideal tiles a step / shards a
    device sends a step)."""
    if tensors is None:
        tensors = len(v.sequence_operands) + len(v.sequence_results)
    devices = len(tiles.counts)
    return tensors * tiles.ideal * devices / max(tiles.sends, 1)


def _force_plan(ring: RingRegion) -> tuple[dict, dict]:
    """mode=force: every operand and result sharded on the ring axis alone."""
    from shardfix.ring.prove import classify_sharding
    from shardfix.ring.dims import shape
    body = ring.region.regions[0].blocks[0]
    ins = {}
    for i, sharding in enumerate(ring.in_shardings()):
        kind = classify_sharding(sharding, ring.axis, shape(body.arguments[i]))
        if kind is not None and kind[0] == "sequence":
            ins[i] = kind[1]
    terminator = list(body.operations)[-1].operation
    outs = {}
    for j, sharding in enumerate(ring.out_shardings()):
        kind = classify_sharding(sharding, ring.axis, shape(terminator.operands[j]))
        if kind is not None and kind[0] == "sequence":
            outs[j] = kind[1]
    return ins, outs


def _insert(permutations: Permutations, ring: RingRegion, index: int, dim: int, is_result: bool, strategy: str,
            stripe: int, manual_axes: tuple[str, ...]) -> None:
    region = ring.region
    value = region.results[index] if is_result else region.operands[index]
    sharding = (ring.out_shardings() if is_result else ring.in_shardings())[index]
    point = ir.InsertionPoint.after(region) if is_result else ir.InsertionPoint(region)
    new = permutations.insert(point, value, ring.mesh_name, ring.mesh, sharding, dim, ring.axis, strategy, stripe,
                              inverse=is_result, manual_axes=manual_axes)
    if is_result:
        value.replace_all_uses_except(new.results[0], new)
    else:
        region.operands[index] = new.results[0]
