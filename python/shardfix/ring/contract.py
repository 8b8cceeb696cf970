"""Rules for ops on Data that move tokens between dims or devices: concatenation, reductions and contractions over
token axes (they make aggregates, whose order-free merges algebra.py holds), and collectives."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from jaxlib.mlir import ir

from . import coverage as cov_ops
from . import stabiliser
from .algebra import (SUM_LIKE, agg_fn, combine, depends, ew_fn, extent, home_axis, relabel, same_axis, try_complete,
                      unify, with_agg)
from .analysis import Engine
from .dims import shape
from .symbolic import Aff, Var
from .values import CONST, EMPTY, FREE, Agg, AggOp, Axis, Cells, Coverage, Data, Index, Stack, Tok, canonical


# ---------------------------------------------------------------------------------------------------------------
# Concatenation.


def concatenate(engine: Engine, op, values: list[Data], dim: int, out) -> Data:
    values = [try_complete(engine, v) for v in values]
    if any(v.agg is not None for v in values):
        aggs = {(v.agg.op, v.agg.term, v.agg.score, cov_ops.normal(engine.canonical_cov(v.agg.cov)),
                 cov_ops.normal(engine.canonical_cov(v.agg.shift_cov))) if v.agg is not None else None
                for v in values}
        if len(aggs) != 1:
            engine.refuse("concatenates aggregates that folded in different blocks", op)
    roles = [v.dims[dim] for v in values]
    others = []
    for v in values:
        dims = tuple(CONST if i == dim else r for i, r in enumerate(v.dims))
        keys = {r.axis for r in dims if isinstance(r, Tok)} | {k for k, _ in v.axes if not v.tok_dims(k)}
        others.append(v.with_(dims=dims, shape=tuple(1 if i == dim else n for i, n in enumerate(v.shape)),
                              axes=tuple((k, a) for k, a in v.axes if k in keys)))
    merged_roles, axes = unify(engine, op, others, others[0].shape)
    merged_roles = list(merged_roles)
    # copies of one value that is the same all along the dim (a state's start, cut into chunks and put back): the
    # same value, longer
    copies = all(r == CONST for r in roles) and all(v.agg is None and v.fn == values[0].fn for v in values)
    if copies:
        merged_roles[dim] = CONST
    elif all(r in (CONST, FREE) for r in roles):
        merged_roles[dim] = FREE if out[dim] > 1 else CONST
    elif all(isinstance(r, Tok) for r in roles):
        # consecutive runs of one block, in order, make a longer run of it
        first = values[0].axis_map[roles[0].axis]
        expected = first.offset
        for v, r in zip(values, roles):
            axis = v.axis_map[r.axis]
            if r.stride != 1 or not same_axis(engine, Axis(first.hop, expected), axis, op):
                engine.refuse("concatenates tokens that are not consecutive tokens of one block", op)
            expected = expected + v.shape[dim]
        key = f"c{len(axes)}"
        axes[key] = first
        merged_roles[dim] = Tok(key, 1)
        # other dims of the same axis (none expected for a run) are left as unified
    else:
        engine.refuse("concatenates token data with other data along the token dim", op)
    fn = values[0].fn if copies else ew_fn(engine, op.name, str(dim), values)
    agg = values[0].agg
    result = canonical(Data(tuple(out), tuple(merged_roles), tuple(axes.items()), fn))
    if agg is not None:
        # one maximum (or shift) for every piece, or none the result can name (stabiliser.py): the pieces' states
        # may have been folded each its own way
        if len({stabiliser.resolve(engine.fns, v.agg.ident) for v in values}) != 1:
            agg = replace(agg, ident=None)
        home = agg.home
        result = with_agg(engine, result, replace(agg, home=_rehome(result, values[0], home)))
    return result


def _rehome(result: Data, source: Data, home: str | None) -> str | None:
    if home is None:
        return None
    axis = source.axis_map[home]
    for k, a in result.axes:
        if a.hop == axis.hop:
            return k
    return None


# ---------------------------------------------------------------------------------------------------------------
# Reductions and contractions over token axes make aggregates.


def _cell(engine: Engine, op, value: Data, key: str, home: Axis | None) -> Coverage:
    axis = value.axis_map[key]
    size = extent(value, key)
    if size is None:
        engine.refuse("reduces over tokens that don't form a contiguous run", op)
    hop = axis.hop - home.hop if home is not None else axis.hop
    return cov_ops.cell(hop, axis.offset, size)


def _constant_init(engine: Engine, init: Data) -> bool:
    """A reduction's start value must not depend on tokens; any constant is folded in the same way in every
    order (the identity, or a floor like INT_MIN or -1e30)."""
    if init.agg is not None or init.axes:
        return False
    key = engine.fns.keys[init.fn]
    return engine.fns.constant(init.fn) is not None or (isinstance(key, tuple) and key[0] == "index" and
                                                         not key[1][0])


def reduce(engine: Engine, op, value: Data, init: Data, combiner: str, dims: list[int], out) -> Data:
    value = try_complete(engine, value)
    reduced_axes = {value.dims[d].axis for d in dims if isinstance(value.dims[d], Tok)}
    kept = [d for d in range(len(value.dims)) if d not in dims]
    if any(isinstance(value.dims[d], Stack) for d in dims):
        engine.refuse("reduces over a stacked buffer", op)
    for key in reduced_axes:
        if any(isinstance(value.dims[d], Tok) and value.dims[d].axis == key for d in kept):
            engine.refuse("reduces over part of a token axis", op)
    roles = tuple(value.dims[d] for d in kept)
    remaining = {r.axis for r in roles if isinstance(r, Tok)}
    axes = tuple((k, a) for k, a in value.axes if k in remaining or (k not in reduced_axes and not value.tok_dims(k)))
    base = Data(tuple(out), roles, axes, value.fn, value.agg)
    if not reduced_axes:
        if value.agg is not None:
            if value.agg.op in SUM_LIKE and combiner == "stablehlo.add":
                return relabel(engine, op, canonical(base), [])
            engine.refuse("reduces a partial aggregate over other dims", op)
        fn = engine.fns.intern(("reduce", combiner, value.fn, tuple(dims)), engine.fns.depends(value.fn))
        return canonical(base.with_(fn=fn))
    if len(reduced_axes) > 1:
        engine.refuse("reduces over two token axes at once", op)
    if not _constant_init(engine, init):
        engine.refuse("reduces with a start value that depends on the data", op)
    (key,) = reduced_axes
    home_key = next(iter(remaining)) if len(remaining) == 1 else None
    if len(remaining) > 1:
        engine.refuse("reduces a value with three token axes", op)
    home = value.axis_map[home_key] if home_key else None
    cell = _cell(engine, op, value, key, home)
    if value.agg is not None:
        if value.agg.op == AggOp.EXP and combiner == "stablehlo.add":
            one = engine.fns.intern(("const", repr(1.0)))
            agg = Agg(AggOp.SSUM, value.agg.home, one, cell, value.agg.score, value.agg.cov, ident=value.agg.ident,
                      start=value.agg.start, by_lse=value.agg.by_lse)
            return with_agg(engine, base, agg)
        engine.refuse("reduces a partial aggregate over tokens again", op)
    op_name = {"stablehlo.add": AggOp.SUM, "stablehlo.maximum": AggOp.MAX, "stablehlo.minimum": AggOp.MIN,
               "stablehlo.multiply": AggOp.MUL, "stablehlo.and": AggOp.AND, "stablehlo.or": AggOp.OR}[combiner]
    term = value.fn
    agg = Agg(op_name, home_key, term if op_name not in (AggOp.MAX, AggOp.MIN) else 0, cell,
              term if op_name in (AggOp.MAX, AggOp.MIN) else 0)
    if op_name in (AggOp.MAX, AggOp.MIN):  # a block's maximum, the op's own (stabiliser.py)
        agg = replace(agg, ident=stabiliser.max_ident(op, agg_fn(engine, agg)))
    return with_agg(engine, base, agg)


def dot(engine: Engine, op, lhs: Data, rhs: Data, dims: dict, out) -> Data:
    lhs, rhs = try_complete(engine, lhs), try_complete(engine, rhs)
    lb, rb, lc, rc = dims["lhs_batch"], dims["rhs_batch"], dims["lhs_contract"], dims["rhs_contract"]
    contracted: list[tuple[str, Data]] = []
    for l, r in zip(lc, rc):
        a, b = lhs.dims[l], rhs.dims[r]
        if isinstance(a, Tok) and isinstance(b, Tok):
            if a.stride != b.stride or not same_axis(engine, lhs.axis_map[a.axis], rhs.axis_map[b.axis], op):
                engine.refuse("contracts tokens of one block against tokens of another", op)
            contracted.append((a.axis, lhs))
        elif isinstance(a, Tok) or isinstance(b, Tok):
            if FREE in (a, b):
                engine.refuse("contracts token data against data that follows local positions", op)
            contracted.append((a.axis, lhs) if isinstance(a, Tok) else (b.axis, rhs))
        elif isinstance(a, Stack) or isinstance(b, Stack):
            engine.refuse("contracts over a stacked buffer", op)
    lhs_free = [d for d in range(len(lhs.dims)) if d not in lb + lc]
    rhs_free = [d for d in range(len(rhs.dims)) if d not in rb + rc]
    # the result's dims: batch (unified), then lhs free, then rhs free
    batch_l = _restrict(lhs, lb)
    batch_r = _restrict(rhs, rb)
    batch_roles, axes = unify(engine, op, [batch_l, batch_r], batch_l.shape) if lb else ((), {})
    roles = list(batch_roles)
    for side, free in ((lhs, lhs_free), (rhs, rhs_free)):
        for d in free:
            role = side.dims[d]
            if isinstance(role, Tok):
                key = f"{'l' if side is lhs else 'r'}{role.axis}"
                axes.setdefault(key, side.axis_map[role.axis])
                role = Tok(key, role.stride)
            roles.append(role)
    if any(isinstance(r, Stack) for r in roles):
        engine.refuse("contracts stacked buffers", op)
    # axes without dims (the token at one place of a block: a single row sliced out, its dim of size 1) stay the
    # result's, whatever is contracted: its every element depends on that token
    for side, tag in ((lhs, "pl"), (rhs, "pr")):
        for key, axis in side.axes:
            if not side.tok_dims(key):
                axes.setdefault(f"{tag}{key}", axis)
    base = canonical(Data(tuple(out), tuple(roles), tuple(axes.items()), 0))
    fn = engine.fns.intern(("dot", lhs.fn, rhs.fn, str(dims)), depends(engine, [lhs, rhs]))
    aggs = [v for v in (lhs, rhs) if v.agg is not None]
    if not contracted:
        if not aggs:
            return base.with_(fn=fn)
        (s,) = aggs if len(aggs) == 1 else engine.refuse("contracts two partial aggregates", op)
        if s.agg.op not in SUM_LIKE:
            engine.refuse("contracts a running maximum", op)
        home = _find_axis(base, home_axis(s))
        term = engine.fns.intern(("dotterm", fn, s.agg.term), depends(engine, [lhs, rhs]))
        return with_agg(engine, base, replace(s.agg, home=home, term=term, finite=False, nan=False))
    if len({k for k, _ in contracted}) > 1:
        engine.refuse("contracts over two token axes at once", op)
    key, source = contracted[0]
    remaining = [k for k, _ in base.axes if base.tok_dims(k)]
    if len(remaining) > 1:
        engine.refuse("contracts a value with three token axes", op)
    home_key = remaining[0] if remaining else None
    home = base.axis_map[home_key] if home_key else None
    cell = _cell(engine, op, source, key, home)
    if aggs:
        (e,) = aggs if len(aggs) == 1 else engine.refuse("contracts two partial aggregates", op)
        if e.agg.op != AggOp.EXP:
            engine.refuse("contracts a partial aggregate over tokens again", op)
        weight = rhs if e is lhs else lhs
        term = engine.fns.intern(("weight", weight.fn, str(dims)), engine.fns.depends(weight.fn))
        return with_agg(engine, base, Agg(AggOp.SSUM, home_key, term, cell, e.agg.score, e.agg.cov,
                                          ident=e.agg.ident, start=e.agg.start, by_lse=e.agg.by_lse))
    return with_agg(engine, base, Agg(AggOp.SUM, home_key, fn, cell))


def _restrict(value: Data, dims: list[int]) -> Data:
    """The value seen along some of its dims only (with the axes those dims carry)."""
    roles = tuple(value.dims[d] for d in dims)
    keys = {r.axis for r in roles if isinstance(r, Tok)}
    return Data(tuple(value.shape[d] for d in dims), roles, tuple((k, a) for k, a in value.axes if k in keys), value.fn)


def _find_axis(value: Data, axis: Axis | None) -> str | None:
    if axis is None:
        return None
    for k, a in value.axes:
        if a == axis:
            return k
    return None


# ---------------------------------------------------------------------------------------------------------------
# Collectives.


def _pairs(op) -> np.ndarray:
    return np.array(ir.DenseIntElementsAttr(op.attributes["source_target_pairs"])).reshape(-1, 2)


def _groups(engine: Engine, op) -> np.ndarray | None:
    from .detect import replica_groups
    return replica_groups(op.attributes["replica_groups"], engine.state.shared.meshes)


def collective_permute(engine: Engine, op):
    from .detect import ring_direction
    (value,) = [engine.get(v) for v in op.operands]
    direction = ring_direction(_pairs(op), engine.ring)
    if direction is None:
        if isinstance(value, Data) and value.is_invariant:
            fn = engine.fns.intern(("permute", value.fn, id(op)), engine.fns.depends(value.fn))
            return [value.with_(fn=fn)]
        engine.refuse(f"moves token data other than one step around the \"{engine.ring.axis}\" ring", op)
    engine.state.directions.add(direction)
    if isinstance(value, Index):
        return [Index(value.shape, shift_coords(value.expr, direction))]
    return [shift_value(value, direction)]


def shift_coords(expr: Aff, direction: int) -> Aff:
    from .symbolic import Coord, Pid, PidDiv
    mapping = {}
    for atom in expr.free_atoms():
        if isinstance(atom, Coord):
            mapping[atom] = Aff.of(Coord(atom.hop + direction))
        if isinstance(atom, (Pid, PidDiv)):
            mapping[atom] = Aff.of(Var(f"moved-{atom}"))  # the sender's device index: unknown here
    return expr.substitute(mapping)


def shift_value(value: Data, direction: int) -> Data:
    """The value one ring step later: every block it holds is one step further behind (or ahead)."""
    axes = tuple((k, Axis(a.hop + direction, a.offset)) for k, a in value.axes)
    elements = tuple((var, shift_value(e, direction)) for var, e in value.elements)
    agg = value.agg
    if agg is not None and agg.home is None:
        # an aggregate over blocks named by their ring step from this device (no home tokens to be relative to)
        agg = replace(agg, home=None, cov=_shift_cov(agg.cov, direction))
    return value.with_(axes=axes, elements=elements, agg=agg)


def _shift_cov(cov: Coverage, direction: int) -> Coverage:
    return Coverage(tuple(Cells(p.hop + direction, p.start, p.size, p.vars) if isinstance(p, Cells) else p
                          for p in cov.parts))


def all_reduce(engine: Engine, op):
    from .detect import ring_group_kind
    ins = [engine.get(v) for v in op.operands]
    kind = ring_group_kind(_groups(engine, op), engine.ring)
    from .dims import reducer
    combiner = reducer(op)
    results = []
    for i, value in enumerate(ins):
        value = try_complete(engine, engine.as_data(value, op, i))
        if kind == "other":  # across replicas holding the same token layout
            if value.agg is not None:
                engine.refuse("all-reduces a partial aggregate across other axes", op)
            results.append(value.with_(fn=engine.fns.intern(("allreduce", combiner, value.fn, id(op)),
                                                            engine.fns.depends(value.fn))))
            continue
        if kind is None:
            engine.refuse("all-reduces over a group that is neither the ring nor other mesh axes", op)
        if value.axes and value.agg is None:
            engine.refuse("adds up token data of different devices elementwise (each device holds other tokens)",
                          op)
        if value.agg is None:
            results.append(value.with_(fn=engine.fns.intern(("allreduce", combiner, value.fn),
                                                            engine.fns.depends(value.fn))))
            continue
        agg = value.agg
        expected = {"stablehlo.add": AggOp.SUM, "stablehlo.maximum": AggOp.MAX,
                    "stablehlo.minimum": AggOp.MIN}.get(combiner)
        if agg.home is not None or agg.op != expected:
            engine.refuse("all-reduces a partial aggregate that is not a reduction over the device's own tokens",
                          op)
        k = cov_ops.fresh_var("dev")
        everyone = Coverage(tuple(Cells(p.hop + Aff.of(k), p.start, p.size,
                                        p.vars + ((k, Aff(), Aff.of(engine.ring.cp - 1)),)) for p in agg.cov.parts
                                  if isinstance(p, Cells)))
        if len(everyone.parts) != len(agg.cov.parts):
            engine.refuse("all-reduces an aggregate whose extent is still unknown", op)
        merged = Agg(agg.op, None, agg.term, everyone, agg.score)
        if agg.op in (AggOp.MAX, AggOp.MIN):  # the devices' maximum, another than each one's
            merged = replace(merged, ident=stabiliser.max_ident(op, agg_fn(engine, merged),
                                                                stabiliser.resolve(engine.fns, agg.ident)))
        done = try_complete(engine, with_agg(engine, value, merged))
        if done.agg is not None:
            engine.refuse("all-reduces an aggregate that does not cover every token of its own block", op)
        results.append(done)
    return results


def other_collective(engine: Engine, op):
    from .detect import ring_group_kind
    ins = [engine.as_data(v, op, i) for i, v in enumerate(engine.get(x) for x in op.operands)]
    kind = ring_group_kind(_groups(engine, op), engine.ring) if "replica_groups" in op.attributes else None
    if kind != "other" or any(not v.is_invariant for v in ins):
        engine.refuse("moves data in device order", op)
    return [Data(shape(r), tuple(FREE if n > 1 else CONST for n in shape(r)), (),
                 engine.fns.intern(("collective", op.name, tuple(v.fn for v in ins), id(op)), depends(engine, ins)))
            for r in op.results]


__all__ = ["EMPTY", "combine", "concatenate", "dot", "reduce", "try_complete", "unify", "with_agg"]
