"""Counting the tiles a running ring-attention program computes: an instrumented copy of a (patched) module in
which every branch of the region's skip conditionals (stablehlo.case) appends 1 (computed) or 0 (skipped) to a
per-device log, in execution order. The log fills a placeholder result the measured program declares (a
per-device int32 vector over all manual axes), so the instrumented module compiles with the program's own
signature. The log split into ring steps gives the tiles each device computes at each step."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from shardfix.ir import make_context
from shardfix.jit import _jax


@dataclass
class _State:
    log: ir.Value
    index: ir.Value


def with_skip_log(body, mesh, in_specs, out_specs, entries: int):
    """jax.shard_map of `body` with one more result: the placeholder for the skip log (`entries` int32 a device;
    globally [devices, entries], devices in mesh order). The placeholder is the region's last result."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def logged(*args):
        return body(*args), jnp.zeros((1, entries), jnp.int32)

    return jax.shard_map(logged, mesh=mesh, in_specs=in_specs, out_specs=(out_specs, P(tuple(mesh.axis_names))),
                         check_vma=False)


def instrumented(lowered, placeholder: int = -1):
    """A copy of `lowered` whose ring region writes its skip log into result `placeholder` of the region."""
    import jax
    ctx = make_context()
    buffer = io.BytesIO()
    lowered.compiler_ir("stablehlo").operation.write_bytecode(buffer)
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(buffer.getvalue())
        funcs = {ir.StringAttr(op.attributes["sym_name"]).value: op.operation for op in module.body.operations
                 if op.operation.name == "func.func"}
        regions = [op for op in _walk(module.operation) if op.name == "sdy.manual_computation"
                   and "shardfix.sequence_permutation" not in op.attributes]
        (region,) = [r for r in regions if _has_permute(r, funcs)]
        body = region.regions[0].blocks[0]
        _inline_everything(body, funcs)
        terminator = list(body.operations)[-1].operation
        placeholder %= len(terminator.operands)
        target = terminator.operands[placeholder]
        size = ir.RankedTensorType(target.type).shape[-1]
        with ir.InsertionPoint.at_block_begin(body):
            state = _State(_zeros([size]), _scalar(0))
        state = _thread_block(body, state, stop=terminator)
        with ir.InsertionPoint(terminator):
            terminator.operands[placeholder] = stablehlo.reshape(target.type, state.log)
        module.operation.verify()
    return _jax.relowered(lowered, module, *_jax.compile_shardings(lowered), jax.stages.Lowered)


def tiles_per_step(log: np.ndarray, cp: int) -> np.ndarray:
    """[devices, steps]: tiles computed per device at each ring step (the log in execution order, cut into cp
    equal parts)."""
    per_device = log.reshape(log.shape[0], cp, -1)
    return per_device.sum(axis=-1)


def critical_path_over_ideal(tiles: np.ndarray) -> float:
    """Sum over steps of the busiest device's tiles, over the total spread evenly."""
    devices = tiles.shape[0]
    return float(tiles.max(axis=0).sum() / (tiles.sum() / devices))


# ---------------------------------------------------------------------------------------------------------------


def _walk(op):
    found = []

    def visit(o):
        found.append(o)
        return ir.WalkResult.ADVANCE

    op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def _has_permute(op, funcs) -> bool:
    for inner in _walk(op):
        if inner.name == "stablehlo.collective_permute":
            return True
        if inner.name == "func.call":
            callee = funcs[ir.FlatSymbolRefAttr(inner.attributes["callee"]).value]
            if _has_permute(callee, funcs):
                return True
    return False


def _inline_everything(block, funcs) -> None:
    while True:
        calls = [op for op in _walk(block.owner) if op.name == "func.call"]
        calls = [c for c in calls if _inside(c, block)]
        if not calls:
            return
        for call in calls:
            callee = funcs[ir.FlatSymbolRefAttr(call.attributes["callee"]).value]
            for old, new in zip(call.results, _jax.inline_call(call, callee)):
                old.replace_all_uses_with(new)
            call.erase()


def _inside(op, block) -> bool:
    parent = op.parent
    while parent is not None:
        if parent == block.owner:
            return True
        parent = parent.parent
    return False


def _zeros(shape):
    t = ir.RankedTensorType.get(shape, ir.IntegerType.get_signless(32))
    return stablehlo.constant(ir.DenseElementsAttr.get(np.zeros(shape, np.int32), type=t))


def _scalar(n: int):
    t = ir.RankedTensorType.get([], ir.IntegerType.get_signless(32))
    return stablehlo.constant(ir.DenseElementsAttr.get(np.array(n, np.int32), type=t))


def _contains_case(op) -> bool:
    return any(o.name == "stablehlo.case" for o in _walk(op))


def _thread_block(block, state: _State, stop=None) -> _State:
    """Pass the log through every op of the block that (transitively) holds a skip conditional."""
    for opview in list(block.operations):
        op = opview.operation
        if stop is not None and op == stop:
            break
        if op.name == "stablehlo.case":
            state = _thread_case(op, state)
        elif op.name == "stablehlo.while" and _contains_case(op):
            state = _thread_while(op, state)
    return state


def _thread_case(op, state: _State) -> _State:
    types = [r.type for r in op.results] + [state.log.type, state.index.type]
    with ir.InsertionPoint(op), op.location:
        new = stablehlo.CaseOp(types, op.operands[0], len(op.regions))
    for flag, (old_region, new_region) in enumerate(zip(op.regions, new.regions)):
        block = old_region.blocks[0]
        block.append_to(new_region)
        terminator = list(block.operations)[-1].operation
        with ir.InsertionPoint(terminator), op.location:
            inner = _thread_block(block, state, stop=terminator)
            # branch 0 of JAX's cond is the false branch: the skip
            mark = stablehlo.reshape(ir.RankedTensorType.get([1], ir.IntegerType.get_signless(32)),
                                     _scalar(1 if flag else 0))
            log = stablehlo.dynamic_update_slice(inner.log, mark, [inner.index])
            index = stablehlo.add(inner.index, _scalar(1))
            stablehlo.ReturnOp(list(terminator.operands) + [log, index])
        terminator.erase()
    for old, new_result in zip(op.results, new.results):
        old.replace_all_uses_with(new_result)
    results = list(new.results)
    op.erase()
    return _State(results[-2], results[-1])


def _thread_while(op, state: _State) -> _State:
    n = len(op.operands)
    types = [r.type for r in op.results] + [state.log.type, state.index.type]
    with ir.InsertionPoint(op), op.location:
        new = stablehlo.WhileOp(types, list(op.operands) + [state.log, state.index])
    for old_region, new_region in zip(op.regions, new.regions):
        block = old_region.blocks[0]
        block.append_to(new_region)
        log_arg = block.add_argument(state.log.type, op.location)
        index_arg = block.add_argument(state.index.type, op.location)
        if new_region == new.regions[1]:
            terminator = list(block.operations)[-1].operation
            inner = _thread_block(block, _State(log_arg, index_arg), stop=terminator)
            with ir.InsertionPoint(terminator), op.location:
                stablehlo.ReturnOp(list(terminator.operands) + [inner.log, inner.index])
            terminator.erase()
    for old, new_result in zip(op.results, list(new.results)[:n]):
        old.replace_all_uses_with(new_result)
    results = list(new.results)
    op.erase()
    return _State(results[-2], results[-1])


__all__ = ["critical_path_over_ideal", "instrumented", "tiles_per_step", "with_skip_log"]
