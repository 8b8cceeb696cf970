"""Backward rings that JAX's autodiff made from a forward ring (no custom_vjp), and why they are left alone.

Under `jax.grad`, JAX splits a ring region F into a forward region (F's results, plus per-device residuals: the
running maxima, masks and blocks each ring step saw) and a backward region B, the transpose of F's linearisation,
which reads those residuals and the cotangents of F's results and returns the cotangents of F's operands.

Where F is proved equivariant (F'(P x) = P F(x) once its position reads are rewritten), so is its derivative; but
that makes B safe to rewrite only if B is the transpose of the *proved* results' linearisation, and nothing in the
module says which result a cotangent differentiates: a second result of F read only through its derivative (a loss
linear in it, the proved one read as aux or through stop_gradient) leaves its linear part in B alone, and the same
source expression can build both (a comprehension, a loop), so neither types nor tracebacks tell them apart. And B's
own ops are JAX's transposes (an online softmax's backward recomputes and compares the running maximum), which the
analysis does not prove. Nor would proving F's every result be enough: autodiff differentiates `max(a, b)` at a tie
by halving the cotangent, so a running maximum folded block by block splits ties by the order the blocks arrive in,
which is what the reorder changes (tests/test_ring_autodiff_ties.py: a proved ring max, reordered by hand before
jax.grad, keeps its forward and changes its gradient by 3.0 where keys repeat). Only where every maximum's cotangent
provably cancels (an online softmax's output o / l is the same for any running shift), or the results are a
log-sum-exp merge's lse(C) and out(C) differentiated as the smooth function each merge step is (no abs at a tie, each
maximum that cancels one computation, jnp.logaddexp's own rule: stabiliser._lse_invariant), is the order
immaterial: `stabiliser_invariant` checks that of the forward's proof (stabiliser.py); and B may recompute positions from the
forward's residuals (under jax.checkpoint it does), which nothing rewrites: recompute.py says which of B's ops do.
Where JAX's record ties each cotangent of B to a proved result of its forward (ring/ties.py, `tied_pairs`), the
stabiliser check passes, B computes no position and the forward none for B alone, prove._accept_autodiff rewrites
B with its forward; otherwise such a B is refused, saying which of these fails: a custom_vjp whose backward is a
ring of its own is proved like any ring. This module recognises B (`is_transpose`, `made_by_autodiff`), finds a
forward whose results the program dropped (`dropped_forward`), and gives the liveness that proves the forward
alone with B's residuals set aside (`Liveness`).
"""

from __future__ import annotations

import re

from jaxlib.mlir import ir

from .detect import RingRegion
from .dims import readers_across
from .recompute import SOURCES as _SOURCES
from .stabiliser import invariant, merges_lse, splits_lse
from .ties import Role, Tie, of_location

_NAME = re.compile(r'loc\("([^"]*)"')


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


def made_by_autodiff(backward: RingRegion, forwards: list[RingRegion]) -> bool:
    """A transpose region (is_transpose) whose ops JAX's autodiff made from the forward's: most of them carry the
    traceback of an op of the forward regions (a transpose keeps its primal op's). A custom_vjp backward called in
    a shard_map body is named `transpose(...)` too, but its ops are the user's backward function's (made at other
    lines, or, as JAX lowers them, with no traceback at all)."""
    keys = _tracebacks(backward.region)
    if 2 * sum(1 for key in keys if key) < len(keys) or not keys:
        return False  # most ops say nowhere where they were made
    made = {key for r in forwards for key in _tracebacks(r.region)}
    return 2 * sum(1 for key in keys if key and key in made) >= len(keys)


_FRAME = re.compile(r'callsite\(|"[^"]*":\d+')


def _tracebacks(op: ir.Operation) -> list[str]:
    """The traceback of every op nested in `op`, as its location prints it less the names that lead it (a
    transpose's name stack differs from its primal op's, its frames don't); empty for an op with no frame."""
    out: list[str] = []
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                text = str(inner.location.attr)
                found = _FRAME.search(text)
                out.append(text[found.start():].rstrip(")") if found else "")
                out += _tracebacks(inner)
    return out


def tie(r: RingRegion) -> Tie | None:
    """What JAX recorded, while it differentiated the program, about the region (ring/ties.py): None where it
    recorded nothing, or something the region does not match (as many slots as the region has operands, for a
    backward region, or results, for a forward one)."""
    found = of_location(_name(r.region))
    if found is None or found.role is Role.TANGENT:
        return None
    count = len(r.region.operands) if found.role is Role.BACKWARD else len(r.region.results)
    return found if count == len(found.slots) else None


def unproved_cotangent(group: list[RingRegion], rings: frozenset) -> tuple[RingRegion, str] | None:
    """A backward region of the group that differentiates a result of its ring which no forward region of the
    group proves, with the sentence that says so: a result JAX dropped from the forward region (the program reads
    it only through its derivative), or one the forward region hands only to backward regions (as a residual, so
    the forward's proof leaves it out). None where every tied backward region differentiates only proved results,
    or no region is tied (ring/ties.py)."""
    forwards = [r for r in group if not is_transpose(r)]
    transposes = [r for r in group if is_transpose(r)]
    live = {r.region: results for r, results in _proved_results(forwards, transposes, rings)}
    computed: dict[int, tuple[RingRegion, dict]] = {}  # ring -> (forward region, original result -> proved?)
    for r in forwards:
        t = tie(r)
        if t is not None and t.role is Role.FORWARD:
            proved = computed.setdefault(t.ring, (r, {}))[1]
            for i, j in enumerate(t.slots):
                if j is not None:
                    proved[j] = proved.get(j, False) or i in live[r.region]
    for r in transposes:
        t = tie(r)
        if t is None or t.role is not Role.BACKWARD:
            continue
        forward, proved = computed.get(t.ring, (None, {}))
        for operand, j in sorted(t.cotangents().items()):
            if proved.get(j):
                continue
            where = f"the ring region at {forward.loc}" if forward is not None and forward.loc else "its ring region"
            if j in proved:
                return r, (f"differentiates result {j} of {where} (operand {operand} is its cotangent), which the "
                           f"forward region hands only to the backward (as a residual), so its proof leaves it out: "
                           f"read that result in the program, or give the kernel a custom_vjp")
            return r, (f"differentiates result {j} of {where} (operand {operand} is its cotangent), which the forward "
                       f"region does not compute: the program reads that result only through its derivative, so "
                       f"nothing proves it unchanged by the reorder; use that result (return it, or let the loss "
                       f"read it), or give the kernel a custom_vjp")
    return None


def differentiated(group: list[RingRegion]) -> tuple[list[int], RingRegion | None] | None:
    """The results of its ring the group's backward regions differentiate (JAX's record, ring/ties.py), and a
    forward region of that ring; None unless every backward region of the group is tied."""
    transposes = [r for r in group if is_transpose(r)]
    found = [tie(r) for r in transposes]
    if not transposes or any(t is None or t.role is not Role.BACKWARD for t in found):
        return None
    rings = {t.ring for t in found}
    forward = next((r for r in group if not is_transpose(r) and (t := tie(r)) is not None and t.ring in rings), None)
    return sorted({j for t in found for j in t.cotangents().values()}), forward


def position_source(op: ir.Operation, funcs: dict) -> ir.Operation | None:
    """An op computing positions or a device index (an iota of any dim, a partition or replica id) in `op`, its
    nested regions or the functions it calls, transitively; None if there is none."""
    pending, seen = [op], set()
    while pending:
        current = pending.pop()
        if current.name in _SOURCES:
            return current
        if current.name == "func.call":
            name = ir.FlatSymbolRefAttr(current.attributes["callee"]).value
            callee = funcs.get(name)
            if callee is None:
                return current  # a function the module does not define: anything
            if name not in seen:
                seen.add(name)
                pending.append(callee)
        for region in current.regions:
            for block in region.blocks:
                pending.extend(inner.operation for inner in block.operations)
    return None


def tied_pairs(forwards: list[RingRegion], transposes: list[RingRegion]) -> list | None:
    """(forward region, its backward regions) for each ring of a group whose every region is tied (ring/ties.py):
    each forward a FORWARD tie of a ring of its own, each transpose a BACKWARD tie of one of those rings; None
    otherwise (and where there is no transpose)."""
    if not transposes:
        return None
    by_ring: dict[int, RingRegion] = {}
    for r in forwards:
        t = tie(r)
        if t is None or t.role is not Role.FORWARD or t.ring in by_ring:
            return None
        by_ring[t.ring] = r
    backwards: dict[int, list] = {}
    for r in transposes:
        t = tie(r)
        if t is None or t.role is not Role.BACKWARD or t.ring not in by_ring:
            return None
        backwards.setdefault(t.ring, []).append(r)
    return [(by_ring[ring], found) for ring, found in backwards.items()]


def stabiliser_invariant(verdict, backwards: list[RingRegion]) -> str | None:
    """Obligation (c) of rewriting a plain-autodiff backward: every result of the forward region (`verdict`, its
    proof) that a backward region of `backwards` differentiates (their ties) is the same for any value of every
    running maximum it reads (stabiliser.py: o = acc / l, lse = m + log l, acc and l shifted by the same maximum),
    so the cotangent reaching each maximum is zero in exact arithmetic and JAX's split of it at ties, which follows
    the order the blocks arrive in, does not matter. It reads the forward's function, so it fails wherever JAX met a
    derivative rule in the ring's body that the module does not show (Tie.rules: the gradient of exp(s -
    stop_gradient(m)) follows each running maximum). None where it holds; else the sentence saying where it fails.
    Used for reasons only, like (d) (recompute.py: the positions the backward recomputes, which are not rewritten)."""
    forward = tie(verdict.ring) if verdict is not None else None
    if forward is None or forward.role is not Role.FORWARD:
        return "the forward region is not tied to the backward (JAX recorded nothing for it)"
    found = [tie(r) for r in backwards]
    if not found or any(t is None or t.role is not Role.BACKWARD or t.ring != forward.ring for t in found):
        return "a backward region is not tied to this forward region"
    rules = tuple(dict.fromkeys(forward.rules + tuple(r for t in found for r in t.rules)))
    if rules:
        shown = "; ".join(rules[:3]) + ("; ..." if len(rules) > 3 else "")
        return (f"its derivative follows a rule the forward does not show ({shown}), so what jax.grad differentiates "
                f"is not the function proved here (a stop_gradient lowers to nothing, a custom_jvp / custom_vjp to "
                f"its primal); this is conservative for now: jax.nn.softmax and other functions with such rules in a "
                f"ring fail it too (jnp.logaddexp and jax.nn.logsumexp do not)")
    kinks = tuple(dict.fromkeys(forward.kinks + tuple(k for t in found for k in t.kinks)))
    for j in sorted({j for t in found for j in t.cotangents().values()}):
        fn = next((verdict.result_fns[i] for i, slot in enumerate(forward.slots)
                   if slot == j and i in verdict.result_fns), None)
        if fn is None or verdict.fns is None:
            return f"result {j} is not a function of its tokens the proof knows whole"
        why = invariant(verdict.fns, fn, verdict.owner)
        if why is None and kinks and merges_lse(verdict.fns, fn) and splits_lse(verdict.fns, verdict.owner):
            named = "; ".join(kinks[:3])
            why = (f"merges log-sum-exps and JAX differentiates {named}: where a merge's operands tie, abs's "
                   "derivative takes one side (it is 1 at 0) and max's or min's splits the cotangent evenly, "
                   "splits that multiply where they nest (max(max(lse, lse_blk), lse_blk)), so the derivative "
                   "need not be the merged function's and depends on which is the running state and which the new "
                   "block, which changes with the layout; merge with jnp.logaddexp, whose own derivative rule is "
                   "exact")
        if why is not None:
            return f"result {j} {why}"
    return None


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
    forwards = [r for r in group if not is_transpose(r)]
    # a custom_vjp's backward (named a transpose too) is proved from its own ops: a dropped forward is no reason
    transposes = [r for r in group if is_transpose(r) and made_by_autodiff(r, forwards)]
    if transposes and forwards and not any(live for _, live in _proved_results(forwards, transposes, rings)):
        return transposes[0]
    return None


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


__all__ = ["OPAQUE", "Liveness", "dropped_forward", "is_transpose", "differentiated", "made_by_autodiff",
           "position_source", "stabiliser_invariant", "tie", "tied_pairs", "unproved_cotangent"]
