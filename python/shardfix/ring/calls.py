"""Calls of functions that treat tokens alike, for hoist-permutations.

A call may run on permuted arguments, and give its results in permuted order, when its callee commutes with the
permutation: every op of the body that reads a value in token order is token-wise along that dim by the rule table
(`moves` / `carriers`), the other operands of such an op that carry the dim are in token order too (an argument,
which the caller then reads permuted) or constant along it (a broadcast scalar, an iota across another dim), and
every result is in token order along one dim. The body is read, never changed, so callees with other callers
(log_softmax and its transpose, silu, one_hot) stay shared. Nothing inside may reduce over the sequence or hold a
region other than a reduction's body: those are left to the call's caller, where their rules apply.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir

from .dims import shape
from .rules import REDUCED, Blocked, carriers, moves

# ops with a region the analysis reads through: the region is a scalar combine of the op's own block arguments
_SIMPLE_REGIONS = frozenset({"stablehlo.reduce", "stablehlo.scatter"})


@dataclass(frozen=True)
class CallMotion:
    """A call run on permuted arguments: the result dim of every result, and the operands read permuted (at
    which of their dims)."""

    dim: int
    operands: dict[int, int]


class TokenwiseCalls:
    """The answer for each (callee, operand, dim), worked out once: the layers of a model call the same functions."""

    def __init__(self, funcs: dict[str, ir.Operation]):
        self.funcs = funcs
        self._found: dict[tuple[str, int, int], CallMotion | Blocked] = {}

    def motion(self, call: ir.Operation, operand: int, dim: int) -> CallMotion:
        """How the call runs when operand `operand` is permuted along `dim`; Blocked when it can't."""
        callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
        key = (callee, operand, dim)
        found = self._found.get(key)
        if found is None:
            func = self.funcs.get(callee)
            self._found[key] = Blocked("calls a function that is being looked at already")  # recursion
            try:
                if func is None or len(func.regions[0].blocks) != 1:
                    raise Blocked("calls a function without a body")
                found = _Callee(self, func).run({operand: dim}, shape(call.operands[operand])[dim])
            except Blocked as why:
                found = why
            self._found[key] = found
        if isinstance(found, Blocked):
            raise found
        return found

    def carriers(self, call: ir.Operation, dim: int) -> dict[int, int]:
        """The operands a call reads permuted to give its results permuted along `dim`: the first operand dim that
        leads there."""
        length = None
        for result in call.results:
            sizes = shape(result)
            if dim >= len(sizes) or length not in (None, sizes[dim]):
                raise Blocked("does not give every result along the sequence dim")
            length = sizes[dim]
        for i, value in enumerate(call.operands):
            for d, size in enumerate(shape(value)):
                if size != length:
                    continue
                try:
                    found = self.motion(call, i, d)
                except Blocked:
                    continue
                if found.dim == dim:
                    return found.operands
        raise Blocked("is not known to treat tokens alike")


class _Callee:
    """One analysis of a callee's body from a set of permuted arguments (grown as the body asks for more)."""

    def __init__(self, calls: TokenwiseCalls, func: ir.Operation):
        self.calls = calls
        self.block = func.regions[0].blocks[0]
        self.args = {hash(a): i for i, a in enumerate(self.block.arguments)}

    def run(self, seeds: dict[int, int], length: int) -> CallMotion:
        while True:
            grown = self._pass(seeds, length)
            if grown is None:
                break
            if all(seeds.get(i) == d for i, d in grown.items()):  # nothing new: the body can't be put in order
                raise Blocked("calls a function that combines tokens with values not in token order")
            seeds = {**seeds, **grown}
        return CallMotion(self._result_dim, dict(sorted(seeds.items())))

    def _pass(self, seeds: dict[int, int], length: int) -> dict[int, int] | None:
        """Follow the token dims through the body; the arguments to add to the seeds if an op needs one of them in
        token order (then the pass starts again), else None with `_result_dim` set."""
        args = list(self.block.arguments)
        dims = {hash(args[i]): d for i, d in seeds.items()}
        self._constant: dict[tuple[int, int], bool] = {}
        self._traced: set[tuple[int, int]] = set()
        for op in self.block.operations:
            op = op.operation
            operands = list(op.operands)
            keys = [hash(v) for v in operands]
            if op.name == "func.return":
                return self._returns(operands, keys, dims)
            if len(op.regions) and (op.name not in _SIMPLE_REGIONS or not _closed(op)):
                # a region may read any value above it, not only the op's operands
                raise Blocked("calls a function holding a region other than a reduction's")
            first = next((j for j, key in enumerate(keys) if key in dims), None)
            if first is None:
                continue
            if op.name == "func.call":
                motion = self.calls.motion(op, first, dims[keys[first]])
                dim, operand_dims = motion.dim, motion.operands
            else:
                dim = moves(op, first, dims[keys[first]])
                if dim == REDUCED:
                    raise Blocked("calls a function that reduces over the sequence")
                operand_dims = carriers(op, dim)
            grown = {}
            for j, key in enumerate(keys):
                want = operand_dims.get(j)
                if key in dims:
                    if want != dims[key]:
                        raise Blocked("calls a function that reads values in two different sequence orders")
                elif want is not None and not self._constant_along(operands[j], want):
                    self._arguments_of(operands[j], want, grown)
            if grown:
                return grown
            for result in op.results:
                if shape(result)[dim] != length:
                    raise Blocked("calls a function that changes the sequence length")
                dims[hash(result)] = dim
        raise Blocked("calls a function without a return")

    def _returns(self, operands: list, keys: list[int], dims: dict[int, int]) -> None:
        """Check the results (all in token order along one dim) and set `_result_dim`; None: nothing to grow."""
        found = {dims[key] for key in keys if key in dims}
        if len(found) != 1:
            raise Blocked("calls a function whose results are not all in token order along one dim")
        (dim,) = found
        for value, key in zip(operands, keys):
            if key not in dims and not self._constant_along(value, dim):
                raise Blocked("calls a function returning a value that is not in token order")
        self._result_dim = dim
        return None

    def _arguments_of(self, value: ir.Value, dim: int, grown: dict[int, int]) -> None:
        """Add to `grown` the arguments (and their dims) that `value`, computed from no token data so far, would be
        computed from in token order along `dim`, through the token-wise ops that make it. The next pass checks
        every op that then reads them."""
        key = (hash(value), dim)
        if key in self._traced:
            return
        self._traced.add(key)
        owner = value.owner
        if isinstance(owner, ir.Block):
            if grown.setdefault(self.args[hash(value)], dim) != dim:
                raise Blocked("calls a function that reads an argument in two sequence orders")
            return
        op = owner.operation
        needed = self.calls.carriers(op, dim) if op.name == "func.call" else carriers(op, dim)
        for j, d in needed.items():
            if not self._constant_along(op.operands[j], d):
                self._arguments_of(op.operands[j], d, grown)

    def _constant_along(self, value: ir.Value, dim: int) -> bool:
        """Whether `value` (computed in the body from no token data) is the same at every place along `dim`: a
        splat constant, an iota across another dim, broadcasts and token-wise ops of such values."""
        key = (hash(value), dim)
        found = self._constant.get(key)
        if found is not None:
            return found
        owner = value.owner
        found = False
        if not isinstance(owner, ir.Block):
            op = owner.operation
            if op.name == "stablehlo.constant":
                found = ir.DenseElementsAttr(op.attributes["value"]).is_splat
            elif op.name == "stablehlo.iota":
                found = ir.IntegerAttr(op.attributes["iota_dimension"]).value != dim
            elif not len(op.regions):
                try:
                    found = all(self._constant_along(op.operands[j], d) for j, d in carriers(op, dim).items())
                except Blocked:
                    found = False
        self._constant[key] = found
        return found


def _closed(op: ir.Operation) -> bool:
    """Whether the ops in `op`'s regions read only values defined in those regions (a reduction's combine)."""
    for region in op.regions:
        for block in region.blocks:
            inner = set(map(hash, block.arguments))
            for nested in block.operations:
                nested = nested.operation
                if len(nested.regions) or any(hash(v) not in inner for v in nested.operands):
                    return False
                inner.update(map(hash, nested.results))
    return True


__all__ = ["CallMotion", "TokenwiseCalls"]
