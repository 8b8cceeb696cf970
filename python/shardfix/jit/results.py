"""The entry function's results JAX reads back: a result the function returns straight from a sharding constraint
(or reshard) that names no sharding of its own takes the constraint's sharding through propagation, and JAX then
converts the executable's output sharding to a NamedSharding, which can hold neither a padded split nor a sub-axis
(6 rows over 8 devices: IndivisibleError). Inside the function the constraint may keep its padded split or sub-axis
(the auto and subaxis policies' choice, which costs a device less there); the result gets a sharding JAX can read,
corrected as at any entry boundary, and the partitioner moves the value to it at the exit."""

from __future__ import annotations

import re
from dataclasses import replace

from jaxlib.mlir import ir

from ..correct import CorrectionError, Site, correct_sharding, resolve_mesh
from ..ir import module_meshes, sharding_from_attr, sharding_to_attr, source_loc
from ..report import Fix, bytes_per_device
from ..sharding import AxisRef, TensorSharding, dim_shard_count, shard_count

_CONSTRAINTS = ("sdy.sharding_constraint", "sdy.reshard")
RESULT_BOUNDARY = "the function returns this value, and JAX reads a result's sharding back without padding or sub-axes"


def repair_returned_constraints(main: ir.Operation, module: ir.Operation, policy: str) -> list[Fix]:
    """Give each result of `main` with no sharding of its own whose value a constraint JAX can't read back sets the
    boundary's correction of that constraint's sharding (the constraint itself is kept); the fixes made."""
    block = main.regions[0].blocks[0]
    terminator = list(block.operations)[-1].operation
    res_attrs = list(ir.ArrayAttr(main.attributes["res_attrs"])) if "res_attrs" in main.attributes else []
    res_attrs += [ir.DictAttr.get({})] * (len(terminator.operands) - len(res_attrs))
    meshes, fixes, changed = module_meshes(module), [], False
    for index, value in enumerate(terminator.operands):
        entry = ir.DictAttr(res_attrs[index])
        owner = value.owner  # an op view, or a block for a block argument
        owner = owner.operation if isinstance(owner, ir.OpView) else owner
        if "sdy.sharding" in entry or not isinstance(owner, ir.Operation) or owner.name not in _CONSTRAINTS:
            continue
        sharding = sharding_from_attr(owner.attributes["sharding"])
        shape = tuple(ir.RankedTensorType(value.type).shape)
        asked = _whole_axes(sharding)  # a sub-axis (the subaxis policy's repair inside) stands for its axis
        try:
            fixed, reasons = correct_sharding(asked, Site(shape, allow_subaxes=False, no_padding=RESULT_BOUNDARY,
                                                          move_axes=True), meshes, policy)
        except CorrectionError:
            continue  # the pass refused the constraint already
        if fixed == sharding:
            continue
        res_attrs[index] = ir.DictAttr.get({**{a.name: a.attr for a in entry}, "sdy.sharding": sharding_to_attr(fixed)})
        changed = True
        name = ir.StringAttr(entry["jax.result_info"]).value if "jax.result_info" in entry else f"result {index}"
        mesh = resolve_mesh(fixed, meshes)[1]
        itemsize = _itemsize(ir.RankedTensorType(value.type).element_type)
        sized = lambda s: None if itemsize is None else bytes_per_device(  # noqa: E731
            shape, [dim_shard_count(d, mesh) for d in s.dims], itemsize)
        fixes.append(Fix("fix-shardings", f"{name} (shape {shape}), set by {owner.name}", source_loc(owner.location),
                         tuple((r.code, r.detail) for r in reasons), asked.body(), fixed.body(),
                         shard_count(asked, mesh), shard_count(fixed, mesh), shape=shape, bytes_before=sized(asked),
                         bytes_after=sized(fixed)))
    if changed:
        main.attributes["res_attrs"] = ir.ArrayAttr.get(res_attrs)
    return fixes


def _whole_axes(sharding: TensorSharding) -> TensorSharding:
    """`sharding` with each sub-axis of a dim written as its whole axis (once)."""
    dims = tuple(replace(d, axes=tuple(dict.fromkeys(AxisRef(a.name) for a in d.axes))) for d in sharding.dims)
    return replace(sharding, dims=dims)


def _itemsize(element_type: ir.Type) -> int | None:
    """Bytes of an element of an MLIR type such as f32, bf16, i8 (None for others: i1, complex, ...)."""
    match = re.fullmatch(r"[a-z]+(\d+)(?:E\w*)?", str(element_type))
    bits = int(match[1]) if match else 0
    return bits // 8 if bits >= 8 and bits % 8 == 0 else None
