"""Rules for ops on Data: elementwise combination (tokens must line up) and the order-free merges of the aggregates
that reductions and contractions make (sums, maxes, the online softmax's rescaled sums); contract.py has the
reductions, contractions, concatenation and collectives themselves."""

from __future__ import annotations

import dataclasses
import math

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from . import coverage as cov_ops
from .finite import float_max, float_to_float, may_be_infinite, narrowing
from .analysis import Engine
from .dims import is_integer, shape
from .optable import Algebra, info
from . import stabiliser
from .symbolic import Aff, Var, congruent
from .values import (CONST, EMPTY, FREE, Agg, AggOp, Axis, Coverage, CoverageVar, Data, ObligationKind, Stack, Tok,
                     canonical)

SUM_LIKE = (AggOp.SUM, AggOp.SSUM)
# the aggregates that become a plain function of their home tokens once every block is folded in
_COMPLETES = frozenset({AggOp.SUM, AggOp.MAX, AggOp.MIN, AggOp.SSUM, AggOp.MUL, AggOp.AND, AggOp.OR, AggOp.SHIFT,
                        AggOp.LSE, AggOp.NSUM})


# ---------------------------------------------------------------------------------------------------------------
# Axes and dims.


def same_hop(engine: Engine, a: Aff, b: Aff, op, what: str) -> bool:
    """Whether two hops name the same block (in a loop's discovery pass, unknown ring steps make it undecided)."""
    diff = a - b
    if diff.is_const:
        return diff.const % engine.ring.cp == 0
    if any(isinstance(x, Var) and x in engine.state.unknown_vars for x in diff.free_atoms()):
        engine.defer(ObligationKind.HOP, a, b, op, what)  # a discovery pass: the real pass decides
        return True
    return congruent(a, b, engine.ring.cp, engine.scope)


def same_axis(engine: Engine, a: Axis, b: Axis, op) -> bool:
    if a == b:
        return True
    if not same_hop(engine, a.hop, b.hop, op, "combines blocks of different ring steps"):
        return False
    diff = a.offset - b.offset
    if diff.is_const:
        return diff.const == 0
    if any(isinstance(x, Var) and x in engine.state.unknown_vars for x in diff.free_atoms()):
        engine.defer(ObligationKind.EQUAL, a.offset, b.offset, op, "combines different tokens of one block")
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
            engine.refuse(f"combines token data with data that varies with local position along dim {d} (an index "
                          "within the block, like jnp.arange(n) or a mask made from it, rather than each token's "
                          "place in the sequence): make it from global positions, axis_index * n + arange(n)", op)
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
    # axes without dims (the value depends on the token, or the unit, at one place of a block) are carried along,
    # apart from the axes with dims even where they start at the same place: tokens along a dim are not the one
    # token at its start
    placed: dict = {}
    for i, v in enumerate(values):
        for k, a in v.axes:
            if k not in renames[i] and not v.tok_dims(k):
                if any(isinstance(r, Tok) for r in roles):
                    engine.refuse("combines tokens with the token at one fixed place of a block (a position read "
                                  "as one number, like a block's first position, or one token sliced out), which "
                                  "the reorder moves: use each token's own position", op, tuple(values))
                key = placed.get(a)
                if key is None:
                    key = placed[a] = f"u{len(axes)}"
                    axes[key] = a
                renames[i][k] = key
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


def depends(engine: Engine, values) -> frozenset:
    out = frozenset()
    for v in values:
        out |= engine.fns.depends(v.fn)
        if v.agg is not None:
            out |= engine.fns.depends(v.agg.term) | engine.fns.depends(v.agg.score)
    return out


def ew_fn(engine: Engine, name: str, attrs: str, values) -> int:
    return engine.fns.intern(("ew", name, attrs, tuple(v.fn for v in values)), depends(engine, values))


def _attrs(op) -> str:
    if op.name == "stablehlo.compare":
        return stablehlo.ComparisonDirectionAttr(op.attributes["comparison_direction"]).value
    if op.name == "stablehlo.convert":
        target = str(ir.ShapedType(op.results[0].type).element_type)
        return f"narrowing to {target}" if float_to_float(op) and narrowing(op) else target
    result = ir.ShapedType(op.results[0].type).element_type
    if isinstance(result, ir.IntegerType) and ir.IntegerType(result).width > 1:
        # integer arithmetic wraps in its type: `uint32(i) - 2` is not `int32(i) - 2`, though both read i
        return str(result)
    return ""


def agg_fn(engine: Engine, agg: Agg) -> int:
    return engine.fns.intern(("agg", agg.op, agg.term, agg.score, str(agg.cov), str(agg.shift_cov), agg.form,
                              agg.start, agg.by_lse),
                             engine.fns.depends(agg.term) | engine.fns.depends(agg.score))


def with_agg(engine: Engine, value: Data, agg: Agg) -> Data:
    return canonical(value.with_(agg=agg, fn=agg_fn(engine, agg)))


# ---------------------------------------------------------------------------------------------------------------
# Completion: an aggregate that has folded in every token of every block is a plain function of its home tokens.


def try_complete(engine: Engine, value: Data) -> Data:
    agg = value.agg
    if agg is None or agg.op not in _COMPLETES or ((agg.nan or agg.masked) and agg.op in (AggOp.LSE, AggOp.NSUM)):
        return value
    scope, block = engine.scope, engine.ring.block
    if not cov_ops.is_complete(agg.cov, scope, block):
        return value
    if agg.op in (AggOp.SSUM, AggOp.SHIFT) and not cov_ops.is_complete(agg.shift_cov, scope, block):
        return value
    fn = engine.fns.intern(("complete", agg.op, agg.term, agg.score) + (() if agg.start is None else (agg.start,)),
                           engine.fns.depends(agg.term) | engine.fns.depends(agg.score))
    if agg.op in (AggOp.MAX, AggOp.MIN, AggOp.SSUM, AggOp.SHIFT):
        stabiliser.note_complete(engine.fns, fn, (agg.ident, home_tokens(value)))
    axes = value.axes
    if agg.home is None:
        axes = ()
    return canonical(value.with_(agg=None, fn=fn, axes=axes))


# ---------------------------------------------------------------------------------------------------------------
# Elementwise.


def combine(engine: Engine, op, values: list[Data]) -> Data:
    out = shape(op.results[0])
    kind = info(op.name).algebra
    if kind is Algebra.CONVERT and float_to_float(op) and not narrowing(op):
        # A float->float convert (bf16 <-> f32, a carry made `.astype(q.dtype)`) is the identity in exact
        # arithmetic, a rounding like that of every add: the same function of the same tokens, partial aggregates
        # included, so a merge run in bf16 with converts around it is the merge. The reorder changes only the order
        # blocks are folded in, and proofs already treat float rounding as exact. Converts to or from an integer
        # type are not the identity (truncation, or an integer sum that wraps), nor is one to a type of narrower
        # range (float16: a running sum overflows or not by the order of its blocks); they take the rules below.
        return values[0]
    if op.name == "stablehlo.multiply" and any(v.agg is None and engine.fns.constant(v.fn) == 0.0 for v in values):
        return _const_data(engine, 0.0, out)  # anything times zero, a running aggregate too (finite numbers)
    completed = [try_complete(engine, v) for v in values]
    if any(v.agg is not None for v in completed) or _rescaling(op, values):
        # merges see the aggregates as they are (a running max that just became complete is still the max the
        # softmax sums are rescaled to)
        return _aggregate_rule(engine, op, values, out)
    values = completed
    if kind is Algebra.CONVERT and values[0].agg is None and engine.fns.constant(values[0].fn) is not None \
            and not isinstance(ir.ShapedType(op.results[0].type).element_type, ir.IntegerType):
        # a constant converted between float types is the same constant, or an infinity beyond the new range
        # (-1e30 in float16 is -inf)
        number = engine.fns.constant(values[0].fn)
        top = float_max(ir.ShapedType(op.results[0].type).element_type)
        if top is not None and abs(number) > top and math.isfinite(number):
            return _const_data(engine, math.copysign(math.inf, number), out)
        return values[0].with_(shape=tuple(out))
    if kind is Algebra.SELECT:
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


def _rescaling(op, values: list[Data]) -> bool:
    """scores - their running max, the max complete: still the rescaling a softmax sum is merged under (an unrolled
    ring's last step completes the max before the last block's sum is rescaled to it)."""
    if info(op.name).algebra is not Algebra.SUBTRACT:
        return False
    x, m = values
    return x.agg is None and m.agg is not None and m.agg.op == AggOp.MAX and m.agg.score == x.fn


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


def _fold_constants(engine: Engine, op, values: list[Data], out) -> Data | None:
    """Arithmetic on constants is a constant; anything times zero is zero (the analysis reasons about finite
    numbers, as it does about reassociation)."""
    numbers = [engine.fns.constant(v.fn) if v.agg is None else None for v in values]
    if op.name == "stablehlo.multiply" and 0.0 in numbers:
        return _const_data(engine, 0.0, out)
    fold = info(op.name).fold
    # integer constants that reach here are not exact index arithmetic (rules.py keeps those that are as Index):
    # numbers of a type that wraps (`uint32(0) - uint32(1)`), so not folded as exact numbers
    if fold is not None and None not in numbers and not is_integer(op.results[0]):
        try:
            result = fold(*numbers)
        except (OverflowError, ZeroDivisionError, ValueError):
            return None
        if result is not None and not math.isnan(result):
            return _const_data(engine, float(result), out)
    return None


def _const_data(engine: Engine, number: float, out) -> Data:
    return Data(tuple(out), tuple(CONST for _ in out), (), engine.fns.intern(("const", repr(float(number)))))


def _is_const(engine: Engine, value: Data, number: float) -> bool:
    return value.agg is None and value.fn == engine.fns.intern(("const", repr(float(number))))


def start_value(engine: Engine, value: Data, agg_value: Data) -> bool:
    """`value` can be an aggregate's start (a floor of a running max, what a softmax sum starts from): the same
    on every device and in every layout, so folded in the same way whatever the order of the blocks. A constant,
    or data of replicated operands (attention-sink logits) that varies only along dims the aggregate doesn't
    index tokens by."""
    if value.agg is not None or not value.is_invariant or engine.fns.depends(value.fn):
        return False
    if engine.fns.constant(value.fn) is not None:
        return True
    return all(r == CONST or (r == FREE and d < len(agg_value.dims) and agg_value.dims[d] == FREE)
               for d, r in enumerate(value.dims))


def home_tokens(value: Data) -> tuple | None:
    """The tokens an aggregate's rows hold, as (the block's hop, the least local token, the greatest), where its
    home axis starts at a known token and no dim is stacked (then each element holds other tokens); else None."""
    axis = home_axis(value)
    if axis is None or not axis.offset.is_const or value.elements or \
            any(isinstance(r, Stack) for r in value.dims):
        return None
    home = value.agg.home
    strides = [(n, r.stride) for n, r in zip(value.shape, value.dims) if isinstance(r, Tok) and r.axis == home]
    if not strides:
        return None
    lo = axis.offset.const + sum((n - 1) * min(stride, 0) for n, stride in strides)
    hi = axis.offset.const + sum((n - 1) * max(stride, 0) for n, stride in strides)
    return axis.hop, lo, hi


def home_axis(value: Data) -> Axis | None:
    if value.agg is None or value.agg.home is None:
        return None
    return value.axis_map.get(value.agg.home)


def _aggregate_rule(engine: Engine, op, values: list[Data], out) -> Data:
    name = op.name
    entry = info(name)
    kind = entry.algebra
    aggs = [v for v in values if v.agg is not None]
    plain = [v for v in values if v.agg is None]
    if entry.unit and all(v.agg is None or (v.agg.home is None and v.agg.op in (AggOp.MAX, AggOp.MIN, AggOp.SUM,
                                                                                        AggOp.UNITFN))
                                 for v in values) and all(not v.axes for v in plain):
        # a predicate of whole units (the largest position in a query chunk, the smallest in a key chunk): a
        # function of those units' tokens, fine where it decides to skip exactly that pair of units
        covered = Coverage(tuple(p for v in aggs for p in v.agg.cov.parts))
        base = Data(tuple(out), tuple(CONST for _ in out), (), 0)
        return with_agg(engine, base, Agg(AggOp.UNITFN, None, ew_fn(engine, name, _attrs(op), values), covered))
    if kind is Algebra.CONVERT and float_to_float(op):
        target = ir.ShapedType(op.results[0].type).element_type
        engine.refuse(f"converts a partial aggregate (a running sum or max) to {target}, "
                      "a type of narrower range, before every block is merged in: whether it overflows depends on "
                      "the order the blocks come in, which differs in each layout; keep the merge state in a type of "
                      "the scores' range (float32 or bfloat16)", op)
    if kind is Algebra.CONVERT:
        # float->float converts of the same range never get here (the identity, above); truncating a running sum or
        # max to an integer mid-merge (or widening an integer sum that may have wrapped) depends on the order
        engine.refuse("converts a partial aggregate (a running sum or max) to or from an integer type before every "
                      "block is merged in, which truncates or wraps differently in each layout: convert the terms "
                      "before reducing them, or the finished result after the ring", op)
    if kind is Algebra.NEGATE and aggs[0].agg.op in SUM_LIKE:
        return relabel(engine, op, aggs[0], plain)
    if kind is Algebra.ADD:
        return _add(engine, op, values)
    if kind is Algebra.MAXIMUM:
        return _maximum(engine, op, values)
    if kind is Algebra.SUBTRACT:
        return _subtract(engine, op, values)
    if kind is Algebra.EXP and aggs[0].agg.op in (AggOp.DIFF, AggOp.MDIFF):
        a = aggs[0].agg
        nan = not a.finite and may_be_infinite(engine, a.score)
        new = Agg(AggOp.EXP if a.op == AggOp.DIFF else AggOp.SHIFT, a.home, a.term, a.cov, a.score, a.shift_cov,
                  nan=nan, ident=a.ident, start=a.start, by_lse=a.by_lse)
        return with_agg(engine, aggs[0], new)
    if kind is Algebra.IS_FINITE:
        a = aggs[0].agg
        return with_agg(engine, aggs[0], Agg(AggOp.FINITE, a.home, aggs[0].fn, a.cov, a.score, a.shift_cov,
                                             ident=a.ident))
    if kind is Algebra.SELECT:
        return _select(engine, op, values)
    if kind is Algebra.SCALE:
        return _scale(engine, op, values)
    engine.refuse("combines a partial aggregate (a running sum or max) with other data in a way that is not an "
                  "order-free merge", op)


def relabel(engine: Engine, op, value: Data, others: list[Data]) -> Data:
    """A linear op on a sum: the same sum of a transformed term."""
    term = engine.fns.intern(("ew", op.name, _attrs(op), (value.agg.term,) + tuple(v.fn for v in others)),
                             depends(engine, [value] + others))
    agg = dataclasses.replace(value.agg, term=term, finite=False, nan=False)
    return with_agg(engine, value, agg)


_TWICE = ("merges two partial results (running sums or maxima) that may both hold the same block, counting its "
          "tokens twice (two merges that read the block of one ring step, or one block merged at two steps): merge "
          "each block once, the block that ring step brings")


def union_cov(engine: Engine, op, a: Coverage, b: Coverage) -> Coverage:
    verdict = cov_ops.disjoint(a, b, engine.scope)
    if verdict is False:
        engine.refuse(_TWICE, op)
    if verdict is None:
        engine.defer(ObligationKind.DISJOINT, a, b, op, _TWICE)
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
        engine.defer(ObligationKind.EQUAL, x.start, y.start, op, message)
        return True
    return False


def cov_prefix(engine: Engine, op, before: Coverage, after: Coverage, message: str) -> Coverage | None:
    """What `after` adds to `before`, when `after` is `before` followed by more parts (None otherwise)."""
    before, after = engine.canonical_cov(before), engine.canonical_cov(after)
    if len(after.parts) < len(before.parts) or not all(
            cells_equal(engine, op, x, y, message) for x, y in zip(before.parts, after.parts)):
        return None
    return Coverage(after.parts[len(before.parts):])


def cov_rest(engine: Engine, before: Coverage, after: Coverage) -> Coverage | None:
    """What `after` adds to `before` where both are sets of blocks listed in any order (the coverage of a
    log-sum-exp merge, whose parts logsum.py keeps in an order of its own): `after` less each part of `before`,
    or None where `after` lacks one."""
    rest = list(engine.canonical_cov(after).parts)
    for part in engine.canonical_cov(before).parts:
        if part not in rest:
            return None
        rest.remove(part)
    return Coverage(tuple(rest))


def covs_equal(engine: Engine, op, a: Coverage, b: Coverage, message: str) -> bool:
    a, b = engine.canonical_cov(a), engine.canonical_cov(b)
    if cov_ops.normal(a) == cov_ops.normal(b):
        return True
    return len(a.parts) == len(b.parts) and all(cells_equal(engine, op, x, y, message)
                                                for x, y in zip(a.parts, b.parts))


def same_cov(engine: Engine, op, a: Coverage, b: Coverage, message: str) -> None:
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
        engine.defer(ObligationKind.SAME_COV, a, b, op, message)
        return
    engine.refuse(message, op)


def aligned(engine: Engine, op, a: Data, b: Data) -> None:
    """Two aggregates merge elementwise only over the same home tokens."""
    ha, hb = home_axis(a), home_axis(b)
    if (ha is None) != (hb is None) or (ha is not None and not same_axis(engine, ha, hb, op)):
        engine.refuse("merges aggregates of different home tokens", op)
    unify(engine, op, [a, b], a.shape)


def _add(engine: Engine, op, values: list[Data]) -> Data:
    a, b = values
    for p, q in ((a, b), (b, a)):
        if p.agg is not None and q.agg is not None and p.agg.op == AggOp.SSTART and q.agg.op == AggOp.SSUM and \
                p.agg.score == q.agg.score:
            # a sum that starts from a start value: the sum, the start folded in once whatever the order
            aligned(engine, op, p, q)
            same_cov(engine, op, p.agg.shift_cov, q.agg.shift_cov, "adds softmax sums rescaled to different maxima")
            return with_agg(engine, q, dataclasses.replace(q.agg, ident=stabiliser.same(engine.fns, p.agg.ident,
                                                                                          q.agg.ident)))
    if b.agg is None and _is_const(engine, b, 0.0):
        return a
    if a.agg is None and _is_const(engine, a, 0.0):
        return b
    if a.agg is None or b.agg is None:
        engine.refuse("adds data to a partial aggregate", op)
    x, y = a.agg, b.agg
    if x.op != y.op or x.op not in SUM_LIKE or x.term != y.term or x.score != y.score:
        engine.refuse("adds two partial results that are not sums of the same terms (a running sum and a rescaled, "
                      "decayed or differently masked one): such a sum depends on the order blocks arrive in; add "
                      "each block's terms into one running sum, rescaled only by the online softmax's max", op)
    aligned(engine, op, a, b)
    if x.op == AggOp.SSUM:
        same_cov(engine, op, x.shift_cov, y.shift_cov, "adds softmax sums rescaled to different maxima")
    ident = stabiliser.same(engine.fns, x.ident, y.ident) if x.op == AggOp.SSUM else None
    merged = Agg(x.op, x.home, x.term, union_cov(engine, op, x.cov, y.cov), x.score, x.shift_cov, ident=ident)
    return with_agg(engine, a, merged)


def _maximum(engine: Engine, op, values: list[Data]) -> Data:
    a, b = values
    for p, q in ((a, b), (b, a)):
        if q.agg is None and p.agg is not None and p.agg.op == AggOp.MAX and start_value(engine, q, p):
            # a constant floor (the running max's start value) is part of the fold, in every order; a finite one
            # keeps the max finite
            number = engine.fns.constant(q.fn)
            if p.agg.finite or number is None or not math.isfinite(number):
                # a start of input data (a sink logit) may be -inf itself
                return p.with_(agg=dataclasses.replace(p.agg, ident=stabiliser.max_ident(
                    op, p.fn, stabiliser.resolve(engine.fns, p.agg.ident), q.fn)))
            return _new_max(engine, op, p, dataclasses.replace(p.agg, finite=True), p, q)
    if a.agg is None or b.agg is None or a.agg.op != AggOp.MAX or b.agg.op != AggOp.MAX or a.agg.score != b.agg.score:
        engine.refuse("takes the maximum of different aggregates", op)
    aligned(engine, op, a, b)
    merged = Agg(AggOp.MAX, a.agg.home, a.agg.term, union_cov(engine, op, a.agg.cov, b.agg.cov), a.agg.score,
                 finite=a.agg.finite or b.agg.finite)
    return _new_max(engine, op, a, merged, a, b)


def _new_max(engine: Engine, op, value: Data, agg: Agg, *operands: Data) -> Data:
    """`value` with aggregate `agg`, a maximum `op` computes from `operands`: another maximum than its operands,
    named with theirs (stabiliser.max_ident; an operand that is no aggregate, a floor, by its function)."""
    history = tuple(stabiliser.resolve(engine.fns, x.agg.ident) if x.agg is not None else x.fn for x in operands)
    return with_agg(engine, value, dataclasses.replace(
        agg, ident=stabiliser.max_ident(op, agg_fn(engine, agg), *history)))


def _subtract(engine: Engine, op, values: list[Data]) -> Data:
    x, m = values
    if x.agg is None and m.agg is not None and m.agg.op == AggOp.MAX and start_value(engine, x, m):
        # the running max before anything was folded in, minus the new one: a rescaling from nothing
        return with_agg(engine, m, Agg(AggOp.MDIFF, m.agg.home, 0, EMPTY, m.agg.score, m.agg.cov,
                                       finite=m.agg.finite, ident=(None, m.agg.ident)))
    if x.agg is None and m.agg is not None and m.agg.op == AggOp.MAX and m.agg.score == x.fn:
        # scores minus their running max: exp of it weights a softmax sum
        home = match_home(engine, op, x, m)
        return with_agg(engine, x, Agg(AggOp.DIFF, home, 0, m.agg.cov, x.fn, finite=m.agg.finite,
                                       ident=m.agg.ident))
    if x.agg is not None and m.agg is not None and x.agg.op == m.agg.op == AggOp.MAX and x.agg.score == m.agg.score:
        aligned(engine, op, x, m)
        return with_agg(engine, x, Agg(AggOp.MDIFF, x.agg.home, 0, x.agg.cov, x.agg.score, m.agg.cov,
                                       finite=m.agg.finite, ident=(x.agg.ident, m.agg.ident)))
    engine.refuse("subtracts a partial aggregate in a way that is not a softmax rescaling", op)


def match_home(engine: Engine, op, pair: Data, agg_value: Data) -> str:
    """The axis of `pair` that is the aggregate's home (the aggregate is constant along the others)."""
    home = home_axis(agg_value)
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
    guard = cond.agg.term if cond.agg is not None and cond.agg.op == AggOp.FINITE else None
    plain_guard = cond.fn if cond.agg is None else None
    # select(is_finite(m), m, c) for a running max m (`m_safe`, the shift flash kernels use): m itself wherever m
    # is finite; where it is not, no unmasked score has been folded in yet, every sum rescaled by it is the empty
    # sum in every order, and a complete max is the same in every order anyway. A function of the merge state.
    if a.agg is not None and a.agg.op in (AggOp.MAX, AggOp.MIN) and guard == a.fn and b.agg is None \
            and engine.fns.constant(b.fn) is not None:
        # named as m (stabiliser.py): where m is finite it is m, derivative included (select passes the cotangent
        # through); where m is -inf every sum shifted by either is empty and stays so, and the select sends m no
        # cotangent, so what reaches m through m_safe is what would reach m used in its place
        return with_agg(engine, a, dataclasses.replace(a.agg, finite=math.isfinite(engine.fns.constant(b.fn))))
    # select(is_finite(x), exp(x - max), 0) is exp(x - max): masked scores contribute nothing either way
    if a.agg is not None and a.agg.op == AggOp.EXP and b.agg is None and _is_const(engine, b, 0.0):
        if plain_guard == _finite_fn(engine, a.agg.score):
            return with_agg(engine, a, dataclasses.replace(a.agg, nan=False))
    # select(is_finite(max_new), exp(max_old - max_new), 1) is the rescaling (1 where nothing is unmasked yet)
    if a.agg is not None and a.agg.op == AggOp.SHIFT and b.agg is None and _is_const(engine, b, 1.0) \
            and guard is not None:
        target = agg_fn(engine, Agg(AggOp.MAX, a.agg.home, a.agg.term, a.agg.shift_cov, a.agg.score))
        if guard == target:
            return with_agg(engine, a, dataclasses.replace(a.agg, nan=False))
    engine.refuse("selects between partial results (running sums or maxima) by something other than the merge's "
                  "own state or the ring's first step: the value kept holds other blocks in another layout; merge "
                  "every block (add, maximum, the online softmax's rescale), resetting only at step 0 "
                  "(`where(i == 0, fresh, merged)`)", op, (cond,))


def reset_select(engine: Engine, loop: int, first: Data, later: Data) -> Data | None:
    """select(first step of `loop`, first, later), as a step-0 reset writes it (`where(i == 0, fresh, merged)`):
    `later`, whenever `later` at that step is `first`. At the first step the loop's carried aggregates have folded
    in nothing, so `later` holds exactly the blocks `first` holds when `first` is `later` less what the loop
    carries (the same fold of the same blocks), or when `first` is zero and `later` a sum or a rescaling from what
    the loop carries alone (an empty sum; a rescaling from no maximum, which annihilates what it scales). A
    function of the merge state, so the fold stays order-free. None: not such a select (the general rules decide)."""
    if later.agg is None:
        return None
    if loop < 0:  # a discovery pass (loops.UNDECIDED): the pass with the loop's counter known decides
        return _reset_start(engine, later)

    def own(cov: Coverage) -> Coverage:
        return Coverage(tuple(p for p in engine.canonical_cov(cov).parts
                              if not (isinstance(p, CoverageVar) and p.name[2:].startswith(f"{loop}_"))))

    x = later.agg
    if first.agg is None:
        if _is_const(engine, first, 0.0) and (x.op in SUM_LIKE or x.op == AggOp.SHIFT) and not own(x.cov).parts:
            return later
        return None
    y = first.agg
    if (x.op, x.term, x.score, x.home) != (y.op, y.term, y.score, y.home) or first.dims != later.dims:
        return None
    if own(x.cov) != engine.canonical_cov(y.cov) or own(x.shift_cov) != own(y.shift_cov):
        return None
    reset = _reset_start(engine, later)
    if stabiliser.resolve(engine.fns, x.ident) != stabiliser.resolve(engine.fns, y.ident):
        # at the first step the value is `first`: of another maximum, it is no longer known which
        return reset.with_(agg=dataclasses.replace(reset.agg, ident=None))
    return reset


def _reset_start(engine: Engine, later: Data) -> Data:
    """A log-sum-exp merge whose floats are off where the state is still at its start (logsum.py), reset at the
    loop's first step: where the select runs at every step (not in a skip's branch), the merge meets the start at
    the first step only, which the reset replaces."""
    x = later.agg
    if x.nan and x.op in (AggOp.LSE, AggOp.NSUM) and engine.state.skippable == 0:
        return with_agg(engine, later, dataclasses.replace(x, nan=False))
    return later


def _finite_fn(engine: Engine, fn: int) -> int:
    return engine.fns.intern(("ew", "stablehlo.is_finite", "", (fn,)), engine.fns.depends(fn))


def _scale(engine: Engine, op, values: list[Data]) -> Data:
    a, b = values
    if op.name == "stablehlo.multiply":
        for zero, other in ((a, b), (b, a)):
            if zero.agg is None and _is_const(engine, zero, 0.0) and other.agg is not None \
                    and other.agg.op in (AggOp.SHIFT, AggOp.EXP):
                return zero.with_(shape=other.shape)  # an empty sum rescaled is still empty
    if a.agg is not None and b.agg is not None:
        x, y = a.agg, b.agg
        if op.name == "stablehlo.multiply":
            for s, t in ((a, b), (b, a)):
                if s.agg.op == AggOp.SSUM and t.agg.op == AggOp.SHIFT and s.agg.score == t.agg.score:
                    same_cov(engine, op, s.agg.shift_cov, t.agg.cov, "rescales a softmax sum from another maximum")
                    _aligned_broadcast(engine, op, s, t)
                    ident = stabiliser.pair(t.agg.ident, 1) \
                        if stabiliser.same(engine.fns, s.agg.ident, stabiliser.pair(t.agg.ident, 0)) else None
                    return with_agg(engine, s, Agg(AggOp.SSUM, s.agg.home, s.agg.term, s.agg.cov, s.agg.score,
                                                   t.agg.shift_cov, ident=ident))
            if x.op == y.op == AggOp.SHIFT and x.score == y.score:
                same_cov(engine, op, x.shift_cov, y.cov, "chains rescalings of different maxima")
                ident = (stabiliser.pair(x.ident, 0), stabiliser.pair(y.ident, 1)) \
                    if stabiliser.same(engine.fns, stabiliser.pair(x.ident, 1), stabiliser.pair(y.ident, 0)) else None
                return with_agg(engine, a, Agg(AggOp.SHIFT, x.home, 0, x.cov, x.score, y.shift_cov, ident=ident))
        if op.name == "stablehlo.divide":
            engine.refuse("divides two partial aggregates: a running sum is read before every block is merged into "
                          f"it (inside the ring loop, or after a ring that runs fewer than its {engine.ring.cp} "
                          f"steps); divide once, after all {engine.ring.cp} blocks are merged", op)
        what = {"stablehlo.multiply": "multiplies"}.get(op.name, "combines")
        engine.refuse(f"{what} two partial aggregates", op)
    s, t = (a, b) if a.agg is not None else (b, a)
    if op.name == "stablehlo.divide" and s is b:
        engine.refuse("divides by a partial aggregate", op)
    if op.name == "stablehlo.multiply" and s.agg.op == AggOp.SHIFT and not engine.canonical_cov(s.agg.cov).parts \
            and start_value(engine, t, s):
        # a softmax sum's start value (1 for an attention sink's logit folded into the initial state) rescaled
        # from the start maximum: a pseudo-token's term, the same in every layout, rescaled as the sum will be
        return with_agg(engine, s, Agg(AggOp.SSTART, s.agg.home, 0, EMPTY, s.agg.score, s.agg.shift_cov,
                                       ident=stabiliser.pair(s.agg.ident, 1)))
    if s.agg.op not in SUM_LIKE and s.agg.op != AggOp.EXP:
        engine.refuse("scales a running maximum", op)
    home = home_axis(s)
    for d, role in enumerate(t.dims):  # the factor may vary with the home tokens only
        if isinstance(role, Tok) and (home is None or not isinstance(s.dims[d], Tok) or
                                      not same_axis(engine, t.axis_map[role.axis], home, op)):
            engine.refuse("scales an aggregate by data of other tokens", op)
    unify(engine, op, [s, t], s.shape)
    return relabel(engine, op, s, [t])


def _aligned_broadcast(engine: Engine, op, s: Data, t: Data) -> None:
    hs, ht = home_axis(s), home_axis(t)
    if hs is None or ht is None or not same_axis(engine, hs, ht, op):
        engine.refuse("rescales a softmax sum of other tokens", op)
