"""Refusals in the user's terms, where the analysis's own would speak of its internals.

The analysis follows integers (positions, chunk indices, loop counters) as exact numbers only where their type holds
every value they take; an op whose result type doesn't (`positions.astype(int8)` at 512 tokens, a counter in int8
past 127) is read as data on its operands instead. What is computed from that data is then refused as "a predicate
of token data", "a loop-carried integer changed other than by a constant step", ...: true of the analysis, useless
to the user. The refusal instead names the op whose type may wrap (its line), the type, the values it must hold, and
what to write. Likewise a loop whose counter is unsigned, or wraps before its bound, has no trip count the analysis
can read; the loop's refusal says so at the loop (`lax.fori_loop`'s line), whatever the body's first complaint was.

Only the text and place of a refusal change here, never whether a region is refused: a wrap is reported only where
the analysis refused anyway, and a loop's counter only where the loop can't be proved without one."""

from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir

from .dims import element_type
from .finite import made_of


@dataclass(frozen=True)
class Wrap:
    """An integer op whose result type doesn't hold every value its exact result takes ([lo, hi], both known)."""

    op: ir.Operation
    calls: tuple
    lo: int
    hi: int

    def reason(self) -> str:
        result = self.op.results[0]
        kind = type_name(element_type(result))
        low, high = type_range(element_type(result))
        what = f"converts integers in {_span(self.lo, self.hi)} to {kind}" if self.op.name == "stablehlo.convert" \
            else f"computes integers in {_span(self.lo, self.hi)} in {kind}"
        return (f"{what}, which holds only {low}..{high}: the result may wrap, and a wrapped number is no longer the "
                "position, chunk index or count it stands for; compute it in int32 (or a type that holds those "
                "values)")


def type_name(t: ir.Type) -> str:
    """JAX's name of an MLIR integer type (ui8 -> uint8, i16 -> int16, i1 -> bool); other types as MLIR prints."""
    if not isinstance(t, ir.IntegerType):
        return str(t)
    t = ir.IntegerType(t)
    return "bool" if t.width == 1 else f"{'u' if t.is_unsigned else ''}int{t.width}"


def type_range(t: ir.Type) -> tuple[int, int]:
    t = ir.IntegerType(t)
    if t.is_unsigned or t.width == 1:
        return 0, 2 ** t.width - 1
    return -2 ** (t.width - 1), 2 ** (t.width - 1) - 1


def _span(lo: int, hi: int) -> str:
    return f"{lo}" if lo == hi else f"{lo}..{hi}"


def note_wrap(fns, fn: int, op: ir.Operation, calls: tuple, lo: float, hi: float) -> None:
    """Function `fn` is `op`'s result read as data because its type doesn't hold [lo, hi] (the first such op, where
    a loop body is interpreted more than once)."""
    fns.wrapped.setdefault(fn, Wrap(op, calls, int(lo), int(hi)))


def wrap_behind(fns, values) -> Wrap | None:
    """The op whose wrapping type made data of what one of `values` is computed from, if any."""
    if not fns.wrapped:
        return None
    todo = []
    for v in values:
        todo.append(getattr(v, "fn", None))
        agg = getattr(v, "agg", None)
        if agg is not None:
            todo += [agg.term, agg.score]
    seen = set()
    while todo:
        fn = todo.pop()
        if type(fn) is not int or fn in seen or not 0 <= fn < len(fns.keys):
            continue
        seen.add(fn)
        found = fns.wrapped.get(fn)
        if found is not None:
            return found
        key = fns.keys[fn]
        if isinstance(key, tuple) and key:
            todo.extend(made_of(key))
    return None
