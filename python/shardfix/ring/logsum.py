"""The log-sum-exp merge of flash-attention style ring kernels, accepted by its algebra.

Such a kernel keeps, per query row t, a normalised output and a log-sum-exp, and merges each block's pair into them:
for a set C of keys (the blocks folded in), lse(C) = log sum_{s in C} exp(score(t, s)) and
out(C) = sum_{s in C} exp(score(t, s) - lse(C)) v(s). Both are functions of the set C alone, so a fold whose
every step computes (out(A u B), lse(A u B)) from (out(A), lse(A)) and (out(B), lse(B)) is order-free, however
it is spelled: logaddexp, `m + log(exp(a - m) + exp(b - m))`, the sigmoid form, softplus. The rules here evaluate
what each op computes in exact arithmetic (lseforms.py has the domain and its identities) and give back the LSE
and NSUM aggregates the loop carries (values.AggOp) where a result is lse(C) or out(C), an intermediate (LOGSUM)
otherwise. Nothing is matched by its spelling; a merge that is not order-free (a decayed output, a weight read
from the step counter, the latest block kept, a hard max for the lse) never reaches the canonical (out(C), lse(C))
the loop's recurrence asks for, and is refused.

Exact arithmetic is what every proof here assumes; the one place floats part from it is the state's start: a state
started at lse = -inf (or a sentinel like -1e30) meets `lse - log_sigmoid(lse - lse_blk)` as -inf - -inf (or
cancels to 0), at the first merge a row sees, which a skip can make a different step in each layout. So every value
also carries what its float computation gives (numpy float32, on sample numbers for the blocks) where the state is
still at its start; a canonical result whose float value there is not its exact value is marked (Agg.nan), and
only a guard on the start (`where(isneginf(lse), block, merged)`) or a reset at a loop's first step that runs at
every step may read it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .algebra import aligned, match_home, same_cov, try_complete, unify, with_agg
from .analysis import Engine
from .dims import shape
from .finite import made_of, may_be_infinite
from . import lsefloats as fl
from . import stabiliser
from .lseforms import (ADVICE, ZERO, Atom, Domain, Form, Kind, Mono, Value, add_lin, apply_cases, at_least_one,
                       at_most_zero, cells, const_value, exact_samples, extreme, log_of, negated, nonnegative,
                       positive, reciprocal, same_keys, times)
from .optable import Algebra, info
from .values import CONST, EMPTY, Agg, AggOp, Coverage, CoverageVar, Data

_STATE = (AggOp.LSE, AggOp.NSUM, AggOp.LOGSUM)


def applies(engine: Engine, op, values: list[Data]) -> bool:
    """Whether this op's operands are in logsum's terms: one is an lse, a normalised output or an intermediate of
    a merge, or the op takes the log of a softmax sum or divides two, one of them a block's (not every block's).
    Sums of every block (o = acc / l and lse = m + log l after an online softmax's ring) stay the algebra's, whose
    terms say which running maximum each sum is shifted by (stabiliser.py); here two maxima of the same value are
    one number."""
    aggs = [v.agg.op for v in values if v.agg is not None]
    if any(a in _STATE for a in aggs) or any(v.agg.op == AggOp.SSUM and v.agg.by_lse for v in values
                                             if v.agg is not None):
        return True
    kind = info(op.name).algebra
    sums = [v for v in values if v.agg is not None and v.agg.op == AggOp.SSUM]
    if all(try_complete(engine, v).agg is None for v in sums):
        return False
    if kind in (Algebra.LOG, Algebra.LOG1P, Algebra.ABS) and sums:
        return True
    return op.name == "stablehlo.divide" and aggs == [AggOp.SSUM, AggOp.SSUM]


# ---------------------------------------------------------------------------------------------------------------
# Lifting the operands.


def _score(engine: Engine, op, values: list[Data]) -> int:
    scores = {v.agg.score for v in values if v.agg is not None and v.agg.op != AggOp.LOGSUM}
    scores |= {v.agg.score for v in values if v.agg is not None and v.agg.op == AggOp.LOGSUM and v.agg.score}
    if len(scores) > 1:
        engine.refuse("merges log-sum-exps of different scores", op)
    score = next(iter(scores), 0)
    if score and may_be_infinite(engine, score):
        engine.refuse("merges log-sum-exps of scores masked with -inf: a block whose keys are all masked has lse "
                      "-inf, and where it meets a state still at -inf the merge is -inf - -inf = nan, at a step that "
                      "changes with the layout; mask with a finite value such as -1e30", op)
    return score


def _lift(engine: Engine, op, value: Data, domain: Domain | None) -> Value:
    agg = value.agg
    if agg is None:
        number = engine.fns.constant(value.fn)
        if number is None:
            engine.refuse("combines a log-sum-exp or a normalised output with data other than the merge's own "
                          "(a weight read from the ring step, a per-token factor): " + ADVICE, op)
        if domain is Domain.LIN:
            return const_value(Domain.LIN, () if number == 0 else (Mono(number, ZERO),), number)
        if number == -math.inf:  # log 0: the lse of no keys (a state started at -inf)
            return const_value(Domain.LOG, Form.of(Atom(Kind.LSE, EMPTY)), number)
        return const_value(Domain.LOG, Form((), number), number)
    cov = engine.canonical_cov(agg.cov)
    if agg.op == AggOp.LOGSUM:
        return _canonical_covs(engine, agg.form)
    if agg.op == AggOp.LSE:
        result = const_value(Domain.LOG, Form.of(Atom(Kind.LSE, cov, agg.start)), 0.0)
    elif agg.op == AggOp.NSUM:
        lse = Atom(Kind.LSE, cov, agg.start)
        result = const_value(Domain.LIN, (Mono(1.0, Form.of(lse).scaled(-1), agg.term, cov),), 0.0)
    elif agg.op == AggOp.MAX:
        result = const_value(Domain.LOG, Form.of(Atom(Kind.MAX, cov)), 0.0)
    elif agg.op == AggOp.SSUM:
        shift_cov = engine.canonical_cov(agg.shift_cov)
        shift = Form.of(Atom(Kind.LSE, shift_cov, agg.start) if agg.by_lse else Atom(Kind.MAX, shift_cov)).scaled(-1)
        result = const_value(Domain.LIN, (_mono(engine, 1.0, shift, agg.term, cov),), 0.0)
    elif agg.op == AggOp.SHIFT:
        f = Form.of(Atom(Kind.MAX, cov)).plus(Form.of(Atom(Kind.MAX, engine.canonical_cov(agg.shift_cov))), -1)
        result = const_value(Domain.LIN, (Mono(1.0, f),), 0.0)
    else:
        engine.refuse(f"combines a log-sum-exp with a partial result of another kind ({agg.op}): " + ADVICE, op)
    # the maxima read here as numbers, for the derivative's check (stabiliser._lse_invariant)
    if agg.op == AggOp.MAX:
        _note_max(engine, agg.score, agg.cov, agg.ident)
    elif agg.op == AggOp.SSUM and not agg.by_lse:
        _note_max(engine, agg.score, agg.shift_cov, agg.ident)
    elif agg.op == AggOp.SHIFT:
        _note_max(engine, agg.score, agg.cov, stabiliser.pair(agg.ident, 0))
        _note_max(engine, agg.score, agg.shift_cov, stabiliser.pair(agg.ident, 1))
    keys = fl.PLAIN
    if may_mask(engine, agg.score):
        blocks = cells(result)
        keys += fl.STATE_KEYS + tuple(k for p in blocks for k in fl.cell_keys(p)) + \
            tuple(k for p in blocks if str(p) in engine.state.started for k in fl.pre_keys(p))
    # a merge whose float result is off in a scenario (its flag) is NaN there: a guard must not pick it
    samples = tuple((k, math.nan if (agg.nan and fl.at_start(k) or agg.masked and not fl.is_normal(k)) else x)
                    for k, x in exact_samples(result, keys))
    return dataclasses.replace(result, samples=samples)


def _note_max(engine: Engine, score: int, cov: Coverage, ident) -> None:
    """A maximum of `score` over `cov` read as the atom MAX(cov), for stabiliser.note_lse_max: the coverage as
    canonical now where it is blocks alone, None where it holds a loop's unknown coverage (which may be found equal
    to any other later)."""
    cov = engine.canonical_cov(cov)
    # as logsum's atoms compare them: the parts in any order (MAX(A u B) is MAX(B u A))
    known = None if any(isinstance(p, CoverageVar) for p in cov.parts) else tuple(sorted(map(str, cov.parts)))
    stabiliser.note_lse_max(engine.fns, score, (known, ident))


def may_mask(engine: Engine, fn: int) -> bool:
    """Whether scores `fn` may hold a mask value, so that a block's row may be all masked (lse -1e30 + log n): a
    constant of magnitude >= lsefloats.MASK_LIKE, an input (a bias passed in), a table or loop data, anywhere in
    what it is made of; a contraction of the data (q . k) and integer arithmetic are taken in range (finite.py)."""
    memo, keys = engine.fns.masking, engine.fns.keys
    stack = [fn]
    while stack:  # depth first without recursion: a score may be built of many ops
        top = stack[-1]
        if top in memo:
            stack.pop()
            continue
        key = keys[top]
        if key[0] == "const":
            memo[top] = key[1] not in ("True", "False") and abs(float(key[1])) >= fl.MASK_LIKE
        elif key[0] in ("dot", "dotterm", "index"):
            memo[top] = False
        else:
            parts = made_of(key)
            pending = [f for f in parts if f not in memo]
            if pending:
                stack.extend(pending)
                continue
            memo[top] = not parts or any(memo[f] for f in parts)
        stack.pop()
    return memo[fn]


def _mono(engine: Engine, coef: float, exp: Form, term: int, cov: Coverage) -> Mono:
    """A sum of exp(score) * term; of term 1, exp(lse(cov)) itself."""
    if engine.fns.constant(term) == 1.0:
        return Mono(coef, exp.plus(Form.of(Atom(Kind.LSE, cov))))
    return Mono(coef, exp, term, cov)


# ---------------------------------------------------------------------------------------------------------------
# The ops, case by case.


def combine(engine: Engine, op, values: list[Data]) -> Data:
    kind = info(op.name).algebra
    out = shape(op.results[0])
    score = _score(engine, op, values)
    if kind is Algebra.SUBTRACT:
        weights = _scores_less_lse(engine, op, values)
        if weights is not None:
            return weights
    bases = [v for v in values if v.agg is not None]
    if bases[0].agg.home is not None:
        for x in bases[1:]:
            aligned(engine, op, bases[0], x)
    unify(engine, op, values, out)
    _alias_states(engine, op, bases)
    result = _rule(engine, op, kind, values)
    # the operand that varies along the most dims carries the result's layout (the others are broadcast to it)
    base = max(bases, key=lambda v: sum(r != CONST for r in v.dims))
    agg = _canonical(engine, op, result, base.agg.home, score)
    return with_agg(engine, base.with_(shape=tuple(out)), agg)


def _scores_less_lse(engine: Engine, op, values: list[Data]) -> Data | None:
    """score(t, s) - lse(C)(t), per pair (`exp(s - lse)`, a block's softmax weights from its log-sum-exp): the
    difference a softmax sum normalised to lse(C) is made of (contract.py sums its exp into an SSUM by_lse)."""
    x, m = values
    if x.agg is not None or m.agg is None or m.agg.op != AggOp.LSE or m.agg.score != x.fn or \
            (not m.agg.cov.parts and m.agg.start is None):  # the lse of no keys, -inf: no weights
        return None
    home = match_home(engine, op, x, m)
    agg = Agg(AggOp.DIFF, home, 0, engine.canonical_cov(m.agg.cov), x.fn, finite=True, start=m.agg.start,
              by_lse=True)
    return with_agg(engine, x, agg)


def _domain_of(value: Data) -> Domain | None:
    agg = value.agg
    if agg is None:
        return None
    if agg.op == AggOp.LOGSUM:
        return agg.form.domain
    return Domain.LOG if agg.op in (AggOp.LSE, AggOp.MAX) else Domain.LIN


def _rule(engine: Engine, op, kind: Algebra, values: list[Data]) -> Value:
    domains = {_domain_of(v) for v in values} - {None}
    if kind is Algebra.SELECT:
        return _select(engine, op, values)
    if len(domains) != 1:
        engine.refuse("adds or compares a log-sum-exp with a normalised output or a softmax sum: " + ADVICE, op)
    (domain,) = domains
    xs = [_lift(engine, op, v, domain) for v in values]
    overflow = _overflow_kept(engine, op, kind, xs)
    result = _arith(engine, op, kind, domain, values, xs)
    return result if overflow is None else dataclasses.replace(result, overflow=overflow)


def _overflow_kept(engine: Engine, op, kind: Algebra, xs: list[Value]):
    """The exp op whose possible inf an operand holds, where this op keeps it (a sum of positive weights) or
    None where it ends it (the denominator of a divide, >= 1: 1 / (1 + inf) = 0, sigmoid's limit); any other use
    of an inf is refused at the exp."""
    held = [x.overflow for x in xs if x.overflow is not None]
    if not held:
        return None
    lin = all(x.domain is Domain.LIN for x in xs)
    if lin and kind is Algebra.ADD and all(nonnegative(m) for x in xs for _, m in x.cases):
        return held[0]
    if lin and op.name == "stablehlo.divide" and xs[0].overflow is None and \
            all(at_least_one(m, a) for a, m in xs[1].cases):
        return None
    _refuse_overflow(engine, held[0])


def _arith(engine: Engine, op, kind: Algebra, domain: Domain, values: list[Data], xs: list[Value]) -> Value:
    log, lin = domain is Domain.LOG, domain is Domain.LIN
    name = op.name
    if kind is Algebra.ADD or kind is Algebra.SUBTRACT:
        sign = 1 if kind is Algebra.ADD else -1
        f = (lambda a, b: a.plus(b, sign)) if log else (lambda a, b: add_lin(engine, op, a, negated(b, sign)))
        return apply_cases(engine, op, domain, f, xs, fl.f32_all(np.add if sign > 0 else np.subtract,
                                                                 xs[0].samples, xs[1].samples))
    if kind is Algebra.NEGATE:
        f = (lambda a: a.scaled(-1)) if log else (lambda a: negated(a, -1))
        return apply_cases(engine, op, domain, f, xs, fl.f32_all(np.negative, xs[0].samples))
    if log and kind in (Algebra.MAXIMUM, Algebra.MINIMUM, Algebra.ABS):
        stabiliser.note_lse_split(engine.fns, op)  # cases on the sign of a difference of lses: a kink at its tie
    if log and kind in (Algebra.MAXIMUM, Algebra.MINIMUM):
        return extreme(engine, op, xs, kind is Algebra.MAXIMUM)
    if log and kind is Algebra.ABS:
        return extreme(engine, op, [xs[0], apply_cases(engine, op, domain, lambda a: a.scaled(-1), xs[:1],
                                                   fl.f32_all(np.negative, xs[0].samples))], True,
                       fl.f32_all(np.abs, xs[0].samples))
    if log and kind is Algebra.EXP:
        result = apply_cases(engine, op, Domain.LIN, lambda a: (Mono(1.0, a),), xs, fl.f32_all(np.exp, xs[0].samples))
        bounded = all(at_most_zero(f, a, bounded=True) for a, f in xs[0].cases)
        return result if bounded else dataclasses.replace(result, overflow=op)
    if log and kind is Algebra.LOGISTIC:  # sigmoid(x) = 1 / (1 + exp(-x))
        f = lambda a: reciprocal(engine, op, add_lin(engine, op, (Mono(1.0, ZERO),), (Mono(1.0, a.scaled(-1)),)))
        return apply_cases(engine, op, Domain.LIN, f, xs, fl.f32_all(lambda t: 1 / (1 + np.exp(-t)), xs[0].samples))
    if log and kind is Algebra.SCALE and name == "stablehlo.multiply":
        return _scale_log(engine, op, values, xs)
    if log and kind in (Algebra.COMPARE, Algebra.IS_FINITE):
        return _predicate(engine, op, values, xs)
    if lin and kind is Algebra.LOG:
        _log_floor(engine, op, xs[0], at_least_one, "log")
        return apply_cases(engine, op, Domain.LOG, lambda a: log_of(engine, op, a), xs,
                           fl.f32_all(np.log, xs[0].samples))
    if lin and kind is Algebra.LOG1P:
        f = lambda a: log_of(engine, op, add_lin(engine, op, (Mono(1.0, ZERO),), a))
        _log_floor(engine, op, xs[0], lambda monos, _: nonnegative(monos), "log1p")
        return apply_cases(engine, op, Domain.LOG, f, xs, fl.f32_all(np.log1p, xs[0].samples))
    if lin and kind is Algebra.ABS:  # of a sum of exponentials: itself
        return apply_cases(engine, op, Domain.LIN, lambda a: positive(engine, op, a), xs,
                           fl.f32_all(np.abs, xs[0].samples))
    if lin and kind is Algebra.SCALE:
        divide = name == "stablehlo.divide"
        f = (lambda a, b: times(engine, op, a, reciprocal(engine, op, b))) if divide else \
            (lambda a, b: times(engine, op, a, b))
        return apply_cases(engine, op, Domain.LIN, f, xs, fl.f32_all(np.divide if divide else np.multiply,
                                                                     xs[0].samples, xs[1].samples))
    engine.refuse(f"applies '{name}' to a log-sum-exp or a normalised output, which is not part of an order-free "
                  "merge: " + ADVICE, op)


def _pred(truth: bool, samples: tuple) -> Value:
    return Value(Domain.PRED, ((frozenset(), truth),), samples)


def _refuse_overflow(engine: Engine, op) -> None:
    """exp of a log-domain form is used only where the exponent is <= 0 in every case, as every max-shifted
    spelling has it (exp(lse - lse'), exp(b - max(a, b)), exp(-|d|)), or inside sigmoid; exp(lse - lse_blk)
    overflows to inf where the two are more than ~88 apart (an all-masked block's lse is -1e30), the state turns
    inf and later blocks are lost, at rows and steps the layout picks."""
    engine.refuse("takes exp of a difference of log-sum-exps that can be positive (lse - lse_blk, "
                  "say): where the two are more than ~88 apart (a block whose row is all masked has lse -1e30) it "
                  "overflows to inf, the running lse becomes inf and later blocks are lost, at rows that change "
                  "with the layout; shift by the max, so that every exponent is <= 0: "
                  "jnp.logaddexp(lse, lse_blk), or max(lse, lse_blk) + log1p(exp(-abs(lse - lse_blk)))", op)


def _log_floor(engine: Engine, op, x: Value, floor, name: str) -> None:
    """log of a sum of weights only where it is >= a positive constant (log1p: >= 0) in every case: log of
    sigmoid(x) for an unbounded x underflows to log 0 = -inf, at rows the layout picks."""
    if not all(floor(m, a) for a, m in x.cases):
        engine.refuse(f"takes the {name} of a value that can underflow to 0 (log(sigmoid(x)) for x = "
                      "lse_blk - lse, a sum of exponentials none of which is exp(0) = 1): where the lses are far "
                      "apart (a block whose row is all masked has lse -1e30) it is -inf, at rows that change with "
                      "the layout; shift by the max: jnp.logaddexp(lse, lse_blk), jax.nn.log_sigmoid, or "
                      "m + log(exp(lse - m) + exp(lse_blk - m)) with m = max(lse, lse_blk)", op)


def _scale_log(engine: Engine, op, values: list[Data], xs: list[Value]) -> Value:
    """A log-domain form times an integer constant (2 * max(a, b) - a - b)."""
    numbers = [engine.fns.constant(v.fn) if v.agg is None else None for v in values]
    k = next((n for n in numbers if n is not None), None)
    if k is None or k != int(k):
        engine.refuse("multiplies log-sum-exps: " + ADVICE, op)
    x = xs[1] if numbers[0] is not None else xs[0]
    return apply_cases(engine, op, Domain.LOG, lambda a: a.scaled(int(k)), [x],
                       fl.f32_all(lambda t: t * np.float32(k), x.samples))


def _predicate(engine: Engine, op, values: list[Data], xs: list[Value]) -> Value:
    """isnan(d) (`d != d`) and isneginf(lse) (`lse == -inf`), isfinite(lse): where the state holds a block every
    form is finite, so these are false (isfinite: true); where it is at its start, what the floats say."""
    if op.name == "stablehlo.is_finite":
        return _pred(True, fl.f32_all(np.isfinite, xs[0].samples))
    from jaxlib.mlir.dialects import stablehlo
    direction = stablehlo.ComparisonDirectionAttr(op.attributes["comparison_direction"]).value
    a, b = xs
    if direction == "NE" and a == b:
        return _pred(False, fl.f32_all(np.isnan, a.samples))
    if direction == "EQ" and values[1].agg is None and engine.fns.constant(values[1].fn) == -math.inf:
        return _pred(False, fl.f32_all(np.isneginf, a.samples))
    engine.refuse("compares log-sum-exps (a block's with the running one, say): which side wins, and so what is "
                  "kept, changes with the order blocks come in; " + ADVICE, op)


def _select(engine: Engine, op, values: list[Data]) -> Value:
    cond, a, b = values
    truth = _constant_truth(engine, cond) if cond.agg is None else None
    if truth is not None:  # decided at compile time, the same on every device in every layout
        chosen = a if truth else b
        domain = _domain_of(chosen) or _domain_of(b if truth else a)
        return _lift(engine, op, chosen, domain)
    if cond.agg is None or cond.agg.op != AggOp.LOGSUM or cond.agg.form.domain is not Domain.PRED:
        engine.refuse("selects between log-sum-exps or normalised outputs by something other than the merge's "
                      "own start (where(isneginf(lse), block, merged)) or the ring's first step "
                      "(where(i == 0, block, merged)): what is kept changes with the layout; " + ADVICE, op)
    pred = cond.agg.form
    domain = _domain_of(a) or _domain_of(b)
    x, y = _lift(engine, op, a, domain), _lift(engine, op, b, domain)
    for held in (pred.overflow, x.overflow, y.overflow):
        if held is not None:
            _refuse_overflow(engine, held)
    chosen = x if pred.single() else y  # where the state holds a block
    samples = fl.f32_all(lambda p, u, w: u if p else w, pred.samples, x.samples, y.samples)
    return dataclasses.replace(chosen, samples=samples)


def _constant_truth(engine: Engine, cond: Data) -> bool | None:
    """A comparison or finiteness test of constants (a guard on a state that is still its constant start, as a
    loop's first pass or an unrolled ring's first step sees it): its truth, or None."""
    key = engine.fns.keys[cond.fn]
    if not (isinstance(key, tuple) and len(key) == 4 and key[0] == "ew"):
        return None
    numbers = [engine.fns.constant(f) for f in key[3]]
    if None in numbers:
        return None
    xs = [np.float32(n) for n in numbers]
    if key[1] == "stablehlo.is_finite":
        return bool(np.isfinite(xs[0]))
    tests = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
             "GE": np.greater_equal}
    if key[1] == "stablehlo.compare" and key[2] in tests:
        return bool(tests[key[2]](*xs))
    return None


# ---------------------------------------------------------------------------------------------------------------
# Back to aggregates.


def _canonical(engine: Engine, op, value: Value, home, score: int) -> Agg:
    """lse(C) and out(C) as the LSE and NSUM aggregates the loop carries; anything else as an intermediate. An
    aggregate whose float computation where the state is at its start is not its exact value is marked."""
    x = value.single()
    agg = None
    if value.domain is Domain.LOG and x is not None and x.const == 0 and len(x.terms) == 1 and \
            x.terms[0][1] == 1 and x.terms[0][0].kind is Kind.LSE:
        atom = x.terms[0][0]
        agg = Agg(AggOp.LSE, home, 0, atom.cov, score, start=atom.start)
    if value.domain is Domain.LIN and x is not None and len(x) == 1 and x[0].term is not None and x[0].coef == 1:
        m = x[0]
        if len(m.exp.terms) == 1 and m.exp.const == 0 and m.exp.terms[0][1] == -1:
            atom = m.exp.terms[0][0]
            if atom.kind is Kind.LSE and same_keys(atom.cov, m.cov):
                agg = Agg(AggOp.NSUM, home, m.term, atom.cov, score, start=atom.start)
    if agg is None:
        made = value if value.made_at is not None else dataclasses.replace(value, made_at=op)
        return Agg(AggOp.LOGSUM, home, 0, EMPTY, score, form=made)
    if value.overflow is not None:
        _refuse_overflow(engine, value.overflow)
    keys = [k for k, _ in value.samples if not fl.is_normal(k)]
    bad = {k for k, x in exact_samples(value, keys) if not fl.same_number(fl.at(value.samples, k), x)}
    return dataclasses.replace(agg, nan=bool(bad & set(fl.START_KEYS)), masked=bool(bad - set(fl.START_KEYS)))


def _canonical_covs(engine: Engine, value: Value) -> Value:
    """`value` with each coverage unknown replaced by its representative."""
    def atom(a: Atom) -> Atom:
        return Atom(a.kind, engine.canonical_cov(a.cov), a.start)

    def form(f: Form) -> Form:
        return Form(tuple(sorted(((atom(a), c) for a, c in f.terms), key=lambda t: t[0].key())), f.const)

    def result(x):
        if value.domain is Domain.LOG:
            return form(x)
        if value.domain is Domain.LIN:
            return tuple(Mono(m.coef, form(m.exp), m.term, None if m.cov is None else engine.canonical_cov(m.cov))
                         for m in x)
        return x

    cases = tuple((frozenset((form(d), sign) for d, sign in a), result(x)) for a, x in value.cases)
    return dataclasses.replace(value, cases=cases)


def _covs(value: Value) -> list[Coverage]:
    out = []
    for a, x in value.cases:
        forms = [d for d, _ in a] + ([x] if value.domain is Domain.LOG else
                                     [m.exp for m in x] if value.domain is Domain.LIN else [])
        out += [atom.cov for f in forms for atom, _ in f.terms]
        if value.domain is Domain.LIN:
            out += [m.cov for m in x if m.cov is not None]
    return out


def _alias_states(engine: Engine, op, bases: list[Data]) -> None:
    """The running lse and the running output of one merge are carried in separate slots, each with its own
    unknown coverage: two such unknowns met in one op are taken to be the same blocks, and checked to be once the
    loop's recurrences are solved (a merge of two states of different blocks is refused then)."""
    covs = []
    for v in bases:
        if v.agg.op in (AggOp.LSE, AggOp.NSUM):
            covs.append(engine.canonical_cov(v.agg.cov))
        elif v.agg.op == AggOp.LOGSUM:
            covs += [engine.canonical_cov(c) for c in _covs(v.agg.form)]
    by_loop: dict = {}
    for p in {p for c in covs for p in c.parts if isinstance(p, CoverageVar)}:
        by_loop.setdefault(p.family(), []).append(p)
    for unknowns in by_loop.values():
        unknowns.sort(key=str)
        for other in unknowns[1:]:
            same_cov(engine, op, Coverage((unknowns[0],)), Coverage((other,)),
                     "merges a running output and a running log-sum-exp of different blocks")


def refuse_carried_hard_max(engine: Engine, agg: Agg) -> None:
    """A loop that carries the max of the running lse and a block's as its lse, refused at that max (the output
    merge that reads it next is not what is wrong)."""
    if agg.op == AggOp.LOGSUM and agg.form.hard_max() and agg.form.made_at is not None:
        engine.refuse("keeps the larger of two log-sum-exps as the running lse (a hard max): the lse of the blocks "
                      "merged is log(exp(lse) + exp(lse_blk)), which the max undercounts by up to log 2 per merge, "
                      "and by how much depends on the order the blocks come in, which changes with the layout; "
                      "use lse' = jnp.logaddexp(lse, lse_blk)", agg.form.made_at)


def carried_start_refusal(agg: Agg) -> str | None:
    """Why a loop may not carry this merge state, or None."""
    if agg.op in (AggOp.LSE, AggOp.NSUM) and agg.nan:
        start = "" if agg.start is None else f" (lse starts at {agg.start:g})"
        return ("merges the first block into a state still at its start" + start + " in a way whose floating-point "
                "result is not the block's (lse - log_sigmoid(lse - lse_blk) cancels a start of -1e30 to 0, rounds "
                "one of -1e4 by 1e-3, or is -inf - -inf = nan): which step a row first meets a block changes with "
                "the layout where blocks are skipped, and the start's error stays in the result; merge with lse' = "
                "jnp.logaddexp(lse, lse_blk), exact from any start; the state taken from the own block before the "
                "loop (as ring-flash-attention does), a guard (where(isneginf(lse), block, merged)) or a step-0 reset "
                "does only where the scores are never masked")
    if agg.op in (AggOp.LSE, AggOp.NSUM) and agg.masked:
        return ("merges blocks in a way whose floating-point result is not the log-sum-exp where a row's keys are all "
                "masked (lse -1e30 + log n): lse - log_sigmoid(lse - lse_blk) is -1e30 + 1e30 = 0 where the state "
                "holds only such keys (a block taken as the state by where(i == 0, block, merged) or "
                "where(isneginf(lse), block, merged), a block computed before the loop, or a fold that starts from "
                "a block), and which rows meet an all-masked block first changes with the layout; merge with lse' = jnp.logaddexp(lse, lse_blk) and "
                "out' = out * exp(lse - lse') + out_blk * exp(lse_blk - lse'), exact wherever either side is masked")
    if agg.op == AggOp.LOGSUM:
        return ("carries a merge state that is not the log-sum-exp and the normalised output of the blocks merged so "
                "far (a decayed or averaged output, lses added, the latest block kept): it depends on the order the "
                "blocks come in, which changes with the layout; " + ADVICE)
    return None
