"""ring-reorder: put the sequence into a load-balanced order (zigzag or striped) around causal ring regions, and
back after them, where the sequence-layout analysis proves the results stay the same (mode=auto), rewriting the
kernels' position arithmetic for the new order; or wherever the user says so (mode=force).

Options: strategy=zigzag|striped; stripe=N tokens a stripe for striped (0, the default: the smallest stripe that
keeps whole every unit of tokens the kernel reads positions of, 1 when it reads none); mode=auto|force|off."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from jaxlib.mlir import ir

from shardfix.ir import manual_axes_of
from shardfix.locations import SourceLoc
from shardfix.report import Remark, RingDecision
from shardfix.ring.detect import RingRegion
from shardfix.ring.permutation import REORDERED_ATTR, Permutations
from shardfix.ring.positions import Layout, apply_rewrites
from shardfix.ring.prove import Verdict, prove_rings, unit_problem

from . import Pass, PassContext


@dataclass(frozen=True)
class RingReorder(Pass):
    name: ClassVar[str] = "ring-reorder"
    description: ClassVar[str] = "load-balance causal ring attention: reorder the sequence around ring regions"

    strategy: Literal["zigzag", "striped"] = "zigzag"
    stripe: int = 0  # striped: tokens a stripe; 0: the smallest stripe the kernel's position units divide
    mode: Literal["auto", "force", "off"] = "auto"

    def apply(self, module: ir.Operation, ctx: PassContext) -> None:
        if self.mode == "off":
            return
        callers: dict[str, int] = {}  # func.call ops naming each function, counted while the rings are found
        verdicts = prove_rings(module, analyse=self.mode == "auto", callers=callers)
        groups: dict[int, list[Verdict]] = {}
        for verdict in verdicts:
            ring = verdict.ring
            if ring.axis is None:
                ctx.report.remarks.append(Remark(self.name, "collective_permutes without a ring: "
                                                 + "; ".join(ring.structure), ring.loc))
                continue
            groups.setdefault(verdict.group if not ring.structure else -1 - len(groups), []).append(verdict)
        applied: list[tuple[Verdict, int]] = []
        for group in groups.values():
            stripe = self._stripe(group)
            problems = {id(v): self._problem(v, stripe) for v in group}
            blocking = next(((v, problems[id(v)]) for v in group if problems[id(v)][0]), None)
            if blocking is not None:
                first, (why, _) = blocking
                for v in group:
                    reason, loc = problems[id(v)]
                    if not reason:
                        reason = f"reordered together with the ring region at {first.ring.loc or '?'}, which is not: {why}"
                    ctx.report.rings.append(RingDecision(v.ring.axis, self._strategy_name(stripe), False, reason,
                                                         loc or v.ring.loc))
                continue
            applied.extend((v, stripe) for v in group)
        if self.mode == "auto":
            apply_rewrites(module, [(v.rewrites, Layout(self.strategy, stripe, v.ring.cp, v.block))
                                    for v, stripe in applied if v.rewrites], callers)
        with Permutations(module) as permutations:
            for v, stripe in applied:
                why = self._reorder(permutations, v, stripe)
                ctx.report.rings.append(RingDecision(v.ring.axis, self._strategy_name(stripe), True, why,
                                                     v.ring.loc))

    def _strategy_name(self, stripe: int) -> str:
        return self.strategy if self.strategy == "zigzag" else f"striped{{stripe={stripe}}}"

    def _stripe(self, group: list[Verdict]) -> int:
        """The stripe for a group: the one asked for, else the least common multiple of the units of tokens its
        kernels read positions of (so that no unit is split), 1 when they read none."""
        if self.strategy != "striped" or self.stripe:
            return self.stripe or 1
        return math.lcm(1, *(unit for v in group for unit, _ in v.units))

    def _problem(self, v: Verdict, stripe: int) -> tuple[str, SourceLoc | None]:
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
        unit = 2 * cp if self.strategy == "zigzag" else cp * cp * stripe
        for index, dim in list(v.sequence_operands.items()) + list(v.sequence_results.items()):
            value = region.operands[index] if (index, dim) in v.sequence_operands.items() else region.results[index]
            length = ir.ShapedType(value.type).get_dim_size(dim)
            if length % unit:
                need = "2*cp" if self.strategy == "zigzag" else "cp*cp*stripe"
                return f"sequence length {length} is not a multiple of {need} = {unit}", None
        if self.mode == "auto":
            problem = unit_problem(v, self.strategy, stripe)
            if problem is not None:
                return f"not provably safe with {self._strategy_name(stripe)}: {problem[0]}", problem[1]
        return "", None

    def _reorder(self, permutations: Permutations, v: Verdict, stripe: int) -> str:
        ring, region = v.ring, v.ring.region
        for index, dim in v.sequence_operands.items():
            _insert(permutations, ring, index, dim, False, self.strategy, stripe)
        for index, dim in v.sequence_results.items():
            _insert(permutations, ring, index, dim, True, self.strategy, stripe)
        region.attributes[REORDERED_ATTR] = ir.StringAttr.get(self._strategy_name(stripe))
        why = (f"{len(v.sequence_operands)} operand(s) reordered, {len(v.sequence_results)} result(s) restored"
               + (f", {len(v.rewrites)} position read(s) rewritten" if v.rewrites and self.mode == "auto" else "")
               + (" (mode=force: safety analysis skipped)" if self.mode == "force" else ""))
        return why


def _force_plan(ring: RingRegion) -> tuple[dict, dict]:
    """mode=force: every operand and result sharded on the ring axis alone."""
    from shardfix.ring.prove import _classify
    from shardfix.ring.dims import shape
    body = ring.region.regions[0].blocks[0]
    ins = {}
    for i, sharding in enumerate(ring.in_shardings()):
        kind = _classify(sharding, ring.axis, shape(body.arguments[i]))
        if kind is not None and kind[0] == "sequence":
            ins[i] = kind[1]
    terminator = list(body.operations)[-1].operation
    outs = {}
    for j, sharding in enumerate(ring.out_shardings()):
        kind = _classify(sharding, ring.axis, shape(terminator.operands[j]))
        if kind is not None and kind[0] == "sequence":
            outs[j] = kind[1]
    return ins, outs


def _insert(permutations: Permutations, ring: RingRegion, index: int, dim: int, is_result: bool, strategy: str,
            stripe: int) -> None:
    region = ring.region
    value = region.results[index] if is_result else region.operands[index]
    sharding = (ring.out_shardings() if is_result else ring.in_shardings())[index]
    point = ir.InsertionPoint.after(region) if is_result else ir.InsertionPoint(region)
    new = permutations.insert(point, value, ring.mesh_name, ring.mesh, sharding, dim, ring.axis, strategy, stripe,
                              inverse=is_result, manual_axes=tuple(sorted(manual_axes_of(region))))
    if is_result:
        value.replace_all_uses_except(new.results[0], new)
    else:
        region.operands[index] = new.results[0]
