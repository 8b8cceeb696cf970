"""The sharding-site walker: every place a sharding lives in a module, each with what a pass needs to judge and
replace it (Shardy's sharding_walker, in Python), and the places whose structure the verifier would reject (a
per-value list of the wrong length or kind, a sharding on a value that can't have one).

One walk, in MLIR's C++ walker, visits the module; changes are collected in `Edits` and written once per
attribute, so a pass stays linear in the module's size however many sites change.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from ..locations import SourceLoc
from ..sharding import COLLECTIVES, TensorSharding
from .attrs import manual_axes_of, sharding_from_attr
from .edits import Edits
from .locations import op_loc, source_loc

_SINGLE_KIND = {"sdy.sharding_constraint": "constraint", "sdy.reshard": "reshard", "sdy.data_flow_edge": "edge"}
_REGION_OPS = {"sdy.manual_computation": "manual", "sdy.named_computation": "named"}
EDGE_ATTRS = ("sdy.propagation_edges", "sdy.result_propagation_edges", "sdy.block_arg_propagation_edges")


@dataclass
class ShardingSite:
    """One place a sharding lives, with what a pass needs to judge and replace it."""

    op: ir.Operation  # the op holding the attribute (the func.func for argument and result shardings)
    attr: ir.Attribute  # the sdy.TensorShardingAttr as found (uniqued by MLIR: cheap to hash and compare)
    kind: str  # arg | result | op-result | constraint | reshard | manual-in | manual-out | named-in | named-out | edge | collective
    index: int  # which argument / result / value
    sharding: TensorSharding
    type: ir.Type | None
    bound_axes: frozenset[str]  # manual in an enclosing manual computation
    manual_axes: frozenset[str]  # made manual by this site's own manual computation
    is_entry_boundary: bool  # an argument or result of a public function
    description: str
    attr_name: str = "sdy.sharding"  # the attribute (or, for arg/result, the arg_attrs/res_attrs entry) holding it
    frozen_by: str = ""  # the sdy collective that checks this sharding (it must stay as it is)
    _locate: Callable[[], SourceLoc] = field(repr=False, default=None)

    @functools.cached_property
    def loc(self) -> SourceLoc:
        """Where the sharding comes from: the op's (or argument's) source location."""
        return self._locate()

    @property
    def shape(self) -> tuple[int | None, ...] | None:
        """The tensor shape (None entries for dynamic dims), or None for a value that isn't a ranked tensor."""
        return shape_of(self.type)


@functools.lru_cache(maxsize=4096)  # types are uniqued and few: a module's thousands of values share them
def shape_of(type_: ir.Type | None) -> tuple[int | None, ...] | None:
    """A ranked shaped type's dims (None for a dynamic one); None for any other type."""
    shaped = None if type_ is None else type_.maybe_downcast()
    if isinstance(shaped, ir.TupleType) and shaped.num_types == 1:  # the verifier looks through a 1-tuple
        shaped = shaped.get_type(0).maybe_downcast()
    if not isinstance(shaped, ir.ShapedType) or not shaped.has_rank:
        return None
    return tuple(None if shaped.is_dynamic_dim(i) else shaped.get_dim_size(i) for i in range(shaped.rank))


@functools.lru_cache(maxsize=4096)
def is_shardable(type_: ir.Type) -> bool:
    """Whether a value of this type can carry a sharding at all: not an unranked tensor, not a tuple of other than
    one element (the verifier's rules; a token or a scalar takes a rank-0 sharding)."""
    concrete = type_.maybe_downcast()
    if isinstance(concrete, ir.TupleType):
        return concrete.num_types == 1 and is_shardable(concrete.get_type(0))
    if isinstance(concrete, ir.ShapedType):
        return concrete.has_rank
    return True


@dataclass
class Problem:
    """An attribute whose structure the verifier rejects: `what` is wrong-kind (a single sharding where a
    per-value list belongs, or the reverse), count (a per-value list of the wrong length) or unshardable (a
    sharding on a value that can't have one)."""

    op: ir.Operation
    attr_name: str  # for a function: arg_attrs or res_attrs
    index: int  # the argument or result of a function; 0 otherwise
    what: str
    description: str
    locate: Callable[[], SourceLoc]
    bound_axes: frozenset[str] = frozenset()


@dataclass
class ModuleShardings:
    sites: list[ShardingSite] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    manual_ops: list[ir.Operation] = field(default_factory=list)  # in pre-order: enclosing ones first
    terminators: dict[ir.Operation, ir.Operation] = field(default_factory=dict)  # manual computation -> sdy.return
    edges: list[tuple[ir.Operation, str]] = field(default_factory=list)  # propagation-edge debug attributes


def walk_shardings(module: ir.Operation) -> list[ShardingSite]:
    """Every sharding in the module, in textual order: func arguments and results, `sdy.sharding` on ops, and the
    shardings of sdy ops (constraints, reshards, manual and named computations, data-flow edges, collectives)."""
    return walk_module(module).sites


def walk_module(module: ir.Operation) -> ModuleShardings:
    """Sites, structural problems and manual computations of the module, in one walk."""
    walk = _Walk(module)
    module.walk(walk.visit, ir.WalkOrder.PRE_ORDER)
    return walk.found


def function_boundary_shardings(module: ir.Operation) -> list[ShardingSite]:
    """Only the argument and result shardings of the module's top-level functions (cheap: no walk of bodies)."""
    walk = _Walk(module)
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name == "func.func":
            walk.function(op.operation)
    return walk.found.sites


def enclosing_manual_axes(op: ir.Operation) -> frozenset[str]:
    """The axes made manual by the manual computations around `op` (one op: walks its parents)."""
    return _Walk(None).bound_axes(op)


def transform_shardings(module: ir.Operation, fn: Callable[[ShardingSite], TensorSharding | None]) -> int:
    """Replace each site's sharding with `fn(site)` (None keeps it); returns how many changed."""
    edits = Edits()
    for site in walk_shardings(module):
        new = fn(site)
        if new is not None and new != site.sharding:
            edits.set_site(site, new)
    edits.apply()
    return edits.changed


class _Walk:
    def __init__(self, module: ir.Operation | None):
        # Sites locate themselves lazily through this object, which keeps the module (and so their ops) alive.
        self.module = module
        self.found = ModuleShardings()
        self.by_value: dict[tuple, ShardingSite] = {}  # (op, "result" | "arg" | "block-arg", index) -> site
        self.returns: dict[ir.Operation, ir.Operation] = {}  # func -> its terminator, for result locations
        self.bound: dict[ir.Operation, frozenset[str]] = {}  # parent op -> axes manual around its body

    def visit(self, op: ir.Operation):
        # MLIR walks in C++ and hands over each op; only ops that can carry a sharding get a closer look.
        name = op.name
        if name == "func.func":
            self.function(op)
        elif name == "func.return":
            self.returns[op.parent.operation] = op
        elif name == "sdy.return":
            self.found.terminators[op.parent.operation] = op
        elif name.startswith("sdy."):
            self.sdy_op(op, name)
            self.debug_edges(op, op.attributes)
        else:
            attributes = op.attributes
            if "sdy.sharding" in attributes:
                self.sharded_op(op, name)
                if len(attributes) > 1:  # most sharded ops hold nothing else
                    self.debug_edges(op, attributes)
        return ir.WalkResult.ADVANCE

    def debug_edges(self, op: ir.Operation, attributes) -> None:
        """Propagation-edge debug attributes (they name axes too); looked for where shardings are."""
        for name in EDGE_ATTRS:
            if name in attributes:
                self.found.edges.append((op, name))

    def bound_axes(self, op: ir.Operation) -> frozenset[str]:
        """The axes made manual by the manual computations around `op` (memoised per parent op)."""
        parent = op.parent
        if parent is None:
            return frozenset()
        parent = parent.operation
        axes = self.bound.get(parent)
        if axes is None:
            axes = self.bound_axes(parent)
            if parent.name == "sdy.manual_computation":
                axes = axes | manual_axes_of(parent)
            self.bound[parent] = axes
        return axes

    # -- functions ---------------------------------------------------------------------------------------------

    def function(self, fn: ir.Operation) -> None:
        attrs = fn.attributes
        name = ir.StringAttr(attrs["sym_name"]).value
        public = "sym_visibility" not in attrs or ir.StringAttr(attrs["sym_visibility"]).value == "public"
        ftype = ir.FunctionType(ir.TypeAttr(attrs["function_type"]).value)
        body = fn.regions[0].blocks[0] if len(fn.regions[0].blocks) else None
        for key, kind, types in (("arg_attrs", "arg", ftype.inputs), ("res_attrs", "result", ftype.results)):
            if key not in attrs:
                continue
            what = "argument" if kind == "arg" else "result"
            for i, dict_attr in enumerate(ir.ArrayAttr(attrs[key])):
                dict_attr = ir.DictAttr(dict_attr)
                if "sdy.sharding" not in dict_attr:
                    continue
                attr = dict_attr["sdy.sharding"]
                locate = functools.partial(self.function_value_loc, fn, body, kind, i)
                if i >= len(types) or not sdy.TensorShardingAttr.isinstance(attr) or not is_shardable(types[i]):
                    problem = "unshardable" if i < len(types) and not is_shardable(types[i]) else "wrong-kind"
                    self.found.problems.append(Problem(fn, key, i, problem, f"{what} {i} of @{name}", locate))
                    continue
                label = ""
                site = ShardingSite(fn, attr, kind, i, sharding_from_attr(attr), types[i], frozenset(), frozenset(),
                                    public, f"{what} {i}{label} of @{name}", key, _locate=locate)
                self.found.sites.append(site)
                if kind == "arg":
                    self.by_value[(fn, "arg", i)] = site

    def op_location(self, op: ir.Operation) -> SourceLoc:
        return op_loc(op)

    def function_value_loc(self, fn: ir.Operation, body, kind: str, index: int) -> SourceLoc:
        if body is not None and kind == "arg":
            loc = source_loc(body.arguments[index].location)
            return loc if loc else source_loc(fn.location)
        terminator = self.returns.get(fn)
        if terminator is not None:
            loc = source_loc(terminator.location)
            if loc:
                return loc
        return source_loc(fn.location)

    # -- ops ---------------------------------------------------------------------------------------------------

    def sharded_op(self, op: ir.Operation, name: str) -> None:
        """An op of another dialect with `sdy.sharding`: one sharding per result."""
        attr = op.attributes["sdy.sharding"]
        locate = functools.partial(self.op_location, op)
        results = op.results
        if not sdy.TensorShardingPerValueAttr.isinstance(attr):
            self.problem(op, "sdy.sharding", "wrong-kind", f"'{name}' sdy.sharding", locate)
            return
        values = list(sdy.TensorShardingPerValueAttr(attr).shardings)
        if not len(results) and len(values) == 1:  # an op without results may name its device (rank 0)
            self.found.sites.append(ShardingSite(op, values[0], "op-result", 0, sharding_from_attr(values[0]), None,
                                                 self.bound_axes(op), frozenset(), False, f"'{name}' sdy.sharding",
                                                 _locate=locate))
            return
        if len(values) != len(results):
            self.problem(op, "sdy.sharding", "count", f"'{name}' sdy.sharding", locate)
            return
        if not all(is_shardable(r.type) for r in results):
            self.problem(op, "sdy.sharding", "unshardable", f"'{name}' sdy.sharding", locate)
            return
        bound = self.bound_axes(op)
        for i, value in enumerate(values):
            site = ShardingSite(op, value, "op-result", i, sharding_from_attr(value), results[i].type, bound,
                                frozenset(), False, f"result {i} of '{name}'", _locate=locate)
            self.found.sites.append(site)
            self.by_value[(op, "result", i)] = site

    def problem(self, op, attr_name: str, what: str, description: str, locate) -> None:
        self.found.problems.append(Problem(op, attr_name, 0, what, description, locate, self.bound_axes(op)))

    def sdy_op(self, op: ir.Operation, name: str) -> None:
        attributes = op.attributes
        locate = functools.partial(self.op_location, op)
        region_kind = _REGION_OPS.get(name)
        if region_kind is not None:
            self.region_op(op, name, region_kind, locate)
        elif name in _SINGLE_KIND or name in COLLECTIVES:
            attr_name = "out_sharding" if name in COLLECTIVES else "sharding"
            site = None
            if attr_name in attributes:
                attr = attributes[attr_name]
                kind = _SINGLE_KIND.get(name, "collective")
                value = op.results[0] if len(op.results) else op.operands[0]
                label = f"'{name}' {attr_name}" if kind == "collective" else f"'{name}' sharding"
                site = ShardingSite(op, attr, kind, 0, sharding_from_attr(attr), value.type, self.bound_axes(op),
                                    frozenset(), False, label, attr_name, _locate=locate)
                self.found.sites.append(site)
                self.by_value[(op, "result", 0)] = site
            if name in COLLECTIVES:
                self.freeze(op, name, site, locate)
        if "sdy.sharding" in attributes:
            self.sharded_op(op, name)

    def region_op(self, op: ir.Operation, name: str, region_kind: str, locate) -> None:
        """A manual or named computation: one sharding per operand (in_shardings) and per result."""
        attributes = op.attributes
        bound = self.bound_axes(op)
        own = frozenset()
        if region_kind == "manual":
            own = manual_axes_of(op)
            self.found.manual_ops.append(op)
        for attr_name, side in (("in_shardings", "in"), ("out_shardings", "out")):
            if attr_name not in attributes:
                continue
            values = list(sdy.TensorShardingPerValueAttr(attributes[attr_name]).shardings)
            types = op.operands if side == "in" else op.results
            if len(values) != len(types) and region_kind == "named":
                self.problem(op, attr_name, "count", f"'{name}' {attr_name}", locate)
                continue
            what = "operand" if side == "in" else "result"
            for i, value in enumerate(values):
                site = ShardingSite(op, value, f"{region_kind}-{side}", i, sharding_from_attr(value),
                                    types[i].type if i < len(types) else None, bound, own, False,
                                    f"{what} {i} of '{name}'", attr_name, _locate=locate)
                self.found.sites.append(site)
                self.by_value[(op, "result" if side == "out" else "block-arg", i)] = site

    def freeze(self, op: ir.Operation, name: str, own: ShardingSite | None, locate) -> None:
        """A collective checks its own sharding and its operand's: neither may change."""
        reason = f"'{name}' at {locate()}"
        if own is not None:
            own.frozen_by = reason
        if not len(op.operands):
            return
        operand = op.operands[0]
        if isinstance(operand, ir.OpResult):
            key = (operand.owner.operation, "result", operand.result_number)
        else:
            argument = ir.BlockArgument(operand)
            owner = argument.owner.owner.operation
            kind = "arg" if owner.name == "func.func" else "block-arg" if owner.name in _REGION_OPS else "result"
            key = (owner, kind, argument.arg_number)
        site = self.by_value.get(key)
        if site is not None:
            site.frozen_by = reason
