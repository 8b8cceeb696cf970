"""Branches: stablehlo.case and stablehlo.if inside a ring region.

A branch (stablehlo.case / if) on a constant takes that branch. Otherwise the branches must agree, except for the
skip-a-block pattern of blockwise attention: one branch folds a block into the accumulators, the other leaves them
(or adds zeros); that is kept only when the predicate is a function of the two units of tokens involved (so both
orders skip the same pairs of units).
"""

from __future__ import annotations

from . import stabiliser
from .algebra import cov_prefix, cov_rest, covs_equal, start_value
from .analysis import Engine
from .symbolic import Aff, Node, Var, bounds
from .values import Agg, AggOp, Cells, Coverage, CoverageVar, Data, Index, ObligationKind, Stack, Tok


def branches(engine: Engine, op):
    selector = engine.get(op.operands[0])
    regions = list(op.regions)
    if isinstance(selector, Index) and selector.expr.is_const:
        value = selector.expr.const
        if op.name == "stablehlo.if":
            chosen = 0 if value else 1
        else:
            chosen = value if 0 <= value < len(regions) else len(regions) - 1
        return engine.run_block(regions[chosen].blocks[0], [])
    engine.state.skippable += 1
    try:
        per_branch = [engine.run_block(r.blocks[0], []) for r in regions]
    finally:
        engine.state.skippable -= 1
    dead = engine.dead_slots.get(op, ())
    if dead:  # results only residuals read (autodiff.py): not compared
        from .autodiff import OPAQUE
        per_branch = [[OPAQUE if j in dead else v for j, v in enumerate(b)] for b in per_branch]
    if all(b == per_branch[0] for b in per_branch[1:]):
        return stabiliser.join(engine.fns, op, per_branch, per_branch[0])
    if len(regions) != 2:
        engine.refuse(f"chooses among {len(regions)} branches that compute different values (a lax.switch): "
                      "what the analysis proves is a branch that skips a block beside one that folds it in, not "
                      "several ways of folding it; fold every block one way (a tile whose keys are all kept is the "
                      "masked tile with nothing masked) under lax.cond(skip, ...)", op)
    return stabiliser.join(engine.fns, op, per_branch, _skip_join(engine, op, selector, per_branch))


def _skip_join(engine: Engine, op, selector, per_branch) -> list:
    """One branch folds one unit pair into aggregates, the other skips it: fine when the predicate is a function of
    that unit pair only (the same pairs are skipped in every order of the units). Aggregates of either unit of the
    pair may be merged (a query chunk's output and a key chunk's gradient)."""
    out, pairs = [], []
    for a, b in zip(*per_branch):
        if a == b:
            out.append(a)
            continue
        merged = None
        for skip, compute in ((a, b), (b, a)):
            found = _folded(engine, skip, compute)
            if found is not None:
                merged = compute
                pairs.append(_unit_pair(engine, op, compute, found))
                break
        if merged is None:
            engine.refuse("branches to values that differ other than by one block folded into an aggregate", op)
        out.append(merged)
    if not pairs:
        engine.refuse("branches to different values", op)
    units = pairs[0]
    for other in pairs[1:]:
        if not _same_pair(engine, op, units, other):
            engine.refuse("skips different pairs of units for different results", op)
    _check_predicate(engine, op, selector, units)
    return out


def _unit_pair(engine: Engine, op, value: Data, added: Coverage) -> list:
    """The two units an aggregate's merge involves, in absolute terms: its home tokens and the block it folds in."""
    from .algebra import extent
    if value.agg.home is None:
        engine.refuse("skips blocks for an aggregate without home tokens", op)
    home = value.axis_map[value.agg.home]
    size = extent(value, value.agg.home)
    if size is None:
        engine.refuse("skips blocks for tokens that don't form a run", op)
    added = engine.canonical_cov(added)
    if len(added.parts) != 1 or not isinstance(added.parts[0], Cells) or added.parts[0].vars:
        engine.refuse("skips more than one block at once", op)
    part = added.parts[0]
    return [(home.hop, home.offset, size), (home.hop + part.hop, part.start, part.size)]


def _hop_relation(engine: Engine, a: Aff, b: Aff) -> bool | None:
    """Whether two hops are the same block, without assuming anything: None while unknowns decide it."""
    diff = a - b
    if diff.is_const:
        return diff.const % engine.ring.cp == 0
    if any(x in engine.state.unknown_vars for x in diff.free_atoms()):
        return None
    return False


def _unit_relation(engine: Engine, u, v) -> bool | None:
    if u[2] != v[2] or (u[1] - v[1]) != Aff():
        return False
    return _hop_relation(engine, u[0], v[0])


def _same_pair(engine: Engine, op, p, q) -> bool:
    """Whether two unit pairs are the same pair (in either order); where unknowns leave both orders open, the
    order with more units already known to match is taken, and its remaining equalities are checked later."""
    from .algebra import same_hop
    orders = [((p[0], q[0]), (p[1], q[1])), ((p[0], q[1]), (p[1], q[0]))]
    scored = []
    for order in orders:
        relations = [_unit_relation(engine, u, v) for u, v in order]
        if False not in relations:
            scored.append((relations.count(True), order))
    if not scored:
        return False
    _, order = max(scored, key=lambda t: t[0])
    return all(same_hop(engine, u[0], v[0], op, "skips different pairs of units for different results")
               for u, v in order)


def _folded(engine: Engine, skip, compute) -> Coverage | None:
    """The coverage `compute` adds over `skip`, when it is `skip` with one block folded in (or a partial over one
    block where `skip` is zero)."""
    if not isinstance(compute, Data) or compute.agg is None or not isinstance(skip, Data):
        return None
    c = compute.agg
    if skip.agg is None:
        # a constant start value (the identity, or a floor like -1e30 for a max): nothing folded in yet
        if c.op in (AggOp.SUM, AggOp.SSUM, AggOp.MAX, AggOp.MIN, AggOp.LSE, AggOp.NSUM) and \
                start_value(engine, skip, compute) and \
                not any(isinstance(p, CoverageVar) for p in c.cov.parts):
            return c.cov
        return None
    s = skip.agg
    if (s.op, s.term, s.score, s.home, s.start) != (c.op, c.term, c.score, c.home, c.start) or \
            skip.dims != compute.dims:
        return None
    s = Agg(s.op, s.home, s.term, engine.canonical_cov(s.cov), s.score, engine.canonical_cov(s.shift_cov))
    c = Agg(c.op, c.home, c.term, engine.canonical_cov(c.cov), c.score, engine.canonical_cov(c.shift_cov))
    message = "folds different blocks into aggregates merged in one branch"
    added = cov_rest(engine, s.cov, c.cov) if c.op in (AggOp.LSE, AggOp.NSUM) else \
        cov_prefix(engine, None, s.cov, c.cov, message)
    if added is None:
        return None
    if c.op in (AggOp.SSUM, AggOp.SHIFT):
        shifted = cov_prefix(engine, None, s.shift_cov, c.shift_cov, message)
        if shifted is None or (shifted.parts and not covs_equal(engine, None, shifted, added, message)):
            return None
    return added if added.parts else None


def _check_predicate(engine: Engine, op, selector, units) -> None:
    if isinstance(selector, Index):
        resolved = engine.resolve(selector, op, 0)
        _positions_only(engine, op, resolved.expr)
        for node in _gpos_nodes(resolved.expr):
            inner, unit = node.args
            coord = next(a for a in inner.atoms() if hasattr(a, "hop"))
            local = inner.without(coord).scale(unit)
            if not _inside(engine, op, coord.hop, local, unit, units):
                engine.refuse("skips blocks by a predicate that reads positions outside the two units it skips", op)
    else:
        pred = selector
        if pred.agg is None and not pred.is_invariant:
            _positions_of_units(engine, op, pred, units)
        if pred.agg is None and engine.fns.depends(pred.fn) - engine.state.unknown_vars:
            engine.refuse(_COUNTERS, op, (pred,))  # a table read at the ring step, say
        if pred.agg is not None:
            if pred.agg.home is not None or pred.agg.op not in (AggOp.UNITFN, AggOp.MAX, AggOp.MIN, AggOp.SUM):
                engine.refuse("skips blocks by a predicate of token data", op, (pred,))
            for p in pred.agg.cov.parts:
                if not isinstance(p, Cells) or p.vars or not _inside(engine, op, p.hop, p.start, p.size, units):
                    engine.refuse("skips blocks by a predicate of tokens outside the two units it skips", op)
    for hop, offset, size in units:
        engine.state.units.setdefault((size, _alignment(offset)), (op, tuple(engine.state.call_ops)))


def _positions_of_units(engine: Engine, op, pred: Data, units) -> None:
    """A predicate held as data rather than as index arithmetic, fine where it is a function of the global
    positions of tokens of the two units it skips, combined elementwise in any way (the parts of a skip JAX's
    partial evaluation computes ahead of a loop and stacks: `kf < p` of a prefix-LM skip, `qf // w` of a chunked
    one, under jax.grad). Such a function takes the same value for the same pair of units once the positions it
    reads are rewritten, whatever boolean or arithmetic combination it is: the reorder changes which tokens a block
    holds, never what a token's position is. Loop variables it may read are refused by the caller."""
    width = _position_unit(engine.fns, pred.fn, frozenset(str(v) for v in engine.fns.depends(pred.fn)))
    if width is None or pred.elements or any(isinstance(role, (Tok, Stack)) for role in pred.dims):
        engine.refuse("skips blocks by a predicate of token data", op, (pred,))
    for _, axis in pred.axes:
        # the tokens it reads the positions of; a unit wider than one token is read as its first token's position,
        # checked whole (as the index form's are), the widest unit taken for every token
        if not _inside(engine, op, axis.hop, axis.offset, width, units):
            engine.refuse("skips blocks by a predicate that reads positions outside the two units it skips", op)


def _position_unit(fns, fn: int, variables: frozenset[str]) -> int | None:
    """Where the function `fn` names is one of global positions (and constants, other mesh axes' coordinates,
    loop variables, named in `variables`) alone, combined elementwise: the widest unit of tokens whose position it
    reads (1: single tokens, or none). None where it reads anything else: token data, a reduction, a table, a
    slice of data at a loop counter, an integer whose type may wrap (functions that index_to_data and the
    elementwise rules don't build from positions alone, or that the analysis reads as data), a ring coordinate or
    partition id outside a position, or a local index (which tokens they name changes with the layout)."""
    key = fns.keys[fn]
    if not isinstance(key, tuple) or not key or fn in fns.wrapped:
        # an integer op whose type may wrap is read as data, as everywhere (README: a skip compared in int8 is
        # refused, the report naming the convert, reasons.py)
        return None
    if key[0] == "const":
        return 1
    if key[0] == "index":
        units: list[int] = []
        return max(units, default=1) if _of_positions(key[1], variables, units) else None
    if key[0] == "ew":
        widths = [_position_unit(fns, f, variables) for f in key[3]]
        return None if None in widths else max(widths, default=1)
    return None


def _of_positions(canon, variables: frozenset[str], units: list[int]) -> bool:
    """Whether an index function's canonical form (analysis.index_to_data: terms of atoms, and a constant) reads
    positions (("pos", axis, unit), their units added to `units`), other mesh axes' coordinates, the loop
    variables named in `variables` and constants alone, through any nodes; not a ring coordinate, a partition id
    or a local index (("dim", i))."""
    terms, _ = canon
    for atom, _ in terms:
        if isinstance(atom, str):
            if atom not in variables:
                return False
        elif atom[0] == "pos":
            units.append(atom[2])
        elif atom[0] == "other":
            continue
        elif atom[0] == "dim":
            return False
        else:  # a node: (op, its arguments: canonical forms, or ints)
            for arg in atom[1:]:
                if isinstance(arg, int):
                    continue
                if not (isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[0], tuple)) \
                        or not _of_positions(arg, variables, units):
                    return False
    return True


_COUNTERS = ("skips blocks by a predicate of loop counters or the ring step, not only of the positions of the two "
             "units it skips: which tokens a chunk or a ring step holds changes with the layout; decide the skip "
             "from the chunks' global positions (first and last)")


def _positions_only(engine: Engine, op, expr: Aff) -> None:
    """A skip's predicate may read the two units' global positions (gpos nodes, checked by _inside) and constants,
    combined by any arithmetic, and nothing else: a loop counter (a chunk's index within its block, the ring step)
    or a local index names other tokens once the reorder changes what a block holds, while positions are
    rewritten. Unknowns of a discovery pass are left to the pass that knows them."""
    for atom, _ in expr.terms:
        if isinstance(atom, Node) and atom.op == "gpos":
            continue
        if isinstance(atom, Node) and atom.op != "opaque":
            for arg in atom.args:
                if isinstance(arg, Aff):
                    _positions_only(engine, op, arg)
            continue
        if isinstance(atom, Var) and atom in engine.state.unknown_vars:
            continue
        engine.refuse(_COUNTERS, op)


def _gpos_nodes(expr: Aff):
    for atom in expr.free_atoms():
        if isinstance(atom, Node) and atom.op == "gpos":
            yield atom


def _inside(engine: Engine, op, hop: Aff, local: Aff, width: int, units) -> bool:
    """Whether tokens [local, local + width) of the block `hop` steps behind lie inside one of the units: a unit
    whose block is known to be that one first, else one whose block is still being solved for (checked later)."""
    candidates = []
    for u_hop, u_offset, u_size in units:
        lo, hi = bounds(local - u_offset, engine.scope)
        if lo < 0 or hi + width > u_size:
            continue
        diff = hop - u_hop
        if diff.is_const:
            if diff.const % engine.ring.cp == 0:
                return True
            continue
        candidates.append(u_hop)
    if candidates:  # decided once the loops' unknowns are solved: one of them must be that block
        engine.defer(ObligationKind.HOP_ANY, hop, tuple(candidates), op,
                     "skips blocks by a predicate that reads positions outside the two units it skips")
        return True
    return False


def _alignment(offset: Aff) -> int:
    """The largest power of... the gcd of an offset's coefficients and constant: every value it takes is a
    multiple of it (0: always 0)."""
    from math import gcd
    g = offset.const
    for _, c in offset.terms:
        g = gcd(g, c)
    return abs(g)


__all__ = ["branches"]
