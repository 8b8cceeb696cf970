"""Sequence permutations as IR: the attributes that mark them, their builders (a small manual computation over
the mesh axes its place leaves free that moves at most one local shard per device), and inserting one at a value.
ring-reorder and hoist-permutations both build and recognise permutations through this module."""

from __future__ import annotations

import math

import numpy as np
from jaxlib.mlir import ir

from ..ir import manual_axes_of
from ..sharding import DimSharding, Mesh, TensorSharding

REORDERED_ATTR = "shardfix.ring_reorder"  # on a region already reordered (so the pass is idempotent)
# On the permutations the pass inserts: {axis, dim, inverse, strategy, stripe}, what it takes to recognise them,
# cancel them against each other, and build more of the same kind.
PERMUTATION_ATTR = "shardfix.sequence_permutation"
# The channel handle of every collective a permutation holds: the one JAX gives all the collectives it lowers
# (jax 0.10 and later), device to device.
CHANNEL = 1


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


class Permutations:
    """Inserts sequence permutations into one module. Each kind of permutation (mesh, sharding, shape, dim,
    strategy, direction) is parsed once and cloned where needed. Use as a context manager: the templates go when it
    closes."""

    def __init__(self, module: ir.Operation):
        self.module = module
        self._templates: dict = {}
        self._bound: dict = {}  # block -> bound_axes(block) (a model's permutations go in a few blocks)

    def __enter__(self) -> "Permutations":
        return self

    def __exit__(self, *exc) -> None:
        # handles to a template's ops must go before the template module (a handle outliving its module
        # corrupts memory)
        ops = [op for _, op in self._templates.values()]
        modules = [module for module, _ in self._templates.values()]
        self._templates.clear()
        del ops
        del modules

    def insert(self, point: ir.InsertionPoint, value: ir.Value, mesh_name: str, mesh: Mesh,
               sharding: TensorSharding, dim: int, axis: str, strategy: str, stripe: int,
               inverse: bool, manual_axes: tuple[str, ...] | None = None) -> ir.Operation:
        """The permutation (or its inverse) of `value` along `dim`, inserted at `point`. Inside a manual
        computation (a nested shard_map) the axes it binds are left out: a manual computation may not bind an axis
        a parent binds, and the value is already local to them."""
        shaped = ir.RankedTensorType(value.type)
        element = str(shaped.element_type)
        block = point.block
        bound = self._bound.get(block)
        if bound is None:
            bound = self._bound[block] = bound_axes(block)
        key = (mesh_name, mesh, sharding, tuple(shaped.shape), element, dim, axis, strategy, stripe, inverse,
               manual_axes, bound)
        found = self._templates.get(key)
        if found is None:
            text = permutation_module(mesh_name, mesh, sharding, tuple(shaped.shape), element, dim, axis, strategy,
                                      stripe, inverse, manual_axes=manual_axes, bound=bound)
            with self.module.context:
                template = ir.Module.parse(text)
            template_op = next(op.operation for op in template.body.operations[1].regions[0].blocks[0].operations
                               if op.operation.name == "sdy.manual_computation")
            found = self._templates[key] = (template, template_op)
        new = found[1].clone(ip=point).operation
        new.operands[0] = value  # it read the template's argument
        return new


def permutations_in(module: ir.Operation) -> int:
    """How many sequence permutations (ops marked PERMUTATION_ATTR) the module holds."""
    count = [0]
    advance = ir.WalkResult.ADVANCE

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "sdy.manual_computation" and PERMUTATION_ATTR in op.attributes:
            count[0] += 1
        return advance

    module.walk(visit)
    return count[0]


def bound_axes(block: ir.Block) -> tuple[str, ...]:
    """The mesh axes bound by the manual computations that enclose `block` (sorted; empty at a function's top)."""
    bound: set[str] = set()
    owner = block.owner
    while owner is not None and owner.name != "func.func":
        if owner.name == "sdy.manual_computation":
            bound |= manual_axes_of(owner)
        owner = owner.parent
    return tuple(sorted(bound))


def permutation_module(mesh_name: str, mesh: Mesh, sharding: TensorSharding, shape: tuple[int, ...], element: str,
                       dim: int, axis: str, strategy: str, stripe: int, inverse: bool,
                       manual_axes: tuple[str, ...] | None = None, bound: tuple[str, ...] = ()) -> str:
    """Text of a module whose function applies the sequence permutation (or its inverse) to dim `dim` of a
    tensor with `sharding`, as one manual computation over `manual_axes` (default: all mesh axes). Over some axes
    only (next to a partial-manual region), the other axes stay free for propagation to place, as in the region.
    `bound`: axes a parent manual computation binds where it goes (neither manual here nor free: `shape` is
    already local to them, and the partition id is read as the parent reads it)."""
    cp = mesh.axis_size(axis)
    manual_axes = tuple(n for n in mesh.axis_names if (manual_axes is None or n in manual_axes) and n not in bound)
    free = tuple(n for n in mesh.axis_names if n not in manual_axes and n not in bound)
    # all manual: every dim closed; else each dim as the region has it (open dims stay open)
    dims = tuple(DimSharding(d.axes, d.is_closed or not free) for d in sharding.dims)
    closed = TensorSharding(mesh_name, dims)
    local = list(shape)
    for i, d in enumerate(closed.dims):
        local[i] //= math.prod(a.size_in(mesh) for a in d.axes if a.name in manual_axes)
    g_type, l_type = _type(shape, element), _type(local, element)
    body = (_zigzag_body if strategy == "zigzag" else _striped_body)(mesh, axis, cp, local, element, dim, stripe,
                                                                     inverse, mesh_name, free)
    manual = ", ".join(f'"{n}"' for n in manual_axes)
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


def _ring_parity(mesh: Mesh, axis: str, cp: int, mesh_name: str, free: tuple[str, ...]) -> str:
    """Lines computing %even: whether this device's position along the ring axis is even. The partition id is
    read where every mesh axis is manual: inside a manual computation over the `free` axes, if any (as JAX reads
    `axis_index` in a partial-manual region)."""
    stride = math.prod(size for _, size in mesh.axes[mesh.axis_index(axis) + 1:])
    indent = "      " if free else "    "
    even = "%e" if free else "%even"
    lines = ("%pid = stablehlo.partition_id : tensor<ui32>",
             f"%stride = stablehlo.constant dense<{stride}> : tensor<ui32>",
             f"%cp = stablehlo.constant dense<{cp}> : tensor<ui32>",
             "%two = stablehlo.constant dense<2> : tensor<ui32>",
             "%zero = stablehlo.constant dense<0> : tensor<ui32>",
             "%q = stablehlo.divide %pid, %stride : tensor<ui32>",
             "%r = stablehlo.remainder %q, %cp : tensor<ui32>",
             "%parity = stablehlo.remainder %r, %two : tensor<ui32>",
             f"{even} = stablehlo.compare EQ, %parity, %zero, UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>")
    text = "".join(f"{indent}{line}\n" for line in lines)
    if not free:
        return text
    names = ", ".join(f'"{n}"' for n in free)
    return (f"    %even = sdy.manual_computation() in_shardings=[] out_shardings=[<@{mesh_name}, []>] "
            f"manual_axes={{{names}}} () {{\n{text}      sdy.return %e : tensor<i1>\n    }} : () -> tensor<i1>\n")


def _zigzag_body(mesh, axis, cp, local, element, dim, stripe, inverse, mesh_name, free) -> str:
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
             f"    %b = stablehlo.slice %x [{second}] : ({l_type}) -> {h_type}\n",
             _ring_parity(mesh, axis, cp, mesh_name, free)]
    permute = ('    %{out} = "stablehlo.collective_permute"(%{src}) <{{channel_handle = #stablehlo.channel_handle'
               '<handle = {handle}, type = 1>, source_target_pairs = {pairs}}}> : ({t}) -> {t}\n')
    if not inverse:
        lines.append(permute.format(out="p1", src="a", handle=CHANNEL, t=h_type,
                                    pairs=_pairs(mesh, axis, lambda r: home(2 * r))))
        lines.append(permute.format(out="p2", src="b", handle=CHANNEL, t=h_type,
                                    pairs=_pairs(mesh, axis, lambda r: home(2 * r + 1))))
        lines.append(f"    %lo = stablehlo.concatenate %p1, %p2, dim = {dim} : ({h_type}, {h_type}) -> {l_type}\n")
        lines.append(f"    %hi = stablehlo.concatenate %p2, %p1, dim = {dim} : ({h_type}, {h_type}) -> {l_type}\n")
        lines.append(f"    %y = stablehlo.select %even, %lo, %hi : tensor<i1>, {l_type}\n")
    else:
        chunk_even = lambda r: r if r % 2 == 0 else 2 * cp - 1 - r  # noqa: E731
        chunk_odd = lambda r: r if r % 2 == 1 else 2 * cp - 1 - r  # noqa: E731
        lines.append(f"    %e = stablehlo.select %even, %a, %b : tensor<i1>, {h_type}\n")
        lines.append(f"    %o = stablehlo.select %even, %b, %a : tensor<i1>, {h_type}\n")
        lines.append(permute.format(out="p1", src="e", handle=CHANNEL, t=h_type,
                                    pairs=_pairs(mesh, axis, lambda r: chunk_even(r) // 2)))
        lines.append(permute.format(out="p2", src="o", handle=CHANNEL, t=h_type,
                                    pairs=_pairs(mesh, axis, lambda r: chunk_odd(r) // 2)))
        lines.append(f"    %y = stablehlo.concatenate %p1, %p2, dim = {dim} : ({h_type}, {h_type}) -> {l_type}\n")
    lines.append(f"    sdy.return %y : {l_type}\n")
    return "".join(lines)


def _striped_body(mesh, axis, cp, local, element, dim, stripe, inverse, mesh_name, free) -> str:
    """One all_to_all: a device's contiguous block, seen as (rows, cp, stripe), sends column e to device e."""
    rows = local[dim] // (cp * stripe)  # the local block is rows * cp * stripe tokens
    split_shape = local[:dim] + [rows, cp, stripe] + local[dim + 1:]
    gathered_shape = local[:dim] + [rows * cp, 1, stripe] + local[dim + 1:]
    l_type = _type(local, element)
    a, b = (_type(split_shape, element), _type(gathered_shape, element))
    src_type, dst_type = (b, a) if inverse else (a, b)
    split_dim, concat_dim = (dim, dim + 1) if inverse else (dim + 1, dim)
    if free:
        shapes = (gathered_shape, split_shape) if inverse else (split_shape, gathered_shape)
        return _exchange_by_permutes(mesh, axis, cp, element, l_type, *shapes, split_dim, concat_dim, mesh_name,
                                     free)
    groups = ring_groups(mesh, axis)
    return (f"    %s = stablehlo.reshape %x : ({l_type}) -> {src_type}\n"
            f'    %t = "stablehlo.all_to_all"(%s) <{{channel_handle = #stablehlo.channel_handle<handle = {CHANNEL}, '
            f"type = 1>, concat_dimension = {concat_dim} : i64, replica_groups = dense<{groups.tolist()}> : "
            f"tensor<{groups.shape[0]}x{groups.shape[1]}xi64>, split_count = {cp} : i64, split_dimension = "
            f"{split_dim} : i64}}> : ({src_type}) -> {dst_type}\n"
            f"    %y = stablehlo.reshape %t : ({dst_type}) -> {l_type}\n"
            f"    sdy.return %y : {l_type}\n")


def _exchange_by_permutes(mesh, axis, cp, element, l_type, src, dst, split_dim, concat_dim, mesh_name, free) -> str:
    """The all_to_all of `_striped_body` as cp - 1 collective_permutes, for a manual computation that leaves some
    mesh axes free (XLA would gather an all_to_all's operand over them). Piece j of a device's block (along
    `split_dim`) goes to ring position j; the pieces received line up by source along `concat_dim`. With c the
    device's ring position: rotate the pieces by c, send the t-th to c + t, then rotate what came back by -c."""
    piece = list(src)
    k = src[split_dim] // cp
    piece[split_dim] = k
    width = piece[concat_dim]  # a received piece's extent along concat_dim
    doubled_src, doubled_dst = list(src), list(dst)
    doubled_src[split_dim] *= 2
    doubled_dst[concat_dim] *= 2
    s_type, d_type, p_type = _type(src, element), _type(dst, element), _type(piece, element)
    ds_type, dd_type = _type(doubled_src, element), _type(doubled_dst, element)
    zero = "%c0"
    lines = [f"    %s = stablehlo.reshape %x : ({l_type}) -> {s_type}\n", _ring_position(mesh, axis, cp, mesh_name, free),
             f"    {zero} = stablehlo.constant dense<0> : tensor<i32>\n",
             f"    %k = stablehlo.constant dense<{k}> : tensor<i32>\n",
             f"    %w = stablehlo.constant dense<{width}> : tensor<i32>\n",
             f"    %ncp = stablehlo.constant dense<{cp}> : tensor<i32>\n",
             f"    %ss = stablehlo.concatenate %s, %s, dim = {split_dim} : ({s_type}, {s_type}) -> {ds_type}\n",
             "    %o1 = stablehlo.multiply %pos, %k : tensor<i32>\n"]
    starts = ", ".join("%o1" if i == split_dim else zero for i in range(len(src)))
    lines.append(f"    %rot = stablehlo.dynamic_slice %ss, {starts}, sizes = [{', '.join(map(str, src))}] : "
                 f"({ds_type}, {', '.join(['tensor<i32>'] * len(src))}) -> {s_type}\n")
    received = []
    for t in range(cp):
        bounds = ", ".join(f"{t * k}:{(t + 1) * k}" if i == split_dim else f"0:{n}" for i, n in enumerate(src))
        lines.append(f"    %p{t} = stablehlo.slice %rot [{bounds}] : ({s_type}) -> {p_type}\n")
        if t == 0:
            received.append("%p0")
            continue
        lines.append(f'    %r{t} = "stablehlo.collective_permute"(%p{t}) <{{channel_handle = '
                     f"#stablehlo.channel_handle<handle = {CHANNEL}, type = 1>, source_target_pairs = "
                     f"{_pairs(mesh, axis, lambda r, t=t: (r + t) % cp)}}}> : ({p_type}) -> {p_type}\n")
        received.append(f"%r{t}")
    order = [received[0]] + received[:0:-1]  # by source, starting from this device: c, c + 1, ...
    lines.append(f"    %z = stablehlo.concatenate {', '.join(order)}, dim = {concat_dim} : "
                 f"({', '.join([p_type] * cp)}) -> {d_type}\n")
    lines.append(f"    %zz = stablehlo.concatenate %z, %z, dim = {concat_dim} : ({d_type}, {d_type}) -> {dd_type}\n")
    lines.append("    %back = stablehlo.subtract %ncp, %pos : tensor<i32>\n")
    lines.append("    %wrap = stablehlo.remainder %back, %ncp : tensor<i32>\n")
    lines.append("    %o2 = stablehlo.multiply %wrap, %w : tensor<i32>\n")
    starts = ", ".join("%o2" if i == concat_dim else zero for i in range(len(dst)))
    lines.append(f"    %u = stablehlo.dynamic_slice %zz, {starts}, sizes = [{', '.join(map(str, dst))}] : "
                 f"({dd_type}, {', '.join(['tensor<i32>'] * len(dst))}) -> {d_type}\n")
    lines.append(f"    %y = stablehlo.reshape %u : ({d_type}) -> {l_type}\n")
    lines.append(f"    sdy.return %y : {l_type}\n")
    return "".join(lines)


def _ring_position(mesh: Mesh, axis: str, cp: int, mesh_name: str, free: tuple[str, ...]) -> str:
    """Lines computing %pos (i32): this device's position along the ring axis, read where every axis is manual."""
    stride = math.prod(size for _, size in mesh.axes[mesh.axis_index(axis) + 1:])
    lines = ("%pid = stablehlo.partition_id : tensor<ui32>",
             f"%stride = stablehlo.constant dense<{stride}> : tensor<ui32>",
             f"%size = stablehlo.constant dense<{cp}> : tensor<ui32>",
             "%q = stablehlo.divide %pid, %stride : tensor<ui32>",
             "%r = stablehlo.remainder %q, %size : tensor<ui32>",
             "%i = stablehlo.convert %r : (tensor<ui32>) -> tensor<i32>")
    names = ", ".join(f'"{n}"' for n in free)
    text = "".join(f"      {line}\n" for line in lines)
    return (f"    %pos = sdy.manual_computation() in_shardings=[] out_shardings=[<@{mesh_name}, []>] "
            f"manual_axes={{{names}}} () {{\n{text}      sdy.return %i : tensor<i32>\n    }} : () -> tensor<i32>\n")
