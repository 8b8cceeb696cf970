"""How ops move tensor dims: the structural facts every per-op rule needs (broadcast, transpose, reshape, reduce,
dot_general, slice). Read through the bindings' typed accessors where they exist."""

from __future__ import annotations

import functools
import math
from types import MappingProxyType
from typing import Mapping

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .optable import Motion, Transfer, names

# The op sets the rules read, from the op table.
ELEMENTWISE = names(lambda op: op.transfer is Transfer.ELEMENTWISE)
# Reducers whose result doesn't depend on the order of the reduced elements.
ORDER_FREE_REDUCERS = names(lambda op: op.order_free)


def shape(value: ir.Value) -> tuple[int, ...]:
    t = ir.ShapedType(value.type)
    return tuple(t.shape) if t.has_rank else ()


def rank(value: ir.Value) -> int:
    return ir.ShapedType(value.type).rank


def element_type(value: ir.Value) -> ir.Type:
    return ir.ShapedType(value.type).element_type


def is_integer(value: ir.Value) -> bool:
    return isinstance(element_type(value), ir.IntegerType)


_SIGNIFICAND = MappingProxyType({"f64": 53, "f32": 24, "f16": 11, "bf16": 8})


def holds(value: ir.Value, lo: float, hi: float) -> bool:
    """Whether the type of `value` holds every integer in [lo, hi], so that arithmetic in it on numbers of
    that range is exact (no wrap). An end the analysis can't bound (infinite) is taken to fit only a type of at
    least 32 bits, signed, or unsigned where the value is known not to be negative: index arithmetic there (device
    indices, positions, loop counters) is taken to stay below 2**31, as JAX's own int32 indexing does. i1 is a
    boolean, 0 or 1."""
    t = element_type(value)
    if not isinstance(t, ir.IntegerType):
        # a float type holds the integers up to 2**p exactly (p: its significand's bits; bf16 rounds 257)
        p = _SIGNIFICAND.get(str(t), 0)
        return not math.isinf(lo) and not math.isinf(hi) and -2 ** p <= lo and hi <= 2 ** p
    t = ir.IntegerType(t)
    width = t.width
    if width == 1:
        return 0 <= lo and hi <= 1
    if t.is_unsigned:
        low, high = 0, 2 ** width - 1
    else:  # signless integers are signed in StableHLO
        low, high = -2 ** (width - 1), 2 ** (width - 1) - 1
    if (not math.isinf(lo) and lo < low) or (not math.isinf(hi) and hi > high):
        return False
    if math.isinf(lo) or math.isinf(hi):
        return width >= 32 and not (t.is_unsigned and lo < 0)
    return True


def ints(attr: ir.Attribute) -> list[int]:
    """A dense integer array attribute (broadcast_dimensions, permutation, dimensions, slice bounds) as ints."""
    try:
        return [int(x) for x in ir.DenseI64ArrayAttr(attr)]
    except (TypeError, ValueError):
        pass
    try:
        return [int(x) for x in np.array(ir.DenseIntElementsAttr(attr)).reshape(-1)]
    except (TypeError, ValueError):
        return [int(ir.IntegerAttr(x).value) for x in ir.ArrayAttr(attr)]


def dot_dims(op: ir.Operation) -> Mapping[str, tuple[int, ...]]:
    """A dot_general's batching and contracting dims: lhs_batch, rhs_batch, lhs_contract, rhs_contract."""
    return _dot_dims(op.attributes["dot_dimension_numbers"])


# Attributes are uniqued per context and immutable: equal dimension numbers are one attribute, read once. The
# results are read-only (tuples in a read-only mapping).
@functools.lru_cache(maxsize=4096)
def _dot_dims(attr: ir.Attribute) -> Mapping[str, tuple[int, ...]]:
    numbers = stablehlo.DotDimensionNumbers(attr)
    return MappingProxyType({"lhs_batch": tuple(numbers.lhs_batching_dimensions),
                             "rhs_batch": tuple(numbers.rhs_batching_dimensions),
                             "lhs_contract": tuple(numbers.lhs_contracting_dimensions),
                             "rhs_contract": tuple(numbers.rhs_contracting_dimensions)})


def dot_result_dims(op: ir.Operation) -> tuple[Mapping[int, int], Mapping[int, int]]:
    """(lhs dim -> result dim, rhs dim -> result dim) for batch and free dims (contracted dims are absent)."""
    return _dot_result_dims(op.attributes["dot_dimension_numbers"], rank(op.operands[0]), rank(op.operands[1]))


@functools.lru_cache(maxsize=4096)
def _dot_result_dims(attr: ir.Attribute, lhs_rank: int, rhs_rank: int) -> tuple[Mapping[int, int], Mapping[int, int]]:
    dims = _dot_dims(attr)
    lhs_free = [d for d in range(lhs_rank) if d not in dims["lhs_batch"] + dims["lhs_contract"]]
    rhs_free = [d for d in range(rhs_rank) if d not in dims["rhs_batch"] + dims["rhs_contract"]]
    batch = len(dims["lhs_batch"])
    lhs = {d: i for i, d in enumerate(dims["lhs_batch"])}
    rhs = {d: i for i, d in enumerate(dims["rhs_batch"])}
    lhs.update({d: batch + i for i, d in enumerate(lhs_free)})
    rhs.update({d: batch + len(lhs_free) + i for i, d in enumerate(rhs_free)})
    return MappingProxyType(lhs), MappingProxyType(rhs)


def reducer(op: ir.Operation) -> str | None:
    """The single op a reduce (or all_reduce) body applies, or None for anything more complex."""
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    if len(body) != 2:
        return None
    inner = body[0]
    block_args = list(op.regions[0].blocks[0].arguments)
    if list(inner.operands) != block_args[:2] and list(inner.operands) != block_args[1::-1]:
        return None
    return inner.name


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Pair up groups of source and destination dims with equal products (size-1 dims on their own), in order;
    None when the reshape is not a sequence of splits and merges."""
    groups = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1 and (j >= len(dst) or dst[j] != 1):
            groups.append(([i], []))
            i += 1
            continue
        if j < len(dst) and dst[j] == 1 and (i >= len(src) or src[i] != 1):
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(src) or j >= len(dst):
            return None
        gi, gj = [i], [j]
        ps, pd = src[i], dst[j]
        i, j = i + 1, j + 1
        while ps != pd:
            if ps < pd:
                if i >= len(src):
                    return None
                ps *= src[i]
                gi.append(i)
                i += 1
            else:
                if j >= len(dst):
                    return None
                pd *= dst[j]
                gj.append(j)
                j += 1
        groups.append((gi, gj))
    return groups


def row_major_strides(sizes: list[int], base: int) -> list[int]:
    """Strides of dims of these sizes laid out row-major over a run whose innermost stride is `base`."""
    out, acc = [], base
    for size in reversed(sizes):
        out.append(acc)
        acc *= size
    return out[::-1]


def splat_number(op: ir.Operation):
    """The value of a splat constant (int, float or bool), or None for anything else."""
    return _splat_number(op.attributes["value"])


# Constants repeat (0, 1, -inf in every layer) and attributes are uniqued: each is read once (the bindings signal a
# mismatched cast with an exception, which costs more than the rest).
@functools.lru_cache(maxsize=4096)
def _splat_number(attr: ir.Attribute):
    try:
        dense = ir.DenseElementsAttr(attr)
    except (TypeError, ValueError):
        return None
    if not dense.is_splat:
        return None
    value = dense.get_splat_value()
    for cls in (ir.IntegerAttr, ir.FloatAttr, ir.BoolAttr):
        try:
            return cls(value).value
        except (TypeError, ValueError):
            continue
    return None


def total(sizes) -> int:
    return math.prod(sizes)


# Ops that only re-assert a value's layout (JAX puts a sharding constraint on the residuals a forward passes to its
# backward on Explicit axes): a value read through them reaches its reader unchanged.
RESTATING = names(lambda op: op.motion is Motion.WHERE_IT_LIVES)


def origin(value: ir.Value) -> ir.Value:
    """The value a chain of layout re-assertions passes on."""
    while True:
        owner = value.owner  # (each read of it makes a new handle: read once a step)
        if isinstance(owner, ir.Block) or owner.name not in RESTATING:
            return value
        value = owner.operands[0]


def readers(value: ir.Value) -> list:
    """The ops that read `value`, through layout re-assertions."""
    found, pending = [], [value]
    while pending:
        for use in pending.pop().uses:
            owner = use.owner
            if hasattr(owner, "name") and owner.name in RESTATING:
                pending.extend(owner.results)
            else:
                found.append(owner)
    return found


# Values between a ring region nested in an outer manual computation (a cp ring inside a dp shard_map) and a region
# of another such computation pass through the outer computations' bodies: followed here, as through a layout
# re-assertion, where the outer computation is not itself one of the `rings`.
MANUAL = "sdy.manual_computation"


def origin_across(value: ir.Value, rings: set) -> ir.Value:
    """`origin`, continued out of an enclosing manual computation's body (its argument is its operand) and into
    one whose result it is (its body's returned value), for computations not in `rings`."""
    return handed_on(value, rings)[0]


def handed_on(value: ir.Value, rings: set) -> tuple[ir.Value, list[tuple[str, ir.Operation, int]]]:
    """origin_across's source of `value`, and the manual computations it crossed on the way, in the order met
    walking back: ("operand", computation, i) where it entered one's body by operand i, ("result", computation, j)
    where it left one by result j."""
    crossed: list[tuple[str, ir.Operation, int]] = []
    while True:
        value = origin(value)
        owner = value.owner
        if isinstance(owner, ir.Block):
            parent = owner.owner
            parent = parent.operation if parent is not None and hasattr(parent, "operation") else parent
            if parent is not None and parent.name == MANUAL and parent not in rings:
                n = ir.BlockArgument(value).arg_number
                crossed.append(("operand", parent, n))
                value = parent.operands[n]
                continue
            return value, crossed
        owner = owner.operation if hasattr(owner, "operation") else owner
        if owner.name == MANUAL and owner not in rings:
            n = ir.OpResult(value).result_number
            crossed.append(("result", owner, n))
            terminator = list(owner.regions[0].blocks[0].operations)[-1].operation
            value = terminator.operands[n]
            continue
        return value, crossed


def readers_across(value: ir.Value, rings: set) -> list:
    """`readers`, continued through enclosing manual computations not in `rings` (an outer body's return passes
    the value to the computation's result, an outer computation's operand to its body's argument)."""
    found, pending = [], [value]
    while pending:
        for use in pending.pop().uses:
            owner = use.owner
            owner = owner.operation if hasattr(owner, "operation") else owner
            name = owner.name
            if name in RESTATING:
                pending.extend(owner.results)
                continue
            parent = owner.parent
            parent = parent.operation if parent is not None and hasattr(parent, "operation") else parent
            if name == "sdy.return" and parent is not None and parent.name == MANUAL and parent not in rings:
                pending.append(parent.results[use.operand_number])
                continue
            if name == MANUAL and owner not in rings:
                pending.append(owner.regions[0].blocks[0].arguments[use.operand_number])
                continue
            found.append(owner)
    return found
