"""Which running maximum a softmax sum is shifted by, and whether a result is the same for every value of it.

An online softmax keeps acc_i = sum_{<=i} exp(s - m_i) w and l_i likewise, rescaling both by exp(m_{i-1} - m_i)
when the running maximum m grows. That identity holds for ANY values of m_1..m_K (exp(m_{i-1} - m_i) exp(s - m_{i-1})
= exp(s - m_i)), so o = acc_K / l_K and lse = m_K + log(l_K) are constant in every m_i: in exact arithmetic the
cotangent autodiff sends into each running maximum is zero, and how `max` splits it between tied operands (by the
order the blocks arrive in, which the reorder changes) does not matter. It holds only where acc and l are shifted by
THE SAME maximum, at every step: two maxima of the same scores folded differently are the same value (the algebra,
value-semantic, can't tell them apart) but not the same function of the blocks' order at ties, and o = exp(m2 - m1)·F
sends them opposite, nonzero cotangents.

So each aggregate carries the identity of its maximum (values.Agg.ident): a maximum is named by the op that merged
it, with its value and the identities of what it merged (`max_ident`: one op of a function called on other data,
or on maxima merged in another order, is another maximum), or by the loop slot carrying it; a sum carried by a
loop is shifted by an unknown maximum (a variable, `shift_var`) that the first rescaling binds and the loop's
recurrence checks (`check_loop`: the slot it is bound to is the one whose next value the returned sum is shifted
by). A loop's first pass names maxima by provisional values; what it noted is rolled back (`mark`, `rollback`).
Anything else loses the identity (None), which fails the check: nothing here refuses or changes a decision.
`invariant` then reads a result's function (the fn keys) as exp(c·M)·F or c·M + F in one maximum M and says whether
c is 0; a function computed once per chunk of rows, each chunk's state with its own maximum, names the map from
each chunk's tokens to its maximum (`complete_ident`). A log-sum-exp merge's lse(C) and out(C) (logsum.py reads
maxima by value there) take `_lse_invariant` instead: the maxima it read as numbers, noted with their identities
(`note_lse_max`).
"""

from __future__ import annotations

from dataclasses import replace

from .values import AggOp, Data

_LEAVES = frozenset({"operand", "const", "iota", "index", "positional"})
_MERGED_LOGS = frozenset({AggOp.LSE, AggOp.NSUM, AggOp.LOGSUM})
_BY_TOKENS = "by-tokens"  # complete_ident's map from tokens to maxima
_SHIFTED = frozenset({AggOp.MAX, AggOp.MIN, AggOp.SSUM, AggOp.SHIFT, AggOp.DIFF, AggOp.MDIFF, AggOp.EXP})


# ---------------------------------------------------------------------------------------------------------------
# Identities.


def max_ident(op, agg_fn: int, *history) -> tuple:
    """A maximum merged (or reduced, or floored) by `op`, holding the value `agg_fn`, from the maxima `history`
    (the identities of the maxima it merged, in operand order; none for a block's own maximum, a reduction of
    scores). The op object keeps the identity from naming another op once this one is gone. Two computations are
    one only where their every merge is: the same op (a jitted helper's is one op for every call) with the same
    value is another computation where what it merged was (two folds whose last merge is one helper call, after
    the blocks before it were merged in other orders, split ties their own ways)."""
    return ("max", op, agg_fn) + history


def slot_ident(op, i: int, score: int, run: int) -> tuple:
    """The maximum loop `op` carries in slot i (at any one iteration, and at the exit), in its analysis `run`: one
    loop op analysed on other inputs (a jitted helper's loop, called twice) carries other maxima, which may tie
    their own ways; a memo that takes an analysis again takes its names with it."""
    return ("slot", op, i, score, run)


def shift_var(op, i: int, score: int, run: int) -> tuple:
    """The maximum the sum loop `op` carries in slot i is shifted by, in its analysis `run`: unknown until the body
    rescales it."""
    return ("shift-of", op, i, score, run)


_UNBOUND = object()  # in the undo log: a shift that had no binding before


def _is_var(ident) -> bool:
    return isinstance(ident, tuple) and bool(ident) and ident[0] == "shift-of"


def resolve(fns, ident):
    seen = 0
    while _is_var(ident) and ident in fns.bound and seen < 64:
        ident, seen = fns.bound[ident], seen + 1
    return ident


def same(fns, a, b):
    """The maximum both identities name (binding an unknown shift to the other), or None."""
    a, b = resolve(fns, a), resolve(fns, b)
    if a is None or b is None:
        return None
    if a == b:
        return a
    for var, other in ((a, b), (b, a)):
        if _is_var(var):
            _bind(fns, var, other)
            return other
    return None


def _bind(fns, var, ident) -> None:
    """An unknown shift bound to a maximum (None: lost), logged as notes are (a memo replaying a loop's or a call's
    analysis binds it again). Its earlier binding is logged for `rollback`."""
    fns.undo.append((fns.bound, var, fns.bound.get(var, _UNBOUND)))
    fns.bound[var] = ident
    fns.notes.append((_bind, var, ident))


def pair(ident, at: int):
    """One end (0: from, 1: to) of a rescaling's identity."""
    return ident[at] if isinstance(ident, tuple) and len(ident) == 2 and ident[0] not in ("max", "slot", _BY_TOKENS) \
        else None


def check_loop(fns, op, inits: list, placeholders: list, returned: list) -> None:
    """Each sum loop `op` carries must be shifted by the maximum of one slot j at every iteration: at the first (its
    start is an empty sum, or shifted by slot j's start) and from one to the next (the shift the body's rescaling
    bound it to is slot j's, and the returned sum is shifted by what slot j returns). Where not, its shift is lost."""
    for i, ph in enumerate(placeholders):
        if isinstance(ph, Data) and ph.agg is not None and _is_var(ph.agg.ident) and isinstance(returned[i], Data) \
                and returned[i].agg is not None and not _holds(fns, ph.agg.ident, i, inits, placeholders, returned):
            _bind(fns, ph.agg.ident, None)


def _holds(fns, var, i: int, inits: list, placeholders: list, returned: list) -> bool:
    target, got = resolve(fns, var), resolve(fns, returned[i].agg.ident)
    if target == var and got == var:
        return True  # neither rescaled nor merged with another sum: shifted by whatever it started with
    if target is None or got is None:
        return False
    for j, (p, r) in enumerate(zip(placeholders, returned)):
        if isinstance(p, Data) and isinstance(r, Data) and p.agg is not None and r.agg is not None \
                and p.agg.op in (AggOp.MAX, AggOp.MIN) and p.agg.ident == target \
                and resolve(fns, r.agg.ident) == got:
            return _empty(fns, inits[i]) or (
                isinstance(inits[i], Data) and inits[i].agg is not None and isinstance(inits[j], Data)
                and inits[j].agg is not None and same(fns, inits[i].agg.ident, inits[j].agg.ident) is not None)
    return False


def _empty(fns, value) -> bool:
    """A sum's start of 0: the empty sum, the same whatever it is shifted by."""
    return isinstance(value, Data) and value.agg is None and fns.constant(value.fn) == 0.0


def note_complete(fns, fn: int, read: tuple) -> None:
    """The identity of a complete aggregate `fn` names, with the tokens its rows hold (`read`: (identity, tokens);
    tokens as algebra.home_tokens gives them, None where not known), noted for the analysis under way (`fns.owner`:
    the table is the module's, and the fns of two rings fed alike intern alike, though made by other maxima), and
    logged for the call memo to note again where it reuses a call's analysis (analysis.Engine.call). Complete fns
    are interned by value, so one fn may be made from several maxima: `complete_ident`."""
    ident, tokens = read
    _add(fns, fns.idents, fn, (ident, fns.owner, tokens))
    fns.notes.append((note_complete, fn, read))


def note_lse_max(fns, score: int, read) -> None:
    """A maximum of the function `score` (a block's, or a running one) that logsum.py reads as a number (an atom of
    its exact arithmetic, where two maxima of one value cancel): `read` is (its coverage's class: the canonical
    coverage's parts as sorted strings, None for one holding a loop's unknown coverage; its identity), noted for
    the ring region being proved and logged for the call memo as note_complete is. `_lse_invariant` asks that the
    maxima of one function read over one coverage be one computation."""
    _add(fns, fns.lse_maxima, (score, fns.owner), read)
    fns.notes.append((note_lse_max, score, read))


def _add(fns, table: dict, key, item) -> None:
    held = table.setdefault(key, set())
    if item not in held:
        held.add(item)
        fns.undo.append((table, key, item))


def mark(fns) -> tuple:
    """Where the notes stand, for `rollback`: a loop's first pass (loops._discover) runs its body on provisional
    values, whose maxima are named by what the pass takes the carried ones to be; the pass after it names them as
    every iteration computes them, and only its notes and bindings hold. Constant in the notes and bindings made so
    far: what `rollback` undoes is logged as it is made."""
    return len(fns.notes), len(fns.undo)


def rollback(fns, marked: tuple) -> None:
    """The notes and bindings as they were at `mark`."""
    notes, undo = marked
    del fns.notes[notes:]
    while len(fns.undo) > undo:
        table, key, item = fns.undo.pop()
        if table is not fns.bound:
            table[key].discard(item)
        elif item is _UNBOUND:
            del table[key]
        else:
            table[key] = item  # the binding it replaced


def complete_ident(fns, fn: int, owner=None):
    """The maximum the complete aggregate `fn` was made from in the analysis `owner` (prove.Verdict.owner; None:
    in any): the one maximum every computation of it names; or, where its computations (one per maximum) hold
    disjoint tokens of one block (a query chunk each, a running maximum each), the map from each one's tokens to its
    maximum, as (_BY_TOKENS, frozenset of (maximum, (hop, first, last))); None if neither (or lost).

    The map names the maximum of every read of `fn`: each computation is noted with the tokens its rows hold, a value
    keeps its tokens whatever moves it, and the analysis combines values elementwise only where they hold the same
    tokens (algebra.unify), so a token's value of `fn` comes from the one computation holding that token, shifted by
    its maximum. Two functions with equal maps are shifted by the same maximum at every token, as two with one
    maximum are."""
    reads = {(resolve(fns, ident), tokens) for ident, by, tokens in fns.idents.get(fn, ())
             if owner is None or by == owner}
    found = {ident for ident, _ in reads}
    if len(found) == 1:
        return found.pop()
    if not found or None in found or any(tokens is None for _, tokens in reads):
        return None
    if len({tokens[0] for _, tokens in reads}) != 1:
        return None  # tokens of other blocks: not compared
    # in order of their first tokens, each span must start after every span of another maximum has ended: the two
    # furthest-reaching maxima so far (of the spans before it) say so
    reach: list = []  # [(maximum, its furthest last token)], at most two, the furthest first
    for ident, (_, first, last) in sorted(reads, key=lambda read: read[1][1:]):
        if any(other != ident and first <= end for other, end in reach):
            return None  # two maxima of the same tokens
        ends = dict(reach)
        ends[ident] = max(last, ends.get(ident, last))
        reach = sorted(ends.items(), key=lambda item: -item[1])[:2]
    return _BY_TOKENS, frozenset(reads)


def join(fns, op, per_branch: list[list], out: list) -> list:
    """The results of a branch op: each aggregate's maximum is the one every branch names if they agree, else the
    maximum the op picks from that tuple of branch maxima (the same tuple, the same maximum): the identities of the
    branch taken at run time, renamed alike."""
    joined = []
    for k, value in enumerate(out):
        if not isinstance(value, Data) or value.agg is None:
            joined.append(value)
            continue
        names = tuple(resolve(fns, b[k].agg.ident) if isinstance(b[k], Data) and b[k].agg is not None else None
                      for b in per_branch)
        if None in names or any(isinstance(n, tuple) and len(n) == 2 for n in names):
            ident = None  # lost, or a rescaling's pair: not followed through branches
        elif len(set(names)) == 1:
            ident = names[0]
        else:
            ident = ("max", op, names)
        joined.append(value if ident == value.agg.ident and ident is not None else
                      value.with_(agg=replace(value.agg, ident=ident)))
    return joined


def memo_key(values) -> tuple:
    """The identities abstract values carry, for memo keys (values equal but for them are other maxima)."""
    return tuple(v.agg.ident if isinstance(v, Data) and v.agg is not None else None for v in values)


def describe(ident) -> str:
    if isinstance(ident, tuple) and ident and ident[0] == _BY_TOKENS:
        return "the running maxima of its rows' chunks (" + "; ".join(
            sorted(f"tokens {first}..{last}: {describe(one)}" for one, (_, first, last) in ident[1])) + ")"
    if isinstance(ident, tuple) and ident and ident[0] == "slot":
        return f"the running maximum carried in slot {ident[2]} of the loop at {_where(ident[1])}"
    if isinstance(ident, tuple) and ident and ident[0] == "max":
        return f"the maximum '{getattr(ident[1], 'name', ident[1])}' at {_where(ident[1])} computes"
    return "a running maximum"


def _where(op) -> str:
    from ..ir import op_loc
    return str(op_loc(op)) if hasattr(op, "location") else str(op)


# ---------------------------------------------------------------------------------------------------------------
# The check: a result as exp(c·M)·F ("mul") or c·M + F ("add") in one maximum M, F free of every maximum.

_INV = ("inv",)


def invariant(fns, fn: int, owner=None) -> str | None:
    """None where the function `fn` is the same for every value of every running maximum it reads; else why not.
    `owner`: the analysis that made `fn` (prove.Verdict.owner: a ring region and which analysis of it; see
    complete_ident)."""
    found = _form(fns, fn, {}, owner)
    if isinstance(found, str):
        return found
    if found == _INV:
        return None
    kind, ident, c = found
    what = "varies with" if kind == "add" else "is scaled by exp of"
    return f"{what} {describe(ident)} ({c:g} times it): the cotangent reaching that maximum is not zero"


def _norm(kind: str, ident, c: float):
    return _INV if c == 0 else (kind, ident, c)


def _form(fns, fn: int, memo: dict, owner=None):
    found = memo.get(fn)
    if found is None:
        found = memo[fn] = _compute(fns, fn, memo, owner)
    return found


def _compute(fns, fn: int, memo: dict, owner):
    key = fns.keys[fn]
    head = key[0] if isinstance(key, tuple) and key else None
    if head in _LEAVES:
        return _INV
    if head == "complete" and key[1] in (AggOp.LSE, AggOp.NSUM):
        for x in key[2:4] if key[1] == AggOp.NSUM else key[3:4]:  # the values summed, the scores
            if _form(fns, x, memo, owner) != _INV:
                return "folds a running maximum into a log-sum-exp merge, which this check does not follow"
        why = _lse_invariant(fns, owner)
        return _INV if why is None else why
    if head in ("complete", "agg") and key[1] in _MERGED_LOGS:
        return "reads a log-sum-exp merge before every block is merged into it"
    if head in ("complete", "agg") and key[1] in _SHIFTED:
        # the weights summed and the scores maxed must be free of every maximum (MAX and the rescalings have no term)
        for x in key[2:4] if key[1] in (AggOp.SSUM, AggOp.EXP) else key[3:4]:
            if _form(fns, x, memo, owner) != _INV:
                return "folds a running maximum into another running sum or maximum, which this check does not follow"
        if head == "agg":
            return "reads a running sum or maximum before every block is merged into it"
        ident = complete_ident(fns, fn, owner)
        if ident is None or any(pair(one, 0) is not None for one in _members(ident)):
            return "depends on a running maximum the analysis can't name (a sum not shifted by one maximum at every " \
                   "step, or two maxima of the same scores that one function holds)"
        if key[1] in (AggOp.MAX, AggOp.MIN):
            return ("add", ident, 1.0)
        if key[1] == AggOp.SSUM:
            return ("mul", ident, -1.0)
        return "reads a rescaling of one running maximum to another"
    if head == "ew":
        return _ew(fns, key[1].removeprefix("stablehlo."), key[2], [_form(fns, x, memo, owner) for x in key[3]])
    for x in _ints(key):  # any other function: free of maxima, or not analysed
        if 0 <= x < fn and _form(fns, x, memo, owner) != _INV:
            return f"reads a running maximum through '{head}', which this check does not follow"
    return _INV


def note_lse_split(fns, op) -> None:
    """logsum.py split cases on the sign of a difference of log-sum-exps at `op` (a max, min or abs of them), in
    the proof of the ring region being proved: where JAX differentiates such an op (Tie.kinks), its derivative at
    the tie need not be the merged function's (autodiff.stabiliser_invariant). Logged for the call memo."""
    _add(fns, fns.lse_splits, fns.owner, op)
    fns.notes.append((_note_split, op, None))


def _note_split(fns, op, _) -> None:
    note_lse_split(fns, op)


def splits_lse(fns, owner) -> bool:
    """Whether the proof of `owner` (None: any region's) split cases on a difference of log-sum-exps."""
    return any(owner is None or by == owner for by in fns.lse_splits)


def _lse_invariant(fns, owner) -> str | None:
    """Whether the lse(C) or out(C) that logsum.py proved a merge computes is differentiated as that function.

    logsum.py proves that every merge step computes (out(A u B), lse(A u B)) from its operands in exact arithmetic,
    in every case of the signs it splits on, so each step is one smooth function G of its operands. JAX's derivative
    of a step is G's where it differentiates no op at a kink: the cases logsum.py splits on come from max, min and
    abs alone (it refuses comparisons of lses; `note_lse_split`), and the JAX side records every such op
    differentiated outside jnp.logaddexp's own rule (Tie.kinks): where both hold, autodiff.stabiliser_invariant
    refuses (at a tie their splits need not add up to G's derivative). A running maximum of the scores is no split
    but a number, checked here. So the derivative of the fold is the derivative of out(C) and lse(C), the same in any
    order, provided the maxima the steps read as numbers (a block's reduce_max) are what the exact arithmetic takes
    them for: a maximum enters as a number, M, and cancels (m + log sum e^(s - m) is lse whatever m is), so the
    cotangent reaching it is zero, but only if every M cancelled is one computation: two computations of one
    maximum cancel by value while JAX splits their cotangents between tied scores each its own way. Hence: every
    maximum logsum.py read (`note_lse_max`) is named, and those of one function over one coverage are computed by
    one op (or carried in one loop slot); a coverage holding a loop's unknown is taken to be any (it may be found
    equal to another later). None where that holds."""
    for (_, by), reads in fns.lse_maxima.items():
        if owner is not None and by != owner:
            continue
        classes: dict = {}
        for known, ident in reads:
            computation = _computation(resolve(fns, ident))
            if computation is None:
                return ("merges log-sum-exps through a maximum the analysis can't name (one whose computation it "
                        "lost track of), so it can't tell whether JAX splits its cotangent between tied scores alike "
                        "everywhere it cancels")
            classes.setdefault(known, set()).add(computation)
        unknown = classes.pop(None, set())
        for computed in list(classes.values()) or [set()]:
            if len(computed | unknown) > 1:
                shown = "; ".join(sorted({describe(c) for c in computed | unknown})[:2])
                return ("merges log-sum-exps in which maxima of the same scores computed by different ops may "
                        f"cancel ({shown}): JAX splits each one's cotangent between tied scores its own way, so "
                        "they need not cancel in the derivative; compute the maximum once and use it wherever it is "
                        "subtracted and added back")
    return None


def merges_lse(fns, fn: int) -> bool:
    """Whether the function `fn` reads the lse(C) or out(C) of a log-sum-exp merge (logsum.py)."""
    seen, todo = set(), [fn]
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        key = fns.keys[x]
        if isinstance(key, tuple) and len(key) > 1 and key[0] in ("complete", "agg") and key[1] in _MERGED_LOGS:
            return True
        todo.extend(y for y in _ints(key) if 0 <= y < x)
    return False


def _members(ident) -> list:
    """The maxima an identity names: those of a map by tokens, else itself."""
    if isinstance(ident, tuple) and ident and ident[0] == _BY_TOKENS:
        return [one for one, _ in ident[1]]
    return [ident]


def _computation(ident):
    """What computes a maximum: the op that merged it and what it merged (whatever value it held), or the loop slot
    carrying it."""
    if isinstance(ident, tuple) and ident and ident[0] == "max":
        return ident[:2] + ident[3:]
    return ident


def _ints(key):
    for part in key if isinstance(key, tuple) else ():
        if type(part) is int:
            yield part
        elif isinstance(part, tuple):
            yield from _ints(part)


def _ew(fns, name: str, attrs: str, forms: list):
    for f in forms:
        if isinstance(f, str):
            return f
    if all(f == _INV for f in forms):
        return _INV
    if name == "convert" and not attrs.startswith(("i", "ui")):
        return forms[0]  # float <-> float: the same value
    if name == "concatenate":
        # pieces of one form (a chunk of rows each, shifted by its own maximum where the form names them by tokens:
        # the pieces keep their tokens) put side by side: that form
        if all(f == forms[0] for f in forms):
            return forms[0]
        ident = next(f[1] for f in forms if f != _INV)
        return f"concatenates values that depend on {describe(ident)} in different ways"
    if name == "negate":
        kind, ident, c = forms[0]
        return _norm(kind, ident, -c) if kind == "add" else forms[0]
    if name in ("log", "exponential") and len(forms) == 1:  # the StableHLO names (stablehlo.exponential)
        kind, ident, c = forms[0]
        if (name, kind) == ("log", "mul"):
            return _norm("add", ident, c)
        if (name, kind) == ("exponential", "add"):
            return _norm("mul", ident, c)
        return f"takes the {name} of a value that depends on {describe(ident)} in a way that is not a shift"
    if len(forms) != 2 or name not in ("add", "subtract", "multiply", "divide"):
        ident = next(f[1] for f in forms if f != _INV)
        return f"applies '{name}' to a value that depends on {describe(ident)}"
    a, b = forms
    idents = list(dict.fromkeys(f[1] for f in forms if f != _INV))  # in operand order
    if len(idents) > 1:
        x, y = (describe(i) for i in idents)
        return f"combines values shifted by two different running maxima ({x}; {y}): the cotangents reaching them " \
               "do not cancel"
    (ident,) = idents
    if name in ("add", "subtract"):
        sign = 1.0 if name == "add" else -1.0
        if a[0] == "add" or b[0] == "add":
            if _INV in forms or a[0] == b[0]:
                return _norm("add", ident, (a[2] if a != _INV else 0.0) + sign * (b[2] if b != _INV else 0.0))
        elif a != _INV and b != _INV and a[2] == b[2]:
            return a  # exp(cM)·F ± exp(cM)·G
        return f"{'adds' if sign > 0 else 'subtracts'} values that depend on {describe(ident)} differently"
    if a[0] == "add" or b[0] == "add":
        return f"{'multiplies' if name == 'multiply' else 'divides'} by a value that varies with {describe(ident)}"
    ca = a[2] if a != _INV else 0.0
    cb = b[2] if b != _INV else 0.0
    return _norm("mul", ident, ca + cb if name == "multiply" else ca - cb)


__all__ = ["check_loop", "complete_ident", "describe", "invariant", "join", "mark", "max_ident", "memo_key",
           "merges_lse", "note_complete", "note_lse_max", "note_lse_split", "pair", "resolve", "rollback", "same",
           "shift_var", "slot_ident", "splits_lse"]
