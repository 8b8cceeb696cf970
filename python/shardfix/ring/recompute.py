"""Obligation (d) of rewriting a plain-autodiff backward region B: which of B's integer and predicate ops compute
positions. The forward's position reads are rewritten for the new layout (positions.py); B's are not, so an op of
B whose value depends on a position (an iota, a device index, or a residual the forward computed from one: under
jax.checkpoint B recomputes `(me - i) % cp`, iota and the causal compare from the forward's residual `me`) would
see the old layout beside permuted data. Every other integer op of B depends on constants and B's own loop
counters only (the reversed ring loop's counter, the hop bookkeeping), which the reorder does not change.

The classification is a conservative dataflow, not a proof: each value gets the set of position sources it may
depend on (through loops to their fixpoint, branches with their selector, calls into their callees, nested regions
with all their op's operands), and an op reading a value the walk never reached depends on something unknown. A
residual operand of B starts with what the forward region's body made it depend on (the same walk on the forward,
followed across layout re-assertions and enclosing manual computations: dims.origin_across); any other operand
(a cotangent, a forward operand JAX hands on, a value from outside the rings) is data, the same on every device
or permuted with the tokens. Over-reporting a position is safe (B stays refused); missing one is what the walk
must never do, so anything it does not model counts as a position source or as unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxlib.mlir import ir

from ..ir import op_loc
from ..ir.locations import this_programs
from ..locations import SourceLoc, is_library_file
from .detect import RingRegion
from .dims import RESTATING, origin_across

# ops whose value is a position or a device's index; an iota counts whatever its dim (conservative)
SOURCES = frozenset({"stablehlo.iota", "stablehlo.partition_id", "stablehlo.replica_id"})
_MAX_DEPTH = 64  # call nesting; deeper is unknown


@dataclass(frozen=True)
class Place:
    """An op and the calls that led to it (outermost first), shown at the user's line."""

    op: ir.Operation
    calls: tuple = ()

    def loc(self) -> SourceLoc:
        locs = [op_loc(c) for c in reversed(this_programs(tuple(self.calls) + (self.op,)))]
        return next((loc for loc in locs if loc.file and not is_library_file(loc.file)),
                    next((loc for loc in locs if loc), SourceLoc()))

    def __str__(self) -> str:
        loc = self.loc()
        return f"'{self.op.name}' at {loc}" if loc else f"'{self.op.name}'"

    def __hash__(self) -> int:
        return hash((str(self.op.location), self.op.name, len(self.calls)))

    def __eq__(self, other) -> bool:
        return isinstance(other, Place) and self.op == other.op and self.calls == other.calls


UNKNOWN = "unknown"  # a taint: the value depends on something the walk did not reach
DATA = "data"  # a taint: the value depends on token data (an operand, a cotangent), which carries no position

# ops that place their data operands' values elsewhere without computing on them, with the slice of their operands
# that picks where from (index operands, a select's predicate): one of those depending on a position computes
_MOVES = {"stablehlo.reshape": slice(0, 0), "stablehlo.broadcast_in_dim": slice(0, 0),
          "stablehlo.transpose": slice(0, 0), "stablehlo.slice": slice(0, 0), "stablehlo.convert": slice(0, 0),
          "stablehlo.concatenate": slice(0, 0), "stablehlo.dynamic_slice": slice(1, None),
          "stablehlo.dynamic_update_slice": slice(2, None), "stablehlo.select": slice(0, 1),
          "stablehlo.optimization_barrier": slice(0, 0), **{name: slice(0, 0) for name in RESTATING}}
# ops whose nested ops are classified one by one (their results only pass on what those return)
_CONTAINERS = frozenset({"stablehlo.while", "stablehlo.case", "stablehlo.if", "func.call"})


@dataclass
class Classified:
    """B's integer and predicate ops (loops, branches and calls are not ops here: the ops in them are), by kind:
    (i) `counters` (constants and loop counters only; `data`: and token data, no position), (ii) `positions`: ops
    computing on a value that depends on a position (each with the position sources it depends on), and `moved`:
    ops that only move such a value, a residual the forward computed (a mask sliced out of the stack the forward's
    loop saved), (iii) `unknown`."""

    counters: list = field(default_factory=list)
    data: list = field(default_factory=list)
    positions: list = field(default_factory=list)  # (Place, frozenset of Place sources)
    unknown: list = field(default_factory=list)
    moved: list = field(default_factory=list)  # (Place, frozenset of Place sources)

    def reason(self) -> str:
        """The sentence a refusal uses."""
        if self.unknown:
            return (f"whether it computes positions, which the walk of its integer ops can't tell at "
                    f"{_listed(self.unknown)}")
        if not self.positions:
            moved = "" if not self.moved else (
                f"; {len(self.moved)} only move values the forward computed from positions, as it computed them "
                f"(at {_listed([p for p, _ in self.moved], 3)}, from {_listed(_sources(self.moved), 3)})")
            data = "" if not self.data else (
                f"; {len(self.data)} read token data too (cotangents, residuals of no position), no position")
            return (f"none of its {len(self.counters) + len(self.data) + len(self.moved)} integer and predicate ops "
                    f"computes a position: {len(self.counters)} are functions of constants and its own loop counters "
                    f"alone (the reversed ring loop's counter and the hop bookkeeping, which the reorder does not "
                    f"change){data}{moved}")
        return (f"it recomputes positions, or values from them, at {_listed([p for p, _ in self.positions])} (from "
                f"{_listed(_sources(self.positions))}), which are not rewritten like the forward's")


def _sources(found: list) -> list:
    return sorted({s for _, sources in found for s in sources}, key=str)


def _listed(places: list, most: int = 8) -> str:
    """The places by line: `file:line (op, op)`, the lines in the order first met."""
    by_line: dict = {}
    for p in places:
        ops = by_line.setdefault(str(p.loc()) or "an unknown line", [])
        if p.op.name.removeprefix("stablehlo.") not in ops:
            ops.append(p.op.name.removeprefix("stablehlo."))
    shown = [f"{loc} ({', '.join(ops)})" for loc, ops in by_line.items()]
    return ", ".join(shown[:most]) + (f" and {len(shown) - most} more lines" if len(shown) > most else "")


def classify(backward: RingRegion, forwards: list[RingRegion], funcs: dict, rings: frozenset) -> Classified:
    """The integer and predicate ops of `backward` (its body and the functions it calls), each classified by what
    it depends on; residual operands start with what the `forwards` regions' bodies made them depend on."""
    flow = _Flow(funcs)
    made: dict = {}  # forward region op -> its terminator's operand taints
    for r in forwards:
        body = r.region.regions[0].blocks[0]
        flow.block(body, [frozenset({DATA})] * len(body.arguments), (), record=False)
        made[r.region] = [flow.get(v) for v in _terminator(body).operands]
    body = backward.region.regions[0].blocks[0]
    starts = []
    outer = set(rings)
    for operand in backward.region.operands:
        source = origin_across(operand, outer)
        owner = source.owner
        op = None if isinstance(owner, ir.Block) else owner.operation
        starts.append(made[op][ir.OpResult(source).result_number] if op in made else frozenset({DATA}))
    flow.found.clear()
    flow.block(body, starts, (), record=True)
    out = Classified()
    for place, taint, moves in flow.found:
        sources = frozenset(t for t in taint if isinstance(t, Place))
        if UNKNOWN in taint:
            out.unknown.append(place)
        elif sources:
            (out.moved if moves else out.positions).append((place, sources))
        elif DATA in taint:
            out.data.append(place)
        else:
            out.counters.append(place)
    return out


def _terminator(block: ir.Block) -> ir.Operation:
    return list(block.operations)[-1].operation


def _element(value: ir.Value) -> ir.Type:
    try:
        return ir.ShapedType(value.type).element_type
    except ValueError:  # a scalar (index, token)
        return value.type


def _integral(value: ir.Value) -> bool:
    return isinstance(_element(value), (ir.IntegerType, ir.IndexType))


def _predicate(value: ir.Value) -> bool:
    element = _element(value)
    return isinstance(element, ir.IntegerType) and ir.IntegerType(element).width == 1


class _Flow:
    """Position-source taints of values, by a forward walk (one table for every value walked)."""

    def __init__(self, funcs: dict):
        self.funcs = funcs
        self.taint: dict = {}
        self.found: list = []  # (Place, taint) of each integer or predicate op walked with record=True

    def get(self, value: ir.Value) -> frozenset:
        return self.taint.get(value, frozenset({UNKNOWN}))

    def block(self, block: ir.Block, args: list, calls: tuple, record: bool) -> list:
        """Walk `block` with its arguments' taints; the taints of its terminator's operands."""
        for a, t in zip(block.arguments, args):
            self.taint[a] = t
        ops = [op.operation for op in block.operations]
        for op in ops[:-1]:
            self.op(op, calls, record)
        return [self.get(v) for v in ops[-1].operands] if ops else []  # the last op is the block's terminator

    def op(self, op: ir.Operation, calls: tuple, record: bool) -> None:
        name = op.name
        if name in SOURCES:
            results = [frozenset({Place(op, calls)})] * len(op.results)
        elif name == "stablehlo.while":
            results = self._while(op, calls, record)
        elif name in ("stablehlo.case", "stablehlo.if"):
            selector = self.get(op.operands[0])
            branches = [self.block(region.blocks[0], [], calls, record) for region in op.regions]
            results = [selector.union(*(b[j] for b in branches)) for j in range(len(op.results))]
        elif name == "func.call":
            results = self._call(op, calls, record)
        else:
            results = [self._generic(op, calls, record)] * len(op.results)
        for v, t in zip(op.results, results):
            self.taint[v] = t
        if not record or name in _CONTAINERS:
            return
        # a position leaving the integers (converted to float: alibi's bias) is followed no further, so the op it
        # leaves by computes one; a predicate made of positions (a mask the forward saved) may select or weigh
        # data: it is the forward's value, and what it selects is not a position
        escapes = not all(_integral(v) for v in op.results) and any(
            _integral(v) and not _predicate(v) and self.get(v) - {DATA} for v in op.operands)
        if name in SOURCES or escapes or any(_integral(v) for v in op.results):
            self.found.append((Place(op, calls), frozenset().union(*results), not escapes and self._moves(op)))

    def _moves(self, op: ir.Operation) -> bool:
        """Whether `op` only moves its data operands' values (the operands that pick where from, if any, depend
        on constants and loop counters alone)."""
        picks = _MOVES.get(op.name)
        return picks is not None and not any(self.get(v) for v in list(op.operands)[picks])

    def _generic(self, op: ir.Operation, calls: tuple, record: bool) -> frozenset:
        """Every result depends on every operand and on what its nested regions return (a reducer's, a
        comparator's), whose arguments depend on every operand."""
        taint = frozenset().union(*(self.get(v) for v in op.operands))
        for region in op.regions:
            for block in region.blocks:
                taint = taint.union(*self.block(block, [taint] * len(block.arguments), calls, record))
        return taint

    def _while(self, op: ir.Operation, calls: tuple, record: bool) -> list:
        """The slots' taints at their fixpoint; every result also depends on the condition (the trip count)."""
        cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
        slots = [self.get(v) for v in op.operands]
        while True:
            condition = frozenset().union(*self.block(cond, slots, calls, False))
            returned = self.block(body, slots, calls, False)
            grown = [s | r | condition for s, r in zip(slots, returned)]
            if grown == slots:
                break
            slots = grown
        if record:
            self.block(cond, slots, calls, True)
            self.block(body, slots, calls, True)
        return slots

    def _call(self, op: ir.Operation, calls: tuple, record: bool) -> list:
        callee = self.funcs.get(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
        if callee is None or not callee.regions[0].blocks or len(calls) >= _MAX_DEPTH:
            return [frozenset({UNKNOWN})] * len(op.results)
        return self.block(callee.regions[0].blocks[0], [self.get(v) for v in op.operands], calls + (op,), record)


__all__ = ["DATA", "Classified", "Place", "SOURCES", "UNKNOWN", "classify"]
