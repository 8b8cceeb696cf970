"""Retargeting a module to another mesh: every mesh attribute the change makes stale (the `sdy.mesh` ops' meshes,
the `stablehlo.mesh` / `mhlo.mesh` copies JAX attaches to them, `mhlo.num_partitions`; shardfix.passes'
fix-shardings swaps inline copies of the old mesh in shardings), and a check that no manual computation's body
would see other local shapes. A module may name its one mesh several times (JAX gives each shard_map's mesh its
own symbol, `@mesh`, `@mesh_0`, ...): all of them are retargeted."""

from __future__ import annotations

from jaxlib.mlir import ir

from ..correct import Reason
from ..locations import SourceLoc
from ..sharding import Mesh
from .attrs import manual_axes_of, mesh_to_attr, module_meshes
from .locations import source_loc

_MESH_COPIES = ("stablehlo.mesh", "mhlo.mesh")  # discardable copies of a mesh in StableHLO's own form


class RetargetError(ValueError):
    def __init__(self, message: str, loc: SourceLoc):
        super().__init__(message)
        self.loc = loc


def retarget(module: ir.Operation, target: Mesh) -> tuple[Mesh, list[tuple]]:
    """Put `target` in place of the module's one mesh (under each name it has); returns that mesh as it was, and
    the Fix fields (site, location, reasons, before, after, shards before, shards after) of each change."""
    top = module.regions[0].blocks[0].operations
    mesh_ops = [op.operation for op in top if op.operation.name == "sdy.mesh"]
    meshes = module_meshes(module)
    distinct = {m for m in meshes.values() if not m.is_maximal}
    if len(distinct) != 1:
        names = ", ".join(f"@{n} = {m}" for n, m in meshes.items() if not m.is_maximal) or "none"
        raise RetargetError(f"--target-mesh needs a module with one mesh (under any number of names); found "
                            f"{names}", source_loc(module.location))
    (original,) = distinct
    fixes = []
    with module.context:
        for op in mesh_ops:
            name = ir.StringAttr(op.attributes["sym_name"]).value
            old = meshes[name]
            if old.is_maximal or old == target:
                continue
            _check_manual_axes(module, old, target)
            op.attributes["mesh"] = mesh_to_attr(target)
            for copy in _MESH_COPIES:
                if copy in op.attributes:
                    op.attributes[copy] = _stablehlo_mesh(op.attributes[copy], target)
            reasons = (Reason("retarget", f"mesh @{name} {old} replaced by {target}"),)
            fixes.append((f"mesh @{name}", source_loc(op.location), tuple((r.code, r.detail) for r in reasons),
                          str(old), str(target), old.size, target.size))
        if "mhlo.num_partitions" in module.attributes:
            module.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32),
                                                                          target.size)
    return original, fixes


def _stablehlo_mesh(old: ir.Attribute, target: Mesh) -> ir.Attribute:
    """`{axes = [{name = "dp", size = 4 : i64}, ...]}` for the target; entries other than axes and device ids
    are kept."""
    i64 = ir.IntegerType.get_signless(64)
    try:
        current = ir.DictAttr(old)
        values = {current[i].name: current[i].attr for i in range(len(current))}
    except ValueError:  # not a dictionary: rebuilt from the target alone
        values = {}
    values["axes"] = ir.ArrayAttr.get([ir.DictAttr.get({"name": ir.StringAttr.get(n), "size": ir.IntegerAttr.get(i64, s)})
                                       for n, s in target.axes])
    values.pop("device_ids", None)
    if target.device_ids is not None:
        values["device_ids"] = ir.DenseI64ArrayAttr.get(list(target.device_ids))
    return ir.DictAttr.get(values)


def _check_manual_axes(module: ir.Operation, old: Mesh, target: Mesh) -> None:
    """Manual axes fix the local shapes inside a manual computation: the target must keep each with its size."""
    manual_ops = []

    def collect(op):
        if op.name == "sdy.manual_computation":
            manual_ops.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(collect)
    for op in manual_ops:
        for axis in sorted(manual_axes_of(op)):
            if not old.has_axis(axis):
                continue
            if not target.has_axis(axis) or target.axis_size(axis) != old.axis_size(axis):
                have = f"size {target.axis_size(axis)}" if target.has_axis(axis) else "no such axis"
                raise RetargetError(f"a manual computation is manual over \"{axis}\"={old.axis_size(axis)} but the "
                                    f"target mesh has {have}; its body's local shapes would change, so retargeting "
                                    f"needs a mesh that keeps \"{axis}\" at {old.axis_size(axis)}",
                                    source_loc(op.location))
