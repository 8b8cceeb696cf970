"""The per-op rules of the ring machinery, by kind: each op's entry in optable.OPS names its kind (a Transfer for
the analysis, a Motion for hoist-permutations), and each kind's function is here:

- the Transfer's rule: the sequence-layout analysis's (analysis.py): from the abstract values of the operands, those
  of the results, or a refusal; an op without one is refused, naming it;
- the Motion's `moves`: for hoist-permutations, where a sequence dim of an operand lands in the result when the op
  treats every token alike along it (or that an order-free reduction removes it); Blocked otherwise;
- its `carries`: the inverse of `moves` (which operand dims a result dim comes from), written out for the kinds
  where asking `moves` about every operand dim costs more than it should (elementwise ops, broadcasts,
  dot_generals).

`RULES` is the table resolved: each op name of optable.OPS with its three functions. The module is longer than the
others on purpose: every kind's rules for both passes side by side.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from . import algebra, branches, contract, counters, finite, logsum, loops, reasons
from . import symbolic as sym
from .analysis import Engine, Refusal
from .dims import (ORDER_FREE_REDUCERS, dot_dims, dot_result_dims, element_type, holds, ints, is_integer, rank,
                   reducer, reshape_groups, row_major_strides, shape, splat_number)
from .optable import OPS, Motion, Transfer, info
from .symbolic import Aff, Coord, Dim, Pid
from .values import CONST, FREE, AggOp, Axis, Data, Index, Stack, Tok, canonical


@dataclass(frozen=True)
class OpRule:
    """One op's rules, resolved from its entry in optable.OPS."""

    transfer: Callable | None = None
    moves: Callable | None = None
    carries: Callable | None = None


_TRANSFERS: dict[Transfer, Callable] = {}
_MOVES: dict[Motion, Callable] = {}
_CARRIES: dict[Motion, Callable] = {}


def _registrar(table: dict, kinds: tuple):
    """A decorator putting its function in `table` for these kinds."""
    def register(fn):
        for kind in kinds:
            assert kind not in table, kind
            table[kind] = fn
        return fn
    return register


def rule(*kinds: Transfer):
    """Register the analysis rule of these kinds of op."""
    return _registrar(_TRANSFERS, kinds)


def moves_rule(*kinds: Motion):
    """Register the hoist rule of these kinds of op."""
    return _registrar(_MOVES, kinds)


def carries_rule(*kinds: Motion):
    """Register the inverse of these kinds' hoist rule."""
    return _registrar(_CARRIES, kinds)


def apply_rule(engine: Engine, op: ir.Operation) -> list:
    entry = RULES.get(op.name)
    if entry is None or entry.transfer is None:
        engine.refuse("is an op the analysis has no rule for, so nothing shows that it treats every token alike: "
                      "compute it outside the ring's shard_map (a dropout mask, say), or with ops it knows", op)
    results = entry.transfer(engine, op)
    for value, result in zip(op.results, results):
        if isinstance(result, Data) and result.agg is not None and result.agg.op in (AggOp.SUM, AggOp.SSUM) and \
                finite.narrow_range(element_type(value)):
            engine.refuse(f"accumulates a running sum in {element_type(value)}, whose range is narrower than "
                          "float32's: whether it overflows depends on the order the blocks come in, which differs "
                          "in each layout; accumulate in float32 (preferred_element_type) and convert after the ring",
                          op)
    if any(_may_be_nan(engine.get(v)) for v in op.operands) and not info(op.name).carries_nan and \
            (op.name != "stablehlo.select" or any(_may_be_nan(r) for r in results)):
        # a guard's result first: what it lets through is the reason (its merged operand is off at the start too)
        for value in [r for r in results if _may_be_nan(r)] + [engine.get(v) for v in op.operands]:
            why = logsum.carried_start_refusal(value.agg) if _may_be_nan(value) else None
            if why is not None:
                engine.refuse(why, op)
        engine.refuse("rescales by exp(x - m) where the running max m may still be -inf (scores masked with -inf "
                      "and a max started at -inf, or a finite mask value that the scores' type makes -inf): "
                      "exp(-inf - -inf) is nan, and which rows meet it depends on what each block holds; shift by "
                      "where(isfinite(m), m, 0), or mask with a finite value such as -1e30 in float32", op)
    return results


def _may_be_nan(value) -> bool:
    return isinstance(value, Data) and value.agg is not None and (value.agg.nan or value.agg.masked)


class Blocked(Exception):
    """The op can't be shown to treat every token alike along the sequence dim."""


class Reduced(enum.Enum):
    """What `moves` gives for a dim that an order-free reduction removes: it lands in no result dim."""

    REDUCED = enum.auto()


REDUCED = Reduced.REDUCED


def moves(op: ir.Operation, operand: int, dim: int):
    """Where dim `dim` of operand `operand` lands in the op's single result (REDUCED: reduced away in an
    order-free way); Blocked when the op isn't token-wise along it."""
    entry = RULES.get(op.name)
    if entry is None or entry.moves is None:
        raise Blocked("is not known to treat tokens alike")
    if len(op.results) != 1:
        raise Blocked("has several results")
    return entry.moves(op, operand, dim)


def carriers(op: ir.Operation, dim: int) -> dict[int, int]:
    """The operands that carry result dim `dim`, and at which of their dims (an operand constant along it is
    absent); Blocked when the op isn't token-wise along it."""
    entry = RULES.get(op.name)
    if entry is None or entry.moves is None:
        raise Blocked("is not known to treat tokens alike")
    if len(op.results) != 1:
        raise Blocked("has several results")
    if entry.carries is not None:
        found = entry.carries(op, dim)
    else:
        found = {}
        for i, value in enumerate(op.operands):
            try:
                value_rank = ir.ShapedType(value.type).rank
            except (TypeError, ValueError):
                continue
            for d in range(value_rank):
                try:
                    mapped = moves(op, i, d)
                except Blocked:
                    continue  # a dim that doesn't reach the result (contracted, broadcast from 1): not this one
                if mapped == dim:
                    found[i] = d
    # Only a broadcast creates a dim its operand doesn't have (then the value is constant along it). Anywhere else a
    # result dim no operand carries is a dim the op assembled (merged by a reshape, batched by a dot_general).
    if not found and op.name != "stablehlo.broadcast_in_dim":
        raise Blocked("does not carry the sequence dim through from one operand")
    return found


def _ins(engine: Engine, op) -> list:
    return [engine.get(v) for v in op.operands]


# ---------------------------------------------------------------------------------------------------------------
# Sources of index arithmetic and constants.


@rule(Transfer.CONSTANT)
def constant(engine: Engine, op):
    out = shape(op.results[0])
    number = splat_number(op)
    if number is not None and is_integer(op.results[0]):
        return [Index(out, Aff.of(int(number)))]
    if number is not None:
        fn = engine.fns.intern(("const", repr(float(number)) if not isinstance(number, bool) else repr(number)))
        return [Data(out, tuple(CONST for _ in out), (), fn)]
    # A table: it varies along its dims with local positions, not with tokens.
    fn = engine.fns.intern(("table", id(op)) + finite.table_facts(op))
    return [Data(out, tuple(FREE if n > 1 else CONST for n in out), (), fn)]


@rule(Transfer.IOTA)
def iota(engine: Engine, op):
    dim = int(ir.IntegerAttr(op.attributes["iota_dimension"]).value)
    out = shape(op.results[0])
    if not holds(op.results[0], 0, out[dim] - 1):
        # an iota that wraps or rounds in its type (int8 or bf16 along 512): not the index numbers, a function of
        # the local index all the same (its own, the type's: not to be mistaken for the index)
        fn = engine.fns.intern(("iota", dim, str(element_type(op.results[0]))))
        return [Data(out, tuple(FREE if i == dim and n > 1 else CONST for i, n in enumerate(out)), (), fn)]
    return [Index(out, Aff.of(Dim(dim)))]


@rule(Transfer.PARTITION_ID)
def partition_id(engine: Engine, op):
    return [Index((), Aff.of(Pid()))]


# ---------------------------------------------------------------------------------------------------------------
# Elementwise.

_DIRECTIONS = {"LT": "lt", "LE": "le", "GT": "gt", "GE": "ge", "EQ": "eq", "NE": "ne"}
@rule(Transfer.ELEMENTWISE)
def elementwise(engine: Engine, op):
    if op.name == "stablehlo.bitcast_convert" and shape(op.operands[0]) != shape(op.results[0]):
        engine.refuse("reinterprets the bits of each element as elements of another width, which adds or removes a "
                      "dim: bitcast to a type of the same width", op)
    ins = _ins(engine, op)
    result = op.results[0]
    wrap = None
    if (info(op.name).index and all(isinstance(x, Index) for x in ins) and
            (is_integer(result) or op.name == "stablehlo.compare")) or \
            (op.name == "stablehlo.select" and all(isinstance(x, Index) for x in ins)):
        exact = _index_elementwise(engine, op, ins)
        folded = _exact(engine, op, exact)
        if folded is not None:
            return [folded]
        wrap = _wraps(engine, op, exact)
    if op.name == "stablehlo.select" and isinstance(ins[0], Index) and ins[0].expr.is_const:
        # decided at compile time, the same on every device in every layout (`where(i == 0, fresh, merged)` at
        # the second ring step of an iteration that runs two): the operand it picks
        return [ins[1] if ins[0].expr.const else ins[2]]
    data = [engine.as_data(x, op, i) for i, x in enumerate(ins)]
    if op.name == "stablehlo.select" and isinstance(ins[0], Index):
        loop = loops.first_iteration_loop(engine, ins[0])
        if loop is not None:  # a merge state started afresh at a loop's first step
            reset = algebra.reset_select(engine, loop, data[1], data[2])
            if reset is not None:
                return [reset]
    if logsum.applies(engine, op, data):
        return [logsum.combine(engine, op, data)]
    combined = algebra.combine(engine, op, data)
    if wrap is not None:
        reasons.note_wrap(engine.fns, combined.fn, op, tuple(engine.state.call_ops), *wrap)
    return [combined]


def _wraps(engine: Engine, op, folded: Index | None) -> tuple[float, float] | None:
    """The values an integer op's exact result takes, where its type doesn't hold them all (it may wrap). None
    where the analysis can't bound them: that is a value it doesn't know (an integer a loop changes other than by
    a constant step), which a wider type wouldn't make known either, so no wrap to blame."""
    if folded is None or not is_integer(op.results[0]):
        return None
    lo, hi = sym.bounds(folded.expr, engine.scope_for(folded.shape))
    return None if math.isinf(lo) or math.isinf(hi) or holds(op.results[0], lo, hi) else (lo, hi)


def _exact(engine: Engine, op, folded: Index | None) -> Index | None:
    """The folded result, where exact integer arithmetic is what the op computes: its result's type holds every
    value the form takes, and a compare compares the numbers as they are (StableHLO compares unsigned integers
    as unsigned: an operand's number, kept as an Index only where its type holds it, is the number compared).
    Else None: the op is read as data on its operands (`uint32(i) - 2` wraps below zero; `x.astype(int8)` of
    positions up to 255 wraps from 128), never as the exact number."""
    if folded is None:
        return None
    result = op.results[0]
    if is_integer(result) and not holds(result, *sym.bounds(folded.expr, engine.scope_for(folded.shape))):
        return None
    if op.name == "stablehlo.compare":
        kind = stablehlo.ComparisonTypeAttr(op.attributes["compare_type"]).value \
            if "compare_type" in op.attributes else None
        scope = engine.scope_for(folded.shape)
        for v in op.operands:
            t = element_type(v)
            if not isinstance(t, ir.IntegerType):
                expected = ("FLOAT", "TOTALORDER")
            else:
                expected = ("UNSIGNED",) if ir.IntegerType(t).is_unsigned or ir.IntegerType(t).width == 1 \
                    else ("SIGNED",)
            if kind not in (None,) + expected or \
                    not holds(v, *sym.bounds(engine.get(v).expr, scope)):
                return None  # compared other than as the numbers are (a signed compare of unsigned numbers)
    return folded


def _index_elementwise(engine: Engine, op, ins: list[Index]) -> Index | None:
    out = shape(op.results[0])
    scope = engine.scope_for(out)
    e = [x.expr for x in ins]
    name = op.name
    src = (op, tuple(range(len(ins))), tuple(engine.state.call_ops))
    if name == "stablehlo.subtract" and _relative_to_block_start(e):
        engine.refuse("subtracts a block's start (coordinate * block length) from positions, to compare positions "
                      "relative to that block with its local indices (as `q_ids = arange(n) + device_idx * n - "
                      "kv_source * n` against `arange(n)`): after the reorder a block's tokens are not one run "
                      "from its start; compare global positions instead (`device_idx * n + arange(n)` against "
                      "`kv_source * n + arange(n)`)", op)
    if name in ("stablehlo.add", "stablehlo.subtract") and _two_blocks(e):
        # a sum or difference of positions of two blocks (q_pos - k_pos): each operand is a position, read as one
        # here, so that what is computed from them is computed from the rewritten positions
        e = [engine.resolve(x, op, i).expr for i, x in enumerate(ins)]
    elif name in ("stablehlo.add", "stablehlo.subtract"):
        offset = _offset_position(engine, e, out)
        if offset is not None:
            # a block's positions shifted by a constant (`q_ids - window <= kv_ids`): the positions are read here,
            # as a number, and rewritten where they are read (the place of a unit in the new layout); the constant
            # is the same in every layout, so the sum is the same function of each token's position in both
            e[offset] = engine.resolve(ins[offset], op, offset).expr
    if name == "stablehlo.add":
        return Index(out, e[0] + e[1])
    if name == "stablehlo.subtract":
        return Index(out, e[0] - e[1])
    if name == "stablehlo.negate":
        return Index(out, -e[0])
    if name == "stablehlo.convert":
        return Index(out, e[0])
    if name == "stablehlo.multiply":
        if e[1].is_const:
            return Index(out, e[0].scale(e[1].const))
        if e[0].is_const:
            return Index(out, e[1].scale(e[0].const))
        return None
    if name in ("stablehlo.divide", "stablehlo.remainder"):
        if not e[1].is_const or e[1].const <= 0:
            return None
        if name == "stablehlo.divide":
            return Index(out, sym.divide(e[0], e[1].const, scope, src))
        if _offset_position(engine, e, out) == 0:
            # positions modulo a constant (`k_pos % 5 != 0`): read as positions here, so that the remainder is that
            # of each token's own position in either layout (of the local index, c * n + j reduced, it would not be)
            e[0] = engine.resolve(ins[0], op, 0).expr
        return Index(out, sym.remainder(e[0], e[1].const, scope, _coordinate_namer(engine), src))
    if name == "stablehlo.sign":
        return Index(out, sym.sign(e[0], scope, src))
    if name == "stablehlo.compare":
        direction = stablehlo.ComparisonDirectionAttr(op.attributes["comparison_direction"]).value
        return Index(out, sym.compare(_DIRECTIONS[direction], e[0], e[1], scope, src))
    if name == "stablehlo.select":
        return Index(out, sym.select(e[0], e[1], e[2], scope, src))
    if name in ("stablehlo.and", "stablehlo.or", "stablehlo.xor"):
        if not all(_is_bool_type(v) for v in op.operands):
            return None
        return Index(out, sym.logical(name.split(".")[1], e[0], e[1], scope=scope))
    if name == "stablehlo.not":
        if not _is_bool_type(op.operands[0]):
            return None
        return Index(out, sym.logical("not", e[0], scope=scope))
    if name == "stablehlo.maximum":
        return Index(out, sym.maximum(e[0], e[1], scope, src))
    if name == "stablehlo.minimum":
        return Index(out, sym.minimum(e[0], e[1], scope, src))
    return None


def _two_blocks(exprs: list[Aff]) -> bool:
    """Whether the forms hold the ring coordinates of two different blocks between them, or the positions of one
    block's tokens along two different dims (q_pos[:, None] - k_pos[None, :] while the block held is this device's
    own: a difference of positions, not of local indices, whatever block it is)."""
    coords = {atom for e in exprs for atom in e.atoms() if isinstance(atom, Coord)}
    if len(coords) > 1:
        return True
    dims = [{a for a in e.atoms() if isinstance(a, Dim)} for e in exprs]
    return len(coords) == 1 and len(exprs) == 2 and all(any(isinstance(a, Coord) for a in e.atoms()) for e in exprs) \
        and all(dims) and dims[0].isdisjoint(dims[1])


def _relative_to_block_start(exprs: list[Aff]) -> bool:
    """positions - (another block's coordinate * a constant): the first operand has a coordinate and a local index,
    the second nothing but a coordinate (a block's first position)."""
    pos, start = exprs
    pos_atoms, start_atoms = pos.atoms(), start.atoms()
    coords = {a for a in pos_atoms + start_atoms if isinstance(a, Coord)}
    return len(coords) == 2 and any(isinstance(a, Dim) for a in pos_atoms) and \
        any(isinstance(a, Coord) for a in pos_atoms) and len(start_atoms) == 1 and isinstance(start_atoms[0], Coord)


def _offset_position(engine: Engine, exprs: list[Aff], out) -> int | None:
    """Which operand holds the positions of one block's tokens (coordinate * a + a local index in [0, a), a whole
    number of units of the block) when the other is a constant; None otherwise, and the general rules decide. A
    coordinate alone (a block's start, `c * n`) is not a token's position."""
    for i, (e, other) in enumerate(zip(exprs, exprs[::-1])):
        atoms = e.atoms()
        coords = [a for a in atoms if isinstance(a, Coord)]
        if not other.is_const or len(coords) != 1 or not any(isinstance(a, Dim) for a in atoms):
            continue
        a = e.coefficient(coords[0])
        if a <= 0 or engine.ring.block % a:
            continue
        lo, hi = sym.bounds(e.without(coords[0]), engine.scope_for(out))
        if 0 <= lo and hi <= a - 1:
            return i
    return None


def _is_bool_type(value: ir.Value) -> bool:
    t = element_type(value)
    return isinstance(t, ir.IntegerType) and t.width == 1


def _coordinate_namer(engine: Engine):
    ring = engine.ring

    def name(stride: int, size: int):
        if stride == ring.stride and size == ring.cp:
            return Aff.of(Coord(Aff()))
        for axis, s, n in ring.other_strides:
            if stride == s and size == n:
                return Aff.of(sym.Other(axis))
        return None

    return name


# ---------------------------------------------------------------------------------------------------------------
# Shape ops.


@rule(Transfer.BROADCAST)
def broadcast_in_dim(engine: Engine, op):
    (value,) = _ins(engine, op)
    out = shape(op.results[0])
    src = shape(op.operands[0])
    mapping = ints(op.attributes["broadcast_dimensions"])
    if isinstance(value, Index):
        subst = {Dim(i): (Aff.of(Dim(d)) if src[i] == out[d] else Aff()) for i, d in enumerate(mapping)}
        return [Index(out, _map_dims(value.expr, subst))]
    roles = [CONST] * len(out)
    for i, d in enumerate(mapping):
        if src[i] == out[d]:
            roles[d] = value.dims[i]
    return [canonical(value.with_(shape=out, dims=tuple(roles),
                                  elements=_elements_map(value, lambda e: broadcast_element(e, mapping, src, out))))]


def broadcast_element(element, mapping, src, out):
    roles = [CONST] * len(out)
    for i, d in enumerate(mapping):
        if src[i] == out[d]:
            roles[d] = element.dims[i]
    return element.with_(shape=out, dims=tuple(roles))


def _map_dims(expr: Aff, subst: dict) -> Aff:
    """Rename Dim atoms (everywhere, Node arguments included)."""
    present = {a for a in expr.free_atoms() if isinstance(a, Dim)}
    mapping = {d: subst.get(d, Aff()) for d in present}
    return expr.substitute(mapping)


def _elements_map(value, fn):
    if not isinstance(value, Data) or not value.elements:
        return value.elements if isinstance(value, Data) else ()
    return tuple((var, fn(element)) for var, element in value.elements)


@rule(Transfer.TRANSPOSE)
def transpose(engine: Engine, op):
    (value,) = _ins(engine, op)
    perm = ints(op.attributes["permutation"])
    out = shape(op.results[0])
    if isinstance(value, Index):
        return [Index(out, _map_dims(value.expr, {Dim(p): Aff.of(Dim(i)) for i, p in enumerate(perm)}))]
    return [canonical(value.with_(shape=out, dims=tuple(value.dims[p] for p in perm),
                                  elements=_elements_map(value, lambda e: e.with_(
                                      shape=out, dims=tuple(e.dims[p] for p in perm)))))]


@rule(Transfer.RESHAPE)
def reshape(engine: Engine, op):
    (value,) = _ins(engine, op)
    src, out = shape(op.operands[0]), shape(op.results[0])
    groups = reshape_groups(src, out)
    if groups is None:
        engine.refuse("reshapes in a way that is not a sequence of splits and merges", op)
    if isinstance(value, Index):
        subst = {}
        for gi, gj in groups:
            if len(gi) == 1 and len(gj) >= 1:  # a split (or a 1-to-1): source index = row-major combination
                strides = row_major_strides([out[j] for j in gj], 1)
                subst[Dim(gi[0])] = sum((Aff.of(Dim(j)).scale(s) for j, s in zip(gj, strides)), Aff())
            elif len(gi) > 1:
                if any(Dim(i) in value.expr.free_atoms() and src[i] > 1 for i in gi):
                    engine.refuse("merges dims of index arithmetic", op)
        return [Index(out, _map_dims(value.expr, subst))]
    return [canonical(_reshape_data(engine, op, value, groups, src, out))]


def _reshape_data(engine, op, value: Data, groups, src, out) -> Data:
    roles = [CONST] * len(out)
    for gi, gj in groups:
        if not gj:
            continue
        if len(gi) == 1:
            role = value.dims[gi[0]] if gi else CONST
            sizes = [out[j] for j in gj]
            if isinstance(role, Tok):
                for j, s in zip(gj, row_major_strides(sizes, role.stride)):
                    roles[j] = Tok(role.axis, s) if out[j] > 1 else CONST
            elif isinstance(role, Stack):
                if len([j for j in gj if out[j] > 1]) > 1:
                    engine.refuse("splits a stacked dim", op)
                for j in gj:
                    roles[j] = role if out[j] > 1 else CONST
            else:
                for j in gj:
                    roles[j] = role if out[j] > 1 else CONST
            continue
        if not gi:
            continue
        merged = [value.dims[i] for i in gi if src[i] > 1]
        if not merged:
            roles[gj[0]] = CONST
        elif all(r in (FREE, CONST) for r in merged):
            roles[gj[0]] = FREE
        elif all(isinstance(r, Tok) for r in merged) and len({r.axis for r in merged}) == 1:
            sizes = [src[i] for i in gi if src[i] > 1]
            expected = row_major_strides(sizes, merged[-1].stride)
            if [r.stride for r in merged] != expected:
                engine.refuse("merges token dims out of order", op)
            roles[gj[0]] = Tok(merged[0].axis, merged[-1].stride)
        elif len(merged) == 1:
            roles[gj[0]] = merged[0]
        else:
            engine.refuse("merges a token dim with another dim", op)
    return value.with_(shape=out, dims=tuple(roles))


@rule(Transfer.SLICE)
def slice_(engine: Engine, op):
    (value,) = _ins(engine, op)
    starts = ints(op.attributes["start_indices"])
    strides = ints(op.attributes["strides"])
    out = shape(op.results[0])
    if isinstance(value, Index):
        subst = {Dim(d): Aff.of(Dim(d)).scale(strides[d]) + starts[d] for d in range(len(out))}
        return [Index(out, _map_dims(value.expr, subst))]
    return [canonical(_slice_data(engine, op, value, [Aff.of(s) for s in starts], strides, out))]


def _slice_data(engine, op, value: Data, starts: list[Aff], strides, out) -> Data:
    roles, axes = list(value.dims), value.axis_map
    elements = dict(value.elements)
    for d, role in enumerate(value.dims):
        full = value.shape[d] == out[d] and starts[d] == Aff()
        if full:
            continue
        if isinstance(role, Tok):
            if strides[d] != 1:
                engine.refuse("slices tokens with a stride", op)
            axis = axes[role.axis]
            axes[role.axis] = Axis(axis.hop, axis.offset + starts[d].scale(role.stride))
            roles[d] = role if out[d] > 1 else CONST
        elif isinstance(role, Stack):
            if out[d] != 1:
                engine.refuse("slices a stacked buffer other than one element at a time", op)
            element = elements.pop(role.var)
            element = _substitute_data(element, {role.var: starts[d]})
            return canonical(_merge_element(value, d, element, out))
        else:
            roles[d] = role if out[d] > 1 else CONST
    return value.with_(shape=out, dims=tuple(roles), axes=tuple(axes.items()))


def _merge_element(stack: Data, d: int, element: Data, out) -> Data:
    """The element of a stacked buffer read at one index: the element's own abstract value, at the result shape."""
    return element.with_(shape=out, dims=tuple(CONST if i == d else r for i, r in enumerate(element.dims)))


def _substitute_data(value: Data, mapping: dict) -> Data:
    from .loops import substitute_value
    return substitute_value(value, mapping)


@rule(Transfer.DYNAMIC_SLICE)
def dynamic_slice(engine: Engine, op):
    ins = _ins(engine, op)
    value, starts = ins[0], ins[1:]
    if isinstance(value, loops.Written):  # read back after this iteration's write into it
        engine.refuse(loops.FILL_READ, op)
    sizes = ints(op.attributes["slice_sizes"])
    src = shape(op.operands[0])
    out = shape(op.results[0])
    if isinstance(value, Data) and value.is_invariant and any(
            isinstance(s, Index) and any(isinstance(a, Coord) for a in s.expr.atoms()) for s in starts):
        return [_table_rows(engine, op, value, starts, src, out)]
    start_exprs = []
    for d, start in enumerate(starts):
        if not isinstance(start, Index):
            engine.refuse("slices at an index read from data", op)
        expr = _address(engine, op, d + 1, start)
        lo, hi = sym.bounds(expr, engine.scope)
        # (a loop's discovery pass, where a counter carried beside the trip counter is still unknown, leaves the
        # check to the pass that knows it)
        if (lo < 0 or hi > src[d] - sizes[d]) and not expr.free_atoms() & engine.state.unknown_vars:
            engine.refuse("slices at an index that may be clamped (out of range)", op)
        start_exprs.append(expr)
    reads = engine.state.filling.get(id(value))
    if reads is not None:  # a buffer its loop fills: checked against the slice the iteration writes (loops.py)
        reads.append((op, tuple(start_exprs), tuple(sizes)))
    if isinstance(value, Index):
        subst = {Dim(d): Aff.of(Dim(d)) + start_exprs[d] for d in range(len(out))}
        return [Index(out, _map_dims(value.expr, subst))]
    if any(not s.is_const for d, s in enumerate(start_exprs) if value.dims[d] == FREE and out[d] != src[d]):
        # a slice of non-token data at a loop-dependent index: its function depends on the loop variable
        varying = frozenset(a for s in start_exprs for a in s.free_atoms() if isinstance(a, sym.Var))
        fn = engine.fns.intern(("dslice", value.fn, tuple(map(str, start_exprs))),
                               engine.fns.depends(value.fn) | varying)
        value = value.with_(fn=fn)
    return [canonical(_slice_data(engine, op, value, start_exprs, [1] * len(out), out))]


def _table_rows(engine: Engine, op, table: Data, starts: list, src, out) -> Data:
    """Rows of a table that doesn't depend on tokens (segment ids or a bias passed whole) sliced at a global
    position: row i is the table at position start + i, so the slice follows the tokens of that run, like a gather
    by those positions. The start is a position read (rewritten: the run's first token's new position), and the
    run must stay whole and in order under the permutation (a unit of its length, checked with the skip units)."""
    roles, axes = [], []
    fns = []
    for d, start in enumerate(starts):
        if not isinstance(start, Index):
            engine.refuse("slices at an index read from data", op)
        coords = [a for a in start.expr.atoms() if isinstance(a, Coord)]
        if not coords:
            expr = _address(engine, op, d + 1, start)
            lo, hi = sym.bounds(expr, engine.scope)
            if lo < 0 or hi > src[d] - out[d] or (not expr.is_const and out[d] != src[d]):
                engine.refuse("slices a table at an index that varies or may be clamped", op)
            roles.append(FREE if out[d] > 1 else CONST)
            continue
        rows = engine.resolve(Index(out, start.expr + Aff.of(Dim(d))), op, d + 1)
        lo, hi = sym.bounds(start.expr, engine.scope)
        if hi > src[d] - out[d]:
            engine.refuse("slices a table at a position that may run past its end (clamped)", op)
        data = engine.as_data(rows, op, d + 1)
        if engine.ring.block % out[d]:
            engine.refuse("slices a table by position in runs that don't divide the block", op)
        local = start.expr.without(coords[0])
        engine.state.units.setdefault((out[d], branches._alignment(local)), (op, tuple(engine.state.call_ops)))
        roles.append(data.dims[d])
        axes.extend(data.axes)
        fns.append(data.fn)
    fn = engine.fns.intern(("table-rows", table.fn, tuple(fns), str(op.attributes["slice_sizes"])),
                           frozenset().union(*(engine.fns.depends(f) for f in fns)))
    return canonical(Data(out, tuple(roles), tuple(axes), fn))


def _address(engine: Engine, op, operand: int, start: Index) -> Aff:
    """A start index: loop variables and constants only (addressing by coordinate or position is refused)."""
    expr = start.expr
    for atom in expr.free_atoms():
        if isinstance(atom, (Coord, Pid, sym.PidDiv)):
            engine.refuse("addresses data by the device index", op)
        if isinstance(atom, sym.Node) and atom.op in ("gpos", "opaque"):
            engine.refuse("addresses data by a computed position", op)
        if isinstance(atom, Dim):
            engine.refuse("addresses data by a vector index", op)
    return expr


@rule(Transfer.DYNAMIC_UPDATE_SLICE)
def dynamic_update_slice(engine: Engine, op):
    ins = _ins(engine, op)
    buffer, update, starts = ins[0], ins[1], ins[2:]
    exprs = [_address(engine, op, i + 2, s) if isinstance(s, Index) else engine.refuse("writes at a data index", op)
             for i, s in enumerate(starts)]
    return [loops.buffer_write(engine, op, buffer, update, exprs, _writes_back_its_read(engine, op, buffer, exprs))]


def _writes_back_its_read(engine: Engine, op, buffer, exprs) -> bool:
    """`dynamic_update_slice(x, dynamic_slice(x, s), s)` into a buffer its loop fills: the slice this iteration read
    out (the one it writes, loops.py checks), written back unchanged, as a merge that leaves part of its state as it
    was does when the kernel updates the state in place. The write keeps the buffer as it was."""
    reads = engine.state.filling.get(id(buffer))
    source = loops.through_identity(op.operands[1])
    if not reads or isinstance(source.owner, ir.Block):
        return False
    read = source.owner
    if read.name != "stablehlo.dynamic_slice" or \
            loops.through_identity(read.operands[0]) != loops.through_identity(op.operands[0]):
        return False
    sizes = tuple(shape(op.operands[1]))
    return any(r.operation == read.operation and tuple(starts) == tuple(exprs) and tuple(n) == sizes
               for r, starts, n in reads)


@rule(Transfer.CONCATENATE)
def concatenate(engine: Engine, op):
    ins = _ins(engine, op)
    dim = int(ir.IntegerAttr(op.attributes["dimension"]).value)
    out = shape(op.results[0])
    if all(isinstance(x, Index) for x in ins):
        ins = [engine.as_data(x, op, i) for i, x in enumerate(ins)]
    data = [engine.as_data(x, op, i) for i, x in enumerate(ins)]
    return [contract.concatenate(engine, op, data, dim, out)]


# ---------------------------------------------------------------------------------------------------------------
# Reductions and contractions.


@rule(Transfer.REDUCE)
def reduce_(engine: Engine, op):
    ins = _ins(engine, op)
    if len(op.results) != 1:
        engine.refuse("is a variadic reduction (arg-max style)", op)
    combiner = reducer(op)
    if combiner not in ORDER_FREE_REDUCERS:
        engine.refuse("reduces with a body that is not an order-free operation", op)
    dims = ints(op.attributes["dimensions"])
    value = engine.as_data(ins[0], op, 0)
    init = engine.as_data(ins[1], op, 1)
    return [contract.reduce(engine, op, value, init, combiner, dims, shape(op.results[0]))]


@rule(Transfer.DOT)
def dot_general(engine: Engine, op):
    lhs, rhs = (engine.as_data(x, op, i) for i, x in enumerate(_ins(engine, op)))
    return [contract.dot(engine, op, lhs, rhs, dot_dims(op), shape(op.results[0]))]


# ---------------------------------------------------------------------------------------------------------------
# Ops that keep values as they are.


@rule(Transfer.IDENTITY)
def identity(engine: Engine, op):
    ins = _ins(engine, op)
    if op.name == "stablehlo.reduce_precision":
        value = engine.as_data(ins[0], op, 0)
        bits = int(ir.IntegerAttr(op.attributes["exponent_bits"]).value)
        mantissa = int(ir.IntegerAttr(op.attributes["mantissa_bits"]).value)
        info = finite.finfo(element_type(op.operands[0]))
        if info is not None and bits >= int(info.nexp):
            return [value]  # a rounding within the same range: the identity in exact arithmetic
        # a narrower range (float16's in float32): numbers become infinities, like a narrowing convert
        if value.agg is not None:
            engine.refuse("rounds a partial aggregate (a running sum or max) to a narrower range before every block "
                          "is merged in: whether it overflows depends on the order the blocks come in", op)
        narrowed = ("ew", "stablehlo.convert", f"narrowing to e{bits}m{mantissa}", (value.fn,))
        return [value.with_(fn=engine.fns.intern(narrowed, engine.fns.depends(value.fn)))]
    return ins


@rule(Transfer.CUSTOM_CALL)
def custom_call(engine: Engine, op):
    target = ir.StringAttr(op.attributes["call_target_name"]).value
    ins = _ins(engine, op)
    if target in ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape") and len(ins) == 1:
        return ins
    if all(isinstance(x, Data) and x.is_invariant for x in ins):
        # a function of its operands (their functions in the key, and what they depend on: a ring step's value
        # through a custom call is still the ring step's)
        fn = engine.fns.intern(("custom", id(op), tuple(x.fn for x in ins)),
                               frozenset().union(*(engine.fns.depends(x.fn) for x in ins)))
        return [engine.as_data(Index(shape(r), sym.opaque()), op, 0) if is_integer(r)
                else Data(shape(r), tuple(FREE for _ in shape(r)), (), engine.fns.intern(("result", fn, j),
                                                                                        engine.fns.depends(fn)))
                for j, r in enumerate(op.results)]
    engine.refuse(f"is an opaque custom call ('{target}') on token data", op)


# ---------------------------------------------------------------------------------------------------------------
# Collectives, control flow and calls live with their analysis.

rule(Transfer.COLLECTIVE_PERMUTE)(contract.collective_permute)
rule(Transfer.ALL_REDUCE)(contract.all_reduce)
rule(Transfer.OTHER_COLLECTIVE)(contract.other_collective)


@rule(Transfer.WHILE)
def while_loop(engine: Engine, op):
    try:
        return loops.while_loop(engine, op)
    except Refusal as refusal:
        better = counters.explain(engine, op, refusal)  # a counter whose type gives no trip count: say so
        if better is refusal:
            raise
        raise better from refusal


rule(Transfer.BRANCHES)(branches.branches)


@rule(Transfer.NESTED_MANUAL)
def nested_manual(engine: Engine, op):
    """A manual computation inside the region, over other mesh axes (JAX puts the `axis_index` of a
    partial-manual region in one): followed in place when it slices nothing (every operand and result whole on
    each device) and returns what every device of its axes agrees on."""
    from jaxlib.mlir.dialects import sdy

    from ..ir import manual_axes_of, sharding_from_attr
    for name in ("in_shardings", "out_shardings"):
        for attr in sdy.TensorShardingPerValueAttr(op.attributes[name]).shardings:
            if any(d.axes for d in sharding_from_attr(attr).dims):
                engine.refuse("splits values over mesh axes inside the ring region", op)
    results = engine.run_block(op.regions[0].blocks[0], _ins(engine, op))
    inner = manual_axes_of(op)
    for value in results:
        atoms = value.expr.free_atoms() if isinstance(value, Index) else set()
        if any(isinstance(a, Pid) or isinstance(a, sym.PidDiv) or (isinstance(a, sym.Other) and a.axis in inner)
               for a in atoms):
            engine.refuse("returns a value that differs between the devices of its manual axes", op)
    return results


@rule(Transfer.GATHER)
def gather(engine: Engine, op):
    """Rows of a table that doesn't depend on tokens (a RoPE cos/sin table, a bias table), picked by indices: each
    result row is a function of its index alone, so it follows the indices' tokens as an elementwise op would
    (positions among them are rewritten where read)."""
    table, indices = (engine.as_data(x, op, i) for i, x in enumerate(_ins(engine, op)))
    numbers = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    if not table.is_invariant:
        engine.refuse("gathers from token data by index, which depends on where tokens sit", op)
    if list(numbers.operand_batching_dims) or indices.agg is not None or \
            any(isinstance(r, Stack) for r in indices.dims):
        engine.refuse("gathers by indices the analysis can't follow (batched, partial aggregates or stacked)", op)
    out = shape(op.results[0])
    vector_dim = numbers.index_vector_dim
    if vector_dim < len(indices.dims) and isinstance(indices.dims[vector_dim], Tok):
        engine.refuse("gathers by an index vector made of different tokens", op)
    batch = [r for d, r in enumerate(indices.dims) if d != vector_dim]
    offset = set(numbers.offset_dims)
    roles, rest = [], iter(batch)
    for d, n in enumerate(out):
        roles.append((FREE if n > 1 else CONST) if d in offset else next(rest))
    fn = engine.fns.intern(("gather", table.fn, indices.fn, str(op.attributes["dimension_numbers"]),
                            tuple(ints(op.attributes["slice_sizes"]))),
                           engine.fns.depends(table.fn) | engine.fns.depends(indices.fn))
    return [canonical(Data(out, tuple(roles), indices.axes, fn))]


@rule(Transfer.CALL)
def call(engine: Engine, op):
    callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
    return engine.call(op, callee, _ins(engine, op))


# Ops that only make sense on values that don't follow tokens: accepted there, refused on token data (what
# each does along the data: its entry's verb).


def _positional(engine: Engine, op):
    ins = [engine.as_data(x, op, i) if not isinstance(x, Index) or sym.is_opaque(x.expr) is False else x
           for i, x in enumerate(_ins(engine, op))]
    if any(isinstance(x, Data) and not x.is_invariant for x in ins) or \
            any(isinstance(x, Index) for x in ins):
        engine.refuse(f"{info(op.name).verb} along the data, which depends on where tokens sit", op)
    fn = engine.fns.intern(("positional", op.name, tuple(x.fn for x in ins), id(op)),
                           frozenset().union(*(engine.fns.depends(x.fn) for x in ins)))
    return [Data(shape(r), tuple(FREE if n > 1 else CONST for n in shape(r)), (), fn) for r in op.results]


rule(Transfer.POSITIONAL)(_positional)

# ---------------------------------------------------------------------------------------------------------------
# Where a sequence dim goes (hoist-permutations).


@moves_rule(Motion.SAME_SHAPE, Motion.ELEMENTWISE, Motion.WHERE_IT_LIVES)
def _moves_elementwise(op, operand: int, dim: int):
    if rank(op.operands[operand]) != rank(op.results[0]):
        raise Blocked("broadcasts a scalar along the sequence")
    return dim


@moves_rule(Motion.BROADCAST)
def _moves_broadcast(op, operand: int, dim: int):
    target = ints(op.attributes["broadcast_dimensions"])[dim]
    if shape(op.results[0])[target] != shape(op.operands[0])[dim]:
        raise Blocked("broadcasts along the sequence dim")
    return target


@carries_rule(Motion.SAME_SHAPE, Motion.ELEMENTWISE, Motion.WHERE_IT_LIVES)
def _carries_elementwise(op, dim: int) -> dict[int, int]:
    whole = rank(op.results[0])
    return {i: dim for i, value in enumerate(op.operands) if rank(value) == whole}


@carries_rule(Motion.BROADCAST)
def _carries_broadcast(op, dim: int) -> dict[int, int]:
    targets = ints(op.attributes["broadcast_dimensions"])
    if dim not in targets:
        return {}
    d = targets.index(dim)
    same = ir.ShapedType(op.operands[0].type).get_dim_size(d) == ir.ShapedType(op.results[0].type).get_dim_size(dim)
    return {0: d} if same else {}


@moves_rule(Motion.TRANSPOSE)
def _moves_transpose(op, operand: int, dim: int):
    return ints(op.attributes["permutation"]).index(dim)


@moves_rule(Motion.RESHAPE)
def _moves_reshape(op, operand: int, dim: int):
    groups = reshape_groups(shape(op.operands[0]), shape(op.results[0]))
    for gi, gj in groups or ():
        if dim in gi:
            sized = [i for i in gi if shape(op.operands[0])[i] > 1]
            out = [j for j in gj if shape(op.results[0])[j] > 1]
            if sized == [dim] and len(out) == 1:
                return out[0]
    raise Blocked("splits or merges the sequence dim")


@moves_rule(Motion.REDUCE)
def _moves_reduce(op, operand: int, dim: int):
    if len(op.operands) != 2 or operand != 0:
        raise Blocked("is a variadic reduction")
    reduced = ints(op.attributes["dimensions"])
    if dim in reduced:
        if reducer(op) not in ORDER_FREE_REDUCERS:
            raise Blocked("reduces along the sequence with an order-sensitive body")
        return REDUCED
    return dim - sum(1 for r in reduced if r < dim)


@moves_rule(Motion.DOT)
def _moves_dot(op, operand: int, dim: int):
    """A batch dim stays token-wise (when the other side is in the same order, see `carriers`); a contracted one
    is summed away, which the order doesn't change when the other side's paired dim is in the same order too
    (`reduced_with`): the weight gradient of a layer sums over the tokens of its activations and cotangents."""
    if dim in dot_dims(op)["lhs_contract" if operand == 0 else "rhs_contract"]:
        return REDUCED
    lhs, rhs = dot_result_dims(op)
    return (lhs if operand == 0 else rhs)[dim]


@carries_rule(Motion.DOT)
def _carries_dot(op, dim: int) -> dict[int, int]:
    found = {}
    for operand, mapping in enumerate(dot_result_dims(op)):
        for d, r in mapping.items():
            if r == dim:
                found[operand] = d
    return found


@moves_rule(Motion.WHOLE_DIM)
def _moves_whole_dim(op, operand: int, dim: int):
    """A slice or pad that leaves the sequence dim whole treats its tokens alike (RoPE's halves of the feature
    dim, and their transpose, a pad of the feature dim)."""
    keys = (("start_indices", "limit_indices", "strides") if op.name == "stablehlo.slice" else
            ("edge_padding_low", "edge_padding_high", "interior_padding"))
    low, high, step = (ints(op.attributes[k])[dim] for k in keys)
    whole = (low, high, step) == ((0, shape(op.operands[0])[dim], 1) if op.name == "stablehlo.slice" else (0, 0, 0))
    if operand != 0 or not whole:
        raise Blocked("slices or pads the sequence dim")
    return dim


@moves_rule(Motion.CONCATENATE)
def _moves_concatenate(op, operand: int, dim: int):
    if dim == ir.IntegerAttr(op.attributes["dimension"]).value:
        raise Blocked("concatenates along the sequence dim")
    return dim


def _sorted_indices(op) -> bool:
    return "indices_are_sorted" in op.attributes and ir.BoolAttr(op.attributes["indices_are_sorted"]).value


def _batch_dims(value: ir.Value, vector_dim: int) -> list[int]:
    """The dims of a gather's or scatter's indices that index (all but the index vector dim)."""
    return [d for d in range(rank(value)) if d != vector_dim]


@moves_rule(Motion.GATHER)
def _moves_gather(op, operand: int, dim: int):
    """Rows of a table picked by indices: each result row is a function of its index alone, so the result follows
    the indices' tokens (an embedding lookup)."""
    numbers = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    batch = _batch_dims(op.operands[1], numbers.index_vector_dim)
    if operand != 1 or dim not in batch or list(numbers.operand_batching_dims):
        raise Blocked("gathers along the sequence dim")
    if _sorted_indices(op):
        raise Blocked("gathers by indices promised sorted, which a permutation unsorts")
    offset = set(numbers.offset_dims)
    return [d for d in range(rank(op.results[0])) if d not in offset][batch.index(dim)]


def _scatter_pairs(op) -> tuple[list[int], list[int]]:
    """A scatter whose indices and updates run over tokens alike (the embedding's gradient, a scatter-add of
    per-token rows by token id): the indices' batch dims and the updates' scatter dims, paired in order; Blocked
    unless permuting those pairs leaves the result as it is (one input, an order-free combine, no batching dims,
    indices not promised sorted)."""
    numbers = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    if len(op.operands) != 3 or list(numbers.input_batching_dims) or reducer(op) not in ORDER_FREE_REDUCERS \
            or _sorted_indices(op):
        raise Blocked("scatters in an order-sensitive way")
    window = set(numbers.update_window_dims)
    return (_batch_dims(op.operands[1], numbers.index_vector_dim),
            [d for d in range(rank(op.operands[2])) if d not in window])


@moves_rule(Motion.SCATTER)
def _moves_scatter(op, operand: int, dim: int):
    indices, updates = _scatter_pairs(op)
    if (operand, dim) not in [(1, d) for d in indices] + [(2, d) for d in updates]:
        raise Blocked("scatters along the sequence dim")
    return REDUCED


def reduced_with(op: ir.Operation, operand: int, dim: int) -> dict[int, int]:
    """Where `moves` says REDUCED: the other operands' dims reduced together with dim `dim` of operand `operand`,
    which must then be in the same order."""
    if op.name == "stablehlo.scatter":
        indices, updates = _scatter_pairs(op)
        return {2: updates[indices.index(dim)]} if operand == 1 else {1: indices[updates.index(dim)]}
    if op.name != "stablehlo.dot_general":
        return {}
    numbers = dot_dims(op)
    mine, other = ("lhs", "rhs") if operand == 0 else ("rhs", "lhs")
    return {1 - operand: numbers[f"{other}_contract"][numbers[f"{mine}_contract"].index(dim)]}


RULES: dict[str, OpRule] = {name: OpRule(_TRANSFERS.get(entry.transfer), _MOVES.get(entry.motion),
                                          _CARRIES.get(entry.motion))
                             for name, entry in OPS.items()}


__all__ = ["Blocked", "OpRule", "REDUCED", "RULES", "apply_rule", "carriers", "moves", "reduced_with", "rule", "Stack",
           "Axis"]
