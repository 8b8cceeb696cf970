"""The log-sum-exp merge of flash-attention style ring kernels, accepted by its algebra.

Such a kernel keeps, per query row t, a normalised output and a log-sum-exp, and merges each block's pair into them:
for a set C of keys (the blocks folded in), lse(C) = log sum_{s in C} exp(score(t, s)) and
out(C) = sum_{s in C} exp(score(t, s) - lse(C)) v(s). Both are functions of the set C alone, so a fold whose
every step computes (out(A u B), lse(A u B)) from (out(A), lse(A)) and (out(B), lse(B)) is order-free, however
it is spelled: logaddexp, `m + log(exp(a - m) + exp(b - m))`, the sigmoid form, softplus. The rules below evaluate
what each op computes in exact arithmetic, in two domains:

- `Form`, the log domain: an affine combination of atoms, each the lse (or the running max) of one set of keys;
- `Lin`, the linear domain: a sum of monomials c * exp(F) * S, F a Form and S a sum over a set of keys of
  exp(score) * term (no S: exp(F) alone, a weight).

They rest on two identities of sums over disjoint sets, exp(lse(A)) + exp(lse(B)) = exp(lse(A u B)) and
exp(lse(A u B)) - exp(lse(B)) = exp(lse(A)), and on case analysis for max, min and abs (max(x, y) is x where
x - y >= 0, y elsewhere): a value is kept as one result per case, and is a function of the sets as soon as every
case gives the same. Nothing is matched by its spelling; a merge that is not order-free (a decayed output, a weight
read from the step counter, the latest block kept, lses added) never reaches the canonical (out(C), lse(C)) the
loop's recurrence asks for, and is refused.

Exact arithmetic is what every proof here assumes; the one place floats part from it is the state's start: a state
started at lse = -inf (or a sentinel like -1e30) meets `lse - log_sigmoid(lse - lse_blk)` as -inf - -inf (or
cancels to 0), at the first merge a row sees, which a skip can make a different step in each layout. So every value
also carries `at_start`, what its float computation gives (numpy float32, on sample numbers for the blocks) where the
state is still at its start; a canonical result whose `at_start` is not its exact value there is marked (Agg.nan),
and only a guard on the start (`where(isneginf(lse), block, merged)`) may read it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import zlib
from dataclasses import dataclass

import numpy as np

from .algebra import aligned, match_home, same_cov, union_cov, unify, with_agg
from .analysis import Engine
from .dims import shape
from .finite import may_be_infinite
from .optable import Algebra, info
from .values import CONST, EMPTY, Agg, AggOp, Cells, Coverage, CoverageVar, Data

_STATE = (AggOp.LSE, AggOp.NSUM, AggOp.LOGSUM)
_LIFTED = (AggOp.MAX, AggOp.SSUM, AggOp.SHIFT) + _STATE
_ADVICE = ("merge each block as lse' = logaddexp(lse, lse_blk); out' = out * exp(lse - lse') + out_blk * "
           "exp(lse_blk - lse') (or its sigmoid form), which depends only on the blocks merged, not their order")


class Kind(enum.Enum):
    LSE = "lse"
    MAX = "max"


@dataclass(frozen=True)
class Atom:
    """lse (or max) of `score` over the keys of `cov`, with a start pseudo-token of score `start` (None: none)."""

    kind: Kind
    cov: Coverage
    start: float | None = None

    def __post_init__(self) -> None:
        # one order of parts for one set of keys: the state's unknown coverage first (a loop's recurrence reads
        # what a step adds after it), then the blocks
        parts = sorted(self.cov.parts, key=lambda p: (not isinstance(p, CoverageVar), str(p)))
        object.__setattr__(self, "cov", Coverage(tuple(parts)))

    def key(self) -> tuple:
        return self.kind.value, tuple(sorted(map(str, self.cov.parts))), repr(self.start)

    def __str__(self) -> str:
        return f"{self.kind.value}({self.cov}{'' if self.start is None else f' + start {self.start}'})"


@dataclass(frozen=True)
class Form:
    """sum of coefficient * atom, plus const: a number per query row in the log domain."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: float = 0.0

    @staticmethod
    def of(atom: Atom) -> "Form":
        return Form(((atom, 1),))

    def plus(self, other: "Form", scale: int = 1) -> "Form":
        acc: dict = {}
        for atom, c in self.terms + tuple((a, c * scale) for a, c in other.terms):
            old = acc.get(atom.key(), (atom, 0))
            acc[atom.key()] = (old[0], old[1] + c)
        terms = tuple(sorted(((a, c) for a, c in acc.values() if c), key=lambda t: t[0].key()))
        return Form(terms, self.const + scale * other.const)

    def scaled(self, k: int) -> "Form":
        return Form(tuple((a, c * k) for a, c in self.terms), self.const * k)

    def oriented(self) -> tuple["Form", bool]:
        """(±self, whether negated): one sign for x - y and y - x, the key of the case x >= y."""
        if self.terms and self.terms[0][1] < 0 or (not self.terms and self.const < 0):
            return self.scaled(-1), True
        return self, False


ZERO = Form()


@dataclass(frozen=True)
class Mono:
    """coef * exp(exp) * sum over `cov` of exp(score) * term (term None: exp(exp) alone)."""

    coef: float
    exp: Form
    term: int | None = None
    cov: Coverage | None = None


class Domain(enum.Enum):
    LOG = "log"
    LIN = "lin"
    PRED = "pred"


@dataclass(frozen=True)
class Value:
    """A LOGSUM aggregate's value: one result per case (an assignment of signs to differences of forms), each a
    Form (LOG), a tuple of Monos (LIN) or a truth value where the state holds a block (PRED); `at_start`: what its
    float computation gives where the state is at its start (NaN: not a number there)."""

    domain: Domain
    cases: tuple[tuple[frozenset, object], ...]
    at_start: float

    def single(self):
        return self.cases[0][1] if len(self.cases) == 1 else None


def applies(op, values: list[Data]) -> bool:
    """Whether this op's operands are in logsum's terms: one is an lse, a normalised output or an intermediate of
    a merge, or the op takes the log of a softmax sum or divides two."""
    aggs = [v.agg.op for v in values if v.agg is not None]
    if any(a in _STATE for a in aggs) or any(v.agg.op == AggOp.SSUM and v.agg.by_lse for v in values
                                             if v.agg is not None):
        return True
    kind = info(op.name).algebra
    if kind in (Algebra.LOG, Algebra.LOG1P, Algebra.ABS) and AggOp.SSUM in aggs:
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
                          "(a weight read from the ring step, a per-token factor): " + _ADVICE, op)
        if domain is Domain.LIN:
            return _const(Domain.LIN, () if number == 0 else (Mono(number, ZERO),), number)
        if number == -math.inf:  # log 0: the lse of no keys (a state started at -inf)
            return _const(Domain.LOG, Form.of(Atom(Kind.LSE, EMPTY)), number)
        return _const(Domain.LOG, Form((), number), number)
    cov = engine.canonical_cov(agg.cov)
    if agg.op == AggOp.LOGSUM:
        return _canonical_covs(engine, agg.form)
    if agg.op == AggOp.LSE:
        result = _const(Domain.LOG, Form.of(Atom(Kind.LSE, cov, agg.start)), 0.0)
    elif agg.op == AggOp.NSUM:
        lse = Atom(Kind.LSE, cov, agg.start)
        result = _const(Domain.LIN, (Mono(1.0, Form.of(lse).scaled(-1), agg.term, cov),), 0.0)
    elif agg.op == AggOp.MAX:
        result = _const(Domain.LOG, Form.of(Atom(Kind.MAX, cov)), 0.0)
    elif agg.op == AggOp.SSUM:
        shift_cov = engine.canonical_cov(agg.shift_cov)
        shift = Form.of(Atom(Kind.LSE, shift_cov, agg.start) if agg.by_lse else Atom(Kind.MAX, shift_cov)).scaled(-1)
        result = _const(Domain.LIN, (_mono(engine, 1.0, shift, agg.term, cov),), 0.0)
    elif agg.op == AggOp.SHIFT:
        f = Form.of(Atom(Kind.MAX, cov)).plus(Form.of(Atom(Kind.MAX, engine.canonical_cov(agg.shift_cov))), -1)
        result = _const(Domain.LIN, (Mono(1.0, f),), 0.0)
    else:
        engine.refuse(f"combines a log-sum-exp with a partial result of another kind ({agg.op}): " + _ADVICE, op)
    sample = _eval(result, result.cases[0][1])
    return dataclasses.replace(result, at_start=math.nan if agg.nan else sample)


def _const(domain: Domain, x, at_start: float) -> Value:
    return Value(domain, ((frozenset(), x),), at_start)


def _mono(engine: Engine, coef: float, exp: Form, term: int, cov: Coverage) -> Mono:
    """A sum of exp(score) * term; of term 1, exp(lse(cov)) itself."""
    if engine.fns.constant(term) == 1.0:
        return Mono(coef, exp.plus(Form.of(Atom(Kind.LSE, cov))))
    return Mono(coef, exp, term, cov)


# ---------------------------------------------------------------------------------------------------------------
# Sample numbers: the float computation where the state is at its start.


def _sample(*key) -> float:
    return (zlib.crc32(repr(key).encode()) % 1000) / 500.0 - 1.0


def _atom_sample(atom: Atom) -> float:
    """The atom where the state is at its start: its blocks only (an unknown coverage, the state's, holds none
    yet), and the start pseudo-token."""
    parts = [p for p in atom.cov.parts if not isinstance(p, CoverageVar)]
    if atom.kind is Kind.MAX:
        return max((_sample("max", str(p)) for p in parts), default=-math.inf)
    xs = [_sample("lse", str(p)) for p in parts] + ([atom.start] if atom.start is not None else [])
    return float(np.logaddexp.reduce(np.array(xs, np.float64))) if xs else -math.inf


def _form_sample(f: Form) -> float:
    with np.errstate(all="ignore"):
        return float(sum((c * _atom_sample(a) for a, c in f.terms), np.float64(f.const)))


def _mono_sample(m: Mono) -> float:
    with np.errstate(all="ignore"):
        scale = m.coef * np.exp(np.float64(_form_sample(m.exp)))
        if m.term is None:
            return float(scale)
        parts = [p for p in m.cov.parts if not isinstance(p, CoverageVar)]
        total = sum((np.exp(_sample("lse", str(p))) * _sample("term", m.term, str(p)) for p in parts),
                    np.float64(0.0))
        return float(scale * total) if parts else 0.0


def _eval(value: Value, x) -> float:
    if value.domain is Domain.LOG:
        return _form_sample(x)
    if value.domain is Domain.LIN:
        return float(sum((_mono_sample(m) for m in x), 0.0))
    return float(x)


def _case_sample(value: Value) -> float:
    """The exact value at the samples: the case the samples fall in."""
    for assignment, x in value.cases:
        if all((_form_sample(d) >= 0) == sign for d, sign in assignment):
            return _eval(value, x)
    return _eval(value, value.cases[0][1])


def _same_number(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return False
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= 1e-3 * (1.0 + abs(b))


def _f32(fn, *xs) -> float:
    with np.errstate(all="ignore"):
        return float(fn(*(np.float32(x) for x in xs)))


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
    if x.agg is not None or m.agg is None or m.agg.op != AggOp.LSE or m.agg.score != x.fn:
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
        engine.refuse("adds or compares a log-sum-exp with a normalised output or a softmax sum: " + _ADVICE, op)
    (domain,) = domains
    xs = [_lift(engine, op, v, domain) for v in values]
    log, lin = domain is Domain.LOG, domain is Domain.LIN
    name = op.name
    if kind is Algebra.ADD or kind is Algebra.SUBTRACT:
        sign = 1 if kind is Algebra.ADD else -1
        f = (lambda a, b: a.plus(b, sign)) if log else (lambda a, b: _add_lin(engine, op, a, _neg(b, sign)))
        return _apply(engine, op, domain, f, xs, _f32(np.add if sign > 0 else np.subtract, xs[0].at_start,
                                                      xs[1].at_start))
    if kind is Algebra.NEGATE:
        f = (lambda a: a.scaled(-1)) if log else (lambda a: _neg(a, -1))
        return _apply(engine, op, domain, f, xs, -xs[0].at_start)
    if log and kind in (Algebra.MAXIMUM, Algebra.MINIMUM):
        return _extreme(engine, op, xs, kind is Algebra.MAXIMUM)
    if log and kind is Algebra.ABS:
        return _extreme(engine, op, [xs[0], _apply(engine, op, domain, lambda a: a.scaled(-1), xs[:1],
                                                   -xs[0].at_start)], True, _f32(np.abs, xs[0].at_start))
    if log and kind is Algebra.EXP:
        return _apply(engine, op, Domain.LIN, lambda a: (Mono(1.0, a),), xs, _f32(np.exp, xs[0].at_start))
    if log and kind is Algebra.LOGISTIC:  # sigmoid(x) = 1 / (1 + exp(-x))
        f = lambda a: _reciprocal(engine, op, _add_lin(engine, op, (Mono(1.0, ZERO),), (Mono(1.0, a.scaled(-1)),)))
        return _apply(engine, op, Domain.LIN, f, xs, _f32(lambda t: 1 / (1 + np.exp(-t)), xs[0].at_start))
    if log and kind is Algebra.SCALE and name == "stablehlo.multiply":
        return _scale_log(engine, op, values, xs)
    if log and kind in (Algebra.COMPARE, Algebra.IS_FINITE):
        return _predicate(engine, op, values, xs)
    if lin and kind is Algebra.LOG:
        return _apply(engine, op, Domain.LOG, lambda a: _log(engine, op, a), xs, _f32(np.log, xs[0].at_start))
    if lin and kind is Algebra.LOG1P:
        f = lambda a: _log(engine, op, _add_lin(engine, op, (Mono(1.0, ZERO),), a))
        return _apply(engine, op, Domain.LOG, f, xs, _f32(np.log1p, xs[0].at_start))
    if lin and kind is Algebra.ABS:  # of a sum of exponentials: itself
        return _apply(engine, op, Domain.LIN, lambda a: _positive(engine, op, a), xs, _f32(np.abs, xs[0].at_start))
    if lin and kind is Algebra.SCALE:
        divide = name == "stablehlo.divide"
        f = (lambda a, b: _times(engine, op, a, _reciprocal(engine, op, b))) if divide else \
            (lambda a, b: _times(engine, op, a, b))
        return _apply(engine, op, Domain.LIN, f, xs, _f32(np.divide if divide else np.multiply, xs[0].at_start,
                                                          xs[1].at_start))
    engine.refuse(f"applies '{name}' to a log-sum-exp or a normalised output, which is not part of an order-free "
                  "merge: " + _ADVICE, op)


def _apply(engine: Engine, op, domain: Domain, f, xs: list[Value], at_start: float) -> Value:
    """f on each consistent combination of the operands' cases."""
    combos = [(frozenset(), [])]
    for x in xs:
        combos = [(a | b, args + [y]) for a, args in combos for b, y in x.cases if _consistent(a | b)]
    return _collapse(Value(domain, tuple((a, f(*args)) for a, args in combos), at_start))


def _consistent(assignment: frozenset) -> bool:
    return len({d for d, _ in assignment}) == len(assignment)


def _collapse(value: Value) -> Value:
    results = {repr(x) for _, x in value.cases}
    if len(results) == 1:
        return dataclasses.replace(value, cases=((frozenset(), value.cases[0][1]),))
    return value


def _extreme(engine: Engine, op, xs: list[Value], largest: bool, at_start: float | None = None) -> Value:
    """max or min of two forms: x where x - y >= 0 (for max), y elsewhere, both cases kept."""
    if at_start is None:
        at_start = _f32(np.maximum if largest else np.minimum, xs[0].at_start, xs[1].at_start)
    cases = []
    for a, x in xs[0].cases:
        for b, y in xs[1].cases:
            if not _consistent(a | b):
                continue
            d, flipped = _key(x.plus(y, -1))
            if not d.terms:
                cases.append((a | b, x if ((d.const >= 0) != flipped) == largest else y))
                continue
            for sign in (True, False):
                assignment = a | b | {(d, sign)}
                if _consistent(assignment):
                    cases.append((assignment, x if (sign != flipped) == largest else y))
    return _collapse(Value(Domain.LOG, tuple(cases), at_start))


def _key(d: Form) -> tuple[Form, bool]:
    """The case variable of the sign of d: d oriented and divided by the gcd of its coefficients (x - y, y - x and
    2x - 2y have one), and whether it was negated."""
    d, flipped = d.oriented()
    g = math.gcd(*(abs(c) for _, c in d.terms)) if d.terms else 1
    if g > 1:
        d = Form(tuple((a, c // g) for a, c in d.terms), d.const / g)
    return d, flipped


def _neg(monos: tuple, sign: int) -> tuple:
    return monos if sign > 0 else tuple(dataclasses.replace(m, coef=-m.coef) for m in monos)


def _add_lin(engine: Engine, op, a: tuple, b: tuple) -> tuple:
    """a + b, like monomials combined by the identities of sums over disjoint sets."""
    monos = list(a) + list(b)
    changed = True
    while changed:
        changed = False
        for i in range(len(monos)):
            for j in range(i + 1, len(monos)):
                merged = _merge_monos(engine, op, monos[i], monos[j])
                if merged is not None:
                    monos = [m for k, m in enumerate(monos) if k not in (i, j)] + ([merged] if merged.coef else [])
                    changed = True
                    break
            if changed:
                break
    return tuple(monos)


def _merge_monos(engine: Engine, op, m: Mono, n: Mono) -> Mono | None:
    if m.term != n.term:
        return None
    if m.term is not None and not _same_cov(m.cov, n.cov):
        # c exp(F) S(C1) + c exp(F) S(C2) = c exp(F) S(C1 u C2), C1, C2 disjoint
        if m.exp == n.exp and m.coef == n.coef and not _shares(m.cov, n.cov):
            return Mono(m.coef, m.exp, m.term, union_cov(engine, op, m.cov, n.cov))
        return None
    # one sum (or none) times two weights: the weights combined
    if m.exp == n.exp:
        return Mono(m.coef + n.coef, m.exp, m.term, m.cov)
    if m.coef == n.coef:  # exp(F + lse(C1)) + exp(F + lse(C2)) = exp(F + lse(C1 u C2)), C1, C2 disjoint
        pair = _two_lses(m.exp.plus(n.exp, -1))
        if pair is not None and _disjoint(pair[0], pair[1]):
            c1, c2 = pair
            union = Atom(Kind.LSE, union_cov(engine, op, c1.cov, c2.cov), _starts(c1.start, c2.start))
            return Mono(m.coef, n.exp.plus(_lse_form(c2), -1).plus(_lse_form(union)), m.term, m.cov)
    if m.coef == -n.coef:  # exp(F + lse(C)) - exp(F + lse(C2)) = exp(F + lse(C \ C2)), C2 within C
        pos, neg = (m, n) if m.coef > 0 else (n, m)
        pair = _two_lses(pos.exp.plus(neg.exp, -1))
        if pair is not None:
            rest = _minus(pair[0], pair[1])
            if rest is not None:
                return Mono(pos.coef, neg.exp.plus(_lse_form(pair[1]), -1).plus(_lse_form(rest)), m.term, m.cov)
    return None


def _two_lses(d: Form) -> tuple[Atom, Atom] | None:
    """(C1, C2) where d = lse(C1) - lse(C2); a constant c on either side is the lse of a pseudo-token of score c
    (exp(c) + exp(lse(C)) is the lse of C and that token: a state's start, or the 1 of 1 + exp(x))."""
    if any(a.kind is not Kind.LSE for a, _ in d.terms) or any(c not in (1, -1) for _, c in d.terms):
        return None
    pos = [a for a, c in d.terms if c == 1]
    neg = [a for a, c in d.terms if c == -1]
    if len(pos) > 1 or len(neg) > 1 or not (pos or neg) or math.isnan(d.const) or math.isinf(d.const):
        return None
    if pos and neg:
        return (pos[0], neg[0]) if d.const == 0 else None
    if pos:
        return (pos[0], Atom(Kind.LSE, EMPTY, -d.const)) if pos[0].start is None else None
    return (Atom(Kind.LSE, EMPTY, d.const), neg[0]) if neg[0].start is None else None


def _lse_form(atom: Atom) -> Form:
    """The form of an lse atom: a pseudo-token alone is its score, a constant."""
    return Form((), atom.start) if not atom.cov.parts and atom.start is not None else Form.of(atom)


def _parts(cov: Coverage) -> set:
    return set(map(str, cov.parts))


def _shares(a: Coverage, b: Coverage) -> bool:
    return bool(_parts(a) & _parts(b))


def _same_cov(a: Coverage, b: Coverage) -> bool:
    return sorted(map(str, a.parts)) == sorted(map(str, b.parts))


def _disjoint(a: Atom, b: Atom) -> bool:
    return not _shares(a.cov, b.cov) and (a.start is None or b.start is None)


def _starts(a: float | None, b: float | None) -> float | None:
    return a if b is None else b


def _minus(whole: Atom, part: Atom) -> Atom | None:
    """The atom of the keys of `whole` not in `part`, where `part` is made of some of `whole`'s parts."""
    if not _parts(part.cov) <= _parts(whole.cov) or (part.start is not None and part.start != whole.start):
        return None
    names = _parts(part.cov)
    rest = Coverage(tuple(p for p in whole.cov.parts if str(p) not in names))
    start = whole.start if part.start is None else None
    if not rest.parts and start is None:
        return None
    return Atom(Kind.LSE, rest, start)


def _times(engine: Engine, op, a: tuple, b: tuple) -> tuple:
    """a * b, where one side is weights alone (no sums of terms) or a constant."""
    if any(m.term is not None for m in a) and any(m.term is not None for m in b):
        engine.refuse("multiplies two softmax-weighted sums: " + _ADVICE, op)
    sums, weights = (a, b) if any(m.term is not None for m in a) else (b, a)
    if any(m.term is not None for m in sums) and len(weights) == 1 and not weights[0].exp.terms and \
            weights[0].coef not in (1.0, -1.0):
        engine.refuse(f"weights a normalised output by the constant {weights[0].coef:g} (a decayed or averaged "
                      "merge): later blocks weigh differently from earlier ones, and which blocks come later changes "
                      "with the layout; " + _ADVICE, op)
    out: tuple = ()
    for w in weights:
        out = _add_lin(engine, op, out, tuple(dataclasses.replace(m, coef=m.coef * w.coef, exp=m.exp.plus(w.exp))
                                              for m in sums))
    return out


def _reciprocal(engine: Engine, op, a: tuple) -> tuple:
    if len(a) != 1 or a[0].term is not None or a[0].coef == 0:
        engine.refuse("divides by a sum of weights that is not one log-sum-exp: " + _ADVICE, op)
    (m,) = a
    return (Mono(1.0 / m.coef, m.exp.scaled(-1)),)


def _log(engine: Engine, op, a: tuple) -> Form:
    if len(a) != 1 or a[0].term is not None or a[0].coef <= 0:
        engine.refuse("takes the log of a sum that is not one log-sum-exp (a sum of different terms, or lses "
                      "over overlapping blocks): " + _ADVICE, op)
    return a[0].exp.plus(Form((), math.log(a[0].coef)))


def _positive(engine: Engine, op, a: tuple) -> tuple:
    if all(m.term is None and m.coef > 0 for m in a):
        return a
    engine.refuse("takes the absolute value of a softmax-weighted sum", op)


def _scale_log(engine: Engine, op, values: list[Data], xs: list[Value]) -> Value:
    """A log-domain form times an integer constant (2 * max(a, b) - a - b)."""
    numbers = [engine.fns.constant(v.fn) if v.agg is None else None for v in values]
    k = next((n for n in numbers if n is not None), None)
    if k is None or k != int(k):
        engine.refuse("multiplies log-sum-exps: " + _ADVICE, op)
    x = xs[1] if numbers[0] is not None else xs[0]
    return _apply(engine, op, Domain.LOG, lambda a: a.scaled(int(k)), [x], _f32(np.multiply, x.at_start, k))


def _predicate(engine: Engine, op, values: list[Data], xs: list[Value]) -> Value:
    """isnan(d) (`d != d`) and isneginf(lse) (`lse == -inf`), isfinite(lse): where the state holds a block every
    form is finite, so these are false (isfinite: true); where it is at its start, what the floats say."""
    if op.name == "stablehlo.is_finite":
        return _const(Domain.PRED, True, float(np.isfinite(np.float32(xs[0].at_start))))
    from jaxlib.mlir.dialects import stablehlo
    direction = stablehlo.ComparisonDirectionAttr(op.attributes["comparison_direction"]).value
    a, b = xs
    if direction == "NE" and a == b:
        return _const(Domain.PRED, False, float(math.isnan(a.at_start)))
    if direction == "EQ" and values[1].agg is None and engine.fns.constant(values[1].fn) == -math.inf:
        return _const(Domain.PRED, False, float(a.at_start == -math.inf))
    engine.refuse("compares log-sum-exps (a block's with the running one, say): which side wins, and so what is "
                  "kept, changes with the order blocks come in; " + _ADVICE, op)


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
                      "(where(i == 0, block, merged)): what is kept changes with the layout; " + _ADVICE, op)
    pred = cond.agg.form
    domain = _domain_of(a) or _domain_of(b)
    x, y = _lift(engine, op, a, domain), _lift(engine, op, b, domain)
    chosen = x if pred.single() else y  # where the state holds a block
    at_start = x.at_start if pred.at_start else y.at_start
    return dataclasses.replace(chosen, at_start=at_start)


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
            if atom.kind is Kind.LSE and _same_cov(atom.cov, m.cov):
                agg = Agg(AggOp.NSUM, home, m.term, atom.cov, score, start=atom.start)
    if agg is None:
        return Agg(AggOp.LOGSUM, home, 0, EMPTY, score, form=value)
    exact = _case_sample(value)
    return dataclasses.replace(agg, nan=not _same_number(value.at_start, exact))


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
        by_loop.setdefault(p.name.rsplit("_", 1)[0], []).append(p)  # loops.py names them cv<loop>_<slot>
    for unknowns in by_loop.values():
        unknowns.sort(key=str)
        for other in unknowns[1:]:
            same_cov(engine, op, Coverage((unknowns[0],)), Coverage((other,)),
                     "merges a running output and a running log-sum-exp of different blocks")


def carried_start_refusal(agg: Agg) -> str | None:
    """Why a loop may not carry this merge state, or None."""
    if agg.op in (AggOp.LSE, AggOp.NSUM) and agg.nan:
        start = "" if agg.start is None else f" (lse starts at {agg.start:g})"
        return ("merges the first block into a state still at its start" + start + " in a way whose floating-point "
                "result is not the block's (lse - log_sigmoid(lse - lse_blk) cancels a start of -1e30 to 0, or is "
                "-inf - -inf = nan): which step a row first meets a block changes with the layout where blocks are "
                "skipped, and the start's error stays in the result; take the state from the first block "
                "(where(i == 0, block, merged), or the first block before the loop), or start lse at -inf and guard "
                "the merge, where(isneginf(lse), block, merged)")
    if agg.op == AggOp.LOGSUM:
        return ("carries a merge state that is not the log-sum-exp and the normalised output of the blocks merged so "
                "far (a decayed or averaged output, lses added, the latest block kept): it depends on the order the "
                "blocks come in, which changes with the layout; " + _ADVICE)
    return None


