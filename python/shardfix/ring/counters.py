"""Why a refused loop has no trip count, in the user's terms.

loops.py reads a while loop's trip count from its counter (`i = c0; while i < n: ...; i += s`, as fori_loop and
scan lower), compared as signed numbers and exact in its type over c0..n. A loop whose counter is unsigned, wraps
before its bound, or starts from a number whose type wraps has none, and a loop without one that changes anything
(the counter itself, at least) is always refused: its body's first complaint ("combines tokens with the token at one
fixed place of a block", where the counter became data) or "a trip count is unknown". Either way the counter is what
to change, so the loop's refusal names it, at the loop (the user's `lax.fori_loop` or `lax.while_loop` line)."""

from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from .analysis import Engine, Refusal
from .dims import element_type, holds
from .loops import const_of, constant_step, signed_compare, through_identity
from .reasons import type_name, type_range, wrap_behind
from .values import Index

_INT32 = "count with a signed int32 counter (int32 bounds for lax.fori_loop, an int32 carry for lax.while_loop)"


def explain(engine: Engine, op: ir.Operation, refusal: Refusal) -> Refusal:
    """The refusal of while loop `op` to report in place of `refusal` (raised while analysing it): the counter's
    type, where that is why the loop has no trip count; else `refusal` itself."""
    found = _counter_slot(op)
    if found is None:
        return refusal
    index, compare = found
    calls = tuple(engine.state.call_ops)
    counter = op.regions[0].blocks[0].arguments[index]
    kind = type_name(element_type(counter))
    if not signed_compare(compare):  # an unsigned type, or an integer compared as unsigned
        return Refusal(f"counts its iterations with a {kind} counter: `i < n` on unsigned integers (where 0 - 1 is "
                       "the largest) gives no trip count the analysis reads, only a signed counter's does; "
                       f"{_INT32}", op, calls)
    try:
        inits = [engine.get(v) for v in op.operands]
    except Refusal:
        return refusal
    start = inits[index]
    if not isinstance(start, Index):
        wrap = wrap_behind(engine.fns, (start,))
        return refusal if wrap is None else Refusal(wrap.reason(), wrap.op, wrap.calls)  # the counter's start
    body = op.regions[1].blocks[0]
    terminator = list(body.operations)[-1].operation
    passthrough = [terminator.operands[i] == body.arguments[i] for i in range(len(inits))]
    bound = const_of(engine, compare.operands[1], inits, op.regions[0].blocks[0], passthrough)
    step = constant_step(engine, op, inits, index, passthrough)
    if not start.expr.is_const or bound is None or not step or step < 1:
        return refusal
    first = start.expr.const
    last = first + max(0, -(-(bound - first) // step)) * step
    if holds(counter, first, last):
        return refusal
    high = type_range(element_type(counter))[1]
    return Refusal(f"counts its iterations with an {kind} counter from {first} by {step} while below {bound}: it "
                   f"passes {high}, the largest {kind}, and wraps before it reaches its bound, so the loop's trip "
                   f"count is not the one its bounds say; {_INT32}", op, calls)


def _counter_slot(op: ir.Operation) -> tuple[int, ir.Operation] | None:
    """(the carried slot, the compare) of a loop whose condition is `arg < n` on an integer argument the body
    changes: a counter, whether or not loops.py reads a trip count from it."""
    cond = op.regions[0].blocks[0]
    compare = through_identity(list(cond.operations)[-1].operation.operands[0]).owner
    if isinstance(compare, ir.Block) or compare.name != "stablehlo.compare" or \
            stablehlo.ComparisonDirectionAttr(compare.attributes["comparison_direction"]).value != "LT":
        return None
    lhs = through_identity(compare.operands[0])
    t = element_type(lhs)
    if not isinstance(lhs.owner, ir.Block) or lhs.owner != cond or not isinstance(t, ir.IntegerType) or \
            ir.IntegerType(t).width == 1:
        return None
    index = ir.BlockArgument(lhs).arg_number
    body = op.regions[1].blocks[0]
    if list(body.operations)[-1].operation.operands[index] == body.arguments[index]:
        return None  # passed through: not a counter
    return index, compare

