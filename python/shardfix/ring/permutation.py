"""Sequence permutations as IR: the attributes that mark them, their builders (a small manual computation over
every mesh axis that moves at most one local shard per device), channel handles, and inserting one at a value.
ring-reorder and hoist-permutations both build and recognise permutations through this module."""

from __future__ import annotations

import math

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..sharding import DimSharding, Mesh, TensorSharding

REORDERED_ATTR = "shardfix.ring_reorder"  # on a region already reordered (so the pass is idempotent)
# On the permutations the pass inserts: {axis, dim, inverse, strategy, stripe}, what it takes to recognise them,
# cancel them against each other, and build more of the same kind.
PERMUTATION_ATTR = "shardfix.sequence_permutation"


def next_channel_handle(module: ir.Operation) -> int:
    """A channel handle above every one the module uses."""
    handles = [0]

    def visit(op):
        if "channel_handle" in op.attributes:
            handles.append(stablehlo.ChannelHandle(op.attributes["channel_handle"]).handle)
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


class Permutations:
    """Inserts sequence permutations into one module. Each kind of permutation (mesh, sharding, shape, dim,
    strategy, direction) is parsed once and cloned where needed; every clone gets channel handles of its own,
    above all those the module used before. Use as a context manager: the templates go when it closes."""

    def __init__(self, module: ir.Operation):
        self.module = module
        self._templates: dict = {}
        self._channel: int | None = None

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
               inverse: bool) -> ir.Operation:
        """The permutation (or its inverse) of `value` along `dim`, inserted at `point`."""
        shaped = ir.RankedTensorType(value.type)
        element = str(shaped.element_type)
        key = (mesh_name, mesh, sharding, tuple(shaped.shape), element, dim, axis, strategy, stripe, inverse)
        found = self._templates.get(key)
        if found is None:
            text = permutation_module(mesh_name, mesh, sharding, tuple(shaped.shape), element, dim, axis, strategy,
                                      stripe, inverse, channel=1)
            with self.module.context:
                template = ir.Module.parse(text)
            template_op = next(op.operation for op in template.body.operations[1].regions[0].blocks[0].operations
                               if op.operation.name == "sdy.manual_computation")
            found = self._templates[key] = (template, template_op)
        new = found[1].clone(ip=point).operation
        new.operands[0] = value  # it read the template's argument
        if self._channel is None:  # found only when a permutation is built: scanning the module costs a walk
            self._channel = next_channel_handle(self.module)
        for op in new.regions[0].blocks[0].operations:
            if "channel_handle" in op.attributes:
                kind = stablehlo.ChannelHandle(op.attributes["channel_handle"]).channel_type
                op.attributes["channel_handle"] = stablehlo.ChannelHandle.get(self._channel, kind,
                                                                              context=self.module.context)
                self._channel += 1
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
