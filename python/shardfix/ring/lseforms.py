"""The domain of logsum.py: what a log-sum-exp merge computes, in exact arithmetic, per query row t.

For a set C of keys (blocks), lse(C) = log sum_{s in C} exp(score(t, s)). Values are kept in two domains:

- `Form`, the log domain: an affine combination of atoms, each the lse (or the running max) of one set of keys,
  plus a constant;
- `Lin`, the linear domain (a tuple of `Mono`s): a sum of monomials c * exp(F) * S, F a Form and S a sum over a set
  of keys of exp(score) * term (no S: exp(F) alone, a weight).

Sums of monomials are simplified by two identities of sums over disjoint sets, exp(lse(A)) + exp(lse(B)) =
exp(lse(A u B)) and exp(lse(A u B)) - exp(lse(B)) = exp(lse(A)) (a constant c on either side being the lse of a
pseudo-token of score c); max, min and abs are kept by case (max(x, y) is x where x - y >= 0, y elsewhere), one
result per case, collapsed as soon as every case gives the same. `Value.samples` carries what the float
computation gives in lsefloats.py's scenarios (the state at its start, a row of masked keys alone), checked
against the exact value there (`exact_sample`); `at_most_zero` proves an exponent cannot overflow.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass

import numpy as np

from . import lsefloats as fl
from .algebra import union_cov
from .analysis import Engine
from .values import EMPTY, Coverage, CoverageVar

ADVICE = ("merge each block as lse' = logaddexp(lse, lse_blk); out' = out * exp(lse - lse') + out_blk * "
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
    Form (LOG), a tuple of Monos (LIN) or a truth value where the state holds a block (PRED); `samples`: what its
    float computation gives in each of lsefloats.py's scenarios (NaN: not a number there)."""

    domain: Domain
    cases: tuple[tuple[frozenset, object], ...]
    samples: tuple
    # an exp (its op) whose exponent can be positive, so the value can be inf: fine only where it ends as the
    # denominator of 1 / (1 + exp(-x)), the way sigmoid lowers
    overflow: object = dataclasses.field(default=None, compare=False, repr=False)
    made_at: object = dataclasses.field(default=None, compare=False, repr=False)  # the op that made it (LOGSUM)

    def hard_max(self) -> bool:
        """Whether it is the max (or min) of log-sum-exps (or of one and a constant start): in each case one of
        them, whole."""
        return self.domain is Domain.LOG and len(self.cases) > 1 and all(
            not x.terms or x.const == 0 and len(x.terms) == 1 and x.terms[0][1] == 1 and
            x.terms[0][0].kind is Kind.LSE for _, x in self.cases) and any(x.terms for _, x in self.cases)

    def single(self):
        return self.cases[0][1] if len(self.cases) == 1 else None


# ---------------------------------------------------------------------------------------------------------------
# Sample numbers (lsefloats.py has the scenarios): the exact value at them.


def const_value(domain: Domain, x, number: float) -> Value:
    return Value(domain, ((frozenset(), x),), fl.constant(number))


def _atom_sample(atom: Atom, key: str) -> float:
    """The atom in scenario `key`: its blocks' numbers and its start pseudo-token (an unknown coverage, the
    state's, holds none at its start)."""
    kind = "max" if atom.kind is Kind.MAX else "lse"
    xs = [x for x in (fl.part_sample(kind, p, key) for p in atom.cov.parts) if x is not None]
    if atom.kind is Kind.MAX:
        return max(xs, default=-math.inf)
    xs += [atom.start] if atom.start is not None else []
    return float(np.logaddexp.reduce(np.array(xs, np.float64))) if xs else -math.inf


def _form_sample(f: Form, key: str) -> float:
    with np.errstate(all="ignore"):
        return float(sum((c * _atom_sample(a, key) for a, c in f.terms), np.float64(f.const)))


def _mono_sample(m: Mono, key: str) -> float:
    with np.errstate(all="ignore"):
        exponent = np.float64(_form_sample(m.exp, key))
        if m.term is None:
            return float(m.coef * np.exp(exponent))
        # exp(F + lse_p) per block p, not exp(F) * exp(lse_p): a row of masked keys alone is exp(1e30 - 1e30)
        total = np.float64(0.0)
        for p in m.cov.parts:
            x = fl.part_sample("lse", p, key)
            if x is not None:
                total += np.exp(exponent + np.float64(x)) * fl.term_sample(key, p)
        return float(m.coef * total)


def evaluate(value: Value, x, key: str) -> float:
    if value.domain is Domain.LOG:
        return _form_sample(x, key)
    if value.domain is Domain.LIN:
        return float(sum((_mono_sample(m, key) for m in x), 0.0))
    return float(x)


def exact_sample(value: Value, key: str) -> float:
    """The exact value in scenario `key`: the case its numbers fall in."""
    for assignment, x in value.cases:
        if all((_form_sample(d, key) >= 0) == sign for d, sign in assignment):
            return evaluate(value, x, key)
    return evaluate(value, value.cases[0][1], key)


def exact_samples(value: Value, keys) -> fl.Samples:
    return tuple((k, exact_sample(value, k)) for k in keys)


def cells(value: Value) -> list:
    """The blocks (not the state) a value's atoms hold."""
    out: dict = {}
    for a, x in value.cases:
        forms = [d for d, _ in a] + ([x] if value.domain is Domain.LOG else
                                     [m.exp for m in x] if value.domain is Domain.LIN else [])
        for f in forms:
            for atom, _ in f.terms:
                out.update((str(p), p) for p in atom.cov.parts if not isinstance(p, CoverageVar))
        if value.domain is Domain.LIN:
            out.update((str(p), p) for m in x if m.cov is not None for p in m.cov.parts
                       if not isinstance(p, CoverageVar))
    return list(out.values())


# ---------------------------------------------------------------------------------------------------------------
# The arithmetic, case by case.


def apply_cases(engine: Engine, op, domain: Domain, f, xs: list[Value], samples: tuple) -> Value:
    """f on each consistent combination of the operands' cases."""
    combos = [(frozenset(), [])]
    for x in xs:
        combos = [(a | b, args + [y]) for a, args in combos for b, y in x.cases if _consistent(a | b)]
    return _collapse(Value(domain, tuple((a, f(*args)) for a, args in combos), samples))


def _consistent(assignment: frozenset) -> bool:
    return len({d for d, _ in assignment}) == len(assignment)


def _collapse(value: Value) -> Value:
    results = {repr(x) for _, x in value.cases}
    if len(results) == 1:
        return dataclasses.replace(value, cases=((frozenset(), value.cases[0][1]),))
    return value


def extreme(engine: Engine, op, xs: list[Value], largest: bool, samples: tuple | None = None) -> Value:
    """max or min of two forms: x where x - y >= 0 (for max), y elsewhere, both cases kept."""
    if samples is None:
        samples = fl.f32_all(np.maximum if largest else np.minimum, xs[0].samples, xs[1].samples)
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
    return _collapse(Value(Domain.LOG, tuple(cases), samples))


def _key(d: Form) -> tuple[Form, bool]:
    """The case variable of the sign of d: d oriented and divided by the gcd of its coefficients (x - y, y - x and
    2x - 2y have one), and whether it was negated."""
    d, flipped = d.oriented()
    g = math.gcd(*(abs(c) for _, c in d.terms)) if d.terms else 1
    if g > 1:
        d = Form(tuple((a, c // g) for a, c in d.terms), d.const / g)
    return d, flipped


def negated(monos: tuple, sign: int) -> tuple:
    return monos if sign > 0 else tuple(dataclasses.replace(m, coef=-m.coef) for m in monos)


def add_lin(engine: Engine, op, a: tuple, b: tuple) -> tuple:
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
    if m.term is not None and not same_keys(m.cov, n.cov):
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


def same_keys(a: Coverage, b: Coverage) -> bool:
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


def times(engine: Engine, op, a: tuple, b: tuple) -> tuple:
    """a * b, where one side is weights alone (no sums of terms) or a constant."""
    if any(m.term is not None for m in a) and any(m.term is not None for m in b):
        engine.refuse("multiplies two softmax-weighted sums: " + ADVICE, op)
    sums, weights = (a, b) if any(m.term is not None for m in a) else (b, a)
    if any(m.term is not None for m in sums) and len(weights) == 1 and not weights[0].exp.terms and \
            weights[0].coef not in (1.0, -1.0):
        engine.refuse(f"weights a normalised output by the constant {weights[0].coef:g} (a decayed or averaged "
                      "merge): later blocks weigh differently from earlier ones, and which blocks come later changes "
                      "with the layout; " + ADVICE, op)
    out: tuple = ()
    for w in weights:
        out = add_lin(engine, op, out, tuple(dataclasses.replace(m, coef=m.coef * w.coef, exp=m.exp.plus(w.exp))
                                              for m in sums))
    return out


def reciprocal(engine: Engine, op, a: tuple) -> tuple:
    if len(a) != 1 or a[0].term is not None or a[0].coef == 0:
        engine.refuse("divides by a sum of weights that is not one log-sum-exp: " + ADVICE, op)
    (m,) = a
    return (Mono(1.0 / m.coef, m.exp.scaled(-1)),)


def log_of(engine: Engine, op, a: tuple) -> Form:
    if len(a) != 1 or a[0].term is not None or a[0].coef <= 0:
        engine.refuse("takes the log of a sum that is not one log-sum-exp (a sum of different terms, or lses "
                      "over overlapping blocks): " + ADVICE, op)
    return a[0].exp.plus(Form((), math.log(a[0].coef)))


def positive(engine: Engine, op, a: tuple) -> tuple:
    if all(m.term is None and m.coef > 0 for m in a):
        return a
    engine.refuse("takes the absolute value of a softmax-weighted sum", op)


# ---------------------------------------------------------------------------------------------------------------
# Signs: what the floats can overflow or underflow on.


def at_most_zero(f: Form, assignment: frozenset, bounded: bool = False) -> bool:
    """Whether f <= 0 wherever the case `assignment` holds, whatever the blocks' scores: a constant, the negated
    side of the case's own comparison (b - max(a, b), -|d|), or lse(A) - lse(B) and max(A) - lse(B) with A within
    B. `bounded`: lse(A) - max(A) too, which is at most log |A|."""
    if not f.terms:
        return f.const <= 0
    for d, sign in assignment:
        for s in (1, -1):  # f = s * k * d + c, k > 0
            k = f.terms[0][1] / (s * dict((a.key(), c) for a, c in d.terms).get(f.terms[0][0].key(), math.nan))
            if not k > 0:
                continue
            rest = f.plus(d, -int(s * k)) if k == int(k) else None
            if rest is not None and not rest.terms and rest.const <= 0 and sign == (s < 0):
                return True
    if f.const > 0 or len(f.terms) > 2:
        return False
    pos = [a for a, c in f.terms if c == 1]
    neg = [a for a, c in f.terms if c == -1]
    if len(pos) + len(neg) != len(f.terms) or len(neg) != 1 or len(pos) > 1:
        return False
    (n,) = neg
    if not pos:  # c - lse(B), B holding a pseudo-token of score >= c
        return n.kind is Kind.LSE and n.start is not None and f.const <= n.start
    (p,) = pos
    within = _parts(p.cov) <= _parts(n.cov) and (p.kind is Kind.MAX or p.start is None or p.start == n.start)
    if p.kind is Kind.LSE and not p.cov.parts and p.start is None:
        return True  # the lse of no keys: -inf
    if n.kind is Kind.LSE:
        return within
    return within and (p.kind is Kind.MAX or (bounded and same_keys(p.cov, n.cov) and p.start is None))


def at_least_one(monos: tuple, assignment: frozenset) -> bool:
    """Whether a sum of weights is >= a positive constant in the case: every weight positive, one of them
    c * exp(F) with F >= 0 (a term exp(0) = 1 of a max-shifted sum, 1 + x, exp(lse(A u B) - lse(A)))."""
    return all(m.term is None and m.coef > 0 for m in monos) and \
        any(at_most_zero(m.exp.scaled(-1), assignment) for m in monos)


def nonnegative(monos: tuple) -> bool:
    return all(m.term is None and m.coef > 0 for m in monos)
