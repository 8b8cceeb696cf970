"""ring-reorder: put the sequence into a load-balanced order (zigzag or striped) around causal ring regions, and
back after them, where the analysis shows the region's results stay the same (mode=auto), or where the user says
so (mode=force)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from shardfix.ir import sharding_from_attr
from shardfix.report import Remark, RingDecision
from shardfix.ring.detect import Ring, find_rings
from shardfix.ring.permutation import (REORDERED_ATTR, insert_permutation, next_channel_handle,
                                       permutation_module)

from . import Pass, PassContext


@dataclass(frozen=True)
class RingReorder(Pass):
    name: ClassVar[str] = "ring-reorder"
    description: ClassVar[str] = "load-balance causal ring attention: reorder the sequence around ring regions"

    strategy: Literal["zigzag", "striped"] = "zigzag"
    stripe: int = 1
    mode: Literal["auto", "force", "off"] = "auto"

    def apply(self, module: ir.Operation, ctx: PassContext) -> None:
        if self.mode == "off":
            return
        channel = None
        for ring in find_rings(module):
            if ring.axis is None:
                ctx.report.remarks.append(Remark(self.name, "collective_permutes without a ring: "
                                                 + "; ".join(ring.structure), ring.loc))
                continue
            why, plan = self._plan(ring)
            if plan is None:
                ctx.report.rings.append(RingDecision(ring.axis, self._strategy_name, False, why, ring.loc))
                continue
            channel = channel or next_channel_handle(module)
            for index, dim, is_result in plan:
                channel = _insert_permutation(module, ring, index, dim, is_result, self.strategy, self.stripe,
                                              channel)
            ring.region.attributes[REORDERED_ATTR] = ir.StringAttr.get(self._strategy_name)
            inputs = sum(1 for _, _, r in plan if not r)
            ctx.report.rings.append(RingDecision(
                ring.axis, self._strategy_name, True,
                f"{inputs} operand(s) reordered, {len(plan) - inputs} result(s) restored"
                + (" (mode=force: safety analysis skipped)" if self.mode == "force" else ""), ring.loc))

    @property
    def _strategy_name(self) -> str:
        return self.strategy if self.strategy == "zigzag" else f"striped{{stripe={self.stripe}}}"

    def _plan(self, ring: Ring):
        """(why not, None) or ("", [(operand or result index, sequence dim, is_result)])."""
        region = ring.region
        if REORDERED_ATTR in region.attributes:
            return f"already reordered ({ir.StringAttr(region.attributes[REORDERED_ATTR]).value})", None
        if ring.structure:
            return "; ".join(ring.structure), None
        plan = []
        for attr_name, values, is_result in (("in_shardings", region.operands, False),
                                             ("out_shardings", region.results, True)):
            shardings = sdy.TensorShardingPerValueAttr(region.attributes[attr_name]).shardings
            what = "result" if is_result else "operand"
            for index, attr in enumerate(shardings):
                sharding = sharding_from_attr(attr)
                for dim, d in enumerate(sharding.dims):
                    if not any(a.name == ring.axis for a in d.axes):
                        continue
                    if [a.name for a in d.axes] != [ring.axis] or d.axes[0].is_sub_axis:
                        return (f"{what} {index}: dim {dim} is sharded on {d} rather than on \"{ring.axis}\" "
                                "alone"), None
                    length = ir.ShapedType(values[index].type).get_dim_size(dim)
                    unit = 2 * ring.cp if self.strategy == "zigzag" else ring.cp * ring.cp * self.stripe
                    if length % unit:
                        need = "2*cp" if self.strategy == "zigzag" else "cp*cp*stripe"
                        return (f"{what} {index}: sequence length {length} is not a multiple of {need} = {unit}"
                                ), None
                    plan.append((index, dim, is_result))
        if not any(not r for _, _, r in plan):
            return f"no operand is sharded on the ring axis \"{ring.axis}\"", None
        if self.mode == "auto" and ring.problems:
            more = f" (and {len(ring.problems) - 2} more)" if len(ring.problems) > 2 else ""
            return "not provably safe: " + "; ".join(ring.problems[:2]) + more, None
        return "", plan


def _insert_permutation(module, ring: Ring, index: int, dim: int, is_result: bool, strategy: str, stripe: int,
                        channel: int) -> int:
    region = ring.region
    value = region.results[index] if is_result else region.operands[index]
    attr_name = "out_shardings" if is_result else "in_shardings"
    sharding = sharding_from_attr(sdy.TensorShardingPerValueAttr(region.attributes[attr_name]).shardings[index])
    shaped = ir.RankedTensorType(value.type)
    text = permutation_module(ring.mesh_name, ring.mesh, sharding, tuple(shaped.shape), str(shaped.element_type),
                              dim, ring.axis, strategy, stripe, is_result, channel)
    point = ir.InsertionPoint.after(region) if is_result else ir.InsertionPoint(region)
    new = insert_permutation(text, point, value, module.context, region.location)
    if is_result:
        value.replace_all_uses_except(new.results[0], new)
    else:
        region.operands[index] = new.results[0]
    return channel + 2
