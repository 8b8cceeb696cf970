"""MLIR locations -> source positions (the bindings print locations but have no accessors for their parts)."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from jaxlib.mlir import ir

from ..locations import ParsedLocation, SourceLoc, location_name, parse_location, source_loc_of


def source_loc(location: ir.Location | ir.Attribute) -> SourceLoc:
    """The user's position in a location (the first frame outside JAX, libraries and shardfix), else its name."""
    attr = location.attr if isinstance(location, ir.Location) else location
    return _source_loc_of_attr(attr)


def op_loc(op: ir.Operation) -> SourceLoc:
    return _source_loc_of_attr(op.location.attr)


def innermost_loc(op: ir.Operation) -> SourceLoc:
    """The innermost frame of an op's location (where the op was made, in a library or not); empty if none."""
    parsed = _parsed(op.location.attr)
    if not parsed.frames:
        return SourceLoc()
    frame = parsed.frames[0]
    return SourceLoc(frame.file, frame.line, frame.col)


def frames(location: ir.Location) -> ParsedLocation:
    return _parsed(location.attr)


def this_programs(chain: Sequence[ir.Operation]) -> list[ir.Operation]:
    """Of a chain of ops, outermost first: a func.call in the ring region, the calls made inside each callee, and
    last the op inside the innermost callee, those whose locations are the program's being compiled.

    JAX caches the jaxprs of jitted functions (jax.random's, jnp's, a user's) and reuses them in every program that
    calls them with the same types. Where such a function was traced while another program was lowered (JAX's
    lowering traces jax.random's helpers under the traceback of the op being lowered), its ops carry that
    program's lines. A location inside a callee is taken only where the module shows it belongs here: its innermost
    frame is a frame of a location already taken (the traceback JAX gave the call it was lowered for, in this
    program), or it is the code of the function the call runs (its outermost frame is in a function of the
    callee's name, or the callee is a loop body or closed call, and the call was taken). A location with no frames
    says nothing either way. The first op of the chain sits in the ring region, traced for this program."""
    if not chain:
        return []
    chain, foreign = _structural(chain)
    taken, known, open_ = [chain[0]], set(_file_lines(chain[0])), True
    for i, (call, op) in enumerate(zip(chain, chain[1:])):
        lines = _file_lines(op)
        if not lines:
            continue
        own = not (foreign and i == len(chain) - 2) and open_ and _runs_callee_code(op, call)
        if lines[0] in known or own:
            taken.append(op)
            known.update(lines)
            open_ = True
        else:
            open_ = False
    return taken


def _structural(chain: Sequence[ir.Operation]) -> tuple[Sequence[ir.Operation], bool]:
    """The chain cut after the call of the function the last op sits in (an op refused where a callee reads its
    value may sit in a caller, or in the ring region itself), and whether that function is none of the chain's (a
    value another call made): such an op's location is taken only where it shares a frame with the calls'."""
    *calls, op = chain
    home = _function_of(op)
    for i in range(len(calls) - 1, -1, -1):
        if _callee(calls[i]) == home:
            return tuple(calls[:i + 1]) + (op,), False
    if not calls or _function_of(calls[0]) == home:
        return (op,), False
    return tuple(chain), True


def _function_of(op: ir.Operation) -> str:
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        parent = parent.parent
    return ir.StringAttr(parent.attributes["sym_name"]).value if parent is not None else ""


def _callee(call: ir.Operation) -> str:
    return str(call.attributes["callee"]).lstrip("@") if "callee" in call.attributes else ""


def _file_lines(op: ir.Operation) -> list[tuple[str, int]]:
    """The (file, line) of each frame of an op's location, innermost first."""
    return [(f.file, f.line) for f in _parsed(op.location.attr).frames if f.file]


def _runs_callee_code(op: ir.Operation, call: ir.Operation) -> bool:
    """Whether op's location is the code of the function `call` calls: its outermost frame is a function of the
    callee's name (a jitted function: JAX roots the traceback of each op of a traced function at that function),
    or the call runs a loop body or another closed call (the user's own function, whatever its name), or the
    location is a bare file position (JAX names the function of every frame of a traceback)."""
    if location_name(str(call.location.attr)).rsplit("/", 1)[-1] == "closed_call":
        return True
    outer = _parsed(op.location.attr).frames[-1].function
    if not outer:  # a position in the module's own text (read from a file), not a traceback: never another's
        return True
    return outer.rsplit(".", 1)[-1] == re.sub(r"_\d+$", "", _callee(call))


@functools.lru_cache(maxsize=65536)
def _source_loc_of_attr(attr: ir.Attribute) -> SourceLoc:
    # Location attributes are uniqued by MLIR: one parse per distinct location.
    return source_loc_of(str(attr))


@functools.lru_cache(maxsize=65536)
def _parsed(attr: ir.Attribute) -> ParsedLocation:
    return parse_location(str(attr))
