"""Loops analysed once per distinct input: a loop nested in another is analysed in each pass of the loop around it
(its discovery pass and its analysis pass: loops.while_loop), 2^depth times in all; where a pass gives it exactly
the inputs an earlier one did, in the same state of the analysis, the earlier results and what it recorded are
taken again (the kernels' inner loops over chunks, whose inputs don't change between their enclosing loop's
passes). Nothing is renamed: the results are the very values the first analysis made, its fresh variables
included, so every later step sees what it would have seen after a fresh analysis up to the names of fresh
variables, which a fresh analysis draws from a process-wide counter anyway.

The key holds everything the analysis of a loop reads:
- the loop op, the ops of it the analysis interprets (`Engine.liveness`: all, or those results other than
  residuals depend on), and the abstract values of its operands and of every value its regions read from outside
  it (a while body may use values of the blocks around it), each with the loop slot it is registered as
  (`carried`: buffer writes into a slot are recognised by it);
- the scope (loop variables' bounds, the dims' extents, the ring size, the mesh's axes), the ring, and the calls
  the analysis is inside (the rewrites it records and its refusals name them);
- the recorded state it reads or extends: the rewrites (key and value), the units, the ring directions seen, the
  coverage unknowns assumed equal. Whether a loop variable is an unknown being solved for is a property of the
  variable itself: a discovery pass's unknowns are fresh, and no value holding them outlives that pass.
Inputs holding a comparison that names the op that built it (a node with a source) are never keyed: those name
places in the caller's context (as for the memo of calls in analysis.py). What a loop records besides its results
is the change it made to the rewrites, units, obligations, ring directions and coverage aliases: from a state
equal on every one of those, the same analysis makes the same change, which is made again."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jaxlib.mlir import ir

from . import stabiliser
from .analysis import Engine, Refusal, scope_key
from .symbolic import Node


def memoized(analyse: Callable[[Engine, ir.Operation, list], list]) -> Callable[[Engine, ir.Operation], list]:
    """`analyse(engine, op, inits)` (inits: the operands' abstract values) run once per key (module docstring)."""

    def run(engine: Engine, op: ir.Operation) -> list:
        inits = [engine.get(v) for v in op.operands]
        key = _key(engine, op, inits)
        state = engine.state
        if key is not None:
            found = state.loop_memo.get(key)
            if found is not None:
                results, rewrites, units, obligations, directions, aliases, notes = found
                for note, a, b in notes:  # what it noted of maxima (stabiliser.py), again: a call's memo around
                    note(engine.fns, a, b)  # this loop records it from the notes
                for k, v in rewrites:
                    state.rewrites[k] = v
                for k, v in units:
                    state.units[k] = v
                state.obligations.extend(obligations)
                state.directions |= directions
                for k, v in aliases:
                    state.cov_alias[k] = v
                return list(results)
        before = (dict(state.rewrites), dict(state.units), len(state.obligations), set(state.directions),
                  dict(state.cov_alias), len(engine.fns.notes))
        results = analyse(engine, op, inits)
        if key is not None:
            state.loop_memo[key] = (tuple(results), _changed(before[0], state.rewrites),
                                     _changed(before[1], state.units), tuple(state.obligations[before[2]:]),
                                     frozenset(state.directions - before[3]), _changed(before[4], state.cov_alias),
                                     tuple(engine.fns.notes[before[5]:]))
        return results

    return run


def _changed(before: dict, after: dict) -> tuple:
    """The entries of `after` that are new or hold another value than in `before` (in `after`'s order: new keys
    in the order they were added)."""
    return tuple((k, v) for k, v in after.items() if k not in before or before[k] != v)


def _key(engine: Engine, op: ir.Operation, inits: list) -> tuple | None:
    state = engine.state
    try:
        captured = tuple(engine.get(v) for v in _captured(state.shared.captured, op))
    except Refusal:  # a value read from outside that the analysis hasn't seen: analysed afresh (and refused so)
        return None
    inputs = tuple(inits) + captured
    if _has_sources(inputs):
        return None
    scope = engine.scope
    key = (op, engine.liveness, tuple((v, state.carried.get(id(v))) for v in inputs), scope_key(scope),
           scope.dim_sizes, scope.cp, scope.mesh_axes, state.ring, tuple(state.call_ops),
           frozenset(state.rewrites.items()), tuple(state.units.items()), frozenset(state.directions),
           tuple(state.cov_alias.items()), stabiliser.memo_key(inputs))
    try:
        hash(key)
    except TypeError:  # a value the domain doesn't make hashable: analysed afresh
        return None
    return key


def _captured(cache: dict, op: ir.Operation) -> list:
    """The values defined outside `op` that its regions' ops read, in the order first read (once per op)."""
    found = cache.get(op)
    if found is None:
        inner: list = []

        def visit(o):
            inner.append(o)
            return ir.WalkResult.ADVANCE

        op.walk(visit)
        defined = set()
        for o in inner:
            defined.update(o.results)
            for region in o.regions:
                for block in region.blocks:
                    defined.update(block.arguments)
        found, seen = [], set()
        for o in inner:
            if o == op:  # its own operands are the loop's inits
                continue
            for v in o.operands:
                if v not in defined and v not in seen:
                    seen.add(v)
                    found.append(v)
        cache[op] = found
    return found


def _has_sources(value) -> bool:
    """Whether a node anywhere in `value` names the op that built it."""
    if isinstance(value, Node):
        return value.src is not None or any(_has_sources(a) for a in value.args)
    if isinstance(value, (tuple, list, frozenset, set)):
        return any(_has_sources(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_has_sources(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


__all__ = ["memoized"]
