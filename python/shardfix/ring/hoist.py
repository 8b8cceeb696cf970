"""Moving sequence permutations across token-wise code: one permutation per program instead of two per layer.

Between ring regions sit computations that treat every token alike along the sequence (elementwise ops, reductions
and dot_generals over other dims, broadcasts, reshapes and transposes that keep the sequence dim whole, sharding
constraints). They commute with a permutation of the sequence, so an inverse permutation can sink through them, a
forward one can rise through them, an inverse followed by the same forward cancels, and an inverse that only feeds
an order-independent reduction over the sequence (a mean loss) is not needed at all. What can't be proven
token-wise stops the motion there, and is reported.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from ..ir import module_meshes, sharding_from_attr, source_loc
from ..locations import SourceLoc
from ..sharding import AxisRef, DimSharding, Mesh, TensorSharding
from .permutation import PERMUTATION_ATTR, insert_permutation, permutation_module

ELEMENTWISE = {f"stablehlo.{name}" for name in (
    "abs add and atan2 cbrt ceil clamp compare complex convert cosine divide exponential exponential_minus_one floor "
    "imag is_finite log log_plus_one logistic maximum minimum multiply negate not or popcnt power real remainder "
    "round_nearest_afz round_nearest_even rsqrt select sign sine sqrt subtract tan tanh xor").split()}
SUPPORTED = ELEMENTWISE | {"sdy.sharding_constraint", "stablehlo.broadcast_in_dim", "stablehlo.transpose",
                           "stablehlo.reshape", "stablehlo.reduce", "stablehlo.dot_general"}
ORDER_FREE_REDUCERS = {"stablehlo.add", "stablehlo.maximum", "stablehlo.minimum", "stablehlo.multiply",
                       "stablehlo.and", "stablehlo.or"}


class Blocked(Exception):
    """The op can't be shown to treat every token alike along the sequence."""


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


@dataclass
class Perm:
    op: ir.Operation
    kind: Kind
    dim: int
    inverse: bool
    sharding: TensorSharding

    @property
    def source(self) -> ir.Value:
        return self.op.operands[0]

    @property
    def result(self) -> ir.Value:
        return self.op.results[0]


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
    return Perm(op, kind, dim, ir.BoolAttr(params["inverse"]).value, sharding)


# ---------------------------------------------------------------------------------------------------------------
# How an op maps the sequence dim between its operands and its result.


def _ints(attr) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", str(attr).split(":", 1)[-1])]


def _dot_dims(op: ir.Operation) -> dict[str, list[int]]:
    text = str(op.attributes["dot_dimension_numbers"])
    out = {}
    for key in ("lhs_batching_dimensions", "rhs_batching_dimensions", "lhs_contracting_dimensions",
                "rhs_contracting_dimensions"):
        m = re.search(key + r" = \[([^\]]*)\]", text)
        out[key] = [int(x) for x in m.group(1).split(",")] if m and m.group(1).strip() else []
    return out


def _rank(value: ir.Value) -> int:
    return ir.ShapedType(value.type).rank


def _shape(value: ir.Value) -> list[int]:
    t = ir.ShapedType(value.type)
    return [t.get_dim_size(i) for i in range(t.rank)]


def result_dim(op: ir.Operation, operand: int, dim: int) -> int | None:
    """Where dim `dim` of operand `operand` lands in the op's result (None: reduced away in an order-independent
    way); Blocked when the op isn't token-wise along it."""
    name = op.name
    if len(op.results) != 1:
        raise Blocked("has several results")
    if name in ELEMENTWISE or name == "sdy.sharding_constraint":
        if _rank(op.operands[operand]) != _rank(op.results[0]):
            raise Blocked("broadcasts a scalar along the sequence")
        return dim
    if name == "stablehlo.broadcast_in_dim":
        target = _ints(op.attributes["broadcast_dimensions"])[dim]
        if _shape(op.results[0])[target] != _shape(op.operands[0])[dim]:
            raise Blocked("broadcasts along the sequence dim")
        return target
    if name == "stablehlo.transpose":
        return _ints(op.attributes["permutation"]).index(dim)
    if name == "stablehlo.reshape":
        return _reshape_dim(_shape(op.operands[0]), _shape(op.results[0]), dim)
    if name == "stablehlo.reduce":
        if len(op.operands) != 2 or operand != 0:
            raise Blocked("is a variadic reduction")
        reduced = _ints(op.attributes["dimensions"])
        if dim in reduced:
            if _reducer(op) not in ORDER_FREE_REDUCERS:
                raise Blocked("reduces along the sequence with an order-sensitive body")
            return None
        return dim - sum(1 for r in reduced if r < dim)
    if name == "stablehlo.dot_general":
        dims = _dot_dims(op)
        side = "lhs" if operand == 0 else "rhs"
        if dim in dims[f"{side}_batching_dimensions"] or dim in dims[f"{side}_contracting_dimensions"]:
            raise Blocked("contracts or batches over the sequence dim")
        batch = len(dims["lhs_batching_dimensions"])
        lhs_free = [d for d in range(_rank(op.operands[0]))
                    if d not in dims["lhs_batching_dimensions"] + dims["lhs_contracting_dimensions"]]
        rhs_free = [d for d in range(_rank(op.operands[1]))
                    if d not in dims["rhs_batching_dimensions"] + dims["rhs_contracting_dimensions"]]
        return batch + (lhs_free.index(dim) if side == "lhs" else len(lhs_free) + rhs_free.index(dim))
    raise Blocked("is not known to treat tokens alike")


def operand_dims(op: ir.Operation, dim: int) -> dict[int, int]:
    """The operands that carry result dim `dim`, and at which of their dims (an operand constant along it is
    absent); Blocked when the op isn't token-wise along it."""
    if op.name not in SUPPORTED or len(op.results) != 1:
        raise Blocked("is not known to treat tokens alike" if op.name not in SUPPORTED else "has several results")
    if op.name == "stablehlo.reduce" and len(op.operands) != 2:
        raise Blocked("is a variadic reduction")
    carriers = {}
    for i, value in enumerate(op.operands):
        try:
            rank = ir.ShapedType(value.type).rank
        except (TypeError, ValueError):
            continue
        for d in range(rank):
            try:
                mapped = result_dim(op, i, d)
            except Blocked:
                continue  # a dim that doesn't reach the result (contracted, broadcast from 1): not this one
            if mapped == dim:
                carriers[i] = d
    # Only a broadcast creates a dim its operand doesn't have (then the value is constant along it). Anywhere else a
    # result dim no operand carries is a dim the op assembled (merged by a reshape, batched by a dot_general).
    if not carriers and op.name != "stablehlo.broadcast_in_dim":
        raise Blocked("does not carry the sequence dim through from one operand")
    return carriers


def _reshape_dim(src: list[int], dst: list[int], dim: int) -> int:
    before = math.prod(src[:dim])
    for j in range(len(dst)):
        if math.prod(dst[:j]) == before and dst[j] == src[dim]:
            return j
    raise Blocked("splits or merges the sequence dim")


def _reducer(op: ir.Operation) -> str | None:
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    return body[0].name if len(body) == 2 else None


# ---------------------------------------------------------------------------------------------------------------
# The rewrite.


@dataclass
class Motion:
    remarks: list[tuple[str, SourceLoc]]
    cancelled: int = 0
    dropped: int = 0


class Mover:
    """Moves the permutations of one module until nothing changes."""

    def __init__(self, module: ir.Operation, next_channel):
        self.module, self._next_channel, self._channel = module, next_channel, None
        self.meshes: dict[str, Mesh] = module_meshes(module)
        self.motion = Motion([])
        self._said: set = set()

    def run(self, limit: int = 10_000) -> Motion:
        for fn in self.module.regions[0].blocks[0].operations:
            fn = fn.operation
            if fn.name != "func.func" or not len(fn.regions[0].blocks):
                continue
            block = fn.regions[0].blocks[0]
            for _ in range(limit):
                if not self._step(block):
                    break
        return self.motion

    def _step(self, block) -> bool:
        perms = [p for p in (perm_of(op.operation) for op in block.operations) if p is not None]
        for perm in perms:
            if self._cancel(perm) or (self._sink(perm) if perm.inverse else self._hoist(perm)):
                return True
        return self._merge(perms) or self._drop_dead(perms)

    # -- the rules ----------------------------------------------------------------------------------------------

    def _cancel(self, perm: Perm) -> bool:
        owner = _owner(perm.source)
        other = perm_of(owner) if owner is not None else None
        if other is None or other.inverse == perm.inverse or other.kind != perm.kind or other.dim != perm.dim:
            return False
        perm.result.replace_all_uses_with(other.source)
        perm.op.erase()
        self.motion.cancelled += 1
        return True

    def _sink(self, inv: Perm) -> bool:
        for use in list(inv.result.uses):
            user = use.owner
            if user.name in ("func.return", "sdy.manual_computation") or user.parent != inv.op.parent:
                continue  # at the function's output, at a region's input, or inside another region: it stays
            try:
                dim = result_dim(user, use.operand_number, inv.dim)
                carriers = {use.operand_number: inv.dim} if dim is None else operand_dims(user, dim)
                self._check_sizes(user, carriers, inv.kind)
            except Blocked as why:
                self._say(inv, user, why)
                continue
            for index, operand_dim in carriers.items():
                user.operands[index] = self._in_permuted_order(user.operands[index], operand_dim, inv, user)
            if dim is None:
                self.motion.dropped += 1
            else:
                self._insert_after(user, inv, dim)
            return True
        return False

    def _hoist(self, fwd: Perm) -> bool:
        owner = _owner(fwd.source)
        if owner is None or owner.parent != fwd.op.parent or len(list(fwd.source.uses)) != 1:
            return False  # at the function's input, or the value is needed in order elsewhere too
        if owner.name == "sdy.manual_computation":
            return False
        try:
            carriers = operand_dims(owner, fwd.dim)
            self._check_sizes(owner, carriers, fwd.kind)
        except Blocked as why:
            self._say(fwd, owner, why)
            return False
        for index, operand_dim in carriers.items():
            owner.operands[index] = self._in_permuted_order(owner.operands[index], operand_dim, fwd, owner)
        fwd.result.replace_all_uses_with(owner.results[0])
        fwd.op.erase()
        return True

    def _merge(self, perms: list[Perm]) -> bool:
        """Two permutations of one kind of the same value: keep the first."""
        for i, a in enumerate(perms):
            for b in perms[i + 1:]:
                if (a.kind, a.dim, a.inverse) == (b.kind, b.dim, b.inverse) and a.source == b.source:
                    b.result.replace_all_uses_with(a.result)
                    b.op.erase()
                    return True
        return False

    def _drop_dead(self, perms: list[Perm]) -> bool:
        dead = [p for p in perms if not list(p.result.uses)]
        for p in dead:
            p.op.erase()
        return bool(dead)

    # -- helpers ------------------------------------------------------------------------------------------------

    def _check_sizes(self, op: ir.Operation, carriers: dict[int, int], kind: Kind) -> None:
        for index, dim in carriers.items():
            if _shape(op.operands[index])[dim] != kind.length:
                raise Blocked("changes the sequence length")

    def _in_permuted_order(self, value: ir.Value, dim: int, like: Perm, user: ir.Operation) -> ir.Value:
        """`value` (in contiguous order) as a value in permuted order: unwrap an inverse, else add a forward."""
        owner = _owner(value)
        other = perm_of(owner) if owner is not None else None
        if other is not None and other.inverse and other.kind == like.kind and other.dim == dim:
            return other.source
        if value == like.result:
            return like.source
        point = ir.InsertionPoint.at_block_begin(value.owner) if owner is None else ir.InsertionPoint.after(owner)
        new = insert_permutation(self._build(value, dim, like, inverse=False), point, value, self.module.context,
                                 like.op.location)
        return new.results[0]

    def _insert_after(self, op: ir.Operation, like: Perm, dim: int) -> None:
        result = op.results[0]
        new = insert_permutation(self._build(result, dim, like, inverse=True), ir.InsertionPoint.after(op), result,
                                 self.module.context, like.op.location)
        result.replace_all_uses_except(new.results[0], new)

    def _build(self, value: ir.Value, dim: int, like: Perm, inverse: bool) -> str:
        mesh = self.meshes[like.kind.mesh_name]
        shape = _shape(value)
        sharding = _derive_sharding(like, _shape(like.source), shape, dim, mesh)
        element = str(ir.ShapedType(value.type).element_type)
        if self._channel is None:  # found only when a permutation is built: scanning the module costs a walk
            self._channel = self._next_channel(self.module)
        text = permutation_module(like.kind.mesh_name, mesh, sharding, tuple(shape), element, dim, like.kind.axis,
                                  like.kind.strategy, like.kind.stripe, inverse, self._channel)
        self._channel += 2
        return text

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


def _owner(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner


def _derive_sharding(like: Perm, like_shape: list[int], shape: list[int], dim: int, mesh: Mesh) -> TensorSharding:
    """The sharding of a new permutation: the ring axis on the sequence dim, and the axes `like` has on the dims
    that sit at the same distance from its sequence dim with the same size (batch dims, say) where they divide."""
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
        dims.append(DimSharding(axes))
    return TensorSharding(like.kind.mesh_name, tuple(dims))
