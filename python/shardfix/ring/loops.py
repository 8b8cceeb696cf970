"""Loops and the buffers they fill (branches.py: case / if).

A while loop is analysed once. Its counter (`i = c0; while i < n: ...; i += s`, as fori_loop and scan lower)
becomes a loop variable; every other carried value becomes an unknown: integers an unknown offset, token data an
unknown number of ring steps, aggregates an unknown set of folded-in blocks. The body is interpreted with those
unknowns, the recurrences it returns are solved (an integer advancing by a constant, data moving one ring step,
an aggregate folding in the blocks of this iteration, a buffer filled one slice per iteration), the facts assumed
about the unknowns are checked against the solution, and the loop's results are the solution at the trip count.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from jaxlib.mlir import ir

from . import coverage as cov_ops
from . import stabiliser
from .algebra import agg_fn, cov_prefix, cov_rest, depends, start_value, try_complete
from .logsum import carried_start_refusal, refuse_carried_hard_max
from .analysis import Engine, Refusal
from .dims import element_type, holds, shape
from .loopmemo import memoized
from .symbolic import Aff, Coord, Node, Var, congruent, sourced_nodes
from .symbolic import Dim as SymDim
from .values import (CONST, EMPTY, FREE, AggOp, Axis, Cells, Coverage, CoverageVar, Data, Index, Obligation,
                     ObligationKind, Stack, Tok, Written, canonical)


# ---------------------------------------------------------------------------------------------------------------
# Buffers.


def buffer_write(engine: Engine, op, buffer, update, starts: list[Aff], unchanged: bool = False):
    """`update` written into `buffer` at `starts` (`unchanged`: it is the slice the body read there, so the write
    leaves the buffer as it was)."""
    from .autodiff import OPAQUE
    if update is OPAQUE or buffer is OPAQUE:  # what only residuals read, written into a buffer: uninterpreted
        return OPAQUE
    out = shape(op.results[0])
    if isinstance(update, Index) and isinstance(buffer, Index) and next(sourced_nodes(update.expr), None) is None:
        # integers (chunk indices, positions) a loop stacks stay integers: read back, they are the same numbers
        written = _slice_written(engine, op, buffer, update, starts, out, unchanged)
        if written is not None:
            return written
    update = try_complete(engine, engine.as_data(update, op, 1))
    if tuple(update.shape) == tuple(out) and all(s == Aff() for s in starts):
        return update
    partial = [d for d in range(len(out)) if update.shape[d] != out[d]]
    slot = engine.state.carried.get(id(buffer))
    if slot is None or len(partial) != 1 or any(s != Aff() for d, s in enumerate(starts) if d != partial[0]):
        engine.refuse("writes part of a buffer other than one slice per iteration of the loop filling it", op)
    loop, index = slot
    return Written(loop, index, partial[0], starts[partial[0]], update, tuple(out), unchanged)


def _slice_written(engine: Engine, op, buffer, update, starts: list[Aff], out,
                   unchanged: bool) -> "Written | None":
    partial = [d for d in range(len(out)) if update.shape[d] != out[d]]
    slot = engine.state.carried.get(id(buffer))
    if slot is None or len(partial) != 1 or any(s != Aff() for d, s in enumerate(starts) if d != partial[0]):
        return None
    return Written(slot[0], slot[1], partial[0], starts[partial[0]], update, tuple(out), unchanged)


UNDECIDED = -1


def first_iteration_loop(engine: Engine, cond: Index) -> int | None:
    """The loop (its op's number, coverage.op_number) whose first iteration, and only that, `cond` holds at: a
    condition of that loop's iteration variable alone (`i == 0` in a fori_loop body). None for any other condition."""
    if cond.shape and any(n > 1 for n in cond.shape):
        return None
    atoms = cond.expr.free_atoms()
    if any(isinstance(a, Var) and a in engine.state.unknown_vars for a in atoms):
        return UNDECIDED  # a loop's discovery pass, its counter still unknown: the pass that follows decides
    loop_vars = [a for a in atoms if isinstance(a, Var) and a in engine.state.loop_vars]
    if len(loop_vars) != 1 or any(not isinstance(a, (Var, Node)) for a in atoms) or \
            any(isinstance(a, Var) and a is not loop_vars[0] for a in atoms):
        return None
    k = loop_vars[0]
    found = engine.scope.var_bounds.get(k)
    if found is None or not found[0].is_const or not found[1].is_const or found[1].const - found[0].const > 256:
        return None
    lo, hi = int(found[0].const), int(found[1].const)
    for value in range(lo, hi + 1):
        fixed = cond.expr.substitute({k: Aff((), value)})
        if not fixed.is_const or fixed.const != (1 if value == lo else 0):
            return None
    return engine.state.loop_vars[k]


def substitute_value(value, mapping: dict):
    """An abstract value with Vars (and CoverageVars) replaced."""
    if isinstance(value, Index):
        return Index(value.shape, value.expr.substitute({k: v for k, v in mapping.items() if isinstance(k, Var)}))
    if not isinstance(value, Data):
        return value
    plain = {k: v for k, v in mapping.items() if isinstance(k, Var)}
    axes = tuple((k, Axis(a.hop.substitute(plain), a.offset.substitute(plain))) for k, a in value.axes)
    agg = value.agg
    if agg is not None:
        agg = replace(agg, cov=cov_ops.substitute(agg.cov, mapping),
                      shift_cov=cov_ops.substitute(agg.shift_cov, mapping))
    elements = tuple((var, substitute_value(e, mapping)) for var, e in value.elements)
    return canonical(value.with_(axes=axes, agg=agg, elements=elements))


# ---------------------------------------------------------------------------------------------------------------
# While loops.


@dataclass
class _Counter:
    index: int
    start: int
    step: int
    trips: int


_IDENTITY = ("sdy.sharding_constraint", "sdy.reshard")


def through_identity(value: ir.Value) -> ir.Value:
    """The value a chain of sharding constraints (which Shardy puts even on loop counters) passes on."""
    while not isinstance(value.owner, ir.Block) and value.owner.name in _IDENTITY:
        value = value.owner.operands[0]
    return value


def const_of(engine: Engine, value: ir.Value, inits: list, block, passthrough: list[bool]) -> int | None:
    """A constant: a splat constant op, or a loop argument that is passed through unchanged from a constant (one the
    body changes is only its start: `while i < n` with `n = n + 1` in the body runs more trips than the start of n
    says)."""
    value = through_identity(value)
    owner = value.owner
    if isinstance(owner, ir.Block):
        if owner == block:
            number = ir.BlockArgument(value).arg_number
            init = inits[number]
            if passthrough[number] and isinstance(init, Index) and init.expr.is_const:
                return init.expr.const
        return None
    if owner.name == "stablehlo.constant":
        from .dims import splat_number
        number = splat_number(owner)
        return int(number) if isinstance(number, (int, bool)) else None
    if owner.block == block:
        # computed in the loop from its arguments: what the analysis holds for it is from an earlier pass
        return None
    try:
        found = engine.get(value)
    except Exception:
        return None
    return found.expr.const if isinstance(found, Index) and found.expr.is_const else None


def _counter(engine: Engine, op, inits: list, passthrough: list[bool]) -> _Counter | None:
    """The loop counter: the condition is `arg_i < n` and the body returns `arg_i + step`."""
    cond = op.regions[0].blocks[0]
    cond_ops = [o.operation for o in cond.operations]
    ret = through_identity(cond_ops[-1].operands[0])
    compare = ret.owner
    if isinstance(compare, ir.Block) or compare.name != "stablehlo.compare":
        return None
    from jaxlib.mlir.dialects import stablehlo
    if stablehlo.ComparisonDirectionAttr(compare.attributes["comparison_direction"]).value != "LT":
        return None
    lhs, rhs = (through_identity(v) for v in compare.operands)
    if not isinstance(lhs.owner, ir.Block) or not signed_compare(compare):
        return None
    index = ir.BlockArgument(lhs).arg_number
    bound = const_of(engine, rhs, inits, cond, passthrough)
    init = inits[index]
    if bound is None or not isinstance(init, Index) or not init.expr.is_const or passthrough[index]:
        return None
    step = constant_step(engine, op, inits, index, passthrough)
    if not step or step < 1:
        return None
    start = init.expr.const
    trips = max(0, -(-(bound - start) // step))
    if not holds(lhs, start, start + trips * step):
        return None  # the counter wraps before it reaches its bound (int8 from 10 by 120): not this trip count
    return _Counter(index, start, step, trips)


def signed_compare(compare: ir.Operation) -> bool:
    """`i < n` compares signed integers as numbers (not unsigned ones, where 0 - 1 is the largest)."""
    t = element_type(compare.operands[0])
    if not isinstance(t, ir.IntegerType) or ir.IntegerType(t).is_unsigned or ir.IntegerType(t).width == 1:
        return False
    from jaxlib.mlir.dialects import stablehlo
    return "compare_type" not in compare.attributes or \
        stablehlo.ComparisonTypeAttr(compare.attributes["compare_type"]).value == "SIGNED"


def constant_step(engine: Engine, op, inits: list, i: int, passthrough: list[bool]) -> int | None:
    """The step of carried integer i when the body returns `arg_i + constant` (and it starts as a constant)."""
    if not inits[i].expr.is_const:
        return None
    body = op.regions[1].blocks[0]
    returned = through_identity(list(body.operations)[-1].operation.operands[i])
    add = returned.owner
    if isinstance(add, ir.Block) or add.name != "stablehlo.add":
        return None
    a, b = (through_identity(v) for v in add.operands)
    arg = body.arguments[i]
    step = const_of(engine, b, inits, body, passthrough) if a == arg else \
        const_of(engine, a, inits, body, passthrough) if b == arg else None
    return step or None


def _while_loop(engine: Engine, op, inits: list):
    body = op.regions[1].blocks[0]
    terminator = list(body.operations)[-1].operation
    passthrough = [terminator.operands[i] == body.arguments[i] for i in range(len(inits))]
    dead = engine.dead_slots.get(op, ())
    if dead:  # slots only residuals read: carried uninterpreted, like values the loop passes through
        from .autodiff import OPAQUE
        if engine.state.strict_residuals and any(isinstance(inits[i], Index) and not inits[i].expr.is_const
                                                 for i in dead):
            # a position carried for the backward alone would reach it unread, so not rewritten
            engine.refuse("carries positions (or a device index) that only the backward reads, which the proof of "
                          "its results does not follow, so the rewrite would leave them in the old layout", op)
        inits = [OPAQUE if i in dead else v for i, v in enumerate(inits)]
        passthrough = [p or i in dead for i, p in enumerate(passthrough)]
    counter = _counter(engine, op, inits, passthrough)
    if counter is not None and counter.trips == 0:
        return inits
    if counter is not None and counter.trips == 1:
        # the body runs once, on the values the loop starts with: straight-line code, as if written out (a scan
        # over 4 ring steps unrolled by 3 runs its first three in one trip, a step-0 reset included); slots only
        # residuals read stay uninterpreted
        return engine.run_block(body, inits, opaque=dead)
    engine.state.loop_runs[id(op)] = next(_RUNS)  # the names of the maxima this analysis carries
    saved = _snapshot(engine.state)
    try:
        plan = _discover(engine, op, inits, passthrough, counter)
    finally:
        _restore(engine.state, saved)
    for _ in range(len(inits) + 1):
        saved = _snapshot(engine.state)
        try:
            return _analyse(engine, op, inits, passthrough, counter, plan)
        except _MoreFree as more:  # data that follows no token changes after all: analysed as changing
            _restore(engine.state, saved)
            plan.free |= more.slots
    engine.refuse("carries a value the analysis can't follow through a loop", op)


# analysed once per distinct input, where a loop around it runs it again (loopmemo.py)
while_loop = memoized(_while_loop)
_RUNS = itertools.count()  # analyses of loops, each naming the maxima it carries (stabiliser.slot_ident)


class _MoreFree(Exception):
    def __init__(self, slots: set):
        super().__init__(str(slots))
        self.slots = slots


@dataclass
class _Plan:
    """What an iteration does to each carried value: an integer's step, each token axis's ring step, and the
    aggregate form of an accumulator that starts as a constant (with its block at iteration k)."""

    index_steps: dict
    hop_steps: dict  # carried index -> per-axis ring steps
    widened: dict  # carried index -> (template Data, per-axis hop as a function of k)
    k: Var
    free: set = None  # carried indices of data that follows no token, changed by anything (a PRNG key's rounds)
    coord_steps: dict = None  # carried index -> (hop at iteration 0, ring steps per iteration) of a carried coordinate
    # carried index -> (its coordinate at iteration 0, ring steps, integer step per iteration) of integers made from
    # one ring coordinate (a block's positions ppermuted with it)
    travel_steps: dict = None
    # carried index -> (dim, start, size) of the slice of a buffer each iteration writes (`Written`), as the
    # discovery pass saw it
    written: dict = None


def _snapshot(state):
    return (dict(state.rewrites), dict(state.units), list(state.obligations), set(state.unknown_vars),
            set(state.directions), dict(state.cov_alias), stabiliser.mark(state.fns))


def _restore(state, saved) -> None:
    (state.rewrites, state.units, state.obligations[:], state.unknown_vars, state.directions,
     state.cov_alias, notes) = saved
    stabiliser.rollback(state.fns, notes)


def _discover(engine: Engine, op, inits, passthrough, counter) -> _Plan:
    """A first pass with everything that changes unknown: how each carried value changes per iteration."""
    body = op.regions[1].blocks[0]
    k = cov_ops.fresh_var("it")
    engine.state.loop_vars[k] = cov_ops.op_number(op)  # as its unknown coverages name it
    placeholders, owned, index_steps = [], {}, {}
    for i, init in enumerate(inits):
        step = constant_step(engine, op, inits, i, passthrough) if isinstance(init, Index) else None
        if passthrough[i]:
            placeholders.append(init)
        elif counter is not None and i == counter.index:
            placeholders.append(Index((), Aff.of(counter.start) + Aff.of(k).scale(counter.step)))
        elif step is not None:
            # a second counter (fori_loop's `i` beside the trip counter): known at every iteration from the start
            index_steps[i] = step
            placeholders.append(_register(engine, op, i, Index(init.shape, init.expr + Aff.of(k).scale(step))))
        elif isinstance(init, Index) and _coordinate_hop(init) is not None:
            # a ring coordinate carried from step to step (`kv_source = (kv_source - 1) % cp`, or a block's
            # coordinate ppermuted with the block): followed as the coordinate of a block an unknown number of
            # ring steps away, so that a step of whole ring steps (mod cp) is recognised as one
            q = cov_ops.fresh_var("q")
            engine.state.unknown_vars.add(q)
            owned[i] = [q]
            placeholders.append(_register(engine, op, i, Index(init.shape, Aff.of(Coord(_coordinate_hop(init)
                                                                                          + Aff.of(q))))))
        elif isinstance(init, Index) and _one_coordinate(init) is not None:
            # integers made from one ring coordinate (a block's positions `c * n + iota`, sent around the ring with
            # the block): followed as those of the block an unknown number of ring steps away, offset by an
            # unknown integer
            q, p = cov_ops.fresh_var("q"), cov_ops.fresh_var("p")
            engine.state.unknown_vars.update((q, p))
            owned[i] = [q, p]
            placeholders.append(_register(engine, op, i, Index(init.shape, _moved(init, Aff.of(q), Aff.of(p)))))
        elif isinstance(init, Index):
            p = cov_ops.fresh_var("p")
            engine.state.unknown_vars.add(p)
            owned[i] = [p]
            placeholders.append(_register(engine, op, i, Index(init.shape, init.expr + Aff.of(p))))
        elif isinstance(init, Data):
            hops = [cov_ops.fresh_var("h") for _ in init.axes]
            engine.state.unknown_vars.update(hops)
            owned[i] = hops
            axes = tuple((key, Axis(a.hop + Aff.of(h), a.offset)) for (key, a), h in zip(init.axes, hops))
            placeholders.append(_carried(engine, op, i, init.with_(axes=axes), _unknown_coverage(op, i, init)))
        else:
            engine.refuse("carries a value the analysis can't follow through a loop", op)
    with _iterating(engine, k, counter):
        returned = engine.run_block(body, placeholders)
    steps: dict = {}
    hop_steps, coord_steps, travel_steps = {}, {}, {}
    for i, ph in enumerate(placeholders):
        if i not in owned:
            continue
        ret = returned[i]
        if isinstance(ret, Written):  # a buffer (that starts as a constant) filled slice by slice
            continue
        if isinstance(ph, Index) and _coordinate_hop(ph) is None and _one_coordinate(inits[i]) is not None:
            q, p = owned[i]
            moved = _one_coordinate(ret) if isinstance(ret, Index) else None
            delta = moved.hop - _one_coordinate(ph).hop if moved is not None else None
            step = ret.expr - _moved(inits[i], Aff.of(q) + delta, Aff.of(p)) if delta is not None and \
                delta.is_const else None
            if step is None or not step.is_const:
                engine.refuse("changes loop-carried integers made from a ring coordinate (a block's positions) "
                              "other than by sending them a constant number of ring steps and adding a constant",
                              op, (ret,))
            travel_steps[i] = (_one_coordinate(inits[i]), delta.const, step.const)
            steps[q], steps[p] = Aff.of(k).scale(delta.const), Aff.of(k).scale(step.const)
            continue
        if isinstance(ph, Index) and _coordinate_hop(ph) is not None:
            delta = _coordinate_hop(ret) - _coordinate_hop(ph) if _coordinate_hop(ret) is not None else None
            if delta is None or not delta.is_const:
                engine.refuse("changes a loop-carried ring coordinate other than by a constant number of ring "
                              "steps: write the source coordinate as `(kv_source - 1) % cp` with cp the ring's "
                              "size, or compute it from the step, `(axis_index - i) % cp`", op)
            coord_steps[i] = (_coordinate_hop(inits[i]), delta.const)
            steps[owned[i][0]] = Aff.of(k).scale(delta.const)
        elif isinstance(ph, Index):
            step = ret.expr - ph.expr if isinstance(ret, Index) else None
            if step is None or not step.is_const:
                engine.refuse("changes a loop-carried integer other than by a constant step", op, (ret,))
            index_steps[i] = step.const
            steps[owned[i][0]] = Aff.of(k).scale(step.const)
        elif isinstance(ret, Data) and len(ret.axes) == len(ph.axes) and ph.axes:
            deltas = []
            for (_, a), (_, b), h in zip(ph.axes, ret.axes, owned[i]):
                delta = b.hop - a.hop
                if not delta.is_const:
                    engine.refuse("moves loop-carried tokens by a varying number of ring steps", op)
                deltas.append(delta.const)
                steps[h] = Aff.of(k).scale(delta.const)
            hop_steps[i] = deltas
    widened = {}
    for i, ph in enumerate(placeholders):
        ret = returned[i]
        if i in owned and isinstance(ph, Data) and ph.agg is None and not ph.axes and isinstance(ret, Data) and \
                ret.agg is not None and start_value(engine, ph, ret):
            widened[i] = _template(engine, op, ret, steps, k, {v for vs in owned.values() for v in vs})
    free = {i for i in owned if _follows_no_token(placeholders[i]) and _follows_no_token(returned[i])
            and returned[i].fn != placeholders[i].fn and returned[i].shape == placeholders[i].shape}
    written = {i: (ret.dim, ret.index, ret.update.shape[ret.dim]) for i, ret in enumerate(returned)
               if i in owned and isinstance(ret, Written)}
    return _Plan(index_steps, hop_steps, widened, k, free, coord_steps, written=written, travel_steps=travel_steps)


def _one_coordinate(value) -> Coord | None:
    """The ring coordinate integers are made from, where they read exactly one."""
    if not isinstance(value, Index):
        return None
    coords = [a for a in value.expr.free_atoms() if isinstance(a, Coord)]
    return coords[0] if len(coords) == 1 else None


def _moved(init: Index, hops: Aff, offset: Aff) -> Aff:
    """`init`'s integers for the block `hops` ring steps further on, plus `offset`."""
    coord = _one_coordinate(init)
    return init.expr.substitute({coord: Aff.of(Coord(coord.hop + hops))}) + offset


def _coordinate_hop(value) -> Aff | None:
    """The hop h when `value` is exactly the ring coordinate of the block h ring steps behind, (c - h) mod cp."""
    if not isinstance(value, Index):
        return None
    terms = value.expr.terms
    if value.expr.const == 0 and len(terms) == 1 and terms[0][1] == 1 and isinstance(terms[0][0], Coord):
        return terms[0][0].hop
    return None


def _follows_no_token(value) -> bool:
    """Data the reorder can't change: no tokens, no aggregate, no stacked buffer (loop data of the same shape on
    every device and in every layout, like the rounds of a PRNG key)."""
    return isinstance(value, Data) and not value.axes and value.agg is None and \
        not any(isinstance(r, (Tok, Stack)) for r in value.dims) and not value.elements


def _free_data(engine: Engine, op, i: int, init: Data, key: tuple, inits) -> Data:
    """Loop data that follows no token at an unknown iteration (or at the exit): a function of the loop's inputs
    (every carried value's start: a key folded with the ring step, or a float started from it, is the ring step's)
    and of the iteration variable in `key`."""
    dims = tuple(FREE if n > 1 else CONST for n in init.shape)
    inputs, reads = [], {a for a in key if isinstance(a, Var)}
    for value in inits:
        if isinstance(value, Data):
            inputs.append((value.fn, value.axes, value.agg))
            reads |= depends(engine, [value])
        elif isinstance(value, Index):
            inputs.append(value.expr)
            reads |= {a for a in value.expr.free_atoms() if isinstance(a, Var)}
        else:
            inputs.append(type(value).__name__)
    return Data(init.shape, dims, (), engine.fns.intern(("loop-data", id(op), i) + key + (tuple(inputs),),
                                                        frozenset(reads)))


def _template(engine: Engine, op, ret: Data, steps: dict, k: Var, mine: set):
    """An accumulator that starts as a constant, in the form the body gives it, and where its tokens are at
    iteration k (where the previous iteration left them)."""
    agg = ret.agg
    refuse_carried_hard_max(engine, agg)
    axes = []
    for key, axis in ret.axes:
        hop = axis.hop.substitute(steps)
        if any(x in mine for x in hop.free_atoms() | axis.offset.free_atoms()) or k in axis.offset.free_atoms():
            engine.refuse("accumulates into tokens the analysis can't pin down from one iteration to the next", op)
        axes.append((key, Axis(hop.substitute({k: Aff.of(k) - 1}), axis.offset)))
    # a merge state's start is the init itself: whether the body's float result at the start is exact is checked on
    # what the body returns (_solve)
    template = ret.with_(axes=(), agg=replace(agg, cov=EMPTY, shift_cov=EMPTY,
                                              nan=agg.nan and agg.op not in (AggOp.LSE, AggOp.NSUM),
                                              masked=agg.masked and agg.op not in (AggOp.LSE, AggOp.NSUM)))
    return template, tuple(axes)


def _unknown_coverage(op, i: int, init: Data):
    if init.agg is None:
        return None
    n = cov_ops.op_number(op)
    return CoverageVar(f"cv{n}_{i}"), CoverageVar(f"sv{n}_{i}")


def _register(engine: Engine, op, i: int, value):
    """`value` is loop-carried value i of `op` (buffer writes into it are recognised)."""
    engine.state.carried[id(value)] = (id(op), i)
    engine.state.shared.keep_alive.append(value)
    return value


def _carried(engine: Engine, op, i: int, value: Data, coverage) -> Data:
    """A loop-carried Data value at an unknown iteration: its aggregate's coverage unknown (what earlier
    iterations folded in), registered so that buffer writes into it can be recognised."""
    agg = value.agg
    if agg is not None and coverage is not None:
        cv, sv = coverage
        if agg.op in (AggOp.LSE, AggOp.NSUM):
            engine.state.started.update(str(p) for p in agg.cov.parts if not isinstance(p, CoverageVar))
        agg = replace(agg, cov=agg.cov.union(Coverage((cv,))),
                      shift_cov=agg.shift_cov.union(Coverage((sv,)))
                      if agg.op in (AggOp.SSUM, AggOp.SHIFT, AggOp.MDIFF) else agg.shift_cov,
                      ident=_slot_ident(engine, op, i, agg))
        value = value.with_(agg=agg, fn=agg_fn(engine, agg))
    return _register(engine, op, i, value)


def _slot_ident(engine: Engine, op, i: int, agg):
    """The maximum a carried aggregate is (a running max: the slot's) or is shifted by (a sum: unknown until the
    body rescales it, checked by _solve), stabiliser.py; named for this analysis of the loop (`_while_loop`)."""
    run = engine.state.loop_runs[id(op)]
    if agg.op in (AggOp.MAX, AggOp.MIN):
        return stabiliser.slot_ident(op, i, agg.score, run)
    if agg.op == AggOp.SSUM:
        return stabiliser.shift_var(op, i, agg.score, run)
    return None


class _iterating:
    """The scope of a loop body: its iteration variable in [0, trips - 1]."""

    def __init__(self, engine: Engine, k: Var, counter):
        self.engine, self.k = engine, k
        self.trips = counter.trips if counter is not None else None

    def __enter__(self):
        self.saved = self.engine.scope
        self.skippable, self.engine.state.skippable = self.engine.state.skippable, 0
        var_bounds = dict(self.saved.var_bounds)
        var_bounds[self.k] = (Aff(), Aff.of((self.trips if self.trips is not None else 1 << 30) - 1))
        self.engine.scope = self.saved.with_vars(var_bounds, ())
        return self

    def __exit__(self, *exc):
        self.engine.scope = self.saved
        self.engine.state.skippable = self.skippable
        return False


def _analyse(engine: Engine, op, inits, passthrough, counter, plan: _Plan):
    """The loop analysed with every carried value in its iteration-k form; only aggregates' coverages are
    unknown, solved from what one iteration folds in."""
    body = op.regions[1].blocks[0]
    k = plan.k
    trips = counter.trips if counter is not None else None
    placeholders, changing = [], []
    for i, init in enumerate(inits):
        if passthrough[i]:
            placeholders.append(init)
            continue
        if counter is not None and i == counter.index:
            placeholders.append(Index((), Aff.of(counter.start) + Aff.of(k).scale(counter.step)))
            continue
        changing.append(i)
        if i in plan.coord_steps:
            # at iteration k the coordinate of the block h0 + d*k ring steps behind: _solve checks that the body
            # maps it to that of h0 + d*(k + 1), and it is that at k = 0 (the init), so by induction at every k
            h0, d = plan.coord_steps[i]
            placeholders.append(_register(engine, op, i, Index(init.shape, Aff.of(Coord(h0 + Aff.of(k).scale(d))))))
        elif i in plan.travel_steps:
            # (likewise: _solve checks the step from k to k + 1)
            _, d, step = plan.travel_steps[i]
            placeholders.append(_register(engine, op, i, Index(init.shape, _moved(init, Aff.of(k).scale(d),
                                                                                   Aff.of(k).scale(step)))))
        elif isinstance(init, Index):
            placeholders.append(_register(engine, op, i, Index(init.shape, init.expr
                                                               + Aff.of(k).scale(plan.index_steps.get(i, 0)))))
        elif i in plan.free:
            placeholders.append(_register(engine, op, i, _free_data(engine, op, i, init, (k,), inits)))
        elif i in plan.written and isinstance(init, Data):
            # a buffer filled slice by slice: at iteration k the slice it writes still holds the init's
            placeholders.append(_register(engine, op, i, init.with_()))
        elif i in plan.widened:
            template, axes = plan.widened[i]
            placeholders.append(_carried(engine, op, i, template.with_(axes=axes), _unknown_coverage(op, i, template)))
        else:
            deltas = plan.hop_steps.get(i, [0] * len(init.axes))
            axes = tuple((key, Axis(a.hop + Aff.of(k).scale(d), a.offset)) for (key, a), d in zip(init.axes, deltas))
            placeholders.append(_carried(engine, op, i, init.with_(axes=axes), _unknown_coverage(op, i, init)))
    if trips is None and changing:
        engine.refuse("changes values in a loop whose trip count is unknown", op)
    reads = {}
    for i in plan.written:
        _check_fill_reads(engine, op, body.arguments[i])
        reads[i] = engine.state.filling[id(placeholders[i])] = []
    first_obligation = len(engine.state.obligations)
    with _iterating(engine, k, counter):
        _check_condition(engine, op, placeholders, counter)
        returned = engine.run_block(body, placeholders)
        for i in plan.written:
            ret = returned[i]
            if not isinstance(ret, Written):
                engine.refuse("writes a buffer it carries other than one slice per iteration of the loop", op)
            dim, size = ret.dim, ret.update.shape[ret.dim]
            for read, starts, sizes in reads[i]:  # each a slice of the buffer: the one this iteration writes
                if starts[dim] != ret.index or sizes[dim] != size or any(
                        d != dim and (starts[d] != Aff() or sizes[d] != n) for d, n in enumerate(ret.shape)):
                    engine.refuse(FILL_READ, read)
        for i in plan.free:
            if not _follows_no_token(returned[i]) or returned[i].shape != placeholders[i].shape:
                engine.refuse(_MIXED, op)
        more = {i for i in changing if i not in plan.free and _follows_no_token(placeholders[i])
                and _follows_no_token(returned[i]) and returned[i].fn != placeholders[i].fn
                and returned[i].shape == placeholders[i].shape}
        if more:
            raise _MoreFree(more)
        solution = _solve(engine, op, placeholders, returned, [i for i in changing if i not in plan.free], k)
        stabiliser.check_loop(engine.fns, op, inits, placeholders, returned)
        _discharge(engine, solution, first_obligation)
    exits = []
    final = {k: Aff.of(trips)} if trips is not None else {}
    for i, init in enumerate(inits):
        if i not in changing:
            exits.append(init if passthrough[i] else Index((), Aff.of(counter.start + counter.step * trips)))
        elif i in plan.free:
            exits.append(_free_data(engine, op, i, init, ("exit",), inits))
        else:
            exits.append(_exit_value(engine, op, init, placeholders[i], returned[i], solution, k, trips, final))
    _check_ring_steps(engine, op, plan, trips, exits)
    return exits


FILL_READ = ("reads a buffer the loop fills slice by slice other than by slicing out the part it writes at that "
              "iteration (an earlier iteration's slice, read back, makes a recurrence along the block, which the "
              "reorder changes)")


def _check_fill_reads(engine: Engine, op, argument) -> None:
    """The body reads the buffer it fills only by one dynamic_update_slice into it and by dynamic_slices (each
    checked by rules.dynamic_slice against the slice written: `State.filling`), directly or in functions it passes
    the buffer to (jnp's dynamic_update_index_in_dim): the value at iteration k is the init with the slices of
    iterations 0..k-1 written, and of that only the slice not written yet is modelled."""
    writes = 0
    todo, seen = [argument], set()
    while todo:
        value = todo.pop()
        for use in value.uses:
            owner, number = use.owner, use.operand_number
            name = owner.name
            if number == 0 and name == "stablehlo.dynamic_slice":
                continue
            if number == 0 and name == "stablehlo.dynamic_update_slice" and writes == 0:
                writes += 1
                continue
            if name == "func.call":
                callee = engine.state.funcs.get(ir.FlatSymbolRefAttr(owner.attributes["callee"]).value)
                if callee is not None and len(callee.regions[0].blocks) and (callee, number) not in seen:
                    seen.add((callee, number))  # (a function handed the buffer twice may write it twice)
                    todo.append(callee.regions[0].blocks[0].arguments[number])
                    continue
            engine.refuse(FILL_READ, owner)


_MIXED = ("changes, step after step in a loop, a value that depends on which tokens the device holds (its data, or "
          "its ring coordinate: a PRNG key folded with the device index, say) other than by merging blocks into a "
          "running sum or max: what it computes changes with the layout; key random numbers by token positions or "
          "by replicated values")


def _check_ring_steps(engine: Engine, op, plan: _Plan, trips, exits) -> None:
    """A loop that passes blocks around the ring for fewer steps than the ring has devices, leaving aggregates
    short of blocks: tokens left behind (what the blocks that never arrive hold changes with the layout)."""
    deltas = {d for ds in plan.hop_steps.values() for d in ds if d}
    steps = {abs(d) for d in deltas}
    cp = engine.ring.cp
    if trips is None or not steps or trips * max(steps) >= cp or (min(deltas) < 0 < max(deltas)):
        return  # (blocks travelling both ways cover the ring in fewer steps: the merges decide)
    if any(next(iter(op.results[i].uses), None) is not None for i, ds in plan.hop_steps.items() if any(ds)):
        return  # the blocks it leaves are read after it (a partially unrolled loop's last steps): the merges decide
    if any(isinstance(v, Data) and v.agg is not None and v.agg.op in (AggOp.SUM, AggOp.MAX, AggOp.MIN, AggOp.SSUM)
           for v in exits):
        ran = trips * max(steps)
        engine.refuse(f"runs {ran} of the {cp} ring steps: the blocks of {cp - ran} device(s) never arrive, so "
                      "its results leave their tokens out (and which tokens those are changes with the layout)", op)


def _check_condition(engine: Engine, op, placeholders, counter) -> None:
    """Loop control must not depend on the device or the data (every device runs the same iterations)."""
    if counter is not None:
        return
    cond = op.regions[0].blocks[0]
    (result,) = engine.run_block(cond, placeholders)
    if not isinstance(result, Index) or any(not isinstance(a, (Var, Node)) for a in result.expr.free_atoms()):
        engine.refuse("loops for a number of iterations the analysis can't determine", op)


def _solve(engine: Engine, op, placeholders, returned, changing, k: Var) -> dict:
    """Check each carried value's recurrence; closed forms of the aggregates' coverages at iteration k."""
    solution: dict = {}
    for i in changing:
        ph, ret = placeholders[i], returned[i]
        if isinstance(ret, Written):
            if ret.slot != i or ret.loop != id(op):
                engine.refuse("writes into a buffer it doesn't carry", op)
            continue
        if isinstance(ph, Index):
            step = ret.expr - ph.expr if isinstance(ret, Index) else None
            expected = ph.expr.substitute({k: Aff.of(k) + 1}) - ph.expr
            if step is None or step != expected:
                engine.refuse("changes a loop-carried integer other than by a constant step", op, (ret,))
            continue
        if not isinstance(ret, Data) or ret.shape != ph.shape or ret.dims != ph.dims or \
                [key for key, _ in ret.axes] != [key for key, _ in ph.axes]:
            engine.refuse("changes the shape or the token layout of a loop-carried value", op)
        for (_, a), (_, b) in zip(ph.axes, ret.axes):
            if b.hop != a.hop.substitute({k: Aff.of(k) + 1}) or b.offset != a.offset:
                engine.refuse("moves loop-carried tokens differently from one iteration to the next", op)
        if ph.agg is None:
            if ret.agg is not None or ret.fn != ph.fn or ret.elements != ph.elements:
                engine.refuse(_MIXED, op)
            continue
        x, y = ph.agg, ret.agg
        if y is not None:
            refuse_carried_hard_max(engine, y)
        why = carried_start_refusal(y) if y is not None else None
        if why is not None:
            engine.refuse(why, op)
        # (a log-sum-exp's start pseudo-token too: one folded in at every step is as many as the steps that ran)
        if y is None or (x.op, x.term, x.score, x.home, x.start) != (y.op, y.term, y.score, y.home, y.start):
            engine.refuse("changes a loop-carried aggregate other than by merging a block into it", op)
        cv, sv = _unknown_coverage(op, i, ph)
        solution[cv] = _added(engine, op, x.cov, y.cov, k, i, x.op in (AggOp.LSE, AggOp.NSUM))
        if x.op in (AggOp.SSUM, AggOp.SHIFT, AggOp.MDIFF):
            solution[sv] = _added(engine, op, x.shift_cov, y.shift_cov, k, i)
    return solution


def _added(engine: Engine, op, before: Coverage, after: Coverage, k: Var, i: int, unordered: bool = False) -> Coverage:
    """The coverage an accumulator holds at iteration k, from what one iteration adds to it (`unordered`: its
    parts are a set, listed in any order)."""
    added = cov_rest(engine, before, after) if unordered else \
        cov_prefix(engine, op, before, after, "merges a block into a loop-carried aggregate")
    if added is None:
        engine.refuse("replaces a running sum or max the loop carries instead of merging the step's block into it "
                      "(a reset at a step other than the ring's first, or a value that keeps only the latest block)",
                      op)
    if any(isinstance(p, CoverageVar) for p in added.parts):
        engine.refuse("merges aggregates of different loops", op)
    if not added.parts:
        return EMPTY
    return cov_ops.over_iterations(added, k, Aff.of(k))


def _discharge(engine: Engine, solution: dict, first: int) -> None:
    """Check the facts assumed about this loop's unknowns; keep those that still involve an outer loop's."""
    state = engine.state
    kept = state.obligations[:first]
    for ob in state.obligations[first:]:
        a, b = _subst(ob.a, solution, engine), _subst(ob.b, solution, engine)
        if _mentions_unknown(a, state) or _mentions_unknown(b, state, exclude=solution):
            kept.append(Obligation(ob.kind, a, b, ob.op, ob.message, ob.calls))
            continue
        if not _holds(engine, ob.kind, a, b):
            raise Refusal(ob.message, ob.op, ob.calls)
    state.obligations[:] = kept


def _subst(x, solution, engine=None):
    if isinstance(x, tuple):
        return tuple(_subst(y, solution, engine) for y in x)
    if isinstance(x, Aff):
        return x.substitute({v: s for v, s in solution.items() if isinstance(v, Var)})
    if isinstance(x, Coverage):
        return cov_ops.substitute(x, solution)
    return x


def _mentions_unknown(x, state, exclude=None) -> bool:
    if isinstance(x, tuple):
        return any(_mentions_unknown(y, state, exclude) for y in x)
    unknown = set(state.unknown_vars) - set(exclude or ())
    if isinstance(x, Aff):
        return any(isinstance(a, Var) and a in unknown for a in x.free_atoms())
    if isinstance(x, Coverage):
        for part in x.parts:
            if isinstance(part, CoverageVar):
                return True
            atoms = part.hop.free_atoms() | part.start.free_atoms()
            if any(isinstance(a, Var) and a in unknown for a in atoms):
                return True
    return False


def _holds(engine: Engine, kind: ObligationKind, a, b) -> bool:
    scope = engine.scope
    if kind == ObligationKind.HOP:
        return congruent(a, b, engine.ring.cp, scope)
    if kind == ObligationKind.HOP_ANY:
        return any(congruent(a, h, engine.ring.cp, scope) for h in b)
    if kind == ObligationKind.EQUAL:
        return (a - b) == Aff()
    if kind == ObligationKind.DISJOINT:
        return cov_ops.disjoint(a, b, scope) is True
    if kind == ObligationKind.SAME_COV:
        return sorted(map(str, a.parts)) == sorted(map(str, b.parts))
    return False


def _exit_value(engine: Engine, op, init, ph, ret, solution, k: Var, trips, final):
    if isinstance(ret, Written):
        # (every iteration wrote back what it read, the only write into the buffer: it still holds the init)
        return init if ret.unchanged else _filled(engine, op, ret, k, trips)
    if isinstance(ph, Index):
        return Index(ph.shape, ph.expr.substitute(final))
    mapping = {v: cov_ops.substitute(s, final) for v, s in solution.items()}
    mapping.update(final)
    return try_complete(engine, substitute_value(ph, mapping))


def _filled(engine: Engine, op, written: Written, k: Var, trips: int) -> Data:
    """A buffer written one slice per iteration: every slice written exactly once, then a token dim (slices of
    consecutive runs of a block) or a stacked dim (anything else that varies with the iteration)."""
    d, size = written.dim, written.update.shape[written.dim]
    if written.index != Aff.of(k).scale(size) or trips * size != written.shape[d]:
        engine.refuse("fills a buffer other than slice by slice in order, exactly once", op)
    update = written.update
    if isinstance(update, Index):
        if size != 1:
            engine.refuse("fills a buffer with slices wider than one element", op)
        # element j along d is the slice the iteration k = j wrote
        expr = update.expr.substitute({SymDim(d): Aff()}).substitute({k: Aff.of(SymDim(d))})
        return Index(written.shape, expr)
    if isinstance(update.dims[d], Tok):
        run = _as_token_run(update, d, k, size)
        if run is None or k in engine.fns.depends(update.fn):
            engine.refuse("fills a buffer with runs of tokens that don't follow one another (each iteration's "
                          "slice must hold the tokens right after the previous one's)", op)
        return canonical(run.with_(shape=written.shape))
    if update.dims[d] != CONST:
        engine.refuse("fills a buffer with slices wider than one element", op)
    varies = k in _value_atoms(update) or k in engine.fns.depends(update.fn)
    if not varies:  # every slice holds the same function of the same tokens, constant along d: so does the buffer
        return canonical(update.with_(shape=written.shape))
    if size != 1:
        engine.refuse("fills a buffer with slices wider than one element", op)
    # tokens of consecutive runs of one block: the buffer dim is a token dim of stride = run length
    chunked = _as_token_dim(update, d, k)
    if chunked is not None and k not in engine.fns.depends(update.fn):
        return canonical(chunked.with_(shape=written.shape))
    var = cov_ops.fresh_var("s")
    element = substitute_value(update, {k: Aff.of(var)})
    dims = tuple(Stack(var, written.shape[d]) if i == d else r for i, r in enumerate(update.dims))
    fn = engine.fns.intern(("stack", element.fn, str(var)), engine.fns.depends(element.fn) - {k})
    return Data(written.shape, dims, (), fn, None, ((var, element),))


def _value_atoms(value: Data) -> set:
    atoms = set()
    for _, axis in value.axes:
        atoms |= axis.hop.free_atoms() | axis.offset.free_atoms()
    if value.agg is not None:
        for part in value.agg.cov.parts + value.agg.shift_cov.parts:
            if isinstance(part, Cells):
                atoms |= part.hop.free_atoms() | part.start.free_atoms()
    return atoms


def _as_token_dim(update: Data, d: int, k: Var) -> Data | None:
    """If the only thing that varies with k is one axis's offset, by `stride * k`, the slice dim joins that axis."""
    moving = [(key, a) for key, a in update.axes if k in a.offset.free_atoms() or k in a.hop.free_atoms()]
    if len(moving) != 1:
        return None
    key, axis = moving[0]
    if k in axis.hop.free_atoms():
        return None
    stride = axis.offset.coefficient(k)
    if stride <= 0 or k in axis.offset.without(k).free_atoms() or update.agg is not None and any(
            isinstance(p, Cells) and (k in p.hop.free_atoms() or k in p.start.free_atoms())
            for p in update.agg.cov.parts + update.agg.shift_cov.parts):
        return None
    axes = tuple((kk, Axis(a.hop, a.offset.without(k)) if kk == key else a) for kk, a in update.axes)
    dims = tuple(Tok(key, stride) if i == d else r for i, r in enumerate(update.dims))
    return update.with_(axes=axes, dims=dims)


def _as_token_run(update: Data, d: int, k: Var, size: int) -> Data | None:
    """A slice of `size` tokens along dim d (tokens offset + stride * j) written at k * size: the buffer's dim d
    holds the tokens offset(0) + stride * i where the slices follow one another, i.e. the axis's offset moves by
    exactly stride * size with k and nothing else does (no other dim carries the axis, no other axis moves, no
    aggregate's coverage moves)."""
    key, stride = update.dims[d].axis, update.dims[d].stride
    if any(isinstance(r, Tok) and r.axis == key for i, r in enumerate(update.dims) if i != d):
        return None
    moving = [kk for kk, a in update.axes if k in a.offset.free_atoms() or k in a.hop.free_atoms()]
    if moving != [key]:
        return None
    axis = update.axis_map[key]
    if k in axis.hop.free_atoms() or axis.offset.coefficient(k) != stride * size:
        return None
    if k in axis.offset.without(k).free_atoms():  # k inside a floor division, say: not a run that moves by k
        return None
    if update.agg is not None and any(
            isinstance(p, Cells) and (k in p.hop.free_atoms() or k in p.start.free_atoms())
            for p in update.agg.cov.parts + update.agg.shift_cov.parts):
        return None
    if update.elements or any(isinstance(r, Stack) for r in update.dims):
        return None
    axes = tuple((kk, Axis(a.hop, a.offset.without(k)) if kk == key else a) for kk, a in update.axes)
    return update.with_(axes=axes)


__all__ = ["Written", "buffer_write", "const_of", "constant_step", "first_iteration_loop", "signed_compare",
           "substitute_value", "through_identity", "while_loop"]
