"""The sequence-layout analysis of a ring region: does reordering the sequence keep the region's results?

The region is interpreted over abstract values (values.py): operands sharded on the ring axis are the device's own
tokens, loops are analysed once with symbolic loop-carried values and their recurrences solved, calls are
followed into their callees, and each op is accepted only by a rule of rules.py. The region may be reordered when
every result is proved to be a complete function of its own tokens (or not to depend on tokens at all). Where a
kernel computes global positions from the ring coordinate (`axis_index * L + iota`), the places that read those
positions are recorded: positions.py rewrites them for the new order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxlib.mlir import ir

from ..ir import op_loc
from ..ir.locations import innermost_loc, this_programs
from ..locations import SourceLoc, is_library_file
from . import coverage as cov_ops
from . import reasons, stabiliser
from .dims import element_type, holds
from .symbolic import Aff, Coord, Node, Other, Pid, PidDiv, Scope, Var, bounds, gpos, map_sources, sourced_nodes
from .symbolic import Dim as SymDim
from .values import (CONST, FREE, Axis, Coverage, CoverageVar, Data, Index, Obligation, ObligationKind, Stack,
                     Tok, Written, canonical)

WRITTEN_USE = ("computes with a buffer the loop fills slice by slice right after writing a slice of it (all it may "
               "do with the buffer then is hand it to the next iteration): what the buffer holds at that point, the "
               "slices of this and the earlier iterations written, is not followed")


class Refusal(Exception):
    """The analysis met something it can't prove keeps the results: the op and why, and the calls that led to it
    (an op inside a library function is placed at the user's call of that function)."""

    def __init__(self, message: str, op: ir.Operation | None = None, calls: tuple = ()):
        super().__init__(message)
        self.op = op
        self.calls = calls

    def _places(self) -> list[ir.Operation]:
        """The op and the calls that led to it whose locations are this program's, innermost first: a function JAX
        traced for another program keeps that program's lines (ir.locations.this_programs)."""
        if self.op is None:
            return []
        return list(reversed(this_programs(tuple(self.calls) + (self.op,))))

    def _locs(self) -> list[SourceLoc]:
        return [op_loc(c) for c in self._places()]

    def user_loc(self) -> SourceLoc:
        """The first of those places in the user's own code (not JAX's, a library's or shardfix's); empty when
        every one is in a library (a kernel whose call from the user's code JAX's location no longer holds)."""
        return next((loc for loc in self._locs() if loc.file and not is_library_file(loc.file)), SourceLoc())

    @property
    def loc(self) -> SourceLoc:
        """The user's line where there is one, else the first place known (a library's)."""
        locs = self._locs()
        return self.user_loc() or next((loc for loc in locs if loc.file), locs[0] if locs else SourceLoc())

    def describe(self, region: SourceLoc = SourceLoc()) -> str:
        """The op, the user's line (or `region`'s, the ring region's, when the op sits in a library whose
        caller JAX's location lost), the library's line it sits at, and why."""
        if self.op is None:
            return str(self)
        where = self.user_loc() or region
        places = self._places()
        inside = innermost_loc(places[0]) if places else SourceLoc()
        place = f" at {where}" if where else ""
        if inside and inside != where and is_library_file(inside.file):
            place += f" (in {inside})"
        return f"'{self.op.name}'{place} {self}"


@dataclass(frozen=True)
class RingInfo:
    axis: str
    cp: int
    block: int  # local tokens along the sequence (L)
    stride: int  # partition ids between consecutive positions along the ring axis
    other_strides: tuple[tuple[str, int, int], ...]  # (axis, stride, size) of the other mesh axes
    direction: int = 0  # +1 / -1 once a ring collective_permute has been seen


@dataclass(frozen=True)
class Rewrite:
    """Replace operand `operand` of `op` (an integer the kernel computed as a contiguous-layout index of a unit of
    `unit` tokens) by the index of that unit in the new order, where `op` is reached through the func.call ops
    `calls` (outermost first; empty: the op is in the region's body). A function is rewritten only for the calls
    whose analysis asked for it (positions.py specializes it)."""

    op: ir.Operation
    operand: int
    unit: int
    calls: tuple = ()

    def key(self):
        return (self.calls, self.op, self.operand)

    def relative_to(self, depth: int) -> "Rewrite":
        """The same read, seen from inside the first `depth` calls of its path."""
        return Rewrite(self.op, self.operand, self.unit, self.calls[depth:])

    def under(self, calls: tuple) -> "Rewrite":
        return Rewrite(self.op, self.operand, self.unit, calls + self.calls)


class FnTable:
    """Interned descriptions of the functions values hold, with the loop variables each depends on, and for each
    function of a loop variable the op that first read that variable as data (what a refusal of a result that
    depends on the ring step cites)."""

    def __init__(self):
        self._ids: dict = {}
        self.vars: list[frozenset] = []
        self.keys: list = []
        self.infinite: dict[int, bool] = {}  # algebra.may_be_infinite's answers
        self.masking: dict[int, bool] = {}  # logsum.may_mask's answers
        self.read_at: dict[int, tuple] = {}  # fn -> (op, calls) where a loop variable it depends on became data
        self.wrapped: dict[int, object] = {}  # fn -> reasons.Wrap: an integer op read as data, its type too narrow
        # stabiliser.py: complete aggregate fn -> the identities of the maxima it was made from, and what each
        # unknown shift of a loop-carried sum was bound to (None: lost)
        self.idents: dict[int, set] = {}  # fn -> {(identity, the analysis that noted it, its rows' tokens)}
        self.bound: dict = {}
        self.owner = None  # the analysis under way: (the ring region being proved, its number)
        # logsum.py: (a maxed function, the analysis) -> the identities of the maxima of it read as numbers
        self.lse_maxima: dict[tuple, set] = {}
        self.lse_splits: dict = {}  # the analysis -> the ops whose cases logsum.py split on (note_lse_split)
        # every (note function, fn, identity) noted, in order (what a call's analysis noted, for its memo)
        self.notes: list = []
        # (table, key, item) each note added, (bound, shift, its binding before) each binding; in order (rollback)
        self.undo: list = []

    def intern(self, key, depends: frozenset = frozenset(), read_at: tuple | None = None) -> int:
        """The function `key` describes; `read_at`: where it reads a loop variable as data, if it does (else the
        place of the functions it is built from)."""
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self.vars)
            self.vars.append(frozenset(depends))
            self.keys.append(key)
            if depends:
                place = read_at if read_at is not None else self._read_in(key)
                if place is not None:
                    self.read_at[found] = place
        return found

    def _read_in(self, key) -> tuple | None:
        """The place recorded for a function a key is built from (the functions of a key are the ints in it)."""
        for part in key if isinstance(key, tuple) else ():
            if isinstance(part, tuple):
                place = self._read_in(part)
            else:
                place = self.read_at.get(part) if type(part) is int else None
            if place is not None:
                return place
        return None

    def constant(self, fn: int):
        """The number a constant fn holds, or None."""
        key = self.keys[fn]
        return float(key[1]) if isinstance(key, tuple) and key[0] == "const" and key[1] not in ("True", "False") \
            else None

    def depends(self, fn: int) -> frozenset:
        return self.vars[fn]


@dataclass
class Shared:
    """What the analyses of all the regions of a module share: the naming of functions, and the calls analysed
    (callee, abstract arguments, scope, ring) -> (results, rewrites, units, obligations, ring directions)."""

    fns: FnTable = field(default_factory=FnTable)
    call_memo: dict = field(default_factory=dict)
    keep_alive: list = field(default_factory=list)  # placeholders whose ids key `State.carried`
    meshes: dict = field(default_factory=dict)  # the module's sdy.mesh symbols, for collectives that name one
    blocks: dict = field(default_factory=dict)  # block -> its arguments, (op, results) pairs and returned values
    apply_rule: object = None  # rules.apply_rule, given by the analysis' caller: the rules build on this module
    liveness: dict = field(default_factory=dict)  # (callee, results read) -> autodiff.Liveness of its body
    rings: frozenset = frozenset()  # the module's ring regions (values between them may pass outer bodies)
    captured: dict = field(default_factory=dict)  # loop op -> the values its regions read from outside it

    def block(self, block: ir.Block) -> tuple:
        """A block's arguments, its ops but the terminator each with its results, and the terminator's operands:
        read from the IR once per module (loops and shared kernels run their bodies many times; the analysis
        doesn't change the IR)."""
        found = self.blocks.get(block)
        if found is None:
            ops = [op.operation for op in block.operations]
            found = self.blocks[block] = (list(block.arguments), [(op, list(op.results)) for op in ops[:-1]],
                                          list(ops[-1].operands))
        return found


@dataclass
class State:
    """The analysis of one ring region: what its loops and calls share."""

    ring: RingInfo
    funcs: dict[str, ir.Operation]
    shared: Shared = field(default_factory=Shared)
    rewrites: dict = field(default_factory=dict)  # (op, operand) -> Rewrite
    units: dict = field(default_factory=dict)  # (tokens, alignment) that must stay whole -> the op relying on it
    obligations: list[Obligation] = field(default_factory=list)
    calling: list = field(default_factory=list)
    call_ops: list = field(default_factory=list)  # the func.call ops being analysed, outermost first
    unknown_vars: set = field(default_factory=set)  # loop-carried quantities being solved for
    directions: set = field(default_factory=set)  # +1 / -1: the ring directions seen
    carried: dict = field(default_factory=dict)  # id of a loop-carried placeholder -> (loop op, index)
    # id of a loop-carried buffer the loop fills -> the dynamic_slices of it the body makes, (op, starts, sizes),
    # each checked against the slice the iteration writes once the body has run (loops.py)
    filling: dict = field(default_factory=dict)
    cov_alias: dict = field(default_factory=dict)  # coverage unknowns assumed equal (checked when solved)
    # a loop's iteration variable -> the loop op's number (coverage.op_number, as its unknown coverages name it)
    loop_vars: dict = field(default_factory=dict)
    loop_runs: dict = field(default_factory=dict)  # id of a loop op -> the number of its analysis under way
    loop_memo: dict = field(default_factory=dict)  # the loops analysed, by their inputs (loopmemo.py)
    # the blocks a loop's (out, lse) merge state starts from, computed before the loop (lsefloats' "pre@" cases)
    started: set = field(default_factory=set)
    # the region's backward is to be rewritten with it (prove._accept_autodiff): an op only residuals depend on may
    # not compute positions of its own (nor call a function that does), which the rewrite would not see
    strict_residuals: bool = False
    # branches of conditionals being analysed within the innermost loop body: ops there may not run at every step
    skippable: int = 0

    @property
    def fns(self) -> FnTable:
        return self.shared.fns


class Engine:
    """Interprets blocks over abstract values; rules.py supplies one rule per op."""

    def __init__(self, state: State, scope: Scope, liveness=None):
        self.state = state
        self.scope = scope
        self.env: dict = {}
        # where only some results need proving (autodiff.Liveness): the ops of this body, its loops and branches
        # to interpret, and the results of loops and branches only residuals read; None: everything
        self.liveness = liveness
        self.live = liveness.ops if liveness is not None else None
        self.dead_slots = liveness.dead_slots if liveness is not None else {}

    # -- values --------------------------------------------------------------------------------------------------

    @property
    def ring(self) -> RingInfo:
        return self.state.ring

    @property
    def fns(self) -> FnTable:
        return self.state.fns

    def get(self, value: ir.Value):
        try:
            return self.env[value]
        except KeyError:
            raise Refusal("uses a value the analysis has not seen") from None

    def set(self, value: ir.Value, abstract) -> None:
        self.env[value] = abstract

    def refuse(self, message: str, op: ir.Operation | None, culprits: tuple = ()) -> None:
        """Refuse at `op` for `message`; where one of `culprits` (the values the refusal is about) is data only
        because an integer op's type may wrap, refuse at that op for that reason instead (reasons.py)."""
        wrap = reasons.wrap_behind(self.fns, culprits) if culprits else None
        if wrap is not None:
            raise Refusal(wrap.reason(), wrap.op, wrap.calls)
        raise Refusal(message, op, tuple(self.state.call_ops))

    def scope_for(self, shape) -> Scope:
        return self.scope.with_dims(shape)

    def defer(self, kind: ObligationKind, a, b, op, message: str) -> None:
        self.state.obligations.append(Obligation(kind, a, b, op, message, tuple(self.state.call_ops)))

    def cov_root(self, var):
        """The representative of a coverage unknown among those assumed equal to it."""
        alias = self.state.cov_alias
        while var in alias:
            var = alias[var]
        return var

    def canonical_cov(self, cov: Coverage) -> Coverage:
        """`cov` with each coverage unknown replaced by its representative."""
        return Coverage(tuple(self.cov_root(p) if isinstance(p, CoverageVar) else p for p in cov.parts))

    # -- blocks --------------------------------------------------------------------------------------------------

    def run_block(self, block, args: list, opaque=()) -> list:
        """Abstract values of the block's terminator operands, given its arguments' (those at the places in `opaque`:
        residuals only, left uninterpreted)."""
        apply_rule = self.state.shared.apply_rule
        env = self.env
        arguments, body, returned = self.state.shared.block(block)
        for arg, value in zip(arguments, args):
            env[arg] = value
        live = self.live
        for op, results in body:
            if live is not None and op not in live:
                self._skip(op)
                continue
            for result, value in zip(results, apply_rule(self, op)):
                env[result] = value
        if opaque:
            from .autodiff import OPAQUE
            return [OPAQUE if i in opaque else self.get(v) for i, v in enumerate(returned)]
        return [self.get(v) for v in returned]

    def _skip(self, op: ir.Operation) -> None:
        """An op only residuals depend on: not interpreted. Where it reads positions computed from the device
        index, they are rewritten as any read of them is (the backward then sees the new layout's positions, as
        the forward's results do)."""
        from .autodiff import OPAQUE, position_source
        if self.state.strict_residuals:
            source = position_source(op, self.state.funcs)
            if source is not None:
                self.refuse("computes positions (or a device index) that only the backward reads, which the proof "
                            "of its results does not follow, so the rewrite would leave them in the old layout",
                            source)
        nested = [op]
        while nested:
            current = nested.pop()
            for index, value in enumerate(current.operands):
                found = self.env.get(value)
                if isinstance(found, Index) and _aff_has_coord(found.expr):
                    self.resolve(found, current, index)
            for region in current.regions:
                for block in region.blocks:
                    nested.extend(inner.operation for inner in block.operations)
        for result in op.results:
            self.env[result] = OPAQUE

    # -- calls ---------------------------------------------------------------------------------------------------

    def call(self, op: ir.Operation, callee_name: str, args: list) -> list:
        callee = self.state.funcs.get(callee_name)
        if callee is None or not len(callee.regions[0].blocks):
            self.refuse(f"calls @{callee_name}, which the module does not define", op)
        if callee_name in self.state.calling:
            self.refuse(f"calls @{callee_name} recursively", op)
        state = self.state
        here = tuple(state.call_ops) + (op,)
        # Where only some of the call's results need proving, the callee is interpreted for those alone.
        liveness, wanted = None, None
        if self.liveness is not None:
            wanted = self.liveness.live_results(op)
            if len(wanted) < len(op.results):
                from .autodiff import Liveness
                liveness = state.shared.liveness.get((callee_name, wanted))
                if liveness is None:
                    liveness = state.shared.liveness[(callee_name, wanted)] = \
                        Liveness(callee.regions[0].blocks[0], set(wanted))
            else:
                wanted = None
        # Arguments holding comparisons not yet read as numbers name the ops that built them, in this context: such
        # calls are analysed afresh each time.
        key = None if _sourced(args) else \
            (callee_name, tuple((a, state.carried.get(id(a)), id(a) if id(a) in state.filling else None)
                                for a in args),
             scope_key(self.scope), state.ring, wanted, stabiliser.memo_key(args), state.strict_residuals,
             state.skippable)
        memo = None if key is None else state.shared.call_memo.get(key)
        if memo is not None:  # the same call analysed before: its results, and what it recorded, again
            results, rewrites, units, obligations, directions, notes = memo
            for note, fn, ident in notes:  # the maxima its aggregates were made from or read, for this region
                note(self.fns, fn, ident)
            results = [_with_sources(v, lambda src: src[:2] + (here + src[2],)) for v in results]
            for rewrite in rewrites:
                rewrite = rewrite.under(here)
                state.rewrites[rewrite.key()] = rewrite
            for key, where in units.items():
                state.units.setdefault(key, where)
            state.obligations.extend(obligations)
            state.directions |= directions
            return results
        before_rewrites, before_units, before_obligations = dict(state.rewrites), dict(state.units), \
            len(state.obligations)
        before_directions, before_notes = set(state.directions), len(self.fns.notes)
        state.calling.append(callee_name)
        state.call_ops.append(op)
        try:
            inner = Engine(state, self.scope, liveness)
            results = inner.run_block(callee.regions[0].blocks[0], args)
        finally:
            state.calling.pop()
            state.call_ops.pop()
        if key is None or not all(src[2][:len(here)] == here for v in results for src in _sources(v)):
            return results
        depth = len(here)  # what the call recorded, as seen from inside it
        recorded = [v.relative_to(depth) for k, v in state.rewrites.items() if k not in before_rewrites]
        state.shared.call_memo[key] = ([_with_sources(v, lambda src: src[:2] + (src[2][depth:],)) for v in results],
                                       recorded, {k: v for k, v in state.units.items() if k not in before_units},
                                       state.obligations[before_obligations:], state.directions - before_directions,
                                       list(self.fns.notes[before_notes:]))
        return results

    # -- index values read as numbers ----------------------------------------------------------------------------

    def resolve(self, value: Index, op: ir.Operation, operand: int) -> Index:
        """`value` where an op reads it as a number: every ring coordinate in it must sit in a contiguous-layout
        position (coordinate * units per block + local unit index), which is recorded for rewriting; anything else
        that depends on the device index is refused."""
        expr = self._resolve_expr(value.expr, value.shape, op, operand, top=True)
        return Index(value.shape, expr)

    def _resolve_expr(self, expr: Aff, shape, op, operand, top: bool) -> Aff:
        atoms = expr.atoms()
        if any(isinstance(a, (Pid, PidDiv)) for a in atoms):
            self.refuse("reads the device index other than as a coordinate along a mesh axis", op)
        coords = [a for a in atoms if isinstance(a, Coord)]
        if coords:
            return self._position(expr, coords, shape, op, operand)
        out = Aff((), expr.const)
        for atom, c in expr.terms:
            if isinstance(atom, Node) and atom.op not in ("gpos", "opaque") and _has_coord(atom):
                atom = self._resolve_node(atom, shape, op)
            out = out + Aff.of(atom).scale(c)
        return out

    def _resolve_node(self, node: Node, shape, fallback_op) -> Aff:
        src = node.src
        args = []
        for i, arg in enumerate(node.args):
            if not isinstance(arg, Aff) or not _aff_has_coord(arg):
                args.append(arg)
                continue
            if isinstance(arg, Aff) and any(isinstance(a, Coord) for a in arg.atoms()):
                if src is None:
                    self.refuse("compares or selects on a ring coordinate where the position it stands for can't be "
                                "rewritten", fallback_op)
                src_op, operands, calls = src
                args.append(self._position(arg, [a for a in arg.atoms() if isinstance(a, Coord)], shape, src_op,
                                           operands[i], calls))
            else:
                args.append(self._resolve_expr(arg, shape, fallback_op, 0, top=False))
        return Aff.of(Node(node.op, tuple(args)))

    def _position(self, expr: Aff, coords, shape, op, operand, calls: tuple | None = None) -> Aff:
        """A contiguous-layout index of a unit: c_h * (L / unit) + local unit index, with the local index in range."""
        if len(coords) != 1:
            self.refuse("reads one number made from the ring coordinates of two blocks (not a sum or difference of "
                        "their positions): compute each block's positions first, then combine those", op)
        coord = coords[0]
        a = expr.coefficient(coord)
        block = self.ring.block
        if a <= 0 or block % a:
            self.refuse(f"uses the ring coordinate times {a}, which is not a whole number of units of the "
                        f"{block}-token block: a position is coordinate * {block} + index (or units of it)", op)
        rest = expr.without(coord)
        if any(isinstance(x, (Coord, Pid, PidDiv)) or (isinstance(x, Node) and _has_coord(x))
               for x in rest.free_atoms()):
            self.refuse("mixes a ring coordinate into other device-dependent arithmetic", op)
        lo, hi = bounds(rest, self.scope_for(shape))
        unknown = self.state.unknown_vars
        if unknown and any(isinstance(x, Var) and x in unknown for x in rest.free_atoms()):
            # a loop's discovery pass, where carried integers are still unknown: the pass that follows, with their
            # closed forms, decides (what this pass records is dropped)
            return gpos(expr, block // a)
        if lo < 0 or hi > a - 1:
            self.refuse(f"computes a position (coordinate * {a} + index) whose index may fall outside 0..{a - 1}, "
                        "so it is not the place of a token of that block", op)
        unit = block // a
        read = op.operands[operand]
        if not holds(read, 0, self.ring.cp * a - 1):
            # the rewrite computes the new places in the read's own type: one that holds them all
            self.refuse(f"reads positions in {element_type(read)}, which can't hold positions up to "
                        f"{self.ring.cp * a - 1}", op)
        calls = tuple(self.state.call_ops) if calls is None else calls
        rewrite = Rewrite(op, operand, unit, calls)
        previous = self.state.rewrites.get(rewrite.key())
        if previous is not None and previous.unit != unit:
            self.refuse("reads one value as positions of two different unit sizes", op)
        self.state.rewrites[rewrite.key()] = rewrite
        self.state.units.setdefault((unit, unit), (op, calls))
        return gpos(expr, unit)

    # -- index values as data ------------------------------------------------------------------------------------

    def as_data(self, value, op: ir.Operation, operand: int) -> Data:
        """Any value as Data: index arithmetic becomes positions (token data), local indices (which vary along a
        dim without following tokens) or invariants."""
        if isinstance(value, Data):
            return value
        if isinstance(value, Written):
            self.refuse(WRITTEN_USE, op)
        value = self.resolve(value, op, operand)
        return index_to_data(self, value, op)


def _has_coord(node: Node) -> bool:
    return any(isinstance(a, Aff) and _aff_has_coord(a) for a in node.args)


def _aff_has_coord(expr: Aff) -> bool:
    """Whether the form reads the device index other than through a position already read as one (gpos)."""
    for atom, _ in expr.terms:
        if isinstance(atom, (Coord, Pid, PidDiv)):
            return True
        if isinstance(atom, Node) and atom.op != "gpos" and _has_coord(atom):
            return True
    return False


def _sources(value) -> list:
    return [n.src for n in sourced_nodes(value.expr)] if isinstance(value, Index) else []


def _sourced(values) -> bool:
    return any(isinstance(v, Index) and next(sourced_nodes(v.expr), None) is not None for v in values)


def _with_sources(value, fn):
    return Index(value.shape, map_sources(value.expr, fn)) if isinstance(value, Index) else value


def scope_key(scope: Scope) -> tuple:
    """What a scope's variable bounds are, as a hashable key (memo keys of analysed calls and loops)."""
    return tuple(sorted((str(v), str(lo), str(hi)) for v, (lo, hi) in scope.var_bounds.items()))


# ---------------------------------------------------------------------------------------------------------------
# Index -> Data.


def index_to_data(engine: Engine, value: Index, op) -> Data:
    """Positions (rewritten) become token axes; other Dim atoms make the dim FREE (a local index: layout-dependent
    if it meets tokens); the rest is invariant. The fn names the function of the positions and loop variables."""
    dims: list = [CONST if n == 1 else None for n in value.shape]
    axes: list[tuple[str, Axis]] = []
    depends: set = set()

    def visit(e: Aff):
        return tuple((visit_atom(atom), c) for atom, c in e.terms), e.const

    def visit_atom(atom):
        if isinstance(atom, Node) and atom.op == "gpos":
            return position_axis(*atom.args)
        if isinstance(atom, SymDim):
            if value.shape[atom.index] > 1:
                if isinstance(dims[atom.index], Tok):
                    engine.refuse("mixes a local index with positions along one dim", op)
                dims[atom.index] = FREE
            return ("dim", atom.index)
        if isinstance(atom, Node):
            return (atom.op,) + tuple(visit(a) if isinstance(a, Aff) else a for a in atom.args)
        if isinstance(atom, Var):
            depends.add(atom)
        if isinstance(atom, Other):
            return ("other", atom.axis)
        return str(atom)

    seen: dict = {}  # the same position read twice (q_pos in a mask and in a chunk test) is one axis

    def position_axis(inner: Aff, unit: int):
        found = seen.get((inner, unit))
        if found is not None:
            return found
        seen[(inner, unit)] = found = _position_axis(inner, unit)
        return found

    def _position_axis(inner: Aff, unit: int):
        coord = next(a for a in inner.atoms() if isinstance(a, Coord))
        if any(isinstance(a, SymDim) for a in coord.hop.free_atoms()):
            # `(me - jnp.arange(cp)) % cp`: a block's coordinate per row, each row a different block (a table of
            # every step's positions, to be read one row per ring step); read whole, no one block's tokens
            engine.refuse("reads positions of a different block along a dim (a table of every ring step's "
                          "positions) as data: slice out the ring step's row first", op)
        rest = inner.without(coord)
        key = f"a{len(axes)}"
        offset = Aff((), rest.const)
        for a, c in rest.terms:
            if isinstance(a, SymDim):
                if unit != 1:
                    engine.refuse("reads a vector of unit indices as data", op)
                if value.shape[a.index] > 1:
                    if dims[a.index] not in (None, CONST):
                        engine.refuse("indexes positions of two blocks along one dim", op)
                    dims[a.index] = Tok(key, c)
            elif isinstance(a, Var):
                offset = offset + Aff.of(a).scale(c)
            else:
                engine.refuse("computes a position from something other than loop variables and indices", op)
        axes.append((key, Axis(coord.hop, offset.scale(unit))))
        return ("pos", key, unit)

    if value.expr.is_const:  # a number, whichever way it was written (an integer constant converted, say)
        return Data(tuple(value.shape), tuple(CONST for _ in value.shape), (),
                    engine.fns.intern(("const", repr(float(value.expr.const)))))
    canon = visit(value.expr)
    dims = [CONST if d is None else d for d in dims]
    fn = engine.fns.intern(("index", canon), frozenset(depends), (op, tuple(engine.state.call_ops)))
    return canonical(Data(tuple(value.shape), tuple(dims), tuple(axes), fn))



__all__ = ["Engine", "FnTable", "Obligation", "Refusal", "Rewrite", "RingInfo", "Shared", "State", "index_to_data",
           "scope_key"]
