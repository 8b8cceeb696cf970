"""Ring regions: detection, the analysis that decides whether reordering the sequence keeps a region's results,
and the IR of the cheap sequence permutation inserted around it.

A ring region is a `sdy.manual_computation` whose body (called functions and loop bodies included) passes data
around a ring of `stablehlo.collective_permute`s along one mesh axis. Reordering the sequence dim (sharded on that
axis) keeps the region's results when nothing in it can observe where a token sits except through data: no device
index, no index arithmetic, no order-sensitive or index-driven ops, no other collectives, and a ring that visits
every shard (the notes' three conditions, made checkable on the IR).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
from jax._src.lib.mlir import ir
from jaxlib.mlir.dialects import sdy

from .ir import SourceLoc, manual_axes_of, mesh_from_attr, sharding_from_attr, source_loc
from .sharding import DimSharding, Mesh, TensorSharding

REORDERED_ATTR = "shardfix.ring_reorder"  # on a region already reordered (so the pass is idempotent)
# On the permutations the pass inserts: {axis, dim, inverse, strategy, stripe}, what it takes to recognise them,
# cancel them against each other, and build more of the same kind.
PERMUTATION_ATTR = "shardfix.sequence_permutation"

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


def next_channel_handle(module: ir.Operation) -> int:
    """A channel handle above every one the module uses."""
    handles = [0]

    def visit(op):
        if "channel_handle" in op.attributes:
            handles.extend(int(h) for h in re.findall(r"handle = (\d+)", str(op.attributes["channel_handle"])))
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return max(handles) + 1


# ---------------------------------------------------------------------------------------------------------------
# The permutation, as IR: a manual computation over every mesh axis that moves at most one local shard per device.


def ring_groups(mesh: Mesh, axis: str) -> np.ndarray:
    """Partition ids grouped by ring: row g lists the devices of one ring in ring order."""
    shape = tuple(size for _, size in mesh.axes)
    k = mesh.axis_index(axis)
    ids = np.arange(math.prod(shape)).reshape(shape)
    return np.moveaxis(ids, k, -1).reshape(-1, shape[k])


def _pairs(mesh: Mesh, axis: str, target) -> str:
    """source_target_pairs sending ring position r to ring position target(r), in every ring."""
    rows = [[int(g[r]), int(g[target(r)])] for g in ring_groups(mesh, axis) for r in range(len(g))]
    return f"dense<{rows}> : tensor<{len(rows)}x2xi64>"


def _type(shape, element: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{element}>" if shape else f"tensor<{element}>"


def insert_permutation(text: str, point: ir.InsertionPoint, value: ir.Value, context: ir.Context,
                       location: ir.Location) -> ir.Operation:
    """Clone the manual computation of a `permutation_module` text at `point`, applied to `value`."""
    with context, location:
        template = ir.Module.parse(text)
        template_op = next(op.operation for op in template.body.operations[1].regions[0].blocks[0].operations
                           if op.operation.name == "sdy.manual_computation")
        new = template_op.clone(ip=point).operation
        # The clone still reads the template's argument: point it at `value` while the template is alive, and
        # drop the handle to the template's op before the template itself (a handle outliving its module, or a
        # use of a freed value, corrupts memory).
        new.operands[0] = value
        del template_op
        del template
    return new


def permutation_module(mesh_name: str, mesh: Mesh, sharding: TensorSharding, shape: tuple[int, ...], element: str,
                       dim: int, axis: str, strategy: str, stripe: int, inverse: bool, channel: int) -> str:
    """Text of a module whose function applies the sequence permutation (or its inverse) to dim `dim` of a
    tensor with `sharding`, as one manual computation over all mesh axes."""
    cp = mesh.axis_size(axis)
    closed = TensorSharding(mesh_name, tuple(DimSharding(d.axes) for d in sharding.dims))
    local = list(shape)
    for i, d in enumerate(closed.dims):
        local[i] //= math.prod(a.size_in(mesh) for a in d.axes)
    g_type, l_type = _type(shape, element), _type(local, element)
    body = (_zigzag_body if strategy == "zigzag" else _striped_body)(mesh, axis, cp, local, element, dim, stripe,
                                                                     inverse, channel)
    manual = ", ".join(f'"{n}"' for n in mesh.axis_names)
    params = (f'{{axis = "{axis}", dim = {dim} : i64, inverse = {str(inverse).lower()}, strategy = "{strategy}", '
              f"stripe = {stripe} : i64}}")
    return (f"sdy.mesh @{mesh_name} = {mesh}\n"
            f"func.func @permute(%arg0: {g_type}) -> {g_type} {{\n"
            f"  %0 = sdy.manual_computation(%arg0) in_shardings=[{closed.body()}] out_shardings=[{closed.body()}] "
            f"manual_axes={{{manual}}} (%x: {l_type}) {{\n{body}"
            f"  }} {{{PERMUTATION_ATTR} = {params}}} : ({g_type}) -> {g_type}\n"
            f"  return %0 : {g_type}\n}}\n")


def _halves(local, dim, element):
    half = list(local)
    half[dim] //= 2
    starts = ", ".join("0:" + str(n) if i != dim else f"0:{half[dim]}" for i, n in enumerate(local))
    ends = ", ".join("0:" + str(n) if i != dim else f"{half[dim]}:{local[dim]}" for i, n in enumerate(local))
    return _type(half, element), starts, ends


def _ring_parity(mesh: Mesh, axis: str, cp: int) -> str:
    """Lines computing %even: whether this device's position along the ring axis is even."""
    stride = math.prod(size for _, size in mesh.axes[mesh.axis_index(axis) + 1:])
    return ("    %pid = stablehlo.partition_id : tensor<ui32>\n"
            f"    %stride = stablehlo.constant dense<{stride}> : tensor<ui32>\n"
            f"    %cp = stablehlo.constant dense<{cp}> : tensor<ui32>\n"
            "    %two = stablehlo.constant dense<2> : tensor<ui32>\n"
            "    %zero = stablehlo.constant dense<0> : tensor<ui32>\n"
            "    %q = stablehlo.divide %pid, %stride : tensor<ui32>\n"
            "    %r = stablehlo.remainder %q, %cp : tensor<ui32>\n"
            "    %parity = stablehlo.remainder %r, %two : tensor<ui32>\n"
            "    %even = stablehlo.compare EQ, %parity, %zero, UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>\n")


def _zigzag_body(mesh, axis, cp, local, element, dim, stripe, inverse, channel) -> str:
    """Each device holds two half shards; two one-to-one collective_permutes move them, a select orders them.

    Forward: chunk c (2 per device, contiguous) goes to device c if c < cp else 2cp-1-c. The first permute moves
    every device's first half (an even chunk), the second its second half (odd); a device keeps the piece holding
    its lower chunk first. Inverse: a device sends its even chunk with the first permute and its odd chunk with the
    second; the receiver puts the even chunk (2e) first.
    """
    h_type, first, second = _halves(local, dim, element)
    l_type = _type(local, element)
    home = lambda c: c if c < cp else 2 * cp - 1 - c  # noqa: E731  (the device of chunk c in zigzag order)
    lines = [f"    %a = stablehlo.slice %x [{first}] : ({l_type}) -> {h_type}\n",
             f"    %b = stablehlo.slice %x [{second}] : ({l_type}) -> {h_type}\n", _ring_parity(mesh, axis, cp)]
    permute = ('    %{out} = "stablehlo.collective_permute"(%{src}) <{{channel_handle = #stablehlo.channel_handle'
               '<handle = {handle}, type = 1>, source_target_pairs = {pairs}}}> : ({t}) -> {t}\n')
    if not inverse:
        lines.append(permute.format(out="p1", src="a", handle=channel, t=h_type,
                                    pairs=_pairs(mesh, axis, lambda r: home(2 * r))))
        lines.append(permute.format(out="p2", src="b", handle=channel + 1, t=h_type,
                                    pairs=_pairs(mesh, axis, lambda r: home(2 * r + 1))))
        lines.append(f"    %lo = stablehlo.concatenate %p1, %p2, dim = {dim} : ({h_type}, {h_type}) -> {l_type}\n")
        lines.append(f"    %hi = stablehlo.concatenate %p2, %p1, dim = {dim} : ({h_type}, {h_type}) -> {l_type}\n")
        lines.append(f"    %y = stablehlo.select %even, %lo, %hi : tensor<i1>, {l_type}\n")
    else:
        chunk_even = lambda r: r if r % 2 == 0 else 2 * cp - 1 - r  # noqa: E731
        chunk_odd = lambda r: r if r % 2 == 1 else 2 * cp - 1 - r  # noqa: E731
        lines.append(f"    %e = stablehlo.select %even, %a, %b : tensor<i1>, {h_type}\n")
        lines.append(f"    %o = stablehlo.select %even, %b, %a : tensor<i1>, {h_type}\n")
        lines.append(permute.format(out="p1", src="e", handle=channel, t=h_type,
                                    pairs=_pairs(mesh, axis, lambda r: chunk_even(r) // 2)))
        lines.append(permute.format(out="p2", src="o", handle=channel + 1, t=h_type,
                                    pairs=_pairs(mesh, axis, lambda r: chunk_odd(r) // 2)))
        lines.append(f"    %y = stablehlo.concatenate %p1, %p2, dim = {dim} : ({h_type}, {h_type}) -> {l_type}\n")
    lines.append(f"    sdy.return %y : {l_type}\n")
    return "".join(lines)


def _striped_body(mesh, axis, cp, local, element, dim, stripe, inverse, channel) -> str:
    """One all_to_all: a device's contiguous block, seen as (rows, cp, stripe), sends column e to device e."""
    rows = local[dim] // (cp * stripe)  # the local block is rows * cp * stripe tokens
    split_shape = local[:dim] + [rows, cp, stripe] + local[dim + 1:]
    gathered_shape = local[:dim] + [rows * cp, 1, stripe] + local[dim + 1:]
    l_type = _type(local, element)
    a, b = (_type(split_shape, element), _type(gathered_shape, element))
    src_type, dst_type = (b, a) if inverse else (a, b)
    split_dim, concat_dim = (dim, dim + 1) if inverse else (dim + 1, dim)
    groups = ring_groups(mesh, axis)
    return (f"    %s = stablehlo.reshape %x : ({l_type}) -> {src_type}\n"
            f'    %t = "stablehlo.all_to_all"(%s) <{{channel_handle = #stablehlo.channel_handle<handle = {channel}, '
            f"type = 1>, concat_dimension = {concat_dim} : i64, replica_groups = dense<{groups.tolist()}> : "
            f"tensor<{groups.shape[0]}x{groups.shape[1]}xi64>, split_count = {cp} : i64, split_dimension = "
            f"{split_dim} : i64}}> : ({src_type}) -> {dst_type}\n"
            f"    %y = stablehlo.reshape %t : ({dst_type}) -> {l_type}\n"
            f"    sdy.return %y : {l_type}\n")
