"""fix-shardings: every sharding valid for its tensor and mesh and evenly divisible, every change reported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from jaxlib.mlir import ir

from shardfix.correct import CorrectionError, Site, correct_sharding, resolve_mesh
from shardfix.ir import (ShardingSite, manual_axes_of, mesh_to_attr, module_meshes, source_loc,
                         transform_shardings)
from shardfix.report import Fix
from shardfix.sharding import Mesh, parse_mesh_spec, shard_count

from . import Pass, PassContext, PassError


@dataclass(frozen=True)
class FixShardings(Pass):
    name: ClassVar[str] = "fix-shardings"
    description: ClassVar[str] = ("repair invalid and indivisible sdy shardings, keeping as much parallelism as "
                                  "the policy allows")
    accepts_invalid_shardings: ClassVar[bool] = True

    policy: Literal["subaxis", "prefix", "drop"] = "subaxis"
    target_mesh: str = ""  # 'dp=4,tp=2': retarget the module's mesh first

    def apply(self, module: ir.Operation, ctx: PassContext) -> None:
        target = ctx.target_mesh
        if self.target_mesh:
            try:
                target = parse_mesh_spec(self.target_mesh)
            except ValueError as e:
                raise PassError(f"fix-shardings: bad target-mesh: {e}") from None
        if target is not None:
            retarget(module, target, ctx)
        meshes = module_meshes(module)
        # A module repeats a few shardings many times: correct (and describe) each (sharding, site) pair once.
        corrected: dict = {}

        def fix(site: ShardingSite):
            key = (site.attr, site.shape, site.bound_axes, site.manual_axes, site.is_entry_boundary)
            outcome = corrected.get(key)
            if outcome is None:
                where = Site(site.shape, site.bound_axes, site.manual_axes, not site.is_entry_boundary)
                outcome = corrected[key] = self._correct(site.sharding, where, meshes)
            if isinstance(outcome, CorrectionError):
                raise PassError(f"{site.description}: {outcome}", site.loc)
            new, record = outcome
            if record is not None:
                ctx.report.fixes.append(Fix(self.name, site.description, site.loc, *record))
            return new

        transform_shardings(module, fix)

    def _correct(self, sharding, where: Site, meshes):
        """(new sharding, the Fix fields after site and location, or None when unchanged), or the error."""
        try:
            new, reasons = correct_sharding(sharding, where, meshes, self.policy)
        except CorrectionError as e:
            return e
        if new == sharding:
            return new, None
        mesh = resolve_mesh(new, meshes)[1]
        return new, (tuple((r.code, r.detail) for r in reasons), sharding.body(), new.body(),
                     shard_count(sharding, mesh), shard_count(new, mesh))


def retarget(module: ir.Operation, target: Mesh, ctx: PassContext) -> None:
    """Put `target` in place of the module's one mesh (keeping its name) and update mhlo.num_partitions."""
    top = module.regions[0].blocks[0].operations
    mesh_ops = [op.operation for op in top if op.operation.name == "sdy.mesh"]
    meshes = module_meshes(module)
    if len([m for m in meshes.values() if not m.is_maximal]) != 1:
        names = ", ".join("@" + n for n in meshes) or "none"
        raise PassError(f"fix-shardings: --target-mesh needs a module with exactly one mesh; found {names}",
                        source_loc(module.location))
    for op in mesh_ops:
        name = ir.StringAttr(op.attributes["sym_name"]).value
        old = meshes[name]
        if old.is_maximal or old == target:
            continue
        _check_manual_axes(module, name, target)
        op.attributes["mesh"] = mesh_to_attr(target)
        ctx.report.fixes.append(Fix(FixShardings.name, f"mesh @{name}", source_loc(op.location),
                                    (("retarget", f"mesh @{name} {old} replaced by {target}"),),
                                    str(old), str(target), old.size, target.size))
    if "mhlo.num_partitions" in module.attributes:
        module.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), target.size)


def _check_manual_axes(module: ir.Operation, mesh_name: str, target: Mesh) -> None:
    """Manual axes fix the local shapes inside a manual computation: the target must keep each with its size."""
    old = module_meshes(module)[mesh_name]
    manual_ops = []

    def collect(op):
        if op.name == "sdy.manual_computation":
            manual_ops.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(collect)
    for op in manual_ops:
        for axis in sorted(manual_axes_of(op)):
            if not target.has_axis(axis) or target.axis_size(axis) != old.axis_size(axis):
                have = f"size {target.axis_size(axis)}" if target.has_axis(axis) else "no such axis"
                raise PassError(f"fix-shardings: manual computation is manual over \"{axis}\"={old.axis_size(axis)} "
                                f"but the target mesh has {have}; its body's local shapes would change",
                                source_loc(op.location))
