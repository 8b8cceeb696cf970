"""Ring regions: the manual computations that pass data around a ring of collective_permutes along one mesh axis,
the facts about that axis the analysis needs, and which collectives move data along it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy, stablehlo

from ..ir import manual_axes_of, module_meshes, sharding_from_attr, source_loc
from ..locations import SourceLoc
from ..sharding import Mesh, TensorSharding
from .permutation import PERMUTATION_ATTR


@dataclass
class RingRegion:
    """A manual computation whose body (calls and loops included) passes data around a ring."""

    region: ir.Operation
    mesh_name: str | None
    mesh: Mesh | None
    axis: str | None
    structure: list[str]  # why no reorder can be expressed at all (empty when it can)
    _read: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def loc(self) -> SourceLoc:
        return source_loc(self.region.location)

    @property
    def cp(self) -> int:
        return self.mesh.axis_size(self.axis)

    def in_shardings(self) -> list[TensorSharding]:
        return self._shardings("in_shardings")

    def out_shardings(self) -> list[TensorSharding]:
        return self._shardings("out_shardings")

    def _shardings(self, name: str) -> list[TensorSharding]:
        """The region's shardings, read once (the passes that hold a RingRegion don't change them)."""
        found = self._read.get(name)
        if found is None:
            found = self._read[name] = [
                sharding_from_attr(a) for a in sdy.TensorShardingPerValueAttr(self.region.attributes[name]).shardings]
        return list(found)


def module_funcs(module: ir.Operation) -> dict[str, ir.Operation]:
    return {ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
            for op in module.regions[0].blocks[0].operations if op.operation.name == "func.func"}


def find_ring_regions(module: ir.Operation, callers: dict[str, int] | None = None,
                      holders: set[str] | None = None) -> list[RingRegion]:
    """Every manual computation with collective_permutes in it (directly, in loops or in called functions), with
    its ring axis; permutations shardfix inserted are not rings. The same walk of the module fills, if given,
    `callers` with the number of func.call ops naming each function, and `holders` with the names of the
    functions whose body holds a manual computation among its own ops (not in a nested region)."""
    funcs = module_funcs(module)
    meshes = module_meshes(module)
    found = _Found(callers if callers is not None else {})
    module.walk(found.visitor())
    if holders is not None:
        for region in found.regions:
            parent = region.parent
            if parent.name == "func.func":
                holders.add(ir.StringAttr(parent.attributes["sym_name"]).value)
    axis_cache: dict = {}
    regions = []
    for region in found.regions:
        if PERMUTATION_ATTR in region.attributes:
            continue
        permutes = found.permutes_in(region, funcs)
        if permutes:
            regions.append(_describe(region, permutes, meshes, axis_cache))
    return regions


_MANUAL = "sdy.manual_computation"
# what ring-reorder hands on (PassContext.handoff): the names of the functions whose body holds a manual
# computation among its own ops, as the pass leaves the module
MANUAL_HOLDERS = "manual-holders"


class _Found:
    """What one walk of the module finds: the manual computations, the collective_permutes and the calls. A
    permute belongs to the nearest manual computation or function around it (a nested shard_map's collectives
    are its own ring), found by going up from the permute; so does a call, but only calls of functions that hold
    permutes (themselves or through their calls) are placed so: a model's other calls are only counted."""

    def __init__(self, callers: dict[str, int]):
        self.callers = callers
        self.regions: list[ir.Operation] = []
        self.permutes: list[ir.Operation] = []
        self.calls: dict[str, list[ir.Operation]] = {}  # callee -> the calls naming it
        self._held: dict | None = None  # holder (op) -> (its permutes, the permute-holding functions it calls)
        self._closure: dict[str, list] = {}

    def visitor(self):
        """The walk's callback: called for every op of the module, so what it reads is bound once here (a look-up
        of the bindings' attributes costs about what the rest of a visit does)."""
        regions, permutes, callers, calls = self.regions, self.permutes, self.callers, self.calls
        advance, symbol = ir.WalkResult.ADVANCE, ir.FlatSymbolRefAttr

        def visit(op: ir.Operation) -> ir.WalkResult:
            name = op.name
            if name == _MANUAL:
                regions.append(op)
            elif name == "func.call":
                callee = symbol(op.attributes["callee"]).value
                callers[callee] = callers.get(callee, 0) + 1
                calls.setdefault(callee, []).append(op)
            elif name == "stablehlo.collective_permute":
                permutes.append(op)
            return advance

        return visit

    def permutes_in(self, region: ir.Operation, funcs: dict[str, ir.Operation]) -> list[ir.Operation]:
        """The permutes `region` runs: its own, and those of the functions it calls (not through a nested manual
        computation, whose ring is its own)."""
        held = self._holdings(funcs)
        own, called = held.get(region, ((), ()))
        out = list(own)
        for callee in called:
            out.extend(self._of_function(callee, funcs, held))
        return out

    def _holdings(self, funcs: dict[str, ir.Operation]) -> dict:
        if self._held is not None:
            return self._held
        held: dict = {}
        names = {f: name for name, f in funcs.items()}
        bearing: list[str] = []
        for permute in self.permutes:
            holder = _holder(permute)
            if holder is None:
                continue
            held.setdefault(holder, ([], []))[0].append(permute)
            if holder.name == "func.func" and holder in names:
                bearing.append(names[holder])
        seen = set(bearing)
        while bearing:  # the functions that call a permute-holding function hold permutes too
            callee = bearing.pop()
            for call in self.calls.get(callee, ()):
                holder = _holder(call)
                if holder is None:
                    continue
                held.setdefault(holder, ([], []))[1].append(callee)
                caller = names.get(holder) if holder.name == "func.func" else None
                if caller is not None and caller not in seen:
                    seen.add(caller)
                    bearing.append(caller)
        self._held = held
        return held

    def _of_function(self, name: str, funcs: dict, held: dict) -> list:
        """The permutes running `name` runs: those of every function it reaches through calls, itself included."""
        found = self._closure.get(name)
        if found is None:
            found, reached, todo = [], {name}, [name]
            while todo:
                own, called = held.get(funcs[todo.pop()], ((), ()))
                found.extend(own)
                for callee in called:
                    if callee not in reached:
                        reached.add(callee)
                        todo.append(callee)
            self._closure[name] = found
        return found


def _holder(op: ir.Operation) -> ir.Operation | None:
    """The nearest manual computation or function around `op` (None outside any: no region runs it)."""
    parent = op.parent
    while parent is not None and parent.name not in (_MANUAL, "func.func"):
        try:
            parent = parent.parent
        except ValueError:  # past the top (the bindings say a detached op has no parent)
            return None
    return parent.operation if parent is not None else None


def _describe(region: ir.Operation, permutes: list, meshes: dict, axis_cache: dict) -> RingRegion:
    shardings = list(sdy.TensorShardingPerValueAttr(region.attributes["in_shardings"]).shardings) + \
        list(sdy.TensorShardingPerValueAttr(region.attributes["out_shardings"]).shardings)
    mesh_ref = sharding_from_attr(shardings[0]).mesh if shardings else None
    if isinstance(mesh_ref, str) and mesh_ref in meshes:
        mesh_name, mesh = mesh_ref, meshes[mesh_ref]
    else:
        return RingRegion(region, None, mesh_ref if isinstance(mesh_ref, Mesh) else None, None,
                          ["the region's mesh is not a named sdy.mesh"])
    if mesh.device_ids is not None:
        return RingRegion(region, mesh_name, mesh, None, ["the mesh has an explicit device order"])
    axes = set()
    for op in permutes:  # the regions of a model share their kernels' collectives: each pair list is read once
        key = (op.attributes["source_target_pairs"], mesh_name)
        if key not in axis_cache:
            axis_cache[key] = ring_axis_of(_pairs(op), mesh)
        axes.add(axis_cache[key])
    found = sorted(a for a in axes if a is not None)
    if len(found) != 1:
        why = (f"no collective_permute forms a ring along one mesh axis: {_not_a_ring(_pairs(permutes[0]), mesh)}; "
               "ring-reorder balances rings that pass each block to the next device along one axis (lax.ppermute "
               "with perm [(i, (i + 1) % n) for i in range(n)], or the reverse)") if not found else \
            f"rings along several axes ({', '.join(found)})"
        return RingRegion(region, mesh_name, mesh, None, [why])
    axis = found[0]
    structure = []
    if axis not in manual_axes_of(region):
        structure.append(f"the ring axis \"{axis}\" is not manual in the region")
    return RingRegion(region, mesh_name, mesh, axis, structure)


def _pairs(op: ir.Operation) -> np.ndarray:
    return np.array(ir.DenseIntElementsAttr(op.attributes["source_target_pairs"])).reshape(-1, 2)


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


def _not_a_ring(pairs: np.ndarray, mesh: Mesh) -> str:
    """Why a collective_permute's pairs are no ring ring_axis_of takes, in the user's terms."""
    shape = tuple(size for _, size in mesh.axes)
    if len(pairs) == 0:
        return "the first sends nothing"
    if not shape or pairs.min() < 0 or pairs.max() >= math.prod(shape):
        return "the first names devices outside the mesh"
    src, dst = (np.stack(np.unravel_index(pairs[:, i], shape), axis=1) for i in (0, 1))
    moved = [mesh.axes[k][0] for k in np.nonzero((src != dst).any(axis=0))[0]]
    if not moved:
        return "the first sends every block to its own device"
    if len(moved) > 1:
        return f"the first moves blocks along several mesh axes at once ({', '.join(moved)})"
    k = mesh.axis_index(moved[0])
    steps = sorted(set(((dst[:, k] - src[:, k]) % shape[k]).tolist()))
    if len(steps) > 1:
        return f"the first sends blocks different distances along \"{moved[0]}\""
    if steps[0] not in (1, shape[k] - 1):
        return (f"the first sends each block {steps[0]} devices along \"{moved[0]}\" (device i to i + {steps[0]}), "
                "not to the next one")
    return f"in the first, not every device along \"{moved[0]}\" takes part exactly once ({len(pairs)} pairs)"


def ring_direction(pairs: np.ndarray, ring) -> int | None:
    """+1 when every device sends to the next one along the ring axis (block i goes to i+1), -1 for the reverse
    ring, None when the pairs are not one full ring along that axis."""
    total = ring.cp * math.prod(n for _, _, n in ring.other_strides)
    if len(pairs) != total or pairs.min() < 0 or pairs.max() >= total or len(set(pairs[:, 0].tolist())) != total:
        return None
    position = (pairs // ring.stride) % ring.cp
    rest = pairs - position * ring.stride
    if not (rest[:, 0] == rest[:, 1]).all():
        return None
    step = (position[:, 1] - position[:, 0]) % ring.cp
    if len(set(step.tolist())) != 1 or step[0] not in (1, ring.cp - 1):
        return None
    return 1 if step[0] == 1 else -1


def replica_groups(attr: ir.Attribute, meshes: dict[str, Mesh]) -> np.ndarray | None:
    """The partition ids of each replica group of a collective: the dense form as written, the mesh-axes form (a
    group per combination of the other axes, members in the order of the named axes) expanded over the devices
    of its sdy.mesh. None for a form this cannot read (sub-axes, an inline or unknown mesh, an unknown axis)."""
    try:
        return np.array(ir.DenseIntElementsAttr(attr))
    except ValueError:
        pass
    try:
        groups = stablehlo.ReplicaGroupMeshAxesAttr(attr)
        mesh_name = ir.FlatSymbolRefAttr(groups.mesh).value
    except (TypeError, ValueError):
        return None
    if mesh_name not in meshes:
        return None
    mesh = meshes[mesh_name]
    refs = [stablehlo.AxisRefAttr(a) for a in groups.axes]
    names = [ref.name for ref in refs]
    if any(ref.sub_axis_info is not None for ref in refs) or len(set(names)) != len(names) or \
            any(not mesh.has_axis(n) for n in names):
        return None
    ids = np.array(mesh.device_ids if mesh.device_ids is not None else range(mesh.size))
    ids = ids.reshape([size for _, size in mesh.axes])
    grouped = [mesh.axis_index(n) for n in names]
    ids = np.moveaxis(ids, grouped, list(range(ids.ndim - len(grouped), ids.ndim)))
    return ids.reshape(-1, math.prod(mesh.axis_size(n) for n in names))


def ring_group_kind(groups: np.ndarray | None, ring) -> str | None:
    """"other" when every replica group keeps one position along the ring axis (a collective over other axes),
    "ring" when every group holds whole rings, None otherwise."""
    if groups is None or groups.size == 0:
        return None
    position = (groups // ring.stride) % ring.cp
    if (position == position[:, :1]).all():
        return "other"
    for group in groups.tolist():
        members = set(group)
        for device in group:
            base = device - ((device // ring.stride) % ring.cp) * ring.stride
            if any(base + i * ring.stride not in members for i in range(ring.cp)):
                return None
    return "ring"


def axis_strides(mesh: Mesh) -> dict[str, int]:
    """Partition ids between consecutive positions along each axis (row-major device order)."""
    out, stride = {}, 1
    for name, size in reversed(mesh.axes):
        out[name] = stride
        stride *= size
    return out
