"""hoist-permutations: after ring-reorder, cancel inverse/forward permutation pairs across token-wise code, hoist
the remaining permutations to the function inputs and sink the inverses to its outputs (or drop them before
order-independent reductions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from jaxlib.mlir import ir

from shardfix.ring.detect import MANUAL_HOLDERS
from shardfix.ring.hoist import Mover
from shardfix.report import Remark

from . import Pass, PassContext


@dataclass(frozen=True)
class HoistPermutations(Pass):
    name: ClassVar[str] = "hoist-permutations"
    description: ClassVar[str] = ("one sequence permutation per program: cancel and hoist ring-reorder's "
                                  "permutations across token-wise code")

    def apply(self, module: ir.Operation, ctx: PassContext) -> None:
        motion = Mover(module, ctx.handed.get(MANUAL_HOLDERS)).run()
        for message, loc in motion.remarks:
            ctx.report.remarks.append(Remark(self.name, message, loc))
