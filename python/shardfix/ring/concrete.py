"""Concrete integer and boolean ops for the tile count (cost.py): each StableHLO op a kernel computes its
coordinates, hops, chunk indices, positions and small masks with, as a step on numpy values, None standing for a
value not known at compile time (data). Division and remainder truncate toward zero, as StableHLO's do; `and` /
`or` on booleans are three-valued (a known false `and` anything is false). `needed_slice`: the values a block's
decisions read, so that nothing else is computed."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

LIMIT = 1 << 16  # elements of the largest integer or boolean value evaluated (bigger ones are treated as data)
_DTYPES = {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "ui8": np.uint8,
           "ui16": np.uint16, "ui32": np.uint32, "ui64": np.uint64, "index": np.int64}


def small_int(t: ir.Type) -> bool:
    try:
        shaped = ir.RankedTensorType(t)
    except ValueError:
        return False
    return str(shaped.element_type) in _DTYPES and shaped.has_static_shape and \
        int(np.prod(shaped.shape, dtype=np.int64)) <= LIMIT


def mapped(g: np.ndarray, unit: int, strategy: str, stripe: int, cp: int, block: int) -> np.ndarray:
    """positions.mapped_index on concrete values: a contiguous unit index to the index of the unit there now."""
    n = block // unit
    c, j = g // n, g % n
    if strategy == "zigzag":
        half = n // 2
        out = np.where(j < half, c * half + j, (2 * cp - 1) * half - c * half + (j - half))
    else:
        m = stripe // unit
        out = ((j // m) * cp + c) * m + j % m
    return np.asarray(out).astype(g.dtype)



def needed_slice(block: ir.Block, results: bool | frozenset[int], arguments, plans: dict | None = None) -> set[int]:
    """The values (by hash) that the skip decisions and loop conditions in `block` read, through loops,
    branches, nested manual computations and calls (`arguments(callee)`: which arguments a callee reads), and,
    with `results`, what the block's integer results read (all of them, or those of the indices given). A fixed
    point: a loop's condition may read what its body computed in the previous trip. `plans`: what was read of
    blocks before (`_plan`), kept by the caller for the blocks it asks about again."""
    plans = {} if plans is None else plans
    needed: set[int] = set()
    if results:
        terminator = list(block.operations)[-1].operation
        needed.update(hash(v) for j, v in enumerate(terminator.operands)
                      if (results is True or j in results) and small_int(v.type))
    plan = _plan(block, plans)
    size = -1
    while size != len(needed):
        size = len(needed)
        _needed_in(plan, needed, arguments)
    return needed


def _plan(block: ir.Block, plans: dict) -> list:
    """What `_needed_in` reads of a block's ops, last first, read from the IR once (the fixed point goes over a
    block several times, and a function's block is asked about for its callers and for its own count): (name,
    result hashes, operand hashes, what the op's kind needs besides)."""
    key = hash(block)
    found = plans.get(key)
    if found is not None:
        return found
    found = plans[key] = []
    for opview in reversed(list(block.operations)):
        op = opview.operation
        name = op.name
        extra = None
        if name == "stablehlo.while":
            cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
            extra = (hash(list(cond.operations)[-1].operation.operands[0]),
                     [(hash(c), hash(b)) for c, b in zip(cond.arguments, body.arguments)],
                     [hash(v) for v in list(body.operations)[-1].operation.operands],
                     _plan(cond, plans), _plan(body, plans))
        elif name in ("stablehlo.case", "stablehlo.if"):
            extra = [([hash(v) for v in list(region.blocks[0].operations)[-1].operation.operands],
                      _plan(region.blocks[0], plans)) for region in op.regions]
        elif name == "sdy.manual_computation":
            body = op.regions[0].blocks[0]
            extra = ([hash(v) for v in list(body.operations)[-1].operation.operands], _plan(body, plans),
                     [hash(a) for a in body.arguments])
        elif name == "func.call":
            extra = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        found.append((name, [hash(r) for r in op.results], [hash(v) for v in op.operands], extra))
    return found


def _needed_in(plan: list, needed: set[int], arguments) -> None:
    for name, outs, ins, extra in plan:
        if name == "stablehlo.while":
            condition, args, yields, cond, body = extra
            needed.add(condition)
            for i, (c, b) in enumerate(args):
                if outs[i] in needed or c in needed or b in needed:
                    needed.update((outs[i], c, b, ins[i], yields[i]))
            _needed_in(cond, needed, arguments)
            _needed_in(body, needed, arguments)
        elif name in ("stablehlo.case", "stablehlo.if"):
            needed.add(ins[0])
            for returned, branch in extra:
                needed.update(v for k, v in enumerate(returned) if outs[k] in needed)
                _needed_in(branch, needed, arguments)
        elif name == "sdy.manual_computation":
            returned, body, body_args = extra
            needed.update(v for k, v in enumerate(returned) if outs[k] in needed)
            _needed_in(body, needed, arguments)
            needed.update(i for i, a in zip(ins, body_args) if a in needed)
        elif name == "func.call":
            reads = arguments(extra)
            needed.update(i for i, read in zip(ins, reads) if read)
        elif any(o in needed for o in outs):
            needed.update(ins)


# -- integer ops ----------------------------------------------------------------------------------------------


def _dtype(t: ir.Type):
    return _DTYPES[str(ir.RankedTensorType(t).element_type)]


def _ints(attr) -> list[int]:
    return list(ir.DenseI64ArrayAttr(attr)) if isinstance(attr, ir.Attribute) else []


def _trunc_div(a, b):
    if (b == 0).any():  # (the method, not np.any's wrapper: the count runs this at every division)
        return None
    return (a - np.fmod(a, b)) // b


def _and3(a, b):
    if a is None or b is None:
        known = a if a is not None else b
        if known is not None and known.dtype == np.bool_ and not known.any():
            return known  # false and anything
        return None
    return np.logical_and(a, b) if a.dtype == np.bool_ else np.bitwise_and(a, b)


def _or3(a, b):
    if a is None or b is None:
        known = a if a is not None else b
        if known is not None and known.dtype == np.bool_ and known.all():
            return known  # true or anything
        return None
    return np.logical_or(a, b) if a.dtype == np.bool_ else np.bitwise_or(a, b)


_BINARY = {
    "stablehlo.add": np.add, "stablehlo.subtract": np.subtract, "stablehlo.multiply": np.multiply,
    "stablehlo.maximum": np.maximum, "stablehlo.minimum": np.minimum, "stablehlo.divide": _trunc_div,
    "stablehlo.remainder": lambda a, b: None if (b == 0).any() else np.fmod(a, b),
    "stablehlo.xor": lambda a, b: np.logical_xor(a, b) if a.dtype == np.bool_ else np.bitwise_xor(a, b),
    "stablehlo.shift_left": np.left_shift, "stablehlo.shift_right_arithmetic": np.right_shift,
}
_UNARY = {
    "stablehlo.negate": np.negative, "stablehlo.abs": np.abs, "stablehlo.sign": np.sign,
    "stablehlo.not": lambda a: np.logical_not(a) if a.dtype == np.bool_ else np.invert(a),
}
_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
            "GE": np.greater_equal}
_REDUCERS = {"stablehlo.add": np.sum, "stablehlo.maximum": np.max, "stablehlo.minimum": np.min,
             "stablehlo.and": np.all, "stablehlo.or": np.any, "stablehlo.multiply": np.prod}


def evaluator(op: ir.Operation, name: str, ins: list[int], outs: list[int]):
    """A step computing an integer op from known operands (None when any operand it needs is unknown)."""
    out = outs[0]
    rtype = op.results[0].type
    dtype = _dtype(rtype)
    shape = tuple(ir.RankedTensorType(rtype).shape)
    attrs = op.attributes
    fn = None
    if name == "stablehlo.constant":
        value = np.array(ir.DenseIntElementsAttr(attrs["value"])).astype(dtype).reshape(shape)

        def fn(env):
            return value
    elif name == "stablehlo.iota":
        dim = ir.IntegerAttr(attrs["iota_dimension"]).value
        view = [1] * len(shape)
        view[dim] = shape[dim]
        value = np.broadcast_to(np.arange(shape[dim], dtype=dtype).reshape(view), shape)

        def fn(env):
            return value
    elif name in _BINARY:
        f = _BINARY[name]

        def fn(env):
            a, b = env[ins[0]], env[ins[1]]
            return None if a is None or b is None else f(a, b)
    elif name == "stablehlo.and":
        def fn(env):
            return _and3(env[ins[0]], env[ins[1]])
    elif name == "stablehlo.or":
        def fn(env):
            return _or3(env[ins[0]], env[ins[1]])
    elif name in _UNARY:
        f = _UNARY[name]

        def fn(env):
            a = env[ins[0]]
            return None if a is None else f(a)
    elif name == "stablehlo.compare":
        f = _COMPARE[str(stablehlo.ComparisonDirectionAttr(attrs["comparison_direction"]).value)]

        def fn(env):
            a, b = env[ins[0]], env[ins[1]]
            return None if a is None or b is None else f(a, b)
    elif name == "stablehlo.convert":
        def fn(env):
            a = env[ins[0]]
            return None if a is None else a.astype(dtype)
    elif name == "stablehlo.select":
        def fn(env):
            p, a, b = env[ins[0]], env[ins[1]], env[ins[2]]
            if p is None:
                return a if a is not None and b is not None and np.array_equal(a, b) else None
            return None if a is None or b is None else np.where(p, a, b)
    elif name == "stablehlo.clamp":
        def fn(env):
            lo, x, hi = env[ins[0]], env[ins[1]], env[ins[2]]
            return None if lo is None or x is None or hi is None else np.minimum(np.maximum(x, lo), hi)
    elif name == "stablehlo.broadcast_in_dim":
        dims = _ints(attrs["broadcast_dimensions"])

        def fn(env):
            a = env[ins[0]]
            if a is None:
                return None
            view = [1] * len(shape)
            for k, d in enumerate(dims):
                view[d] = a.shape[k]
            return np.broadcast_to(a.reshape(view), shape)
    elif name == "stablehlo.reshape":
        def fn(env):
            a = env[ins[0]]
            return None if a is None else a.reshape(shape)
    elif name == "stablehlo.transpose":
        perm = _ints(attrs["permutation"])

        def fn(env):
            a = env[ins[0]]
            return None if a is None else np.transpose(a, perm)
    elif name == "stablehlo.slice":
        starts, limits, strides = (_ints(attrs[k]) for k in ("start_indices", "limit_indices", "strides"))
        index = tuple(slice(s, e, t) for s, e, t in zip(starts, limits, strides))

        def fn(env):
            a = env[ins[0]]
            return None if a is None else a[index]
    elif name == "stablehlo.dynamic_slice":
        sizes = _ints(attrs["slice_sizes"])

        def fn(env):
            a, starts = env[ins[0]], [env[i] for i in ins[1:]]
            if a is None or any(s is None for s in starts):
                return None
            at = [min(max(int(s), 0), n - k) for s, n, k in zip(starts, a.shape, sizes)]
            return a[tuple(slice(s, s + k) for s, k in zip(at, sizes))]
    elif name == "stablehlo.dynamic_update_slice":
        def fn(env):
            a, u, starts = env[ins[0]], env[ins[1]], [env[i] for i in ins[2:]]
            if a is None or u is None or any(s is None for s in starts):
                return None
            at = [min(max(int(s), 0), n - k) for s, n, k in zip(starts, a.shape, u.shape)]
            b = np.array(a)
            b[tuple(slice(s, s + k) for s, k in zip(at, u.shape))] = u
            return b
    elif name == "stablehlo.concatenate":
        dim = ir.IntegerAttr(attrs["dimension"]).value

        def fn(env):
            parts = [env[i] for i in ins]
            return None if any(p is None for p in parts) else np.concatenate(parts, axis=dim)
    elif name == "stablehlo.reduce" and len(ins) == 2:
        body = [o.operation.name for o in op.regions[0].blocks[0].operations]
        reducer = _REDUCERS.get(body[0]) if len(body) == 2 else None
        dims = tuple(_ints(attrs["dimensions"]))
        if reducer is not None:
            combine = _BINARY.get(body[0]) or {"stablehlo.and": np.logical_and, "stablehlo.or": np.logical_or}[body[0]]

            def fn(env):
                a, init = env[ins[0]], env[ins[1]]
                return None if a is None or init is None else combine(reducer(a, axis=dims), init)
    if name in ("stablehlo.constant", "stablehlo.iota"):
        constant = fn(None)  # already of the result's dtype and shape: nothing to convert at each run

        def step(env, run):
            env[out] = constant
        return step
    if name == "stablehlo.partition_id":
        def step(env, run):
            env[out] = np.array(run.pid, dtype)
        return step
    if name == "stablehlo.replica_id":
        def step(env, run):
            env[out] = np.array(0, dtype)
        return step
    if fn is None:
        def step(env, run):
            for o in outs:
                env[o] = None
        return step

    ndarray = np.ndarray

    def step(env, run):
        try:
            value = fn(env)
        except (ValueError, TypeError, IndexError, OverflowError, FloatingPointError):
            value = None
        if value is not None:
            if type(value) is not ndarray or value.dtype != dtype:  # numpy scalars from 0-d ops, promotions
                value = np.asarray(value, dtype)
            if value.shape != shape:
                value = value.reshape(shape)
        env[out] = value
    return step


__all__ = ["LIMIT", "evaluator", "mapped", "needed_slice", "small_int"]
