"""ring-reorder: find ring regions (manual computations whose body passes data around a ring of
collective_permutes) and record a decision for each.

This version detects rings and reports them; it never rewrites, so every decision is `applied=False` with the
reason. The load-balancing rewrite will only be enabled together with the analysis that proves it safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
from jax._src.lib.mlir import ir

from shardfix.ir import manual_axes_of, module_meshes, sharding_from_attr, source_loc
from shardfix.report import RingDecision, Remark
from shardfix.sharding import Mesh

from . import Pass, PassContext


@dataclass(frozen=True)
class RingReorder(Pass):
    name: ClassVar[str] = "ring-reorder"
    description: ClassVar[str] = "detect ring collectives in manual computations (load-balanced reorder: planned)"

    strategy: Literal["zigzag", "striped"] = "zigzag"
    stripe: int = 1
    mode: Literal["auto", "force", "off"] = "auto"

    def apply(self, module: ir.Operation, ctx: PassContext) -> None:
        if self.mode == "off":
            return
        meshes = module_meshes(module)
        for region in _manual_computations(module):
            mesh = _mesh_of(region, meshes)
            if mesh is None:
                continue
            axes = {ring_axis_of(pairs, mesh) for pairs in _permute_pairs(region, module)}
            axes.discard(None)
            loc = source_loc(region.location)
            if len(axes) == 1:
                ctx.report.rings.append(RingDecision(axes.pop(), self.strategy, False,
                                                     "reordering is not implemented yet; region left unchanged", loc))
            elif len(axes) > 1:
                ctx.report.remarks.append(Remark(self.name, f"rings along several axes ({', '.join(sorted(axes))}); "
                                                            "left unchanged", loc))


def _manual_computations(module: ir.Operation) -> list[ir.Operation]:
    found = []

    def visit(op):
        if op.name == "sdy.manual_computation":
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return found


def _mesh_of(region: ir.Operation, meshes: dict[str, Mesh]) -> Mesh | None:
    from jaxlib.mlir.dialects import sdy
    shardings = list(sdy.TensorShardingPerValueAttr(region.attributes["in_shardings"]).shardings)
    if not shardings:
        return None
    mesh = sharding_from_attr(shardings[0]).mesh
    return meshes.get(mesh) if isinstance(mesh, str) else mesh


def _permute_pairs(region: ir.Operation, module: ir.Operation) -> list[np.ndarray]:
    """source_target_pairs of every collective_permute in the region, following calls to private functions."""
    funcs = {ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
             for op in module.regions[0].blocks[0].operations if op.operation.name == "func.func"}
    pairs, seen = [], set()

    def visit(op):
        if op.name == "stablehlo.collective_permute":
            pairs.append(np.array(ir.DenseIntElementsAttr(op.attributes["source_target_pairs"])).reshape(-1, 2))
        elif op.name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            if callee in funcs and callee not in seen:
                seen.add(callee)
                funcs[callee].walk(visit)
        return ir.WalkResult.ADVANCE

    for r in region.regions:
        for block in r.blocks:
            for op in block.operations:
                op.operation.walk(visit)
    return pairs


def ring_axis_of(pairs: np.ndarray, mesh: Mesh) -> str | None:
    """The mesh axis along which `pairs` form one full cycle per group of the other axes, stepping by one."""
    if not mesh.axes or len(pairs) == 0:
        return None
    shape = tuple(size for _, size in mesh.axes)
    if pairs.min() < 0 or pairs.max() >= math.prod(shape):
        return None
    src, dst = (np.stack(np.unravel_index(pairs[:, i], shape), axis=1) for i in (0, 1))
    moved = np.nonzero((src != dst).any(axis=0))[0]
    if len(moved) != 1:
        return None
    k, n = int(moved[0]), shape[int(moved[0])]
    step = (dst[:, k] - src[:, k]) % n
    if n < 2 or len(set(step.tolist())) != 1 or step[0] not in (1, n - 1):
        return None
    if len(pairs) != math.prod(shape) or len(set(pairs[:, 0].tolist())) != len(pairs):
        return None  # not every device takes part exactly once
    return mesh.axes[k][0]
