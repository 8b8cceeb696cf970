"""Coverage arithmetic: which blocks (and which tokens of them) an aggregate has folded in, as families of token
ranges over loop variables; when two coverages are disjoint; when a coverage is every token of every block."""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from typing import Iterator

from .symbolic import Aff, Scope, Var, bounds, differs_mod
from .values import EMPTY, Cells, Coverage, CoverageVar


class _Naming:
    """The numbers in the names of one module's unknowns: fresh variables in order, loop ops by first use."""

    def __init__(self) -> None:
        self.counter = itertools.count()
        self.ops: dict = {}  # id of an op object -> (its number, the object, kept alive)


_process_counter = itertools.count()  # fresh variables made outside any naming (the analysis' parts run alone)
_naming: contextvars.ContextVar[_Naming | None] = contextvars.ContextVar("shardfix_ring_naming", default=None)


@contextlib.contextmanager
def naming() -> Iterator[None]:
    """Number the unknowns the analyses inside make from 0, in the order they make them: their names (which pick
    lsefloats' sample numbers) then depend on the module alone, not on what the process analysed before. A naming
    already under way goes on (names must stay distinct among everything one module's analyses share)."""
    if _naming.get() is not None:
        yield
        return
    token = _naming.set(_Naming())
    try:
        yield
    finally:
        _naming.reset(token)


def fresh_var(prefix: str) -> Var:
    current = _naming.get()
    if current is None:  # spelt apart from any naming's, so that the two never meet under one name
        return Var(f"{prefix}.{next(_process_counter)}")
    return Var(f"{prefix}{next(current.counter)}")


def op_number(op) -> int:
    """A number for the Python object `op` (a loop op as an analysis holds it), the same at every use within one
    naming, which keeps the object alive, so that no other object takes its id meanwhile (outside a naming, the
    op's id: the caller keeps the op alive while it uses the number). A loop analysed again through another object
    (a callee run for another call) gets another number."""
    current = _naming.get()
    if current is None:
        return id(op)
    found = current.ops.get(id(op))
    if found is None:
        found = current.ops[id(op)] = (len(current.ops), op)
    return found[0]


def cell(hop: Aff, start: Aff, size: int) -> Coverage:
    return Coverage((Cells(hop, start, size),))


def substitute(cov: Coverage, mapping: dict) -> Coverage:
    """Replace Vars (and CoverageVars, mapped to Coverages) inside a coverage."""
    parts = []
    for part in cov.parts:
        if isinstance(part, CoverageVar):
            parts.extend(mapping[part].parts if part in mapping else (part,))
            continue
        inner = {k: v for k, v in mapping.items() if not isinstance(k, CoverageVar)}
        bound = tuple((v, lo.substitute(inner), hi.substitute(inner)) for v, lo, hi in part.vars)
        parts.append(Cells(part.hop.substitute(inner), part.start.substitute(inner), part.size, bound))
    return Coverage(tuple(parts))


def over_iterations(added: Coverage, counter: Var, upto: Aff) -> Coverage:
    """The union of `added` (which mentions `counter`) for counter in [0, upto - 1]: the coverage a loop has folded
    in before iteration `upto`."""
    k = Var(f"{counter.name}'")  # named after the loop: the same additions give the same coverage
    parts = []
    for part in added.parts:
        if isinstance(part, CoverageVar):
            raise ValueError("a coverage variable can't be iterated")
        mapping = {counter: Aff.of(k)}
        bound = tuple((v, lo.substitute(mapping), hi.substitute(mapping)) for v, lo, hi in part.vars)
        parts.append(Cells(part.hop.substitute(mapping), part.start.substitute(mapping), part.size,
                           bound + ((k, Aff(), upto - 1),)))
    return Coverage(tuple(parts))


def _scope_with(scope: Scope, families) -> Scope:
    var_bounds = dict(scope.var_bounds)
    for fam in families:
        for v, lo, hi in fam.vars:
            var_bounds[v] = (lo, hi)
    return scope.with_vars(var_bounds)


def _rename(fam: Cells) -> Cells:
    """The same family with fresh bound variables (so two families can be compared without capture)."""
    mapping = {v: Aff.of(fresh_var("r")) for v, _, _ in fam.vars}
    return Cells(fam.hop.substitute(mapping), fam.start.substitute(mapping), fam.size,
                 tuple((mapping[v].terms[0][0], lo.substitute(mapping), hi.substitute(mapping))
                       for v, lo, hi in fam.vars))


def families_disjoint(a: Cells, b: Cells, scope: Scope) -> bool:
    """Whether no member of family `a` overlaps a member of family `b`."""
    a, b = _rename(a), _rename(b)
    inner = _scope_with(scope, (a, b))
    if _empty(a, inner) or _empty(b, inner) or differs_mod(a.hop, b.hop, scope.cp, inner):
        return True
    lo, hi = bounds(b.start - a.start, inner)  # b starts at or after a ends, or ends before a starts
    if lo >= a.size or hi <= -b.size:
        return True
    # member by member, where the families are small: blocks 3j and 3j' + 1 (j, j' in [0, 1]) of a ring of 8,
    # a loop running three ring steps an iteration, never meet, though no one residue argument shows it
    ma, mb = _members(a), _members(b)
    if ma is None or mb is None or len(ma) * len(mb) > _PAIRS:
        return False
    return all(_apart(x, a.size, y, b.size, scope) for x in ma for y in mb)


def _members(fam: Cells) -> list[tuple[Aff, Aff]] | None:
    """(hop, start) of each member of a family whose variables have constant ranges, at most _MEMBERS of them."""
    ordered, out = _order_vars(fam), []

    def walk(i: int, mapping: dict) -> bool:
        if i == len(ordered):
            out.append((fam.hop.substitute(mapping), fam.start.substitute(mapping)))
            return len(out) <= _MEMBERS
        v, lo, hi = ordered[i]
        lo_v, hi_v = lo.substitute(mapping), hi.substitute(mapping)
        if not (lo_v.is_const and hi_v.is_const):
            return False
        return all(walk(i + 1, {**mapping, v: Aff.of(x)}) for x in range(lo_v.const, hi_v.const + 1))

    return out if walk(0, {}) else None


_MEMBERS, _PAIRS = 256, 4096  # beyond these, the families are too large to compare member by member


def _apart(x: tuple[Aff, Aff], x_size: int, y: tuple[Aff, Aff], y_size: int, scope: Scope) -> bool:
    """Whether two members (hop, start) never overlap: other blocks, or token ranges that don't meet."""
    if differs_mod(x[0], y[0], scope.cp, scope):
        return True
    lo, hi = bounds(y[1] - x[1], scope)
    return lo >= x_size or hi <= -y_size


def _empty(fam: Cells, scope: Scope) -> bool:
    """Whether the family has no members: a variable's range is empty (what the iterations before the first one
    of a loop that runs once folded in)."""
    return any(bounds(hi - lo, scope)[1] < 0 for _, lo, hi in fam.vars)


def family_self_disjoint(fam: Cells, scope: Scope) -> bool:
    """Whether the members of one family (different values of its variables) never overlap each other."""
    if not fam.vars:
        return True
    # Two different assignments differ in at least one variable; check the innermost-free form: members for v and
    # v' = v + delta (delta >= 1) with the other variables equal, per variable.
    inner = _scope_with(scope, (fam,))
    for v, lo, hi in fam.vars:
        if bounds(hi - lo, inner)[1] < 1:
            continue  # one value at most: no two members differ in it
        d = fresh_var("d")
        shifted = {v: Aff.of(v) + Aff.of(d)}
        var_bounds = dict(inner.var_bounds)
        var_bounds[d] = (Aff.of(1), hi - lo)
        s = scope.with_vars(var_bounds)
        hop2, start2 = fam.hop.substitute(shifted), fam.start.substitute(shifted)
        if differs_mod(fam.hop, hop2, scope.cp, s):
            continue
        lo_d, hi_d = bounds(start2 - fam.start, s)
        if lo_d >= fam.size or hi_d <= -fam.size:
            continue
        members = _members(fam)  # member by member, where the family is small (see families_disjoint)
        if members is None or len(members) ** 2 > _PAIRS:
            return False
        return all(_apart(x, fam.size, y, fam.size, scope) for i, x in enumerate(members) for y in members[i + 1:])
    return True


def disjoint(a: Coverage, b: Coverage, scope: Scope) -> bool | None:
    """True if provably disjoint, False if not provably, None if a CoverageVar makes it undecidable yet."""
    if any(isinstance(p, CoverageVar) for p in a.parts + b.parts):
        return None
    return all(families_disjoint(x, y, scope) for x in a.parts for y in b.parts)


def is_complete(cov: Coverage, scope: Scope, block: int) -> bool:
    """Whether the coverage holds every token of every block exactly once: `block` tokens per block, cp blocks."""
    if any(isinstance(p, CoverageVar) for p in cov.parts):
        return False
    parts = list(cov.parts)
    if not all(family_self_disjoint(p, scope) for p in parts):
        return False
    if not all(families_disjoint(x, y, scope) for i, x in enumerate(parts) for y in parts[i + 1:]):
        return False
    return _count(parts, scope) == scope.cp * block and _within(parts, scope, block)


def _count(parts, scope: Scope) -> int | None:
    """Tokens in the union of pairwise and internally disjoint families: size times the number of assignments of
    each family's variables (enumerated: loop trip counts are small); None while a bound is still symbolic."""
    total = 0
    for fam in parts:
        assignments = _assignments(fam)
        if assignments is None:
            return None
        total += fam.size * assignments
    return total


def _assignments(fam: Cells) -> int | None:
    ordered = _order_vars(fam)

    def walk(i, mapping) -> int | None:
        if i == len(ordered):
            return 1
        v, lo, hi = ordered[i]
        lo_v, hi_v = lo.substitute(mapping), hi.substitute(mapping)
        if not (lo_v.is_const and hi_v.is_const):
            return None
        count = 0
        for x in range(lo_v.const, hi_v.const + 1):
            sub = walk(i + 1, {**mapping, v: Aff.of(x)})
            if sub is None:
                return None
            count += sub
        return count

    return walk(0, {})


def _order_vars(fam: Cells):
    """Variables ordered so that each one's bounds only mention earlier ones."""
    remaining, ordered, known = list(fam.vars), [], set()
    while remaining:
        for entry in remaining:
            v, lo, hi = entry
            deps = {a for a in lo.free_atoms() | hi.free_atoms() if isinstance(a, Var)}
            if deps <= known:
                ordered.append(entry)
                known.add(v)
                remaining.remove(entry)
                break
        else:
            return tuple(fam.vars)
    return tuple(ordered)


def _within(parts, scope: Scope, block: int) -> bool:
    """Every member lies inside a block: 0 <= start and start + size <= block."""
    for fam in parts:
        inner = _scope_with(scope, (fam,))
        lo, hi = bounds(fam.start, inner)
        if lo < 0 or hi + fam.size > block:
            return False
    return True


__all__ = ["EMPTY", "cell", "disjoint", "families_disjoint", "family_self_disjoint", "fresh_var", "is_complete",
           "over_iterations", "substitute"]


def normal(cov: Coverage) -> tuple:
    """A canonical form of a coverage for comparing: each family's bound variables renamed by position, parts
    sorted (two loops that fold in the same blocks give the same form)."""
    out = []
    for part in cov.parts:
        if isinstance(part, CoverageVar):
            out.append(str(part))
            continue
        mapping = {v: Aff.of(Var(f"@{i}")) for i, (v, _, _) in enumerate(part.vars)}
        renamed = Cells(part.hop.substitute(mapping), part.start.substitute(mapping), part.size,
                        tuple((mapping[v].terms[0][0], lo.substitute(mapping), hi.substitute(mapping))
                              for v, lo, hi in part.vars))
        out.append(str(renamed))
    return tuple(sorted(out))
