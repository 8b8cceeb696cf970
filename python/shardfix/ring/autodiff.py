"""Backward rings that JAX's autodiff made from a forward ring: proved from the forward, not from their own ops.

Under `jax.grad`, JAX splits a ring region F into a forward region (F's results, plus per-device residuals: the
running maxima, masks and blocks each ring step saw) and a backward region B, the transpose of F's linearisation,
which reads those residuals and the cotangents of F's results and returns the cotangents of F's operands.

The reorder keeps the ring schedule and permutes tokens: where the forward is proved, with its position reads
rewritten (F'), F'(P x) = P F(x) for every x. Differentiating, J_F'(P x) = P J_F(x) P^T, so the transpose at P x
applied to P ct is P J_F(x)^T ct (and, for replicated operands, J_w F^T ct unchanged). B computes that transpose from
the residuals F' hands it: positions are integers, which carry no tangent, so B with F''s residuals is the backward
of F' as JAX builds it for any value of them, provided B computes no position of its own (it reads no device
index). So B is rewritten by permuting its sequence operands (cotangents, and forward operands JAX forwards) and
restoring its sequence results, with the residuals passed in the layout the forward made them: the order-dependent
partial aggregates among them need no proof of their own; only the forward's results must be proved, over the ops
they depend on (`Liveness`).

The argument holds only for the part of F that is proved: B must be the transpose of the linearisation of the
forward's *proved* results, not of something else the program computed there (a result of F read only through
its derivative, a loss linear in it, is dropped from the forward by JAX, and its linear part lives in B alone; a
value that only feeds residuals is not proved either). So which region is such a transpose is read from JAX's
provenance, op by op: its location's name is a `transpose(...)` of the name stack, it reads residuals of a
forward region of its group, and every op of its own carries the traceback (every frame outside JAX, with the
columns of the expression) of an op that the forward's proved results depend on (a transposed op keeps its
primal op's traceback; a custom_vjp's backward, the user's or a library's, was made at its own lines and is
proved from its ops instead). This trusts JAX's provenance: a program that passes a forward's per-device values
to a region it names `transpose(...)` itself is taken at its word. Ties of a maximum are where JAX's derivative
is a convention rather than a derivative; as with reassociation, the analysis reasons about the exact function.
"""

from __future__ import annotations

import functools
import os
import re

import jax
import jaxlib
from jaxlib.mlir import ir

from ..ir.locations import frames
from .detect import RingRegion
from .dims import origin_across, readers_across

_NAME = re.compile(r'loc\("([^"]*)"')
DEVICE_INDEX_OPS = ("stablehlo.partition_id", "stablehlo.replica_id")


class Opaque:
    """A value the analysis did not interpret: a result only a transposed region reads (a residual)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "residual"


OPAQUE = Opaque()


def _name(op: ir.Operation) -> str:
    found = _NAME.search(str(op.location))
    return found.group(1) if found else ""


def is_transpose(r: RingRegion) -> bool:
    """The region, or a manual computation it is nested in (a ring inside a dp shard_map), is named as JAX names
    a transpose."""
    op = r.region
    while op is not None and op.name != "builtin.module":
        if op.name == "sdy.manual_computation" and "transpose(" in _name(op):
            return True
        parent = op.parent
        op = parent.operation if parent is not None and hasattr(parent, "operation") else parent
    return False


def _walk(op: ir.Operation, funcs: dict | None, seen: set, out: list) -> None:
    """Every op nested in `op`, and in the functions it calls (each once) unless `funcs` is None."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                out.append(inner)
                if inner.name == "func.call" and funcs is not None:
                    callee = ir.FlatSymbolRefAttr(inner.attributes["callee"]).value
                    if callee not in seen and callee in funcs:
                        seen.add(callee)
                        _walk(funcs[callee], funcs, seen, out)
                _walk(inner, funcs, seen, out)


def _provenance(op: ir.Operation) -> tuple | None:
    """Where an op was made, as precisely as its location says: the frames of its traceback outside JAX (file,
    line and the columns of the expression), innermost first, a frame repeated by nested loops once; empty for
    JAX's own machinery (the loop counters a transpose adds). A transposed op keeps its primal op's traceback.
    None where JAX cut the traceback at its limit (`jax_traceback_in_locations_limit`; all of it at 0): the calls
    beyond the cut are unknown, so two different places in the program can look alike."""
    parsed = frames(op.location).frames
    limit = jax.config.jax_traceback_in_locations_limit
    if len(parsed) >= (limit if limit >= 0 else 1000):  # JAX's own reading of a negative limit
        return None
    out: list = []
    for f in parsed:
        key = (f.file, f.line, f.col, f.end_line, f.end_col)
        if not _is_jax_file(f.file) and (not out or out[-1] != key):
            out.append(key)
    return tuple(out)


def _made_by(made: tuple, proved: set, prefixes: set) -> bool:
    """Whether an op made at `made` is the transpose of a proved op: the same expression reached by the same
    calls, one traceback a beginning of the other (JAX moves a loop's invariant primal computation out of the loop
    it differentiates inside, or the other way round, which adds or drops the loop's own frames)."""
    return made in prefixes or any(made[:n] in proved for n in range(1, len(made)))


# (without a file, nothing is JAX's: its frames then count as the user's, which pairs less, never more)
_JAX_DIRS = tuple(os.path.realpath(os.path.dirname(f)) + os.sep for f in (jax.__file__, jaxlib.__file__) if f)


@functools.lru_cache(maxsize=4096)
def _is_jax_file(path: str) -> bool:
    """A file of the installed JAX (not merely one in a folder named `jax`: a user's package can have one, and
    every frame of its code would then look like JAX's machinery, which any transpose may contain)."""
    return os.path.realpath(path).startswith(_JAX_DIRS)


def _live_provenance(forward: RingRegion, live: set[int], funcs: dict, out: set, seen: set) -> None:
    """The provenance of every op the forward region's results `live` depend on, in its body and, by the results
    read, in the functions it calls."""
    _live_block(forward.region.regions[0].blocks[0], frozenset(live), funcs, out, seen)


def _live_block(block: ir.Block, live: frozenset, funcs: dict, out: set, seen: set) -> None:
    liveness = Liveness(block, set(live))
    for op in liveness.ops:
        out.add(_provenance(op))
        if op.name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            wanted = liveness.live_results(op)
            if callee in funcs and (callee, wanted) not in seen:
                seen.add((callee, wanted))
                _live_block(funcs[callee].regions[0].blocks[0], wanted, funcs, out, seen)


def _proved_results(forwards: list, transposes: list, rings: frozenset) -> list:
    """(forward region, the results of it the proof covers): those read by anything but the transposes (the others
    are residuals)."""
    candidates = {r.region for r in transposes}
    return [(r, {j for j, result in enumerate(r.region.results)
                 if not all(reader in candidates for reader in readers_across(result, rings))}) for r in forwards]


def dropped_forward(group: list[RingRegion], rings: frozenset) -> RingRegion | None:
    """A transpose of the group whose forward regions hand it residuals only: the program reads the forward's
    results only through their derivative (a loss linear in them), so JAX dropped them and nothing is there to
    prove the transpose from."""
    transposes = [r for r in group if is_transpose(r)]
    forwards = [r for r in group if not is_transpose(r)]
    if transposes and forwards and not any(live for _, live in _proved_results(forwards, transposes, rings)):
        return transposes[0]
    return None


def paired_backwards(group: list[RingRegion], funcs: dict, rings: frozenset) -> set:
    """The regions of `group` that are JAX's transposes of its forward regions (see the module's docstring)."""
    transposes = [r for r in group if is_transpose(r)]
    forwards = [r for r in group if not is_transpose(r)]
    if not forwards or not transposes:
        return set()
    proved: set = set()
    seen: set = set()
    for r, live in _proved_results(forwards, transposes, rings):
        if live:
            _live_provenance(r, live, funcs, proved, seen)
    forward_ops_set = {r.region for r in forwards}
    out = set()
    for r in transposes:
        ops: list = []
        _walk(r.region, funcs, set(), ops)
        if any(op.name in DEVICE_INDEX_OPS for op in ops):
            continue  # computes positions of its own: not rewritten, so not the backward of the rewritten forward
        # every op, in the functions it calls too (a loop's body is one where JAX outlines it); a function JAX
        # traced once and cached (a jitted helper) keeps the traceback of the program that first traced it, so a
        # transpose through one is not paired (it is proved from its ops)
        proved.discard(None)  # a cut traceback vouches for nothing
        prefixes = {key[:n] for key in proved for n in range(1, len(key) + 1)}
        keys = {_provenance(op) for op in ops}
        made = {key for key in keys if key is not None and key}
        if not made or None in keys:
            continue  # no op says where it was made (tracebacks left out of the locations), or not all of it
        if not all(_made_by(key, proved, prefixes) for key in made):
            continue  # code of its own (a custom_vjp's backward), or the derivative of something not proved
        sources = [origin_across(v, rings) for v in r.region.operands]
        if not any(not isinstance(v.owner, ir.Block) and v.owner in forward_ops_set for v in sources):
            continue
        out.add(r.region)
    return out


class Liveness:
    """The ops of a block (nested regions included; a call is one op, its callee gets a Liveness of its own for
    the results read) that the terminator's operands at `live_results` depend on, and for each loop or branch the
    results nothing live reads (dead slots)."""

    def __init__(self, block: ir.Block, live_results: set[int]):
        self.values: set = set()
        self.ops: set = set()
        self.dead_slots: dict = {}
        terminator = list(block.operations)[-1].operation
        for i in live_results:
            self.values.add(terminator.operands[i])
        _mark_block(block, self.values, self.ops, self.dead_slots, skip_terminator=True)

    def live_results(self, op: ir.Operation) -> frozenset:
        return frozenset(j for j, v in enumerate(op.results) if v in self.values)


def _mark_block(block: ir.Block, live_values: set, live: set, dead_slots: dict, skip_terminator: bool) -> None:
    ops = [op.operation for op in block.operations]
    if skip_terminator:
        ops = ops[:-1]
    for op in reversed(ops):
        results = list(op.results)
        if results and not any(v in live_values for v in results):
            continue
        live.add(op)
        if op.name == "stablehlo.while":
            _mark_while(op, live_values, live, dead_slots)
            continue
        if op.name in ("stablehlo.case", "stablehlo.if"):
            _mark_branches(op, live_values, live, dead_slots)
            continue
        live_values.update(op.operands)
        for region in op.regions:
            for inner in region.blocks:
                _mark_all(inner, live_values, live)


def _mark_all(block: ir.Block, live_values: set, live: set) -> None:
    for op in block.operations:
        op = op.operation
        live.add(op)
        live_values.update(op.operands)
        for region in op.regions:
            for inner in region.blocks:
                _mark_all(inner, live_values, live)


def _mark_branches(op: ir.Operation, live_values: set, live: set, dead_slots: dict) -> None:
    """Each branch computes the case's live results; the selector is live."""
    slots = {j for j, v in enumerate(op.results) if v in live_values}
    live_values.update(op.operands)
    for region in op.regions:
        for block in region.blocks:
            terminator = list(block.operations)[-1].operation
            live.add(terminator)
            live_values.update(terminator.operands[j] for j in slots)
            _mark_block(block, live_values, live, dead_slots, skip_terminator=True)
    dead = set(range(len(op.results))) - slots
    if dead:
        dead_slots[op] = dead


def _mark_while(op: ir.Operation, live_values: set, live: set, dead_slots: dict) -> None:
    cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
    slots = {j for j, v in enumerate(op.results) if v in live_values}
    _mark_all(cond, live_values, live)  # loop control is always live
    slots |= {j for j, a in enumerate(cond.arguments) if a in live_values}
    terminator = list(body.operations)[-1].operation
    while True:
        inner_values = set(live_values)
        inner_values.update(terminator.operands[j] for j in slots)
        inner_live: set = set()
        _mark_block(body, inner_values, inner_live, dead_slots, skip_terminator=True)
        grown = slots | {j for j, a in enumerate(body.arguments) if a in inner_values}
        if grown == slots:
            break
        slots = grown
    live.add(terminator)
    live |= inner_live
    live_values |= inner_values
    live_values.update(op.operands[j] for j in slots)
    dead = set(range(len(op.results))) - slots
    if dead:
        dead_slots[op] = dead


__all__ = ["OPAQUE", "Liveness", "dropped_forward", "is_transpose", "paired_backwards"]
