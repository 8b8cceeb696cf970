"""Moving sequence permutations across token-wise code: one permutation per program instead of two per layer.

Between ring regions sit computations that treat every token alike along the sequence (elementwise ops, reductions
and dot_generals over other dims, broadcasts, reshapes and transposes that keep the sequence dim whole, slices, pads
and concatenates of other dims, gathers by token ids, sharding constraints, calls of functions that do only such
things: calls.py). They commute with a permutation of the sequence (the `moves` rules of rules.py say which op does and
where the sequence dim goes), so such an op can run on permuted operands and give its result in permuted order.
For each function body the pass decides which ops run in permuted order, then puts permutations only where an
order is read that no value is in:

1. Forward, in program order (the inverses sink). The inverse after a ring region says that its result is at hand
   in permuted order. A token-wise op reading such a value runs in permuted order: its other sequence operands are
   then read in permuted order too, and its results are at hand in permuted order in turn. A reduction over the
   sequence with an order-free body (a mean loss; a dot_general summing the tokens of two sides in the same order,
   a layer's weight gradient; a scatter-add of per-token rows by token id, an embedding's gradient) reads its
   operands permuted and gives what it gave before: nothing after it needs
   restoring.
2. Backward, in reverse program order (the forward permutations rise). A value read in permuted order (a ring
   region's operand, a sequence operand of an op of step 1) that nothing gives in that order is computed in
   permuted order by its own op, when that op is token-wise and everything that reads its results reads them
   permuted; that op's operands are then read permuted in turn. A splat constant or an iota across another dim is
   in every order already; an integer iota along the sequence (positions) is computed permuted beside it.
3. The edits. Each reader gets the value in the order it reads: a value read permuted that no op gives so is
   permuted once, after its definition (at the function's input, say); a value computed in permuted order that
   something reads in contiguous order is permuted back once, after its definition. The module's own permutations
   are kept where they are what is needed and erased where nothing reads them any more.

Each op is looked at once each way, with maps from values to their orders, and the IR changes only where the two
orders meet: the time grows with the function, not with how far the permutations travel. What can't be shown
token-wise stops the motion at that op, and is reported.
"""

from __future__ import annotations

import heapq
import math
import operator
from itertools import count, repeat
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from ..ir import manual_axes_of, module_meshes, sharding_from_attr, source_loc
from ..locations import SourceLoc
from ..sharding import AxisRef, DimSharding, Mesh, TensorSharding
from .calls import CallMotion, TokenwiseCalls
from .detect import module_funcs
from .dims import holds, is_integer, reducer
from .dims import shape as _shape
from .permutation import PERMUTATION_ATTR, Permutations
from .positions import mapped_index
from .optable import OPS, UNKNOWN, Regions
from .optable import Motion as OpMotion
from .rules import REDUCED, Blocked, carriers, moves, reduced_with


@dataclass(frozen=True)
class Kind:
    """Permutations of one kind are interchangeable: same order, ring axis, mesh and sequence length."""

    strategy: str
    stripe: int
    axis: str
    mesh_name: str
    length: int

    def __str__(self) -> str:
        return self.strategy if self.strategy == "zigzag" else f"striped{{stripe={self.stripe}}}"


@dataclass(frozen=True, eq=False)
class Order:
    """The order a value is in: permuted by a kind of permutation along one of its dims. One object per order
    (Mover.order), compared by identity."""

    kind: Kind
    dim: int


class Perm:
    """A sequence permutation in the IR. Its sharding and manual axes are read when a new permutation copies them
    (most never are)."""

    __slots__ = ("op", "kind", "dim", "inverse", "order", "_sharding", "_manual_axes")

    def __init__(self, op: ir.Operation, kind: Kind, dim: int, inverse: bool, sharding: TensorSharding | None = None,
                 manual_axes: tuple[str, ...] | None = None, order: Order | None = None):
        self.op, self.kind, self.dim, self.inverse = op, kind, dim, inverse
        self.order = order  # set by the Mover that looks at it
        self._sharding, self._manual_axes = sharding, manual_axes

    @property
    def sharding(self) -> TensorSharding:
        if self._sharding is None:
            self._sharding = sharding_from_attr(
                sdy.TensorShardingPerValueAttr(self.op.attributes["in_shardings"]).shardings[0])
        return self._sharding

    @property
    def manual_axes(self) -> tuple[str, ...]:
        if self._manual_axes is None:
            self._manual_axes = tuple(sorted(manual_axes_of(self.op)))
        return self._manual_axes

    @property
    def source(self) -> ir.Value:
        return self.op.operands[0]

    @property
    def result(self) -> ir.Value:
        return self.op.results[0]


def perm_of(op: ir.Operation, read: dict | None = None, canonical=None) -> Perm | None:
    """The permutation an op is, when it is one that ring-reorder (or this module) inserted. `read`: what was read
    of permutations before, by the hashes of their parameters, operand type and shardings (attributes and types
    are uniqued: a hash is the address of what it names, so a model's permutations are read once per kind, and a
    hit compares nothing through the bindings). `canonical`: maps a Kind read to its Order along a dim (the
    caller's one object for it), kept with what was read."""
    attributes = op.attributes
    if op.name != "sdy.manual_computation" or PERMUTATION_ATTR not in attributes:
        return None
    params, shardings, operand_type = attributes[PERMUTATION_ATTR], attributes["in_shardings"], op.operands[0].type
    key = (hash(params), hash(operand_type), hash(shardings))
    found = read.get(key) if read is not None else None
    if found is None:
        kind, dim, inverse, parsed = _read_perm(ir.DictAttr(params), operand_type, shardings)
        order = canonical(kind, dim) if canonical is not None else None
        found = (order.kind if order is not None else kind, dim, inverse, parsed, order)
        if read is not None:
            read[key] = found
    kind, dim, inverse, parsed, order = found
    return Perm(op, kind, dim, inverse, parsed, order=order)


def _read_perm(params: ir.DictAttr, operand_type: ir.Type, shardings: ir.Attribute) -> tuple:
    dim = ir.IntegerAttr(params["dim"]).value
    length = ir.ShapedType(operand_type).get_dim_size(dim)
    sharding = sdy.TensorShardingPerValueAttr(shardings).shardings[0]
    try:  # a mesh by name (the permutations built here name theirs), read without parsing the whole sharding
        mesh, parsed = ir.FlatSymbolRefAttr(sdy.TensorShardingAttr(sharding).mesh_or_ref).value, None
    except (TypeError, ValueError):
        parsed = sharding_from_attr(sharding)
        mesh = parsed.mesh
    kind = Kind(ir.StringAttr(params["strategy"]).value, ir.IntegerAttr(params["stripe"]).value,
                ir.StringAttr(params["axis"]).value, mesh, length)
    return kind, dim, ir.BoolAttr(params["inverse"]).value, parsed


@dataclass
class Motion:
    remarks: list[tuple[str, SourceLoc]]


_TYPE = operator.attrgetter("type")


def _attribute_hash(attributes, name: str) -> int | None:
    """The hash of an op's attribute, None where the op has none of that name (one call into the bindings where
    it has: a miss is rare, an optional flag)."""
    try:
        return hash(attributes[name])
    except KeyError:
        return None

# The motions whose rules read a reduction's body (its combine).
_WITH_BODY = frozenset({OpMotion.REDUCE, OpMotion.SCATTER})

# How many ops before a reader `_Body._place_of` looks at for the op that gives it a value, before it looks it up.
_NEAR = 4

# The motions of the ops whose sequence dims land where they were (elementwise over one shape, and where values
# live): their moves and carries need no types read.
_IN_PLACE = frozenset({OpMotion.SAME_SHAPE, OpMotion.WHERE_IT_LIVES})


class Mover:
    """Moves the permutations of one module as far as the rules allow."""

    def __init__(self, module: ir.Operation, holders: frozenset[str] | None = None):
        """`holders`: the names of the functions whose body holds a manual computation, where known (as
        ring-reorder leaves the module); else they are found by a walk."""
        self.module = module
        self.holders = holders
        self.meshes: dict[str, Mesh] = module_meshes(module)
        self.motion = Motion([])
        self._said: set = set()
        self._calls: TokenwiseCalls | None = None
        self._kinds: dict[Kind, Kind] = {}
        self._orders: dict[tuple[int, int], Order] = {}
        self._fits: dict[tuple, bool] = {}
        self._rules: dict[tuple, object] = {}
        self._signatures: dict[tuple, int] = {}
        self.perms_read: dict = {}  # see perm_of
        self.plans: dict[tuple[int, int, Order], tuple | Blocked] = {}  # see _Body._plan

    def kind(self, kind: Kind) -> Kind:
        """The one Kind object equal to `kind` (Orders are looked up by their kind's identity)."""
        return self._kinds.setdefault(kind, kind)

    def fits(self, value_type: ir.Type, order: Order) -> bool:
        """Whether a value of this type has the sequence's length along the order's dim (types are uniqued: each
        is read once; keyed by its hash, the address of what it names, so that a hit compares no types through
        the bindings)."""
        key = (hash(value_type), order.dim, order.kind.length)
        found = self._fits.get(key)
        if found is None:
            found = self._fits[key] = self._fit(value_type, order)
        return found

    def fits_hashed(self, type_hash: int, order: Order, value: ir.Value) -> bool:
        """`fits` for `value`, whose type's hash is known: its type is read only the first time."""
        key = (type_hash, order.dim, order.kind.length)
        found = self._fits.get(key)
        if found is None:
            found = self._fits[key] = self._fit(value.type, order)
        return found

    @staticmethod
    def _fit(value_type: ir.Type, order: Order) -> bool:
        shaped = ir.ShapedType(value_type)
        return shaped.has_rank and order.dim < shaped.rank and shaped.get_dim_size(order.dim) == order.kind.length

    def canonical_order(self, kind: Kind, dim: int) -> Order:
        """The one Order object for (kind, dim), `kind` any Kind (the Order's is the one Kind object equal to it)."""
        return self.order(self.kind(kind), dim)

    def order(self, kind: Kind, dim: int) -> Order:
        """The one Order object for (kind, dim), `kind` one of `self.kind`'s."""
        key = (id(kind), dim)
        found = self._orders.get(key)
        if found is None:
            found = self._orders[key] = Order(kind, dim)
        return found

    def run(self) -> Motion:
        with Permutations(self.module) as self.permutations:
            for fn in _with_manual_computations(self.module, self.holders):
                _Body(self, fn.regions[0].blocks[0]).run()
        del self.permutations
        return self.motion

    # -- where the sequence dim goes: the rule table, and calls of elementwise functions ----------------------

    def rule(self, key: tuple, compute):
        """A rule's answer for ops of one signature (`signature`): the layers of a model repeat the same ops, so
        the table is asked once per kind of op rather than once per op. A Blocked answer is raised again."""
        found = self._rules.get(key)
        if found is None:
            try:
                found = compute()
            except Blocked as why:
                found = why
            self._rules[key] = found
        if isinstance(found, Blocked):
            raise found
        return found

    def signature(self, op: ir.Operation, name: str, values: list) -> tuple[int, tuple[int, ...]]:
        """A number for what the rules read of an op: its name, operand and result types, the attributes its table
        entry says the rules read (all of them for an op without one), and the combine of a reduction's body (two
        reductions alike but for their bodies aren't alike). MLIR uniques types and attributes, so they are keyed
        by their hashes, the addresses of what they name: a hit compares none of them through the bindings. A
        number, so that the several rule keys of an op don't each hash all of that again; with it, the hashes of
        the operands' types (for `fits_hashed`)."""
        entry = OPS.get(name, UNKNOWN)
        names = entry.hoist_reads
        if names is None:
            attributes = op.attributes
            names = tuple(attributes)  # iterated, its names
            read = tuple(map(hash, map(attributes.__getitem__, names)))
        elif names:
            attributes = op.attributes
            try:  # (an optional flag missing is rare: then each is asked alone)
                read = tuple([hash(attributes[n]) for n in names])
            except KeyError:
                read = tuple(map(_attribute_hash, repeat(attributes), names))
        else:
            read = ()
        body = reducer(op) if entry.motion in _WITH_BODY else None
        results = (hash(op.result.type),) if entry.single_result else tuple(map(hash, map(_TYPE, op.results)))
        types = tuple([hash(v.type) for v in values])
        whole = (name, types, results, names, read, body)
        return self._signatures.setdefault(whole, len(self._signatures)), types

    def sinks(self, op: ir.Operation, name: str, motion: OpMotion, operand: int, order: Order) -> tuple:
        """How an op runs when operand `operand` is read in `order` (`_Body._sink`): the result dim the sequence
        lands in (REDUCED: an order-free reduction sums it away) and the operand dims read in that order with it;
        Blocked when it can't. The op's result must fit the order (else it couldn't be put back in order)."""
        if motion is OpMotion.CALL:  # the operands the callee needs permuted with this one
            found = self.call(op, operand, order.dim)
            dim, operand_dims = found.dim, found.operands
        else:
            dim = moves(op, operand, order.dim)
            operand_dims = ({operand: order.dim, **reduced_with(op, operand, order.dim)} if dim == REDUCED else
                            self.carriers(op, dim, name))
        if dim != REDUCED and not all(self.fits(r.type, self.order(order.kind, dim)) for r in op.results):
            raise Blocked("changes the sequence length")
        return dim, operand_dims

    @property
    def calls(self) -> TokenwiseCalls:
        if self._calls is None:
            self._calls = TokenwiseCalls(module_funcs(self.module))
        return self._calls

    def call(self, op: ir.Operation, operand: int, dim: int) -> CallMotion:
        """A call run with operand `operand` permuted along `dim` (see calls.py)."""
        return self.calls.motion(op, operand, dim)

    def carriers(self, op: ir.Operation, dim: int, name: str) -> dict[int, int]:
        motion = OPS.get(name, UNKNOWN).motion
        if motion in _IN_PLACE:
            return {i: dim for i in range(len(op.operands))}
        if motion is OpMotion.CALL:
            return self.calls.carriers(op, dim)
        return carriers(op, dim)

    def say(self, kind: Kind, inverse: bool, op: ir.Operation, why: Blocked) -> None:
        key = (kind, inverse, op.name, str(why), source_loc(op.location))
        if key in self._said:
            return
        self._said.add(key)
        what = "an inverse" if inverse else "a"
        name = op.name
        if name == "func.call":
            name += f"' to '@{ir.FlatSymbolRefAttr(op.attributes['callee']).value}"
        self.motion.remarks.append((f"{what} {kind} permutation stops at '{name}': it {why}",
                                    source_loc(op.location)))


def _with_manual_computations(module: ir.Operation, holders: frozenset[str] | None = None) -> list[ir.Operation]:
    """The functions, in module order, whose bodies hold a manual computation (a permutation is one; a body
    without any has nothing to move): those named in `holders` where given, else found by a walk that reads each
    body op's name and goes no deeper, which costs less than listing the body's ops (a model whose every layer has
    its own kernel helpers has hundreds of functions, none holding one)."""
    if holders is not None:
        return [fn.operation for fn in module.regions[0].blocks[0].operations
                if fn.operation.name == "func.func" and ir.StringAttr(fn.operation.attributes["sym_name"]).value
                in holders and len(fn.operation.regions[0].blocks)]
    advance, skip, interrupt = ir.WalkResult.ADVANCE, ir.WalkResult.SKIP, ir.WalkResult.INTERRUPT
    found = []
    holds = [False]

    def visit(op: ir.Operation) -> ir.WalkResult:
        name = op.name
        if name == "func.func":  # the function walked (functions hold no functions)
            return advance
        if name == "sdy.manual_computation":
            holds[0] = True
            return interrupt
        return skip

    for fn in module.regions[0].blocks[0].operations:
        fn = fn.operation
        if fn.name == "func.func" and len(fn.regions[0].blocks):
            holds[0] = False
            fn.walk(visit, ir.WalkOrder.PRE_ORDER)
            if holds[0]:
                found.append(fn)
    return found


class _Body:
    """The orders of the values of one function body, and the edits that follow from them.

    Ops are named by their place in the body (an op's hash in the bindings follows its operands, which the edits
    change), values by their hash (the address of what they name: dicts keyed by the values themselves compare
    colliding keys through the bindings, which costs more than the rest)."""

    def __init__(self, mover: Mover, block: ir.Block):
        self.mover = mover
        self.block = block
        self.ops = ops = [op.operation for op in block.operations]
        self.names = names = [op.name for op in ops]
        self.perms: dict[int, Perm] = {}  # place -> the permutation there
        for i in [i for i, name in enumerate(names) if name == "sdy.manual_computation"]:
            perm = perm_of(ops[i], mover.perms_read, mover.canonical_order)
            if perm is not None:
                self.perms[i] = perm
        self.perm_place = {id(perm): i for i, perm in self.perms.items()}
        # value -> (order, holder, like): the value is at hand in `order` as `holder` (the value itself when its op
        # runs in permuted order); `like` is the permutation new ones of that order copy their sharding from
        self.permuted: dict[int, tuple[Order, ir.Value, Perm]] = {}
        # the results of the ops that run in permuted order, by their hashes, in the order they are found to
        self.runs_permuted: list[int] = []
        self.own: set[int] = set()  # results of the ops in runs_permuted: at hand in permuted order as themselves
        self.signatures: dict[int, tuple[int, tuple]] = {}  # place -> Mover.signature of its op (asked once)
        # what reads a value in permuted order: (reader's place, operand number or None for a forward permutation,
        # value, order, like)
        self.reads: list[tuple[int, int | None, ir.Value, Order, Perm, int]] = []  # ..., and the value's hash
        self.read_count: dict[tuple[int, Order], int] = {}
        # The sink's shortcuts (`_sink`'s layout re-assertions, `_same_shape`) read every operand of an op they run
        # in permuted order, so its place is kept (`whole`) rather than a read per operand; a read of a value its op
        # computes in permuted order, in that order, needs no edit, so it isn't listed in reads. Neither is in
        # read_order: that is asked only of the op at the same place, and an op whose results run permuted is never
        # looked at again.
        self.whole: set[int] = set()
        # (place, operand number) of the other reads of such values, in their order, by the ops the sink runs
        # permuted (read_count, which only `_all_reads_permuted` asks, and only of values not in permuted order,
        # doesn't count them)
        self.trivial: list[tuple[int, int]] = []
        # The values their ops compute in permuted order that a use may read in another order (or as they are):
        # an operand the op reading it doesn't read in that order (a ring region, a return, an op the motion
        # stops at, an operand an op reads as it is), or a use in a region. Only their uses are looked at by the
        # edits; every use of any other is a read in its order: its readers all come after it, and each is looked
        # at by the sink, which sees it in permuted order (or, for the values `_hoist` gives in permuted order, was
        # asked of every use before).
        self.mixed: set[int] = set()
        self.read_order: dict[tuple[int, int], Order] = {}  # (reader's place, operand number) -> the order it reads
        # place -> its results read permuted: (value, order, like, the value's hash)
        self.needs: dict[int, list[tuple[ir.Value, Order, Perm, int]]] = {}
        self.heap: list[int] = []
        # the module's permutations, by (source, order), and the ones the edits keep (by id)
        self.forwards: dict[tuple[int, Order], Perm] = {}
        self.inverses: dict[tuple[int, Order], Perm] = {}
        self.kept: set[int] = set()

    def run(self) -> None:
        if not self.perms:
            return
        self._sink()
        self._hoist()
        self._edit()

    # -- 1. forward: inverses sink ------------------------------------------------------------------------------

    def _sink(self) -> None:
        """(The values whose ops run in permuted order that some use may read otherwise are found here too, for the
        edits: see `mixed`.)"""
        permuted, perms, names = self.permuted, self.perms, self.names
        same_shape = self._same_shape
        read_count, reads, runs_permuted, own, mixed, whole = (self.read_count, self.reads, self.runs_permuted,
                                                               self.own, self.mixed, self.whole)
        read_order, needs, heap, trivial = self.read_order, self.needs, self.heap, self.trivial
        where_it_lives, as_is, source, nested = (OpMotion.WHERE_IT_LIVES, OpMotion.AS_IS, OpMotion.SOURCE,
                                                 Regions.NESTED)
        mover = self.mover
        plans = mover.plans
        entries = list(map(OPS.get, names, repeat(UNKNOWN)))
        for place, op, entry in zip(count(), self.ops, entries):
            motion = entry.motion
            if motion is where_it_lives:
                # nearly half the ops between the rings on Explicit axes: one operand, a result of its type, so a
                # permuted operand is read in its order and the result is at hand in it, with nothing to check
                # (its operand and result read alone: the bindings build no lists)
                value = op.operands[0]
                key = hash(value)
                found = permuted.get(key)
                if found is not None:
                    order, like = found[0], found[2]
                    whole.add(place)
                    if key not in own:  # (a read of a value its op gives in this order needs no edit)
                        reads.append((place, 0, value, order, like, key))
                        read_count[(key, order)] = read_count.get((key, order), 0) + 1
                    result = op.result
                    key = hash(result)
                    runs_permuted.append(key)
                    permuted[key] = (order, result, like)
                    own.add(key)
                continue
            if motion is source:  # (no operands: constants, iotas)
                continue
            values = list(op.operands)
            keys = list(map(hash, values))
            if own and entry.regions is nested and len(op.regions):
                _mark_nested(op, own, mixed)  # (only values computed before the op can be read in its regions)
            if motion is as_is:
                perm = perms.get(place)
                if perm is None:  # a ring region, a return: reads its operands as they are
                    mixed.update(key for key in keys if key in own)
                elif perm.inverse:
                    permuted[hash(perm.result)] = (perm.order, values[0], perm)
                    self.inverses.setdefault((keys[0], perm.order), perm)
                    if keys[0] in own:
                        mixed.add(keys[0])
                else:
                    self.forwards.setdefault((keys[0], perm.order), perm)
                    self._read(place, None, values[0], perm.order, perm, keys[0])
                    if keys[0] in own and permuted[keys[0]][0] is not perm.order:
                        mixed.add(keys[0])
                continue
            for i, key in enumerate(keys):
                first = permuted.get(key)
                if first is not None:
                    break
            else:
                continue  # (nothing of it in permuted order: none of its operands is in own either)
            order, _, like = first
            if motion is OpMotion.SAME_SHAPE:
                same_shape(place, op, values, keys, order, like)
                continue
            name = names[place]
            signature = self.signatures[place] = mover.signature(op, name, values)
            plan = plans.get((signature[0], i, order))
            if plan is None:
                plan = self._plan(op, name, motion, i, order, signature, values)
            if plan.__class__ is Blocked:
                mover.say(order.kind, True, op, plan)
                mixed.update(key for key in keys if key in own)
                continue
            result_order, reading, read_operands = plan
            why = None
            for j, read, fits in reading:
                found = permuted.get(keys[j])
                if found is not None:
                    if found[0] is not read:
                        why = "reads values in two different sequence orders"
                        break
                elif not fits:
                    why = "changes the sequence length"
                    break
            if why is not None:
                mover.say(order.kind, True, op, Blocked(why))
                mixed.update(key for key in keys if key in own)
                continue
            for j, read, _ in reading:  # `_read`: the op's first reads (none of its operands is read already)
                key = keys[j]
                read_order[(place, j)] = read
                if key in own:  # at hand in that order (checked above): nothing to edit, nor to count
                    trivial.append((place, j))
                    continue
                reads.append((place, j, values[j], read, like, key))
                read_count[(key, read)] = read_count.get((key, read), 0) + 1
                found = permuted.get(key)
                if found is None or found[0] is not read:  # not at hand in that order: its op may compute it so
                    owner = self._place_of(values[j], place)
                    if owner is not None:
                        if owner not in needs:
                            heapq.heappush(heap, -owner)
                        needs.setdefault(owner, []).append((values[j], read, like, key))
            # an operand in permuted order that the op doesn't read so (the other side of an op that sums the
            # sequence away, say); those it reads are read in their own order (checked above)
            if len(keys) > len(read_operands):
                for j, key in enumerate(keys):
                    if key in own and j not in read_operands:
                        mixed.add(key)
            if result_order is not None:
                self._run_permuted(place, result_order, like, entry.single_result)

    def _plan(self, op: ir.Operation, name: str, motion: OpMotion, operand: int, order: Order,
              signature: tuple[int, tuple[int, ...]], values: list) -> tuple | Blocked:
        """How ops of this signature sink with operand `operand` in `order` (`Mover.sinks`, asked once per kind of
        op, operand and order: the layers of a model repeat the same ops): the order of the result (None: an
        order-free reduction sums the sequence away), for each operand read permuted, the order it is read in
        and whether its type fits that order (the check `_check` makes of an operand not at hand in it), and the
        numbers of the operands read permuted. Keyed by the signature, which holds every operand type, and the
        order, so the whole answer is the key's; Blocked where the op can't sink."""
        mover = self.mover
        try:
            dim, operand_dims = mover.rule((signature[0], operand, order.dim, order.kind.length),
                                           lambda: mover.sinks(op, name, motion, operand, order))
        except Blocked as why:
            plan = why
        else:
            kind = order.kind
            reading = []
            for j, d in operand_dims.items():
                read = mover.order(kind, d)
                reading.append((j, read, mover.fits_hashed(signature[1][j], read, values[j])))
            plan = (None if dim == REDUCED else mover.order(kind, dim), tuple(reading), frozenset(operand_dims))
        mover.plans[(signature[0], operand, order)] = plan
        return plan

    def _same_shape(self, place: int, op: ir.Operation, values: list, keys: list[int], order: Order,
                    like: Perm) -> None:
        """The sink's reads and `_run_permuted` for an op whose operands and results all have one shape (most ops
        between the rings): every operand read in `order` along the same dim, with the same checks, in one pass
        (the op is looked at once here, so none of its operands is read already)."""
        permuted, fits, own = self.permuted, self.mover.fits, self.own
        for j, key in enumerate(keys):
            found = permuted.get(key)
            why = None
            if found is not None:
                if found[0] is not order:
                    why = "reads values in two different sequence orders"
            elif not fits(values[j].type, order):
                why = "changes the sequence length"
            if why is not None:
                self.mover.say(order.kind, True, op, Blocked(why))
                self.mixed.update(key for key in keys if key in own)
                return
        result = op.result  # (one result: elementwise)
        if not fits(result.type, order):  # a dynamic sequence dim: it couldn't be put back
            self.mover.say(order.kind, True, op, Blocked("changes the sequence length"))
            self.mixed.update(key for key in keys if key in own)
            return
        read_count, reads, needs = self.read_count, self.reads, self.needs
        self.whole.add(place)
        for j, key in enumerate(keys):
            if key in own:  # in `order` (checked above): at hand, nothing to edit
                continue
            value = values[j]
            reads.append((place, j, value, order, like, key))
            counted = (key, order)
            read_count[counted] = read_count.get(counted, 0) + 1
            if key not in permuted:  # not at hand in that order (checked above): its op may compute it so
                owner = self._place_of(value, place)
                if owner is not None:
                    if owner not in needs:
                        heapq.heappush(self.heap, -owner)
                    needs.setdefault(owner, []).append((value, order, like, key))
        key = hash(result)
        permuted[key] = (order, result, like)
        own.add(key)
        self.runs_permuted.append(key)

    # -- 2. backward: forward permutations rise -----------------------------------------------------------------

    def _hoist(self) -> None:
        needs, heap, names, mover = self.needs, self.heap, self.names, self.mover
        permuted, table, unknown, source = self.permuted, OPS.get, UNKNOWN, OpMotion.SOURCE
        plans = mover.plans
        while heap:
            place = -heapq.heappop(heap)
            op = self.ops[place]
            name = names[place]
            for value, order, like, key in needs.pop(place, ()):
                found = permuted.get(key)
                if found is not None and found[0] is order:
                    continue  # at hand in that order
                if table(name, unknown).motion is source:
                    self._computed_permuted(op, value, order, like)
                    continue
                if not self._all_reads_permuted(place, order):
                    continue
                signature = self.signatures.get(place)
                if signature is None:
                    signature = self.signatures[place] = mover.signature(op, name, list(op.operands))
                plan = plans.get((signature[0], None, order))
                if plan is None:
                    plan = self._carriers_plan(op, name, order, signature)
                if plan.__class__ is Blocked:
                    mover.say(order.kind, False, op, plan)
                    continue
                if plan:
                    operands = op.operands
                    reading = [(j, operands[j], read, None) for j, read, _ in plan]
                    try:
                        self._check(place, reading, signature[1])
                    except Blocked as why:
                        mover.say(order.kind, False, op, why)
                        continue
                    for j, value, read, _ in reading:
                        self._read(place, j, value, read, like)
                self._run_permuted(place, order, like)

    def _carriers_plan(self, op: ir.Operation, name: str, order: Order,
                       signature: tuple[int, tuple[int, ...]]) -> tuple | Blocked:
        """How ops of this signature run with their results in `order` (`Mover.carriers`, asked once per kind of
        op and order): the operands read permuted, each with the order it is read in; Blocked where they can't.
        Keyed by the signature (the carriers read no more than it holds) and the order."""
        mover = self.mover
        try:
            operand_dims = mover.rule((signature[0], "carriers", order.dim),
                                      lambda: mover.carriers(op, order.dim, name))
        except Blocked as why:
            plan = why
        else:
            plan = tuple((j, mover.order(order.kind, d), None) for j, d in operand_dims.items())
        mover.plans[(signature[0], None, order)] = plan
        return plan

    def _computed_permuted(self, op: ir.Operation, value: ir.Value, order: Order, like: Perm) -> None:
        """A value no operand makes, asked for in permuted order: a splat constant, or an iota across another dim,
        is that already; an integer iota along the sequence dim (the positions RoPE reads) is computed in permuted
        order beside it, each position mapped to the token that sits there (what ring-reorder's position rewrite
        computes), for the readers that read it permuted. Else a permutation of it will be built."""
        key = hash(value)
        if key in self.permuted:
            return  # in another order already
        holder = None
        if op.name == "stablehlo.constant":
            holder = value if ir.DenseElementsAttr(op.attributes["value"]).is_splat else None
        elif ir.IntegerAttr(op.attributes["iota_dimension"]).value != order.dim:
            holder = value
        elif is_integer(value) and holds(value, 0, order.kind.length - 1):
            # (mapped in the iota's own type: one that holds every position, else the arithmetic wraps)
            kind = order.kind
            cp = dict(self.mover.meshes[kind.mesh_name].axes)[kind.axis]
            with ir.InsertionPoint.after(op), op.location:
                holder = mapped_index(value, 1, kind.strategy, kind.stripe, cp, kind.length // cp)
        if holder is not None:
            self.permuted[key] = (order, holder, like)

    def _all_reads_permuted(self, place: int, order: Order) -> bool:
        """The op may run in permuted order: not a permutation or a region, not already running permuted, and
        every use of each of its results reads it in `order`."""
        op = self.ops[place]
        entry = OPS.get(self.names[place], UNKNOWN)
        if place in self.perms or entry.motion is OpMotion.AS_IS:
            return False
        results = [(r, hash(r)) for r in ((op.result,) if entry.single_result else op.results)]
        permuted, read_count = self.permuted, self.read_count
        if any(key in permuted for _, key in results):
            return False
        return all(sum(1 for _ in r.uses) == read_count.get((key, order), 0) for r, key in results)

    # -- 3. the edits -------------------------------------------------------------------------------------------

    def _edit(self) -> None:
        # Which uses read contiguous order, found before anything changes: every use of a value computed in
        # permuted order that is not one of the reads above (readers found by their place, `_place_of_op`; a reader
        # without results is a return, one in a region or made here no reader of the body's)
        reads = None
        contiguous = []
        permuted, mixed, whole = self.permuted, self.mixed, self.whole
        for key in (self.runs_permuted if mixed else ()):
            if key not in mixed:
                continue  # every use is one of the reads in permuted order
            held = permuted[key]
            result = held[1]  # (the result itself: its op runs in permuted order)
            if reads is None:
                reads = {(place, j if j is not None else 0) for place, j, _, _, _, _ in self.reads}
                reads.update(self.trivial)
            for use in result.uses:
                owner = use.owner.operation
                if not len(owner.results):
                    contiguous.append((result, owner, use.operand_number))
                    continue
                place = self._place_of_op(owner)
                if place not in whole and (place, use.operand_number) not in reads:
                    contiguous.append((result, owner, use.operand_number))
        permuted, own = self.permuted, self.own
        for place, j, value, order, like, key in self.reads:
            if j is not None and key in own and permuted[key][0] is order:
                continue  # its op gives it in the order read: the operand stays as it is
            op = self.ops[place]
            held = self._held_in(value, order, like, place)
            if j is not None:
                if op.operands[j] != held:
                    op.operands[j] = held
            elif held != op.results[0]:  # a forward permutation of the module's that is no longer needed
                op.results[0].replace_all_uses_with(held)
        for result, owner, operand in contiguous:
            owner.operands[operand] = self._restored(result)
        for perm in sorted(self.perms.values(), key=lambda p: p.inverse):  # forwards first: they read inverses
            if id(perm) not in self.kept and not any(True for _ in perm.result.uses):
                perm.op.erase()

    def _held_in(self, value: ir.Value, order: Order, like: Perm, reader: int) -> ir.Value:
        """The value in `order` for the op at `reader`: what holds it so, else a forward permutation of it (the
        module's, or a new one right after its definition)."""
        found = self._in(value, order)
        if found is not None:
            return found
        key = hash(value)
        # a value its op computes in permuted order is in another order than this one (else it would be at hand):
        # a permutation reads it put back in contiguous order. So do the module's own: two ring regions given
        # different layouts (zigzag and striped, or two stripes) with token-wise code between them, which runs in
        # the first region's order, leave the second's forward permutation reading a value in the first order
        source = self._restored(value) if key in self.own else value
        perm = self.forwards.get((key, order))
        if perm is None:
            perm = self._build(source, order, like, inverse=False)
            self.forwards[(key, order)] = perm
        else:
            if perm.source != source:
                perm.op.operands[0] = source
            if self.perm_place.get(id(perm), -1) > reader or source is not value:
                # the module's permutation sits before a later reader (a ring region): an earlier reader needs it
                # where a new one would go, right after the definition (or after the restoring permutation, which
                # sits there)
                owner = source.owner
                if isinstance(owner, ir.Block):
                    perm.op.move_before(self.ops[0])
                else:
                    perm.op.move_after(owner.operation)
                self.perm_place[id(perm)] = -1
        self.kept.add(id(perm))
        return perm.result

    def _restored(self, value: ir.Value) -> ir.Value:
        """A value its op computes in permuted order, put back in contiguous order (once)."""
        key = hash(value)
        order, _, like = self.permuted[key]
        perm = self.inverses.get((key, order))
        if perm is None:
            perm = self._build(value, order, like, inverse=True)
            self.inverses[(key, order)] = perm
        self.kept.add(id(perm))
        return perm.result

    # -- helpers ------------------------------------------------------------------------------------------------

    def _in(self, value: ir.Value, order: Order) -> ir.Value | None:
        found = self.permuted.get(hash(value))
        return found[1] if found is not None and found[0] is order else None

    def _read(self, place: int, operand: int | None, value: ir.Value, order: Order, like: Perm,
              value_key: int | None = None) -> None:
        """The op at `place` reads `value` (its operand `operand`, None for a forward permutation's source) in
        `order`. `value_key`: hash(value), where the caller has it."""
        if operand is not None:
            if (place, operand) in self.read_order:
                return  # read already (a use is counted once: read_count is compared with the uses)
            self.read_order[(place, operand)] = order
        value_key = hash(value) if value_key is None else value_key
        key = (value_key, order)
        self.reads.append((place, operand, value, order, like, value_key))
        self.read_count[key] = self.read_count.get(key, 0) + 1
        found = self.permuted.get(value_key)
        if found is None or found[0] is not order:  # not at hand in that order: its op may compute it so
            owner = self._place_of(value, place)  # None: a function argument
            if owner is not None:
                if owner not in self.needs:
                    heapq.heappush(self.heap, -owner)
                self.needs.setdefault(owner, []).append((value, order, like, value_key))

    def _place_of(self, value: ir.Value, reader: int) -> int | None:
        """The place of the op whose result `value` is (None for a block argument), read by the op at `reader`.
        Nearly always the op right before its reader (a broadcast of a weight, say): the few ops before it are
        compared first, by their hashes (the address of the op, whichever object of the bindings names it), and
        the rest searched by their order in the block."""
        owner = value.owner
        if isinstance(owner, ir.Block):
            return None
        key = hash(owner)  # (an op view's hash is its operation's)
        ops = self.ops
        for place in range(reader - 1, max(reader - _NEAR, 0) - 1, -1):
            if hash(ops[place]) == key:
                return place
        return self._place_of_op(owner.operation, reader)

    def _place_of_op(self, op: ir.Operation, before: int | None = None) -> int | None:
        """The place of an op of the body, found by bisection on the order of the block (MLIR keeps each op's
        index in its block, so each comparison is a lookup), before place `before` where given; None for an op
        that isn't one of the body's (nested in a region, or made here)."""
        if op.block != self.block:
            return None  # (ops of two blocks have no order to compare)
        ops = self.ops
        low, high = 0, len(ops) if before is None else before
        while low < high:
            middle = (low + high) // 2
            if ops[middle].is_before_in_block(op):
                low = middle + 1
            else:
                high = middle
        return low if low < len(ops) and hash(ops[low]) == hash(op) else None

    def _run_permuted(self, place: int, order: Order, like: Perm, single_result: bool | None = None) -> None:
        op = self.ops[place]
        if single_result is None:
            single_result = OPS.get(self.names[place], UNKNOWN).single_result
        runs_permuted, permuted, own = self.runs_permuted, self.permuted, self.own
        for result in ((op.result,) if single_result else op.results):
            key = hash(result)
            runs_permuted.append(key)
            permuted[key] = (order, result, like)
            own.add(key)

    def _check(self, place: int, reading: list[tuple[int, ir.Value, Order, int | None]],
               types: tuple[int, ...] | None = None) -> None:
        """The op at `place` may read these operands in permuted order: each has the sequence's length along
        its dim (a value at hand in that order has it already), is in no other permuted order, and is not read in
        another order already (a dot_general that sums the tokens of one dim of an operand can't also give a
        result permuted along another dim of it). `types`: the hashes of the op's operands' types, where known."""
        fits, hashed = self.mover.fits, self.mover.fits_hashed
        for index, value, order, key in reading:
            found = self.permuted.get(hash(value) if key is None else key)
            if found is not None and found[0] is not order:
                raise Blocked("reads values in two different sequence orders")
            if found is None and not (fits(value.type, order) if types is None else
                                      hashed(types[index], order, value)):
                raise Blocked("changes the sequence length")
            read = self.read_order.get((place, index))
            if read is not None and read is not order:
                raise Blocked("would read an operand in two sequence orders (along two of its dims)")

    def _build(self, value: ir.Value, order: Order, like: Perm, inverse: bool) -> Perm:
        """A permutation of `value` in `order` (or its inverse), right after the value's definition."""
        owner = value.owner
        point = (ir.InsertionPoint.at_block_begin(owner) if isinstance(owner, ir.Block)
                 else ir.InsertionPoint.after(owner.operation))
        kind = order.kind
        mesh = self.mover.meshes[kind.mesh_name]
        sharding = _derive_sharding(like, list(_shape(like.source)), list(_shape(value)), order.dim, mesh)
        op = self.mover.permutations.insert(point, value, kind.mesh_name, mesh, sharding, order.dim, kind.axis,
                                            kind.strategy, kind.stripe, inverse, like.manual_axes)
        return Perm(op, kind, order.dim, inverse, sharding, like.manual_axes, order)


def _mark_nested(op: ir.Operation, own: set[int], mixed: set[int]) -> None:
    """Add to `mixed` each value of `own` read by an operand of an op in `op`'s regions, except inside manual
    computations (isolated from above: their bodies read only their own values)."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                for key in map(hash, inner.operands):
                    if key in own:
                        mixed.add(key)
                if inner.name != "sdy.manual_computation" and len(inner.regions):
                    _mark_nested(inner, own, mixed)


def _derive_sharding(like: Perm, like_shape: list[int], shape: list[int], dim: int, mesh: Mesh) -> TensorSharding:
    """The sharding of a new permutation: the ring axis on the sequence dim, and the axes `like` has on the dims
    that sit at the same distance from its sequence dim with the same size (batch dims, say) where they divide."""
    partial = len(like.manual_axes) < len(mesh.axes)  # the other axes left to propagation: dims stay open
    dims = []
    for j, size in enumerate(shape):
        i = like.dim + (j - dim)
        axes: tuple[AxisRef, ...] = ()
        if j == dim:
            axes = (AxisRef(like.kind.axis),)
        elif 0 <= i < len(like_shape) and like_shape[i] == size and i < len(like.sharding.dims):
            axes = like.sharding.dims[i].axes
            if size % math.prod(a.size_in(mesh) for a in axes):
                axes = ()
        dims.append(DimSharding(axes, not partial))
    return TensorSharding(like.kind.mesh_name, tuple(dims))
