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

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .analysis import Rewrite


def apply_rewrites(rewrites: list[Rewrite], strategy: str, stripe: int, cp: int, block: int) -> int:
    """Rewrite every recorded read in place (each op's operand once); returns how many reads were rewritten."""
    done = 0
    for rewrite in sorted(rewrites, key=lambda r: (str(r.op.location), r.operand)):
        op = rewrite.op
        value = op.operands[rewrite.operand]
        with ir.InsertionPoint(op), op.location:
            op.operands[rewrite.operand] = mapped_index(value, rewrite.unit, strategy, stripe, cp, block)
        done += 1
    return done


def mapped_index(value: ir.Value, unit: int, strategy: str, stripe: int, cp: int, block: int) -> ir.Value:
    """New ops computing, from a contiguous-layout unit index `value`, the unit's index in the new order."""
    n = block // unit
    build = _Builder(value)
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
    """Integer arithmetic on tensors of one type, with splat constants."""

    def __init__(self, like: ir.Value):
        self.type = ir.RankedTensorType(like.type)

    def const(self, number: int) -> ir.Value:
        element = self.type.element_type
        width = ir.IntegerType(element).width
        unsigned = ir.IntegerType(element).is_unsigned
        dtype = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}[width] if not unsigned else \
            {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[width]
        scalar = ir.RankedTensorType.get([], element)
        dense = ir.DenseElementsAttr.get(np.array(number, dtype=dtype), type=scalar)
        splat = stablehlo.constant(dense)
        if not self.type.shape:
            return splat
        return stablehlo.broadcast_in_dim(self.type, splat, [])

    def div(self, x, n: int):
        return x if n == 1 else stablehlo.divide(x, self.const(n))

    def rem(self, x, n: int):
        return self.const(0) if n == 1 else stablehlo.remainder(x, self.const(n))

    def mul(self, x, n: int):
        return x if n == 1 else stablehlo.multiply(x, self.const(n))

    def add(self, x, y):
        return stablehlo.add(x, y)

    def sub(self, x, n: int):
        return x if n == 0 else stablehlo.subtract(x, self.const(n))

    def sub_from(self, n: int, x):
        return stablehlo.subtract(self.const(n), x)

    def less(self, x, n: int):
        direction = stablehlo.ComparisonDirectionAttr.get("LT")
        return stablehlo.compare(x, self.const(n), direction)

    def select(self, pred, a, b):
        return stablehlo.select(pred, a, b)
