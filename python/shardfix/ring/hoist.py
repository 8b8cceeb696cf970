"""Moving sequence permutations across token-wise code: one permutation per program instead of two per layer.

Between ring regions sit computations that treat every token alike along the sequence (elementwise ops, reductions
and dot_generals over other dims, broadcasts, reshapes and transposes that keep the sequence dim whole, sharding
constraints). They commute with a permutation of the sequence (the `moves` rules of rules.py say which op does and
where the sequence dim goes), so an inverse permutation can sink through them, a forward one can rise through
them, an inverse followed by the same forward cancels, and an inverse that only feeds an order-independent
reduction over the sequence (a mean loss) is not needed at all. What can't be shown token-wise stops the motion
there, and is reported.

The permutations of a function are moved with a worklist: each one is looked at when it appears or when something
next to it changes, and permutations of one value are shared through an index, so the work is proportional to the
number of moves, not to the number of moves times the size of the function.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from ..ir import manual_axes_of, module_meshes, sharding_from_attr, source_loc
from ..locations import SourceLoc
from ..sharding import AxisRef, DimSharding, Mesh, TensorSharding
from .detect import module_funcs
from .dims import ELEMENTWISE
from .dims import shape as _shape
from .permutation import PERMUTATION_ATTR, Permutations
from .rules import REDUCED, Blocked, carriers, moves, reduced_with


@dataclass(frozen=True)
class Kind:
    """Permutations of one kind are interchangeable: same order, ring axis, mesh and sequence length."""

    strategy: str
    stripe: int
    axis: str
    mesh_name: str
    length: int

    def __str__(self) -> str:
        return self.strategy if self.strategy == "zigzag" else f"striped{{stripe={self.stripe}}}"


@dataclass(eq=False)
class Perm:
    op: ir.Operation
    kind: Kind
    dim: int
    inverse: bool
    sharding: TensorSharding
    manual_axes: tuple[str, ...] = ()
    erased: bool = False
    placeholder: bool = False  # stands for a permutation while they move: one cheap op, made real at the end

    @property
    def source(self) -> ir.Value:
        return self.op.operands[0]

    @property
    def result(self) -> ir.Value:
        return self.op.results[0]


# What a permutation hoist-permutations adds is while the permutations move (most are cancelled or moved again
# before the end): an op of the builtin dialect that passes its operand through, never left in the module.
PLACEHOLDER = "builtin.unrealized_conversion_cast"


def perm_of(op: ir.Operation) -> Perm | None:
    """The permutation an op is, when it is one that ring-reorder (or this module) inserted."""
    if op.name != "sdy.manual_computation" or PERMUTATION_ATTR not in op.attributes:
        return None
    params = ir.DictAttr(op.attributes[PERMUTATION_ATTR])
    sharding = sharding_from_attr(sdy.TensorShardingPerValueAttr(op.attributes["in_shardings"]).shardings[0])
    dim = ir.IntegerAttr(params["dim"]).value
    length = ir.ShapedType(op.operands[0].type).get_dim_size(dim)
    kind = Kind(ir.StringAttr(params["strategy"]).value, ir.IntegerAttr(params["stripe"]).value,
                ir.StringAttr(params["axis"]).value, sharding.mesh, length)
    return Perm(op, kind, dim, ir.BoolAttr(params["inverse"]).value, sharding, tuple(sorted(manual_axes_of(op))))


@dataclass
class Motion:
    remarks: list[tuple[str, SourceLoc]]
    cancelled: int = 0
    dropped: int = 0


@dataclass
class _Function:
    """The permutations of one function body: by result value (an op's hash changes with its operands; a value's
    doesn't), and by (source, kind, dim, direction) to share them."""

    block: ir.Block
    by_result: dict = field(default_factory=dict)
    by_source: dict = field(default_factory=dict)
    queue: deque = field(default_factory=deque)

    def add(self, perm: Perm) -> None:
        self.by_result[perm.result] = perm
        self.by_source.setdefault(_key(perm.source, perm), perm)
        self.queue.append(perm)

    def forget(self, perm: Perm) -> None:
        perm.erased = True
        self.by_result.pop(perm.result, None)
        if self.by_source.get(_key(perm.source, perm)) is perm:
            del self.by_source[_key(perm.source, perm)]

    def perm(self, op) -> Perm | None:
        if op is None or len(op.results) != 1:
            return None
        return self.by_result.get(op.results[0])


def _key(source: ir.Value, perm: Perm):
    return (source, perm.kind, perm.dim, perm.inverse)


class Mover:
    """Moves the permutations of one module as far as the rules allow."""

    def __init__(self, module: ir.Operation):
        self.module = module
        self.meshes: dict[str, Mesh] = module_meshes(module)
        self.motion = Motion([])
        self._said: set = set()
        self._funcs: dict[str, ir.Operation] | None = None
        self._elementwise: dict[str, bool] = {}

    # -- where the sequence dim goes: the rule table, and calls of elementwise functions ----------------------

    def _moves(self, op: ir.Operation, operand: int, dim: int):
        if op.name == "func.call" and self._elementwise_call(op):
            return dim
        return moves(op, operand, dim)

    def _carriers(self, op: ir.Operation, dim: int) -> dict[int, int]:
        if op.name == "func.call" and self._elementwise_call(op):
            return {i: dim for i in range(len(op.operands))}
        return carriers(op, dim)

    def _elementwise_call(self, op: ir.Operation) -> bool:
        """A call of a function that is elementwise as a whole (jax.nn.silu, say, lowers to one): its arguments and
        single result of one type, and its body only elementwise ops on them and on splat constants (and
        broadcasts of scalars), so every token of the result is computed from the same token of the arguments."""
        if not len(op.results) or any(v.type != op.results[0].type for v in list(op.operands) + list(op.results)):
            return False
        callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        if callee not in self._elementwise:
            if self._funcs is None:
                self._funcs = module_funcs(self.module)
            func = self._funcs.get(callee)
            self._elementwise[callee] = func is not None and _is_elementwise_body(func, op.results[0].type)
        return self._elementwise[callee]

    def run(self) -> Motion:
        with Permutations(self.module) as self.permutations:
            for fn in self.module.regions[0].blocks[0].operations:
                fn = fn.operation
                if fn.name != "func.func" or not len(fn.regions[0].blocks):
                    continue
                body = _Function(fn.regions[0].blocks[0])
                for op in body.block.operations:
                    perm = perm_of(op.operation)
                    if perm is not None:
                        body.add(perm)
                self._drain(body)
                self._materialize(body)
        del self.permutations
        return self.motion

    def _drain(self, body: _Function) -> None:
        while body.queue:
            perm = body.queue.popleft()
            if perm.erased:
                continue
            if not list(perm.result.uses):
                self._erase(body, perm)
            elif self._cancel(body, perm) or self._share(body, perm):
                continue
            elif perm.inverse:
                self._sink(body, perm)
            else:
                self._hoist(body, perm)

    # -- the rules ----------------------------------------------------------------------------------------------

    def _materialize(self, body: _Function) -> None:
        """The permutations that stay where the motion left them, built in place of their placeholders."""
        for perm in list(body.by_result.values()):
            if not perm.placeholder:
                continue
            real = self.permutations.insert(ir.InsertionPoint(perm.op), perm.source, perm.kind.mesh_name,
                                            self.meshes[perm.kind.mesh_name], perm.sharding, perm.dim,
                                            perm.kind.axis, perm.kind.strategy, perm.kind.stripe, perm.inverse,
                                            perm.manual_axes)
            perm.result.replace_all_uses_with(real.results[0])
            perm.op.erase()

    def _erase(self, body: _Function, perm: Perm) -> None:
        body.forget(perm)
        source_perm = body.perm(_owner(perm.source))
        perm.op.erase()
        if source_perm is not None:
            body.queue.append(source_perm)  # it may have lost its last use

    def _cancel(self, body: _Function, perm: Perm) -> bool:
        other = body.perm(_owner(perm.source))
        if other is None or other.inverse == perm.inverse or other.kind != perm.kind or other.dim != perm.dim:
            return False
        perm.result.replace_all_uses_with(other.source)
        self._erase(body, perm)
        self.motion.cancelled += 1
        return True

    def _share(self, body: _Function, perm: Perm) -> bool:
        """Two permutations of one kind of the same value: keep the first."""
        first = body.by_source.get(_key(perm.source, perm))
        if first is None or first is perm or first.erased:
            body.by_source[_key(perm.source, perm)] = perm
            return False
        perm.result.replace_all_uses_with(first.result)
        self._erase(body, perm)
        body.queue.append(first)  # its source may have no other use left: it may move now
        return True

    def _sink(self, body: _Function, inv: Perm) -> None:
        for use in list(inv.result.uses):
            user = use.owner.operation
            later = body.perm(user)
            if later is not None or user.name in ("func.return", "sdy.manual_computation") \
                    or user.parent != inv.op.parent:
                if later is not None:
                    body.queue.append(later)  # a forward permutation right after: they may cancel
                continue  # at the function's output, at a region's input, or inside another region: it stays
            try:
                dim = self._moves(user, use.operand_number, inv.dim)
                operand_dims = {use.operand_number: inv.dim, **reduced_with(user, use.operand_number, inv.dim)} \
                    if dim == REDUCED else self._carriers(user, dim)
                self._check_sizes(user, operand_dims, inv.kind)
            except Blocked as why:
                self._say(inv, user, why)
                continue
            if self._move_after(body, inv, user, use.operand_number, dim, operand_dims):
                return
            for index, operand_dim in operand_dims.items():
                user.operands[index] = self._in_permuted_order(body, user.operands[index], operand_dim, inv)
            if dim == REDUCED:
                self.motion.dropped += 1
            else:
                self._insert_after(body, user, inv, dim)
            body.queue.append(inv)  # it may have other users left, or none
            return

    def _move_after(self, body: _Function, inv: Perm, user: ir.Operation, operand: int, dim, operand_dims) -> bool:
        """Sink `inv` past its only user by moving it, when the user keeps its type and reads nothing else along
        the sequence: the same as the inverse of the user's result, without building one."""
        if dim != inv.dim or operand_dims != {operand: inv.dim} or len(user.results) != 1 \
                or user.results[0].type != inv.result.type or len(list(inv.result.uses)) != 1:
            return False
        result = user.results[0]
        body.forget(inv)
        user.operands[operand] = inv.source
        result.replace_all_uses_with(inv.result)
        inv.op.operands[0] = result
        inv.op.move_after(user)
        inv.erased = False
        body.add(inv)
        return True

    def _move_before(self, body: _Function, fwd: Perm, owner: ir.Operation, operand_dims) -> bool:
        """Hoist `fwd` above the op that makes its source by moving it, when that op reads one value along the
        sequence, of its own type."""
        if len(operand_dims) != 1 or len(owner.results) != 1:
            return False
        ((index, dim),) = operand_dims.items()
        if dim != fwd.dim or owner.operands[index].type != fwd.source.type:
            return False
        body.forget(fwd)
        fwd.result.replace_all_uses_with(owner.results[0])
        fwd.op.operands[0] = owner.operands[index]
        fwd.op.move_before(owner)
        owner.operands[index] = fwd.result
        fwd.erased = False
        body.add(fwd)
        return True

    def _hoist(self, body: _Function, fwd: Perm) -> None:
        owner = _owner(fwd.source)
        if owner is None or owner.parent != fwd.op.parent or len(list(fwd.source.uses)) != 1:
            return  # at the function's input, or the value is needed in order elsewhere too
        if owner.name == "sdy.manual_computation" or body.perm(owner) is not None:
            return
        try:
            operand_dims = self._carriers(owner, fwd.dim)
            self._check_sizes(owner, operand_dims, fwd.kind)
        except Blocked as why:
            self._say(fwd, owner, why)
            return
        if self._move_before(body, fwd, owner, operand_dims):
            return
        for index, operand_dim in operand_dims.items():
            owner.operands[index] = self._in_permuted_order(body, owner.operands[index], operand_dim, fwd)
        source = fwd.source
        fwd.result.replace_all_uses_with(source)
        self._erase(body, fwd)
        # the owner's other results (an elementwise call's) are now in permuted order too: restore them for their
        # users
        others = [r for r in owner.results if r != source]
        if others:
            self._insert_after(body, owner, fwd, fwd.dim, others)

    # -- helpers ------------------------------------------------------------------------------------------------

    def _check_sizes(self, op: ir.Operation, operand_dims: dict[int, int], kind: Kind) -> None:
        for index, dim in operand_dims.items():
            if _shape(op.operands[index])[dim] != kind.length:
                raise Blocked("changes the sequence length")

    def _in_permuted_order(self, body: _Function, value: ir.Value, dim: int, like: Perm) -> ir.Value:
        """`value` (in contiguous order) as a value in permuted order: unwrap an inverse, reuse a forward
        permutation of it, else add one."""
        owner = _owner(value)
        other = body.perm(owner)
        if other is not None and other.inverse and other.kind == like.kind and other.dim == dim:
            return other.source
        if value == like.result:
            return like.source
        shared = body.by_source.get((value, like.kind, dim, False))
        if shared is not None and not shared.erased:
            body.queue.append(shared)  # the value may have no user in contiguous order left: it may move now
            return shared.result
        point = ir.InsertionPoint.at_block_begin(value.owner) if owner is None else ir.InsertionPoint.after(owner)
        new = self._build(point, value, dim, like, inverse=False)
        body.add(new)
        return new.result

    def _insert_after(self, body: _Function, op: ir.Operation, like: Perm, dim: int, results=None) -> None:
        """Inverse permutations of dim `dim` of the op's results (all of them, or `results`) that have users."""
        for result in op.results if results is None else results:
            if not list(result.uses):
                continue
            new = self._build(ir.InsertionPoint.after(op), result, dim, like, inverse=True)
            result.replace_all_uses_except(new.result, new.op)
            body.add(new)

    def _build(self, point: ir.InsertionPoint, value: ir.Value, dim: int, like: Perm, inverse: bool) -> Perm:
        """A permutation of `like`'s kind of dim `dim` of `value`, inserted at `point` (what perm_of would read
        back from it)."""
        mesh = self.meshes[like.kind.mesh_name]
        shape = list(_shape(value))
        sharding = _derive_sharding(like, list(_shape(like.source)), shape, dim, mesh)
        op = ir.Operation.create(PLACEHOLDER, results=[value.type], operands=[value],
                                 loc=ir.Location.unknown(self.module.context), ip=point)
        kind = like.kind if shape[dim] == like.kind.length else replace(like.kind, length=shape[dim])
        return Perm(op, kind, dim, inverse, sharding, like.manual_axes, placeholder=True)

    def _say(self, perm: Perm, op: ir.Operation, why: Blocked) -> None:
        key = (str(perm.kind), perm.inverse, op.name, str(why), str(source_loc(op.location)))
        if key in self._said:
            return
        self._said.add(key)
        what = "an inverse" if perm.inverse else "a"
        name = op.name
        if name == "func.call":
            name += f"' to '@{ir.FlatSymbolRefAttr(op.attributes['callee']).value}"
        self.motion.remarks.append((f"{what} {perm.kind} permutation stops at '{name}': it {why}",
                                    source_loc(op.location)))


def _is_elementwise_body(func: ir.Operation, whole: ir.Type) -> bool:
    blocks = func.regions[0].blocks
    if len(blocks) != 1:
        return False
    for opview in blocks[0].operations:
        op = opview.operation
        if op.name == "func.return":
            pass
        elif op.name == "stablehlo.constant":
            if not ir.DenseElementsAttr(op.attributes["value"]).is_splat:
                return False
        elif op.name == "stablehlo.broadcast_in_dim":
            if ir.ShapedType(op.operands[0].type).rank != 0:
                return False
        elif op.name not in ELEMENTWISE or op.regions and len(op.regions) or len(op.results) != 1 \
                or op.results[0].type != whole and ir.ShapedType(op.results[0].type).shape != ir.ShapedType(whole).shape:
            return False
        else:
            for value in op.operands:
                if ir.ShapedType(value.type).shape != ir.ShapedType(whole).shape:
                    return False
    return True


def _owner(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def _derive_sharding(like: Perm, like_shape: list[int], shape: list[int], dim: int, mesh: Mesh) -> TensorSharding:
    """The sharding of a new permutation: the ring axis on the sequence dim, and the axes `like` has on the dims
    that sit at the same distance from its sequence dim with the same size (batch dims, say) where they divide."""
    partial = len(like.manual_axes) < len(mesh.axes)  # the other axes left to propagation: dims stay open
    dims = []
    for j, size in enumerate(shape):
        i = like.dim + (j - dim)
        axes: tuple[AxisRef, ...] = ()
        if j == dim:
            axes = (AxisRef(like.kind.axis),)
        elif 0 <= i < len(like_shape) and like_shape[i] == size and i < len(like.sharding.dims):
            axes = like.sharding.dims[i].axes
            if size % math.prod(a.size_in(mesh) for a in axes):
                axes = ()
        dims.append(DimSharding(axes, not partial))
    return TensorSharding(like.kind.mesh_name, tuple(dims))
