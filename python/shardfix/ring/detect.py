"""Ring regions: detection of the manual computations that pass data around a ring of collective_permutes, the
ring axis, and how many steps the ring makes.

A ring region is a `sdy.manual_computation` whose body (called functions and loop bodies included) passes data
around a ring of `stablehlo.collective_permute`s along one mesh axis. Reordering the sequence dim (sharded on that
axis) keeps the region's results when nothing in it can observe where a token sits except through data: no device
index, no index arithmetic, no order-sensitive or index-driven ops, no other collectives, and a ring that visits
every shard (the notes' three conditions, made checkable on the IR).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from ..ir import manual_axes_of, mesh_from_attr, sharding_from_attr, source_loc
from ..locations import SourceLoc
from ..sharding import Mesh
from .permutation import PERMUTATION_ATTR


# Ops through which a region could see a token's place, or that move data by index or in device order.
POSITION_OPS = {
    "stablehlo.partition_id": "reads the device index",
    "stablehlo.replica_id": "reads the device index",
    "stablehlo.iota": "builds index arithmetic",
    "stablehlo.reduce_window": "is order-sensitive (windows, cumulative sums)",
    "stablehlo.select_and_scatter": "is order-sensitive (windows)",
    "stablehlo.convolution": "is order-sensitive",
    "stablehlo.reverse": "is order-sensitive",
    "stablehlo.sort": "is order-sensitive",
    "stablehlo.fft": "is order-sensitive",
    "stablehlo.dynamic_slice": "moves data by index",
    "stablehlo.dynamic_update_slice": "moves data by index",
    "stablehlo.gather": "moves data by index",
    "stablehlo.scatter": "moves data by index",
    "stablehlo.rng": "draws random numbers by position",
    "stablehlo.rng_bit_generator": "draws random numbers by position",
    "stablehlo.custom_call": "is opaque to the analysis",
    "stablehlo.all_gather": "concatenates in device order",
    "stablehlo.all_to_all": "moves data in device order",
    "stablehlo.reduce_scatter": "scatters in device order",
    "stablehlo.collective_broadcast": "moves data in device order",
}


@dataclass
class Ring:
    """What the analysis found in one manual computation."""

    region: ir.Operation
    mesh_name: str | None
    mesh: Mesh | None
    axis: str | None = None
    problems: list[str] = field(default_factory=list)  # why reordering might change the results
    structure: list[str] = field(default_factory=list)  # why the rewrite can't be expressed at all

    @property
    def loc(self) -> SourceLoc:
        return source_loc(self.region.location)

    @property
    def cp(self) -> int:
        return self.mesh.axis_size(self.axis)


def find_rings(module: ir.Operation) -> list[Ring]:
    """Every manual computation with collective_permutes in it, analysed."""
    funcs = {ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
             for op in module.regions[0].blocks[0].operations if op.operation.name == "func.func"}
    meshes = {ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
              for op in module.regions[0].blocks[0].operations if op.operation.name == "sdy.mesh"}
    rings = []
    for region in _ops_named(module, "sdy.manual_computation"):
        if PERMUTATION_ATTR in region.attributes:
            continue
        facts = _Facts()
        for r in region.regions:
            for block in r.blocks:
                _scan_block(block, 1, funcs, facts, set())
        if not facts.permutes:
            continue
        rings.append(_judge(region, facts, meshes))
    return rings


def _ops_named(module: ir.Operation, name: str) -> list[ir.Operation]:
    found = []

    def visit(op):
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return found


@dataclass
class _Facts:
    permutes: list[tuple[ir.Operation, int | None]] = field(default_factory=list)  # (op, executions)
    position_ops: list[tuple[ir.Operation, str]] = field(default_factory=list)


def _scan_block(block, times: int | None, funcs, facts: _Facts, calling: set) -> None:
    for opview in block.operations:
        op = opview.operation
        name = op.name
        if name == "stablehlo.collective_permute":
            facts.permutes.append((op, times))
        elif name in POSITION_OPS:
            facts.position_ops.append((op, POSITION_OPS[name]))
        elif name == "stablehlo.constant" and _is_position_table(op):
            facts.position_ops.append((op, "is a constant table that can encode positions"))
        elif name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            if callee in funcs and callee not in calling:
                for block_ in funcs[callee].regions[0].blocks:
                    _scan_block(block_, times, funcs, facts, calling | {callee})
            continue
        inner = times
        if name == "stablehlo.while":
            trips = _trip_count(op)
            inner = None if trips is None or times is None else times * trips
        for region in op.regions:
            for inner_block in region.blocks:
                _scan_block(inner_block, inner, funcs, facts, calling)


def _is_position_table(op: ir.Operation) -> bool:
    value = op.attributes["value"]
    try:
        dense = ir.DenseElementsAttr(value)
    except (TypeError, ValueError):
        return True
    return not dense.is_splat and ir.ShapedType(dense.type).rank >= 1


def _trip_count(loop: ir.Operation) -> int | None:
    """Iterations of a counted loop (`i = c0; while i < n: ...; i += c1`, as fori_loop lowers), else None."""
    cond = loop.regions[0].blocks[0]
    ops = [o.operation for o in cond.operations]
    compare = next((o for o in ops if o.name == "stablehlo.compare"), None)
    if compare is None or "LT" not in str(compare.attributes["comparison_direction"]):
        return None
    counter, bound = compare.operands
    if not isinstance(counter.owner, ir.Block):
        return None
    index = ir.BlockArgument(counter).arg_number
    limit = _constant_int(bound)
    start = _constant_int(loop.operands[index])
    body_return = list(loop.regions[1].blocks[0].operations)[-1].operation
    step_value = body_return.operands[index]
    step_op = step_value.owner if not isinstance(step_value.owner, ir.Block) else None
    if limit is None or start is None or step_op is None or step_op.name != "stablehlo.add":
        return None
    a, b = step_op.operands
    body_arg = loop.regions[1].blocks[0].arguments[index]
    step = _constant_int(b) if a == body_arg else (_constant_int(a) if b == body_arg else None)
    if not step or step < 1:
        return None
    return max(0, -(-(limit - start) // step))


def _constant_int(value: ir.Value) -> int | None:
    owner = value.owner
    if isinstance(owner, ir.Block) or owner.name != "stablehlo.constant":
        return None
    dense = ir.DenseElementsAttr(owner.attributes["value"])
    if not dense.is_splat or ir.ShapedType(dense.type).rank != 0:
        return None
    return int(np.array(ir.DenseIntElementsAttr(owner.attributes["value"])).reshape(-1)[0])


def _judge(region: ir.Operation, facts: _Facts, meshes: dict) -> Ring:
    shardings = list(sdy.TensorShardingPerValueAttr(region.attributes["in_shardings"]).shardings) + \
        list(sdy.TensorShardingPerValueAttr(region.attributes["out_shardings"]).shardings)
    mesh_ref = sharding_from_attr(shardings[0]).mesh if shardings else None
    if isinstance(mesh_ref, str):
        mesh_name, mesh = mesh_ref, mesh_from_attr(meshes[mesh_ref].attributes["mesh"])
    else:
        mesh_name, mesh = None, mesh_ref
    ring = Ring(region, mesh_name, mesh)
    if mesh is None or mesh_name is None:
        ring.structure.append("the region's mesh is not a named sdy.mesh")
        return ring
    if mesh.device_ids is not None:
        ring.structure.append("the mesh has an explicit device order")
        return ring
    axes = [ring_axis_of(np.array(ir.DenseIntElementsAttr(op.attributes["source_target_pairs"])).reshape(-1, 2), mesh)
            for op, _ in facts.permutes]
    found = sorted({a for a in axes if a is not None})
    if len(found) != 1:
        ring.structure.append("no ring along one mesh axis" if not found else
                              f"rings along several axes ({', '.join(found)})")
        return ring
    ring.axis = found[0]
    if ring.axis not in manual_axes_of(region):
        ring.structure.append(f"the ring axis \"{ring.axis}\" is not manual in the region")
    for (op, _), axis in zip(facts.permutes, axes):
        if axis != ring.axis:
            ring.problems.append(f"a collective_permute at {source_loc(op.location) or 'unknown location'} is not a "
                                 f"ring along \"{ring.axis}\"")
    for op, why in facts.position_ops:
        ring.problems.append(f"'{op.name}' at {source_loc(op.location) or 'unknown location'} {why}")
    hops = _ring_hops(facts.permutes)
    if hops is None:
        ring.problems.append("the number of ring steps could not be determined (a loop that is not a counted loop)")
    elif hops < ring.cp - 1:
        ring.problems.append(f"the ring makes {hops} step(s), fewer than the {ring.cp - 1} needed to visit every "
                             "shard")
    return ring


def _ring_hops(permutes: list[tuple[ir.Operation, int | None]]) -> int | None:
    """How far data travels around the ring: a looped permute runs once per iteration; unrolled permutes chain."""
    looped = [times for op, times in permutes if times != 1]
    if looped:
        return None if any(t is None for t in looped) else min(looped)
    chain: dict = {}
    for op, _ in permutes:
        source = op.operands[0].owner
        previous = chain.get(source) if not isinstance(source, ir.Block) else None
        chain[op] = (previous or 0) + 1
    return max(chain.values())


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


