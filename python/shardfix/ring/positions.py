"""The position rewrite: where a kernel reads a contiguous-layout index `c * n + j` of a unit of tokens (c a ring
coordinate, j the unit's local index, n units a device), give it the global index of the unit that sits there in
the new order instead:

    zigzag   device c holds chunks c and 2cp-1-c, each n/2 units:
             g1 = c*(n/2) + j                    for j < n/2
                  (2cp-1-c)*(n/2) + (j - n/2)    otherwise
    striped  stripes of s tokens dealt round-robin; with m = s / unit units a stripe:
             g1 = ((j div m)*cp + c)*m + (j mod m)

Everything downstream (iota + g*unit masks, skip predicates) is then right by construction. The units must stay
whole under the permutation (prove.unit_problem checks it before anything is rewritten).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .analysis import Rewrite


@dataclass(frozen=True)
class Layout:
    """The order a region's reads are rewritten for."""

    strategy: str
    stripe: int
    cp: int
    block: int


def apply_rewrites(module: ir.Operation, plans: list[tuple[list[Rewrite], Layout]],
                   callers: dict[str, int] | None = None, copies: list[tuple[str, str]] | None = None) -> int:
    """Rewrite the recorded reads of each region (its rewrites, the layout it is reordered to). Reads in the
    region's body are rewritten in place, and so are those of a private function that only this region's call
    reaches (a layer's own copy of its kernel's helpers); any other function holding reads is rewritten in a copy
    made for the calls that asked for exactly those reads, so its other callers (regions left as they are, other
    layouts, other arguments) keep the original; copies are shared between calls that ask for the same. Originals
    no call reaches any more are erased. Returns how many reads were rewritten. `callers`: how many func.call ops
    name each function before the rewrite, if known (else the module is walked to count them). `copies`, if
    given, receives (original, copy) for each copy made."""
    specializer = _Specializer(module, callers)
    done = 0
    for rewrites, layout in plans:
        here = [r for r in rewrites if not r.calls]
        for rewrite in sorted(here, key=lambda r: (str(r.op.location), r.operand)):
            _rewrite_operand(rewrite.op, rewrite.operand, rewrite.unit, layout, specializer.consts)
        done += len(here)
        for call, below in _by_first_call([r for r in rewrites if r.calls]).items():
            specializer.redirect(call, below, layout)
            done += len(below)
    specializer.erase_unreached()
    if copies is not None:
        copies.extend((key[0], name) for key, name in specializer.copies.items())
    return done


def _by_first_call(rewrites: list[Rewrite]) -> dict:
    """Rewrites grouped by the call they go through first, each as seen from inside that call."""
    grouped: dict = {}
    for r in rewrites:
        grouped.setdefault(r.calls[0], []).append(r.relative_to(1))
    return grouped


def _rewrite_operand(op: ir.Operation, operand: int, unit: int, layout: Layout, consts: dict) -> None:
    value = op.operands[operand]
    with ir.InsertionPoint(op), op.location:
        op.operands[operand] = mapped_index(value, unit, layout.strategy, layout.stripe, layout.cp, layout.block,
                                            (consts, op.operation.block))


class _Specializer:
    """Copies of functions with some of their reads rewritten, one per (function, reads, layout)."""

    def __init__(self, module: ir.Operation, callers: dict[str, int] | None = None):
        self.module = module
        self.callers = callers  # func.call ops naming each function, before any redirect (None: unknown)
        self.consts: dict = {}  # the splat constants the rewrites share, by (block, type, number) (see _Builder)
        self.table = ir.SymbolTable(module)
        self.copies: dict = {}  # (function name, reads, layout) -> name of the copy
        self.indexes: dict = {}  # function name -> {op: its place in a pre-order walk}
        self.redirected: set = set()  # names of functions some call was moved away from
        self.moved: list[tuple[str, str]] = []  # (from, to) of each call the module had that was moved

    def redirect(self, call: ir.Operation, rewrites: list[Rewrite], layout: Layout, in_copy: bool = False) -> None:
        name = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
        if not in_copy and self._only_call(name):
            self._rewrite_in_place(name, rewrites, layout)
            return
        new_name = self.copy(name, rewrites, layout)
        call.attributes["callee"] = ir.FlatSymbolRefAttr.get(new_name)
        self.redirected.add(name)
        if not in_copy:  # a call the module had (a copy's calls are counted in the copy)
            self.moved.append((name, new_name))

    def _only_call(self, name: str) -> bool:
        """Whether a call in an original body (a region's, or a function's rewritten in place) is the only call
        of private function `name` the module has. Copies only ever repeat calls of their originals, so such a
        function is never reached through a copy, and no other caller sees it rewritten."""
        if self.callers is None:
            self.callers = _count_calls(self.module, {})
        if self.callers.get(name) != 1:
            return False
        func = self.table[name]
        return "sym_visibility" in func.attributes and \
            ir.StringAttr(func.attributes["sym_visibility"]).value == "private"

    def _rewrite_in_place(self, name: str, rewrites: list[Rewrite], layout: Layout) -> None:
        """The rewrites (relative to function `name`, which only the call being rewritten reaches) applied to the
        function itself, in their order (the analysis's, the same for the same input)."""
        for r in rewrites:
            if not r.calls:
                _rewrite_operand(r.op, r.operand, r.unit, layout, self.consts)
        for call, below in _by_first_call([r for r in rewrites if r.calls]).items():
            self.redirect(call, below, layout)

    def copy(self, name: str, rewrites: list[Rewrite], layout: Layout) -> str:
        """The copy of function `name` with `rewrites` (relative to it) applied."""
        index = self._index(name)
        key = (name, frozenset(r.key() + (r.unit,) for r in rewrites), layout)  # ops of the originals
        found = self.copies.get(key)
        if found is not None:
            return found
        original = self.table[name]
        with ir.InsertionPoint.after(original):
            clone = original.operation.clone()
        clone.attributes["sym_visibility"] = ir.StringAttr.get("private")
        new_name = self._fresh(f"{name}_{layout.strategy}")
        clone.attributes["sym_name"] = ir.StringAttr.get(new_name)
        self.table.insert(clone)
        self.copies[key] = new_name
        ops = _preorder(clone)  # the copy's ops, in the same places as the original's
        here = [r for r in rewrites if not r.calls]
        for r in sorted(here, key=lambda r: (index[r.op], r.operand)):
            _rewrite_operand(ops[index[r.op]], r.operand, r.unit, layout, self.consts)
        for call, below in _by_first_call([r for r in rewrites if r.calls]).items():
            self.redirect(ops[index[call]], below, layout, in_copy=True)
        return new_name

    def erase_unreached(self) -> None:
        """Erase the private functions calls were moved away from once no call reaches them."""
        if not self.redirected:
            return
        if self.callers is not None:  # counted before: moved calls and the copies' calls change the counts
            callers = dict(self.callers)
            for old, new in self.moved:
                callers[old] -= 1
                callers[new] = callers.get(new, 0) + 1
            for copy in self.copies.values():
                _count_calls(self.table[copy].operation, callers)
        else:
            callers = _count_calls(self.module, {})
        pending = [n for n in self.redirected if not callers.get(n)]
        while pending:
            name = pending.pop()
            func = self.table[name]
            if "sym_visibility" not in func.attributes or \
                    ir.StringAttr(func.attributes["sym_visibility"]).value != "private" or callers.get(name):
                continue
            for op in _preorder(func.operation):
                if op.name == "func.call":
                    callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
                    callers[callee] -= 1
                    if not callers[callee]:
                        pending.append(callee)
            self.indexes.pop(name, None)
            self.table.erase(func)

    def _index(self, name: str) -> dict:
        found = self.indexes.get(name)
        if found is None:
            found = self.indexes[name] = {op: i for i, op in enumerate(_preorder(self.table[name].operation))}
        return found

    def _fresh(self, base: str) -> str:
        n = 0
        while f"{base}_{n}" in self.table:
            n += 1
        return f"{base}_{n}"


def _count_calls(op: ir.Operation, callers: dict[str, int]) -> dict[str, int]:
    """Add the func.call ops in `op` to `callers` (callee -> how many call it)."""
    for inner in _preorder(op):
        if inner.name == "func.call":
            callee = ir.FlatSymbolRefAttr(inner.attributes["callee"]).value
            callers[callee] = callers.get(callee, 0) + 1
    return callers


def _preorder(op: ir.Operation) -> list:
    found = []

    def visit(o):
        found.append(o)
        return ir.WalkResult.ADVANCE

    op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def mapped_index(value: ir.Value, unit: int, strategy: str, stripe: int, cp: int, block: int,
                 shared: tuple[dict, ir.Block] | None = None) -> ir.Value:
    """New ops computing, from a contiguous-layout unit index `value`, the unit's index in the new order (at the
    current insertion point). `shared`: a cache of splat constants and the block the new ops go in; constants
    then go at the block's start, once per type and number, for every rewrite in that block."""
    n = block // unit
    build = _Builder(value, shared)
    c = build.div(value, n)
    j = build.rem(value, n)
    if strategy == "zigzag":
        half = n // 2
        lo = build.add(build.mul(c, half), j)
        hi = build.add(build.sub_from((2 * cp - 1) * half, build.mul(c, half)), build.sub(j, half))
        return build.select(build.less(j, half), lo, hi)
    m = stripe // unit
    return build.add(build.mul(build.add(build.mul(build.div(j, m), cp), c), m), build.rem(j, m))


class _Builder:
    """Integer arithmetic on tensors of one type, with splat constants. The ops are made with their result types
    given (the same ops the dialect's builders make, without inferring each type again: a model's layers each
    rewrite their own reads, ten ops a read)."""

    def __init__(self, like: ir.Value, shared: tuple[dict, ir.Block] | None = None):
        self.shared = shared
        if shared is None:
            self.type = ir.RankedTensorType(like.type)
            self._types = [self.type]
            self._consts: dict[int, ir.Value] = {}
            return
        # what a block's rewrites of one type share: the type, its result list and its constants by number, found
        # with one look-up a read (a model's layers each rewrite their own reads, each asking for several constants)
        cache, block = shared
        key = ("block", block, like.type)
        found = cache.get(key)
        if found is None:
            kind = ir.RankedTensorType(like.type)
            found = cache[key] = (kind, [kind], {})
        self.type, self._types, self._consts = found

    def const(self, number: int) -> ir.Value:
        found = self._consts.get(number)
        if found is None:
            if self.shared is None:
                return self._const(number)
            with ir.InsertionPoint.at_block_begin(self.shared[1]):
                found = self._consts[number] = self._const(number)
        return found

    def _const(self, number: int) -> ir.Value:
        scalar, dense = self._attribute(number)
        splat = ir.Operation.create("stablehlo.constant", results=[scalar], attributes={"value": dense}).result
        if not self.type.shape:
            return splat
        return ir.Operation.create("stablehlo.broadcast_in_dim", results=self._types, operands=[splat],
                                   attributes={"broadcast_dimensions": ir.DenseI64ArrayAttr.get([])}).result

    def _attribute(self, number: int) -> tuple[ir.Type, ir.Attribute]:
        """The scalar type and the splat value of a constant (kept with the shared constants: each block makes its
        own constant ops, of the same few values)."""
        cache = self.shared[0] if self.shared is not None else {}
        key = ("value", self.type, number)
        found = cache.get(key)
        if found is None:
            element = self.type.element_type
            width = ir.IntegerType(element).width
            unsigned = ir.IntegerType(element).is_unsigned
            dtype = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}[width] if not unsigned else \
                {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[width]
            scalar = ir.RankedTensorType.get([], element)
            found = cache[key] = (scalar, ir.DenseElementsAttr.get(np.array(number, dtype=dtype), type=scalar))
        return found

    def _op(self, name: str, *operands: ir.Value) -> ir.Value:
        return ir.Operation.create(name, results=self._types, operands=list(operands)).result

    def div(self, x, n: int):
        return x if n == 1 else self._op("stablehlo.divide", x, self.const(n))

    def rem(self, x, n: int):
        return self.const(0) if n == 1 else self._op("stablehlo.remainder", x, self.const(n))

    def mul(self, x, n: int):
        return x if n == 1 else self._op("stablehlo.multiply", x, self.const(n))

    def add(self, x, y):
        return self._op("stablehlo.add", x, y)

    def sub(self, x, n: int):
        return x if n == 0 else self._op("stablehlo.subtract", x, self.const(n))

    def sub_from(self, n: int, x):
        return self._op("stablehlo.subtract", self.const(n), x)

    def less(self, x, n: int):
        cache = self.shared[0] if self.shared is not None else {}
        key = ("less", self.type)
        found = cache.get(key)
        if found is None:
            found = cache[key] = ([ir.RankedTensorType.get(self.type.shape, ir.IntegerType.get_signless(1))],
                                  {"comparison_direction": stablehlo.ComparisonDirectionAttr.get("LT")})
        return ir.Operation.create("stablehlo.compare", results=found[0], operands=[x, self.const(n)],
                                   attributes=found[1]).result

    def select(self, pred, a, b):
        return self._op("stablehlo.select", pred, a, b)

