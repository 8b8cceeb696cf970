"""MLIR locations -> source positions (the bindings print locations but have no accessors for their parts)."""

from __future__ import annotations

import functools

from jaxlib.mlir import ir

from ..locations import ParsedLocation, SourceLoc, parse_location, source_loc_of


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


@functools.lru_cache(maxsize=65536)
def _source_loc_of_attr(attr: ir.Attribute) -> SourceLoc:
    # Location attributes are uniqued by MLIR: one parse per distinct location.
    return source_loc_of(str(attr))


@functools.lru_cache(maxsize=65536)
def _parsed(attr: ir.Attribute) -> ParsedLocation:
    return parse_location(str(attr))
