"""Infinities and float ranges, which the proof's exact arithmetic leaves out.

The proof treats floats as real numbers: rounding is exact, so a merge may be reassociated. Two things of floats
change results with the order of the blocks all the same, and are judged here:
  - an infinity in a running max: where every score folded in so far is -inf (masked with -inf, no finite start),
    the max is -inf and exp(-inf - -inf) is nan, on rows that depend on what each block holds. `facts` says which
    functions may be infinite (or near enough to overflow), for algebra's rescale rule;
  - a narrower range: a running sum kept in float16 overflows or not by the order of its blocks.
Inputs may hold infinities (a -inf mask bias passed in); a contraction of them (q . k) is taken in range, as every
sum of finite numbers is; a constant is read.
"""

from __future__ import annotations

import math
import re

import numpy as np
from jaxlib.mlir import ir

# a number this large may overflow when doubled: finfo(float32).min added twice, or scaled by 2
HUGE = float(np.finfo(np.float32).max) / 2

_BOOLEAN = frozenset({"stablehlo.compare", "stablehlo.is_finite", "stablehlo.and", "stablehlo.or", "stablehlo.not",
                      "stablehlo.xor"})
# infinite on finite operands: log(0) (a mask written log(mask)), exp and power of large numbers
_OVERFLOWS = frozenset({"stablehlo.log", "stablehlo.log_plus_one", "stablehlo.exponential", "stablehlo.power"})
_PARTS = {"agg": slice(2, 4), "complete": slice(2, 4), "reduce": slice(2, 3), "weight": slice(1, 2),
          "permute": slice(1, 2), "allreduce": slice(2, 3), "stack": slice(1, 2), "dslice": slice(1, 2),
          "gather": slice(1, 3)}


def finfo(element: ir.Type):
    """ml_dtypes' finfo of an MLIR float type (None: not one it knows)."""
    import ml_dtypes  # jax's own dependency

    name = str(element)
    name = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}.get(name) or \
        re.sub(r"^f(\d+)(E\d+M\d+\w*)$", lambda m: f"float{m[1]}_{m[2].lower()}", name)
    try:
        return ml_dtypes.finfo(name)
    except (TypeError, ValueError, AttributeError):
        return None


def float_to_float(op) -> bool:
    """A convert between two floating-point types."""
    return isinstance(ir.ShapedType(op.operands[0].type).element_type, ir.FloatType) and \
        isinstance(ir.ShapedType(op.results[0].type).element_type, ir.FloatType)


def float_max(element: ir.Type) -> float | None:
    """The largest finite number of a float type (None: not a float type ml_dtypes knows)."""
    info = finfo(element)
    return None if info is None else float(info.max)


def narrow_range(element: ir.Type) -> bool:
    """A float type whose exponents stop short of float32's (float16, the float8s)."""
    info = finfo(element) if isinstance(element, ir.FloatType) else None
    return info is not None and int(info.maxexp) < 128


def narrowing(op) -> bool:
    """A float->float convert whose result type holds a smaller range of exponents than its operand's (f32 -> f16:
    numbers the operand holds become infinities); bf16 holds f32's."""
    source = finfo(ir.ShapedType(op.operands[0].type).element_type)
    target = finfo(ir.ShapedType(op.results[0].type).element_type)
    return source is None or target is None or int(target.maxexp) < int(source.maxexp)


def table_facts(op) -> tuple[bool, bool]:
    """(every number finite, none near overflow) of a dense constant; (False, False) where its elements can't be
    read (bfloat16, say)."""
    try:
        numbers = np.asarray(ir.DenseElementsAttr(op.attributes["value"]))
    except (TypeError, ValueError, RuntimeError):
        return False, False
    if numbers.dtype.kind not in "fc" or numbers.size == 0:
        return True, True
    finite = bool(np.isfinite(numbers).all())
    return finite, finite and float(np.abs(numbers).max()) <= HUGE


def finite_constant(value: ir.Value) -> bool:
    """`value` is a constant of finite numbers, none near overflow, through broadcasts, reshapes and same-range
    converts (a table a ring region closes over, such as T5's buckets, comes in as an operand)."""
    while not isinstance(value.owner, ir.Block):
        op = value.owner
        if op.name == "stablehlo.constant":
            return all(table_facts(op))
        if op.name == "stablehlo.convert" and float_to_float(op) and narrowing(op):
            return False
        if op.name not in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert",
                           "stablehlo.transpose", "sdy.sharding_constraint", "sdy.reshard"):
            return False
        value = op.operands[0]
    return False


def _number(key: tuple) -> float | None:
    return float(key[1]) if key[0] == "const" and key[1] not in ("True", "False") else None


def _within(key: tuple, bound: float, below: bool) -> bool:
    """A constant of magnitude at most (`below`) or at least `bound`."""
    number = _number(key)
    return number is not None and (abs(number) <= bound if below else abs(number) >= bound)


_TRUTH = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not", "xor"})


def _unit(key: tuple, keys: list) -> bool:
    """A value of magnitude at most 1: such a constant, or a truth value (converted to a number: a mask that
    scales finfo.min, `(q < k) * finfo.min`)."""
    while key[0] == "ew" and key[1] == "stablehlo.convert":
        key = keys[key[3][0]]
    if key[0] == "ew":
        return key[1] in _BOOLEAN
    if key[0] == "index":  # a comparison of integers: ((node, 1),), 0 with the node's name first
        terms, const = key[1]
        return const == 0 and len(terms) == 1 and terms[0][1] == 1 and isinstance(terms[0][0], tuple) and \
            terms[0][0][0] in _TRUTH
    return _within(key, 1.0, below=True)


def _describe(key: tuple, keys: list) -> tuple[bool, bool, tuple, str]:
    """(infinite by itself, near overflow by itself, the functions it is made of, how they combine: "add", "mul",
    "div" or "") for a function's interned key (analysis.FnTable)."""
    kind = key[0]
    if kind == "const":
        number = _number(key)
        return (number is not None and not math.isfinite(number), number is not None and abs(number) > HUGE,
                (), "")
    if kind in ("index", "dot", "dotterm"):  # integer arithmetic; a contraction of the data, taken in range
        return False, False, (), ""
    if kind == "operand":  # an input may hold infinities (a -inf mask bias); a finite constant doesn't
        return not key[3], not key[3], (), ""
    if kind == "table":
        return not key[2], not key[3], (), ""
    if kind == "ew":
        name, attrs, args = key[1:]
        if name in _BOOLEAN or (name == "stablehlo.convert" and re.fullmatch(r"u?i\d+", attrs)):
            return False, False, (), ""  # booleans; integers (a T5 bucket's int(log(n)) is finite whatever n is)
        divisor = _number(keys[args[1]]) if name == "stablehlo.divide" else 1.0
        overflows = name in _OVERFLOWS or not divisor or \
            (name == "stablehlo.convert" and (attrs.startswith("narrowing") or re.fullmatch(r"f(16|[4-8]E\w+)",
                                                                                           attrs) is not None))
        how = {"stablehlo.add": "add", "stablehlo.subtract": "add", "stablehlo.multiply": "mul",
               "stablehlo.divide": "div"}.get(name, "")
        return overflows, False, args[1:] if name == "stablehlo.select" else args, how
    if kind in _PARTS or kind in ("table-rows", "collective", "positional"):
        return False, False, made_of(key), ""
    return True, True, (), ""  # loop data, custom calls: anything


def made_of(key: tuple) -> tuple:
    """The functions an interned key (analysis.FnTable) is built from: its operands' for an elementwise op, a
    reduction, a contraction, a permutation, a gather, ...; none for a source (a constant, an operand, loop data)."""
    kind = key[0]
    if kind == "ew":
        return tuple(key[3])
    if kind in ("dot", "dotterm"):
        return key[1:3]
    if kind in _PARTS:
        return key[_PARTS[kind]]
    if kind == "table-rows":
        return (key[1],) + tuple(key[2])
    if kind in ("collective", "positional"):
        return tuple(key[2])
    return ()


def facts(engine, fn: int) -> tuple[bool, bool]:
    """(may be infinite, may be near overflow) for function `fn` on finite inputs of the contraction. Infinite: an
    infinite constant (a -inf mask) or input, a table with infinities, a log or exp, a quotient by anything but a
    nonzero constant, a convert into float16's range, or two numbers near overflow added (finfo.min twice), or one
    multiplied by anything but a constant of magnitude at most 1. A select is judged by its branches."""
    memo: dict = engine.fns.infinite
    keys = engine.fns.keys
    stack = [fn]
    while stack:
        top = stack[-1]
        if top in memo:
            stack.pop()
            continue
        infinite, huge, parts, how = _describe(keys[top], keys)
        pending = [p for p in parts if p not in memo]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        inner = [memo[p] for p in parts]
        large = [k for k, (_, h) in enumerate(inner) if h]
        if how == "add" and len(large) > 1:
            infinite = True  # finfo.min + finfo.min
        elif how == "mul" and large and not all(_unit(keys[parts[1 - k]], keys) for k in large):
            infinite = True  # finfo.min * 2, or times data
        elif how == "div" and 0 in large and not _within(keys[parts[1]], 1.0, below=False):
            infinite = True  # finfo.min / 0.5
        infinite = infinite or any(i for i, _ in inner)
        memo[top] = (infinite, huge or infinite or bool(large))
    return memo[fn]


def may_be_infinite(engine, fn: int) -> bool:
    return facts(engine, fn)[0]
