"""sdy attributes <-> the pure sharding model, and the module's meshes and manual axes."""

from __future__ import annotations

import functools

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from ..sdy_syntax import parse_manual_axes
from ..sharding import AxisRef, DimSharding, Mesh, TensorSharding


def mesh_from_attr(attr: ir.Attribute) -> Mesh:
    mesh = sdy.MeshAttr(attr)
    axes = tuple((a.name, a.size) for a in map(sdy.MeshAxisAttr, mesh.axes))
    ids = list(mesh.device_ids)
    return Mesh(axes, tuple(ids) if ids else None)


def mesh_to_attr(mesh: Mesh) -> ir.Attribute:
    axes = [sdy.MeshAxisAttr.get(n, s) for n, s in mesh.axes]
    return sdy.MeshAttr.get(axes, list(mesh.device_ids or ()))


def _axis_from_attr(attr: ir.Attribute) -> AxisRef:
    ref = sdy.AxisRefAttr(attr)
    if ref.sub_axis_info is None:
        return AxisRef(ref.name)
    info = sdy.SubAxisInfoAttr(ref.sub_axis_info)
    return AxisRef(ref.name, info.pre_size, info.size)


def _axis_to_attr(ref: AxisRef) -> ir.Attribute:
    info = sdy.SubAxisInfoAttr.get(ref.pre_size, ref.size) if ref.is_sub_axis else None
    return sdy.AxisRefAttr.get(ref.name, info)


@functools.lru_cache(maxsize=8192)
def sharding_from_attr(attr: ir.Attribute) -> TensorSharding:
    """The model of a sharding attribute (attributes are uniqued by MLIR, so this is cached)."""
    ts = sdy.TensorShardingAttr(attr)
    ref = ts.mesh_or_ref
    mesh = ref.value if isinstance(ref, ir.FlatSymbolRefAttr) else mesh_from_attr(ref)
    dims = tuple(DimSharding(tuple(map(_axis_from_attr, d.axes)), d.is_closed, d.priority)
                 for d in map(sdy.DimensionShardingAttr, ts.dimension_shardings))
    return TensorSharding(mesh, dims, tuple(map(_axis_from_attr, ts.replicated_axes)),
                          tuple(map(_axis_from_attr, ts.unreduced_axes)))


def sharding_to_attr(sharding: TensorSharding) -> ir.Attribute:
    """The sdy attribute for a sharding, in the current context."""
    return _sharding_to_attr_in(sharding, ir.Context.current)


@functools.lru_cache(maxsize=8192)
def _sharding_to_attr_in(sharding: TensorSharding, _context: ir.Context) -> ir.Attribute:
    mesh = sharding.mesh if isinstance(sharding.mesh, str) else mesh_to_attr(sharding.mesh)
    dims = [sdy.DimensionShardingAttr.get([_axis_to_attr(a) for a in d.axes], d.is_closed, d.priority)
            for d in sharding.dims]
    return sdy.TensorShardingAttr.get(mesh, dims, [_axis_to_attr(a) for a in sharding.replicated],
                                      [_axis_to_attr(a) for a in sharding.unreduced])


def per_value_to_attr(shardings) -> ir.Attribute:
    return sdy.TensorShardingPerValueAttr.get([sharding_to_attr(s) for s in shardings])


def module_meshes(module: ir.Operation) -> dict[str, Mesh]:
    """The module's `sdy.mesh` symbols, in order."""
    meshes = {}
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name == "sdy.mesh":
            attrs = op.operation.attributes
            meshes[ir.StringAttr(attrs["sym_name"]).value] = mesh_from_attr(attrs["mesh"])
    return meshes


def manual_axes_of(op: ir.Operation) -> frozenset[str]:
    """The axes a sdy.manual_computation makes manual."""
    return frozenset(manual_axes_list(op))


def manual_axes_list(op: ir.Operation) -> tuple[str, ...]:
    """A sdy.manual_computation's manual axes as written, duplicates and order included (the bindings give
    ManualAxesAttr no accessor: its printed form is read with the sdy syntax reader)."""
    return _manual_axes(op.attributes["manual_axes"])


@functools.lru_cache(maxsize=4096)
def _manual_axes(attr: ir.Attribute) -> tuple[str, ...]:
    return parse_manual_axes(str(attr))


def manual_axes_to_attr(axes) -> ir.Attribute:
    return sdy.ManualAxesAttr.get([ir.StringAttr.get(a) for a in axes])
