"""Rules for ops on Data: elementwise combination (tokens must line up), concatenation, reductions and
contractions over token axes (they make aggregates), the order-free merges of aggregates (sums, maxes, the online
softmax's rescaled sums), and collectives."""

from __future__ import annotations

import math

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from . import coverage as cov_ops
from .analysis import Engine
from .dims import shape
from .symbolic import Aff, Var
from .values import CONST, EMPTY, FREE, Agg, Axis, Cells, Coverage, CoverageVar, Data, Index, Stack, Tok, canonical

_SUM_LIKE = ("sum", "ssum")


# ---------------------------------------------------------------------------------------------------------------
# Axes and dims.


def same_hop(engine: Engine, a: Aff, b: Aff, op, what: str) -> bool:
    """Whether two hops name the same block (in a loop's discovery pass, unknown ring steps make it undecided)."""
    diff = a - b
    if diff.is_const:
        return diff.const % engine.ring.cp == 0
    if any(isinstance(x, Var) and x in engine.state.unknown_vars for x in diff.free_atoms()):
        engine.defer("hop", a, b, op, what)  # a discovery pass: the real pass decides
        return True
    return False


def same_axis(engine: Engine, a: Axis, b: Axis, op) -> bool:
    if a == b:
        return True
    if not same_hop(engine, a.hop, b.hop, op, "combines blocks of different ring steps"):
        return False
    diff = a.offset - b.offset
    if diff.is_const:
        return diff.const == 0
    if any(isinstance(x, Var) and x in engine.state.unknown_vars for x in diff.free_atoms()):
        engine.defer("equal", a.offset, b.offset, op, "combines different tokens of one block")
        return True
    return False


def unify(engine: Engine, op, values: list[Data], out_shape) -> tuple[tuple, dict]:
    """The dims of an elementwise result: along each dim, every operand follows the same tokens, or is constant."""
    roles, axes = [], {}
    renames: list[dict] = [dict() for _ in values]
    for d in range(len(out_shape)):
        # a scalar operand (a select's predicate, a clamp's bound) is broadcast: constant along every dim
        present = [(i, v.dims[d]) for i, v in enumerate(values) if v.dims and v.dims[d] != CONST]
        if not present:
            roles.append(CONST)
            continue
        toks = [(i, r) for i, r in present if isinstance(r, Tok)]
        stacks = [(i, r) for i, r in present if isinstance(r, Stack)]
        frees = [(i, r) for i, r in present if r == FREE]
        if toks and (frees or stacks):
            engine.refuse(f"combines token data with data that varies with local position along dim {d}", op)
        if stacks:
            if frees or len({r for _, r in stacks}) != 1:
                engine.refuse("combines stacked buffers of different loops", op)
            roles.append(stacks[0][1])
            continue
        if frees:
            roles.append(FREE)
            continue
        first_i, first = toks[0]
        axis = values[first_i].axis_map[first.axis]
        key = renames[first_i].setdefault(first.axis, f"u{len(axes)}")
        axes.setdefault(key, axis)
        for i, r in toks[1:]:
            other = values[i].axis_map[r.axis]
            if r.stride != first.stride or not same_axis(engine, axis, other, op):
                engine.refuse("combines data of different tokens (blocks or positions) elementwise", op)
            renames[i].setdefault(r.axis, key)
        roles.append(Tok(key, first.stride))
    # axes without dims (the value depends on one token, or one unit, of a block) are carried along
    for i, v in enumerate(values):
        for k, a in v.axes:
            if k not in renames[i] and not v.tok_dims(k) and a not in axes.values():
                renames[i][k] = f"u{len(axes)}"
                axes[renames[i][k]] = a
    return tuple(roles), axes


def extent(value: Data, key: str) -> int | None:
    """Tokens an axis spans when its dims tile a contiguous run (strides 1, n1, n1*n2, ...)."""
    dims = sorted((r.stride, value.shape[d]) for d, r in enumerate(value.dims) if isinstance(r, Tok) and r.axis == key)
    if not dims:
        return 1
    span = 1
    for stride, size in dims:
        if stride != span:
            return None
        span *= size
    return span


def _depends(engine: Engine, values) -> frozenset:
    out = frozenset()
    for v in values:
        out |= engine.fns.depends(v.fn)
        if v.agg is not None:
            out |= engine.fns.depends(v.agg.term) | engine.fns.depends(v.agg.score)
    return out


def ew_fn(engine: Engine, name: str, attrs: str, values) -> int:
    return engine.fns.intern(("ew", name, attrs, tuple(v.fn for v in values)), _depends(engine, values))


def _attrs(op) -> str:
    if op.name == "stablehlo.compare":
        return stablehlo.ComparisonDirectionAttr(op.attributes["comparison_direction"]).value
    if op.name == "stablehlo.convert":
        return str(ir.ShapedType(op.results[0].type).element_type)
    return ""


def agg_fn(engine: Engine, agg: Agg) -> int:
    return engine.fns.intern(("agg", agg.op, agg.term, agg.score, str(agg.cov), str(agg.shift_cov)),
                             engine.fns.depends(agg.term) | engine.fns.depends(agg.score))


def with_agg(engine: Engine, value: Data, agg: Agg) -> Data:
    return canonical(value.with_(agg=agg, fn=agg_fn(engine, agg)))


# ---------------------------------------------------------------------------------------------------------------
# Completion: an aggregate that has folded in every token of every block is a plain function of its home tokens.


def try_complete(engine: Engine, value: Data) -> Data:
    agg = value.agg
    if agg is None or agg.op not in ("sum", "max", "min", "ssum", "mul", "and", "or", "shift"):
        return value
    scope, block = engine.scope, engine.ring.block
    if not cov_ops.is_complete(agg.cov, scope, block):
        return value
    if agg.op in ("ssum", "shift") and not cov_ops.is_complete(agg.shift_cov, scope, block):
        return value
    fn = engine.fns.intern(("complete", agg.op, agg.term, agg.score),
                           engine.fns.depends(agg.term) | engine.fns.depends(agg.score))
    axes = value.axes
    if agg.home is None:
        axes = ()
    return canonical(value.with_(agg=None, fn=fn, axes=axes))


# ---------------------------------------------------------------------------------------------------------------
# Elementwise.


def combine(engine: Engine, op, values: list[Data]) -> Data:
    out = shape(op.results[0])
    if op.name == "stablehlo.multiply" and any(v.agg is None and engine.fns.constant(v.fn) == 0.0 for v in values):
        return _const_data(engine, 0.0, out)  # anything times zero, a running aggregate too (finite numbers)
    completed = [try_complete(engine, v) for v in values]
    if any(v.agg is not None for v in completed):
        # merges see the aggregates as they are (a running max that just became complete is still the max the
        # softmax sums are rescaled to)
        return _aggregate_rule(engine, op, values, out)
    values = completed
    if op.name == "stablehlo.convert" and values[0].agg is None and engine.fns.constant(values[0].fn) is not None \
            and not isinstance(ir.ShapedType(op.results[0].type).element_type, ir.IntegerType):
        return values[0].with_(shape=tuple(out))  # a constant converted between float types is the same constant
    if any(v.agg is not None for v in values):
        return _aggregate_rule(engine, op, values, out)
    if op.name == "stablehlo.select":
        cond, a, b = values
        # select(is_finite(x), x, -inf) is x with NaN and +inf scores masked: the same scores for the softmax
        if cond.fn == _finite_fn(engine, a.fn) and _is_const(engine, b, -math.inf):
            return a
    folded = _fold_constants(engine, op, values, out)
    if folded is not None:
        return folded
    roles, axes = unify(engine, op, values, out)
    elements = _combine_elements(engine, op, values, roles)
    fn = ew_fn(engine, op.name, _attrs(op), values)
    return canonical(Data(tuple(out), roles, tuple(axes.items()), fn, None, elements))


def _combine_elements(engine: Engine, op, values: list[Data], roles) -> tuple:
    """Stacked buffers combined elementwise: their elements combine by the same rule."""
    stacks = [r for r in roles if isinstance(r, Stack)]
    if not stacks:
        return ()
    out = []
    for role in stacks:
        parts = []
        for v in values:
            element = dict(v.elements).get(role.var)
            parts.append(element if element is not None else v)
        element_roles, axes = unify(engine, op, parts, parts[0].shape)
        fn = ew_fn(engine, op.name, _attrs(op), parts)
        out.append((role.var, canonical(Data(parts[0].shape, element_roles, tuple(axes.items()), fn))))
    return tuple(out)


_FOLD = {"stablehlo.add": lambda a, b: a + b, "stablehlo.subtract": lambda a, b: a - b,
         "stablehlo.multiply": lambda a, b: a * b, "stablehlo.divide": lambda a, b: a / b if b else None,
         "stablehlo.maximum": max, "stablehlo.minimum": min, "stablehlo.negate": lambda a: -a}


def _fold_constants(engine: Engine, op, values: list[Data], out) -> Data | None:
    """Arithmetic on constants is a constant; anything times zero is zero (the analysis reasons about finite
    numbers, as it does about reassociation)."""
    numbers = [engine.fns.constant(v.fn) if v.agg is None else None for v in values]
    if op.name == "stablehlo.multiply" and 0.0 in numbers:
        return _const_data(engine, 0.0, out)
    if op.name in _FOLD and None not in numbers:
        try:
            result = _FOLD[op.name](*numbers)
        except (OverflowError, ZeroDivisionError, ValueError):
            return None
        if result is not None and not math.isnan(result):
            return _const_data(engine, float(result), out)
    return None


def _const_data(engine: Engine, number: float, out) -> Data:
    return Data(tuple(out), tuple(CONST for _ in out), (), engine.fns.intern(("const", repr(float(number)))))


def _is_const(engine: Engine, value: Data, number: float) -> bool:
    return value.agg is None and value.fn == engine.fns.intern(("const", repr(float(number))))


def _home_axis(value: Data) -> Axis | None:
    if value.agg is None or value.agg.home is None:
        return None
    return value.axis_map.get(value.agg.home)


_UNIT_OPS = {"stablehlo.compare", "stablehlo.and", "stablehlo.or", "stablehlo.not", "stablehlo.xor",
             "stablehlo.convert", "stablehlo.select"}


def _aggregate_rule(engine: Engine, op, values: list[Data], out) -> Data:
    name = op.name
    aggs = [v for v in values if v.agg is not None]
    plain = [v for v in values if v.agg is None]
    if name in _UNIT_OPS and all(v.agg is None or (v.agg.home is None and v.agg.op in ("max", "min", "sum",
                                                                                        "unitfn"))
                                 for v in values) and all(not v.axes for v in plain):
        # a predicate of whole units (the largest position in a query chunk, the smallest in a key chunk): a
        # function of those units' tokens, fine where it decides to skip exactly that pair of units
        covered = Coverage(tuple(p for v in aggs for p in v.agg.cov.parts))
        base = Data(tuple(out), tuple(CONST for _ in out), (), 0)
        return with_agg(engine, base, Agg("unitfn", None, ew_fn(engine, name, _attrs(op), values), covered))
    if name in ("stablehlo.convert", "stablehlo.negate") and aggs[0].agg.op in _SUM_LIKE:
        return _relabel(engine, op, aggs[0], plain)
    if name == "stablehlo.add":
        return _add(engine, op, values)
    if name == "stablehlo.maximum":
        return _maximum(engine, op, values)
    if name == "stablehlo.subtract":
        return _subtract(engine, op, values)
    if name == "stablehlo.exponential" and aggs[0].agg.op in ("diff", "mdiff"):
        a = aggs[0].agg
        new = Agg("exp" if a.op == "diff" else "shift", a.home, a.term, a.cov, a.score, a.shift_cov)
        return with_agg(engine, aggs[0], new)
    if name == "stablehlo.is_finite":
        a = aggs[0].agg
        return with_agg(engine, aggs[0], Agg("finite", a.home, aggs[0].fn, a.cov, a.score, a.shift_cov))
    if name == "stablehlo.select":
        return _select(engine, op, values)
    if name in ("stablehlo.multiply", "stablehlo.divide"):
        return _scale(engine, op, values)
    engine.refuse("combines a partial aggregate (a running sum or max) with other data in a way that is not an "
                  "order-free merge", op)


def _relabel(engine: Engine, op, value: Data, others: list[Data]) -> Data:
    """A linear op on a sum: the same sum of a transformed term."""
    term = engine.fns.intern(("ew", op.name, _attrs(op), (value.agg.term,) + tuple(v.fn for v in others)),
                             _depends(engine, [value] + others))
    agg = Agg(value.agg.op, value.agg.home, term, value.agg.cov, value.agg.score, value.agg.shift_cov)
    return with_agg(engine, value, agg)


def _union(engine: Engine, op, a: Coverage, b: Coverage) -> Coverage:
    verdict = cov_ops.disjoint(a, b, engine.scope)
    if verdict is False:
        engine.refuse(f"merges aggregates that may count the same tokens twice ({a} and {b})", op)
    if verdict is None:
        engine.defer("disjoint", a, b, op, "merges aggregates that may count the same tokens twice")
    return a.union(b)


def cells_equal(engine: Engine, op, x, y, message: str) -> bool:
    """Two parts of coverages are the same tokens (ring steps still unknown in a discovery pass are deferred)."""
    if x == y:
        return True
    if isinstance(x, CoverageVar) or isinstance(y, CoverageVar):
        return engine.cov_root(x) == engine.cov_root(y) if isinstance(x, CoverageVar) and \
            isinstance(y, CoverageVar) else False
    if x.size != y.size or x.vars != y.vars:
        return False
    if not same_hop(engine, x.hop, y.hop, op, message):
        return False
    diff = x.start - y.start
    if diff.is_const:
        return diff.const == 0
    if any(isinstance(v, Var) and v in engine.state.unknown_vars for v in diff.free_atoms()):
        engine.defer("equal", x.start, y.start, op, message)
        return True
    return False


def cov_prefix(engine: Engine, op, before: Coverage, after: Coverage, message: str) -> Coverage | None:
    """What `after` adds to `before`, when `after` is `before` followed by more parts (None otherwise)."""
    before, after = engine.canonical_cov(before), engine.canonical_cov(after)
    if len(after.parts) < len(before.parts) or not all(
            cells_equal(engine, op, x, y, message) for x, y in zip(before.parts, after.parts)):
        return None
    return Coverage(after.parts[len(before.parts):])


def covs_equal(engine: Engine, op, a: Coverage, b: Coverage, message: str) -> bool:
    a, b = engine.canonical_cov(a), engine.canonical_cov(b)
    if cov_ops.normal(a) == cov_ops.normal(b):
        return True
    return len(a.parts) == len(b.parts) and all(cells_equal(engine, op, x, y, message)
                                                for x, y in zip(a.parts, b.parts))


def _same_cov(engine: Engine, op, a: Coverage, b: Coverage, message: str) -> None:
    a, b = engine.canonical_cov(a), engine.canonical_cov(b)
    if a == b or (not any(isinstance(p, CoverageVar) for p in a.parts + b.parts) and covs_equal(engine, op, a, b,
                                                                                                message)):
        return
    if any(isinstance(p, CoverageVar) for p in a.parts + b.parts):
        # two unknown coverages taken to be the same (the softmax sums' shift and the running max's coverage):
        # merge them now, check it once the loop's recurrences are solved
        if len(a.parts) == len(b.parts) and all(
                x == y or (isinstance(x, CoverageVar) and isinstance(y, CoverageVar)) for x, y in zip(a.parts, b.parts)):
            for x, y in zip(a.parts, b.parts):
                if x != y:
                    engine.state.cov_alias[x] = y
        engine.defer("same-cov", a, b, op, message)
        return
    engine.refuse(message, op)


def _aligned(engine: Engine, op, a: Data, b: Data) -> None:
    """Two aggregates merge elementwise only over the same home tokens."""
    ha, hb = _home_axis(a), _home_axis(b)
    if (ha is None) != (hb is None) or (ha is not None and not same_axis(engine, ha, hb, op)):
        engine.refuse("merges aggregates of different home tokens", op)
    unify(engine, op, [a, b], a.shape)


def _add(engine: Engine, op, values: list[Data]) -> Data:
    a, b = values
    if b.agg is None and _is_const(engine, b, 0.0):
        return a
    if a.agg is None and _is_const(engine, a, 0.0):
        return b
    if a.agg is None or b.agg is None:
        engine.refuse("adds data to a partial aggregate", op)
    x, y = a.agg, b.agg
    if x.op != y.op or x.op not in _SUM_LIKE or x.term != y.term or x.score != y.score:
        engine.refuse("adds two different aggregates", op)
    _aligned(engine, op, a, b)
    if x.op == "ssum":
        _same_cov(engine, op, x.shift_cov, y.shift_cov, "adds softmax sums rescaled to different maxima")
    merged = Agg(x.op, x.home, x.term, _union(engine, op, x.cov, y.cov), x.score, x.shift_cov)
    return with_agg(engine, a, merged)


def _maximum(engine: Engine, op, values: list[Data]) -> Data:
    a, b = values
    for p, q in ((a, b), (b, a)):
        if q.agg is None and p.agg is not None and p.agg.op == "max" and engine.fns.constant(q.fn) is not None:
            return p  # a constant floor (the running max's start value) is part of the fold, in every order
    if a.agg is None or b.agg is None or a.agg.op != "max" or b.agg.op != "max" or a.agg.score != b.agg.score:
        engine.refuse("takes the maximum of different aggregates", op)
    _aligned(engine, op, a, b)
    merged = Agg("max", a.agg.home, a.agg.term, _union(engine, op, a.agg.cov, b.agg.cov), a.agg.score)
    return with_agg(engine, a, merged)


def _subtract(engine: Engine, op, values: list[Data]) -> Data:
    x, m = values
    if x.agg is None and engine.fns.constant(x.fn) is not None and m.agg is not None and m.agg.op == "max":
        # the running max before anything was folded in, minus the new one: a rescaling from nothing
        return with_agg(engine, m, Agg("mdiff", m.agg.home, 0, EMPTY, m.agg.score, m.agg.cov))
    if x.agg is None and m.agg is not None and m.agg.op == "max" and m.agg.score == x.fn:
        # scores minus their running max: exp of it weights a softmax sum
        home = _match_home(engine, op, x, m)
        return with_agg(engine, x, Agg("diff", home, 0, m.agg.cov, x.fn))
    if x.agg is not None and m.agg is not None and x.agg.op == m.agg.op == "max" and x.agg.score == m.agg.score:
        _aligned(engine, op, x, m)
        return with_agg(engine, x, Agg("mdiff", x.agg.home, 0, x.agg.cov, x.agg.score, m.agg.cov))
    engine.refuse("subtracts a partial aggregate in a way that is not a softmax rescaling", op)


def _match_home(engine: Engine, op, pair: Data, agg_value: Data) -> str:
    """The axis of `pair` that is the aggregate's home (the aggregate is constant along the others)."""
    home = _home_axis(agg_value)
    if home is None:
        engine.refuse("rescales scores by an aggregate without home tokens", op)
    found = None
    for d, role in enumerate(pair.dims):
        if isinstance(role, Tok):
            other = agg_value.dims[d]
            if isinstance(other, Tok):
                if not same_axis(engine, pair.axis_map[role.axis], home, op):
                    engine.refuse("rescales scores by the maxima of other tokens", op)
                found = role.axis
            elif other != CONST:
                engine.refuse("rescales scores by data that varies along their tokens", op)
    if found is None:
        engine.refuse("rescales scores by maxima of tokens the scores don't have", op)
    return found


def _select(engine: Engine, op, values: list[Data]) -> Data:
    cond, a, b = values
    guard = cond.agg.term if cond.agg is not None and cond.agg.op == "finite" else None
    plain_guard = cond.fn if cond.agg is None else None
    # select(is_finite(x), exp(x - max), 0) is exp(x - max): masked scores contribute nothing either way
    if a.agg is not None and a.agg.op == "exp" and b.agg is None and _is_const(engine, b, 0.0):
        if plain_guard == _finite_fn(engine, a.agg.score):
            return a
    # select(is_finite(max_new), exp(max_old - max_new), 1) is the rescaling (1 where nothing is unmasked yet)
    if a.agg is not None and a.agg.op == "shift" and b.agg is None and _is_const(engine, b, 1.0) and guard is not None:
        target = agg_fn(engine, Agg("max", a.agg.home, a.agg.term, a.agg.shift_cov, a.agg.score))
        if guard == target:
            return a
    engine.refuse("selects between partial aggregates", op)


def _finite_fn(engine: Engine, fn: int) -> int:
    return engine.fns.intern(("ew", "stablehlo.is_finite", "", (fn,)), engine.fns.depends(fn))


def _scale(engine: Engine, op, values: list[Data]) -> Data:
    a, b = values
    if op.name == "stablehlo.multiply":
        for zero, other in ((a, b), (b, a)):
            if zero.agg is None and _is_const(engine, zero, 0.0) and other.agg is not None \
                    and other.agg.op in ("shift", "exp"):
                return zero.with_(shape=other.shape)  # an empty sum rescaled is still empty
    if a.agg is not None and b.agg is not None:
        x, y = a.agg, b.agg
        if op.name == "stablehlo.multiply":
            for s, t in ((a, b), (b, a)):
                if s.agg.op == "ssum" and t.agg.op == "shift" and s.agg.score == t.agg.score:
                    _same_cov(engine, op, s.agg.shift_cov, t.agg.cov, "rescales a softmax sum from another maximum")
                    _aligned_broadcast(engine, op, s, t)
                    return with_agg(engine, s, Agg("ssum", s.agg.home, s.agg.term, s.agg.cov, s.agg.score,
                                                   t.agg.shift_cov))
            if x.op == y.op == "shift" and x.score == y.score:
                _same_cov(engine, op, x.shift_cov, y.cov, "chains rescalings of different maxima")
                return with_agg(engine, a, Agg("shift", x.home, 0, x.cov, x.score, y.shift_cov))
        what = {"stablehlo.multiply": "multiplies", "stablehlo.divide": "divides"}.get(op.name, "combines")
        engine.refuse(f"{what} two partial aggregates", op)
    s, t = (a, b) if a.agg is not None else (b, a)
    if op.name == "stablehlo.divide" and s is b:
        engine.refuse("divides by a partial aggregate", op)
    if s.agg.op not in _SUM_LIKE and s.agg.op != "exp":
        engine.refuse("scales a running maximum", op)
    home = _home_axis(s)
    for d, role in enumerate(t.dims):  # the factor may vary with the home tokens only
        if isinstance(role, Tok) and (home is None or not isinstance(s.dims[d], Tok) or
                                      not same_axis(engine, t.axis_map[role.axis], home, op)):
            engine.refuse("scales an aggregate by data of other tokens", op)
    unify(engine, op, [s, t], s.shape)
    return _relabel(engine, op, s, [t])


def _aligned_broadcast(engine: Engine, op, s: Data, t: Data) -> None:
    hs, ht = _home_axis(s), _home_axis(t)
    if hs is None or ht is None or not same_axis(engine, hs, ht, op):
        engine.refuse("rescales a softmax sum of other tokens", op)


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
    if all(r in (CONST, FREE) for r in roles):
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
    fn = ew_fn(engine, op.name, str(dim), values)
    agg = values[0].agg
    result = canonical(Data(tuple(out), tuple(merged_roles), tuple(axes.items()), fn))
    if agg is not None:
        home = agg.home
        result = with_agg(engine, result, Agg(agg.op, _rehome(result, values[0], home), agg.term, agg.cov,
                                              agg.score, agg.shift_cov))
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
    return cov_ops.cell(engine.canonical_aff(hop), engine.canonical_aff(axis.offset), size)


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
            if value.agg.op in _SUM_LIKE and combiner == "stablehlo.add":
                return _relabel(engine, op, canonical(base), [])
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
        if value.agg.op == "exp" and combiner == "stablehlo.add":
            one = engine.fns.intern(("const", repr(1.0)))
            agg = Agg("ssum", value.agg.home, one, cell, value.agg.score, value.agg.cov)
            return with_agg(engine, base, agg)
        engine.refuse("reduces a partial aggregate over tokens again", op)
    op_name = {"stablehlo.add": "sum", "stablehlo.maximum": "max", "stablehlo.minimum": "min",
               "stablehlo.multiply": "mul", "stablehlo.and": "and", "stablehlo.or": "or"}[combiner]
    term = value.fn
    agg = Agg(op_name, home_key, term if op_name not in ("max", "min") else 0, cell,
              term if op_name in ("max", "min") else 0)
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
    base = canonical(Data(tuple(out), tuple(roles), tuple(axes.items()), 0))
    fn = engine.fns.intern(("dot", lhs.fn, rhs.fn, str(dims)), _depends(engine, [lhs, rhs]))
    aggs = [v for v in (lhs, rhs) if v.agg is not None]
    if not contracted:
        if not aggs:
            return base.with_(fn=fn)
        (s,) = aggs if len(aggs) == 1 else engine.refuse("contracts two partial aggregates", op)
        if s.agg.op not in _SUM_LIKE:
            engine.refuse("contracts a running maximum", op)
        home = _find_axis(base, _home_axis(s))
        term = engine.fns.intern(("dotterm", fn, s.agg.term), _depends(engine, [lhs, rhs]))
        return with_agg(engine, base, Agg(s.agg.op, home, term, s.agg.cov, s.agg.score, s.agg.shift_cov))
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
        if e.agg.op != "exp":
            engine.refuse("contracts a partial aggregate over tokens again", op)
        weight = rhs if e is lhs else lhs
        term = engine.fns.intern(("weight", weight.fn, str(dims)), engine.fns.depends(weight.fn))
        return with_agg(engine, base, Agg("ssum", home_key, term, cell, e.agg.score, e.agg.cov))
    return with_agg(engine, base, Agg("sum", home_key, fn, cell))


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
        agg = Agg(agg.op, None, agg.term, _shift_cov(agg.cov, direction), agg.score, agg.shift_cov)
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
        expected = {"stablehlo.add": "sum", "stablehlo.maximum": "max", "stablehlo.minimum": "min"}.get(combiner)
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
                 engine.fns.intern(("collective", op.name, tuple(v.fn for v in ins), id(op))))
            for r in op.results]


__all__ = ["EMPTY", "combine", "concatenate", "dot", "reduce", "try_complete", "unify", "with_agg"]
