"""The tiles a ring kernel computes, counted from its own skip conditionals at compile time, under each layout.

A *tile* is one execution of a branch of a skip conditional that computes (a `stablehlo.case` or `stablehlo.if`
inside the ring region, one of whose branches holds a dot_general or convolution and one of which holds none: the
`lax.cond` that skips a (query chunk, key chunk) pair). The count is exact: for each device c of the ring the
region is run on its integers and booleans alone, with `partition_id` = c's id, every loop run for the trip count
its own counters give, each conditional's predicate evaluated concretely, and floating-point values (the data)
left unknown. Only integer and boolean values of at most `LIMIT` elements are computed: the predicate slices
(coordinates, hop counters, chunk indices, positions, small masks); an op on data is never evaluated. A layout's
position rewrite (prove.py's rewrites: the reads of a contiguous unit index `c*n + j`) is applied to the operand it
rewrites as the run reaches it, through the same calls, so the count is that of the rewritten kernel.

A predicate that depends on data (segment ids, positions passed as data, a mask reduced from data) can't be
evaluated: that tile is counted as computed, and the count says how many such decisions there were (three-valued
`and` / `or` keep a decision known where its known part settles it: a causal skip and-ed with a segment test).

Steps: the tiles between one round of collective_permutes and the next (a round ends at the first permute after a
skip conditional ran), so a step holds what a device computes on one visiting block.

*Critical path.* Every ring step ends in collective_permutes each device both sends and receives: device d can't
start step s+1 before its neighbour finished step s, and XLA runs the collectives of one step as one synchronising
exchange, so a step lasts as long as its busiest device. The critical path is the sum over steps of the per-step
maximum over devices (not the maximum over devices of their sums, which would assume devices run ahead freely).
The ideal is the total spread evenly: total / devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from jaxlib.mlir import ir

from .concrete import LIMIT, evaluator, mapped, needed_slice, small_int

BUDGET = 2_000_000  # ops run per count at most (beyond it the kernel is too big to count, and said so)
_WORK = frozenset({"stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution"})
_ACTING = frozenset({"stablehlo.case", "stablehlo.if", "stablehlo.while", "stablehlo.collective_permute"})


class Uncountable(Exception):
    """The kernel's tiles can't be counted at compile time (the message says why)."""


@dataclass(frozen=True)
class Tiles:
    """Tiles each device computes at each ring step under one layout."""

    layout: str
    counts: tuple[tuple[int, ...], ...]  # [device][step]
    data_dependent: int = 0  # skip decisions (per device, summed) that depend on data: counted as computed
    decisions: int = 0  # skip decisions in all
    sends: int = 0  # collective_permutes a device runs in all (the ring's own transfers)
    # [device] -> {result index: its value, or None where the count could not compute it}, for the results asked
    # to be kept (a forward's saved predicates, read by its backward's count)
    kept: tuple = field(default=(), compare=False, repr=False)

    @property
    def steps(self) -> int:
        return max((len(c) for c in self.counts), default=0)

    def _padded(self) -> np.ndarray:
        out = np.zeros((len(self.counts), self.steps), np.int64)
        for d, row in enumerate(self.counts):
            out[d, :len(row)] = row
        return out

    # cached: a model's layers share one count, which the layout choice and each layer's decision read again
    @cached_property
    def critical(self) -> int:
        """Sum over steps of the busiest device's tiles (ring steps synchronise at their collective_permutes)."""
        return int(self._padded().max(axis=0).sum()) if self.counts else 0

    @cached_property
    def total(self) -> int:
        return int(sum(map(sum, self.counts)))

    @property
    def ideal(self) -> float:
        return self.total / len(self.counts) if self.counts else 0.0


@dataclass
class _Run:
    pid: int
    rewrites: dict  # (calls, op) -> [(operand, unit)]
    layout: tuple | None  # (strategy, stripe, cp, block)
    stack: list = field(default_factory=list)
    steps: list = field(default_factory=lambda: [0])
    seen: bool = False  # a skip conditional ran since the last permute
    unknown: int = 0
    decisions: int = 0
    sends: int = 0
    ops: int = 0


@dataclass
class _Block:
    steps: list  # closures (env, run) -> None
    args: list[int]  # slots of the block's arguments
    results: list[int]  # slots of its terminator's operands


class Counter:
    """Counts the tiles of ring regions of one module. Functions are compiled once (slots for values, a closure an
    op) and shared by every count; `rewritten` is every op some layout's rewrite touches (each is checked against
    the call path it is reached through when it runs)."""

    def __init__(self, funcs: dict[str, ir.Operation], rewritten: set):
        self.funcs = funcs
        self.rewritten = rewritten
        self._compiled: dict = {}  # function name, or (region, results kept) -> (block, slots)
        self._reads: dict[ir.Operation, list[int]] = {}
        self._work: dict[str, bool] = {}
        self._arguments: dict[str, list[bool]] = {}
        self._acting: dict[str, bool] = {}
        self.needed: set[int] = set()  # values the unit being compiled needs (see concrete.needed_slice)
        self._plans: dict = {}  # what needed_slice read of each block

    def count(self, region: ir.Operation, pids: list[int], rewrites: list, layout: tuple | None,
              name: str, given: dict[int, list] | None = None, keep: frozenset[int] = frozenset()) -> Tiles:
        """The tiles of `region` run as each device of `pids` (in ring order), with `rewrites` (prove.py's) read
        through `layout` = (strategy, stripe, cp, block), or as written (layout None). `given`: operand index ->
        its value on each device of `pids` (None: unknown), for operands another region's count computed (a
        backward reading the predicates its forward saved); `keep`: the results whose values the count also
        computes, for such a region (Tiles.kept)."""
        table: dict = {}
        for r in rewrites if layout is not None else ():
            table.setdefault((tuple(r.calls), r.op), []).append((r.operand, r.unit))
        body, size = self._compile_region(region, keep)
        counts, unknown, decisions, sends, kept = [], 0, 0, 0, []
        for d, pid in enumerate(pids):
            run = _Run(pid, table, layout)
            env: list = [None] * size
            for i, values in (given or {}).items():
                env[body.args[i]] = values[d]
            _exec(body, env, run)
            if not run.seen and len(run.steps) > 1:
                run.steps.pop()  # the permutes after the last step
            counts.append(tuple(run.steps))
            kept.append({j: env[body.results[j]] for j in keep})
            unknown, decisions, sends = unknown + run.unknown, decisions + run.decisions, sends + run.sends
        if not decisions and not keep:
            raise Uncountable("no skip conditional")
        return Tiles(name, tuple(counts), unknown, decisions, sends, tuple(kept))

    def reads(self, region: ir.Operation) -> list[int]:
        """The operands of `region` whose values its skip decisions and loop conditions read (integer and boolean
        ones: the others are data to the count)."""
        self._compile_region(region, frozenset())
        return self._reads[region]

    # -- compiling ------------------------------------------------------------------------------------------------

    def _compile_region(self, region: ir.Operation, keep: frozenset[int]) -> tuple[_Block, int]:
        key = (region, keep)
        if key not in self._compiled:
            slots: dict[int, int] = {}
            block = region.regions[0].blocks[0]
            self.needed = needed_slice(block, keep, self._arguments_needed, self._plans)
            if not keep:
                self._reads[region] = [i for i, a in enumerate(block.arguments)
                                       if hash(a) in self.needed and small_int(a.type)]
            self._compiled[key] = (self._block(block, slots), len(slots))
        return self._compiled[key]

    def _function(self, name: str) -> tuple[_Block, int]:
        found = self._compiled.get(name)
        if found is None:
            slots: dict[int, int] = {}
            self._compiled[name] = None  # a recursive call is not followed
            block = self.funcs[name].regions[0].blocks[0]
            outer, self.needed = self.needed, needed_slice(block, True, self._arguments_needed, self._plans)
            found = self._compiled[name] = (self._block(block, slots), len(slots))
            self.needed = outer
        return found

    def _arguments_needed(self, callee: str) -> list[bool]:
        """Which arguments of `callee` its integer results and its skip decisions read."""
        found = self._arguments.get(callee)
        if found is None:
            if callee not in self.funcs:
                return []
            self._arguments[callee] = []  # recursion: nothing
            block = self.funcs[callee].regions[0].blocks[0]
            needed = needed_slice(block, True, self._arguments_needed, self._plans)
            found = self._arguments[callee] = [hash(a) in needed for a in block.arguments]
        return found

    def works(self, op: ir.Operation) -> bool:
        """Whether `op` holds (in its regions or callees) an op that computes on data in bulk."""
        found = False

        def visit(inner):
            nonlocal found
            if inner.name in _WORK:
                found = True
                return ir.WalkResult.INTERRUPT
            if inner.name == "func.call" and self._calls_work(ir.FlatSymbolRefAttr(inner.attributes["callee"]).value):
                found = True
                return ir.WalkResult.INTERRUPT
            return ir.WalkResult.ADVANCE

        op.walk(visit)
        return found

    def _acts(self, name: str) -> bool:
        """Whether running function `name` can count a tile or end a step (it holds a conditional, a loop or a
        collective_permute, itself or through its calls)."""
        found = self._acting.get(name)
        if found is None:
            self._acting[name] = True  # recursion: assume so
            found = False

            def visit(inner):
                nonlocal found
                if inner.name in _ACTING or inner.name == "func.call" and self._acts(
                        ir.FlatSymbolRefAttr(inner.attributes["callee"]).value):
                    found = True
                    return ir.WalkResult.INTERRUPT
                return ir.WalkResult.ADVANCE

            if name in self.funcs:
                self.funcs[name].walk(visit)
            self._acting[name] = found
        return found

    def _calls_work(self, name: str) -> bool:
        if name not in self._work:
            self._work[name] = False  # recursion
            self._work[name] = name in self.funcs and self.works(self.funcs[name])
        return self._work[name]

    def _block(self, block: ir.Block, slots: dict[int, int]) -> _Block:
        def slot(value) -> int:
            key = hash(value)
            found = slots.get(key)
            if found is None:
                found = slots[key] = len(slots)
            return found

        args = [slot(a) for a in block.arguments]
        steps, results = [], []
        for opview in block.operations:
            op = opview.operation
            name = op.name
            if name in ("stablehlo.return", "sdy.return", "func.return"):
                results = [slot(v) for v in op.operands]
                continue
            ins = [slot(v) for v in op.operands]
            outs = [slot(v) for v in op.results]
            step = self._step(op, name, ins, outs, slots, slot)
            if step is None:
                continue
            if op in self.rewritten:
                step = _rewriting(step, op, ins)
            steps.append(step)
        return _Block(steps, args, results)

    def _step(self, op, name, ins, outs, slots, slot):
        if name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            if callee not in self.funcs or not self._acts(callee) and not any(hash(r) in self.needed
                                                                                for r in op.results):
                return None  # a helper on data (nothing it gives is read, nothing in it decides a tile)
            return _call(self, op, callee, ins, outs)
        if name == "stablehlo.while":
            cond = self._block(op.regions[0].blocks[0], slots)
            body = self._block(op.regions[1].blocks[0], slots)
            return _while(cond, body, ins, outs)
        if name in ("stablehlo.case", "stablehlo.if"):
            branches = [self._block(r.blocks[0], slots) for r in op.regions]
            work = [self.works_region(r) for r in op.regions]
            skip = any(work) and not all(work)
            return _case(branches, work, skip, ins[0], outs)
        if name == "sdy.manual_computation":
            return _inline(self._block(op.regions[0].blocks[0], slots), ins, outs)
        if name == "stablehlo.collective_permute":
            return _permute(outs)
        if name in ("sdy.sharding_constraint", "sdy.reshard", "stablehlo.optimization_barrier"):
            return _identity(ins, outs)
        if not outs or not any(hash(v) in self.needed for v in op.results) or \
                not all(small_int(v.type) for v in op.results):
            return None  # data, nothing, or nothing a decision reads: left unknown
        return evaluator(op, name, ins, outs)

    def works_region(self, region: ir.Region) -> bool:
        return any(op.operation.name in _WORK or self.works(op.operation) for block in region.blocks
                   for op in block.operations)


# -- running --------------------------------------------------------------------------------------------------


def _exec(block: _Block, env: list, run: _Run) -> None:
    run.ops += len(block.steps)
    if run.ops > BUDGET:
        raise Uncountable(f"more than {BUDGET} ops to run")
    for step in block.steps:
        step(env, run)


def _call(counter: Counter, op, callee: str, ins, outs):
    resolved: list = []  # the callee's compiled body, looked up on the first call

    def step(env, run):
        if not resolved:
            compiled = counter._function(callee)
            if compiled is None:
                raise Uncountable(f"'{callee}' calls itself")
            resolved.append(compiled)
        body, size = resolved[0]
        frame: list = [None] * size
        for a, i in zip(body.args, ins):
            frame[a] = env[i]
        run.stack.append(op)
        _exec(body, frame, run)
        run.stack.pop()
        for o, r in zip(outs, body.results):
            env[o] = frame[r]
    return step


def _while(cond: _Block, body: _Block, ins, outs):
    def step(env, run):
        for a, i in zip(body.args, ins):
            env[a] = env[i]
        while True:
            for a, b in zip(cond.args, body.args):
                env[a] = env[b]
            _exec(cond, env, run)
            go = env[cond.results[0]]
            if go is None:
                raise Uncountable("a loop's trip count depends on data")
            if not bool(go):
                break
            _exec(body, env, run)
            values = [env[r] for r in body.results]
            for a, v in zip(body.args, values):
                env[a] = v
        for o, a in zip(outs, body.args):
            env[o] = env[a]
    return step


def _case(branches: list[_Block], work: list[bool], skip: bool, index: int, outs):
    first_work = work.index(True) if any(work) else 0

    def step(env, run):
        value = env[index]
        if value is None:
            chosen = first_work
            if skip:
                run.unknown += 1
        else:
            # stablehlo.if: region 0 when the predicate holds; stablehlo.case: the index's branch
            chosen = int(value) if value.dtype != np.bool_ else (0 if bool(value) else 1)
            if chosen < 0 or chosen >= len(branches):
                chosen = len(branches) - 1  # stablehlo.case: an index out of range runs the last branch
        if skip:
            run.decisions += 1
            run.seen = True
            if work[chosen]:
                run.steps[-1] += 1
        branch = branches[chosen]
        _exec(branch, env, run)
        for o, r in zip(outs, branch.results):
            env[o] = env[r]
    return step


def _inline(body: _Block, ins, outs):
    def step(env, run):
        for a, i in zip(body.args, ins):
            env[a] = env[i]
        _exec(body, env, run)
        for o, r in zip(outs, body.results):
            env[o] = env[r]
    return step


def _permute(outs):
    def step(env, run):
        run.sends += 1
        if run.seen:
            run.steps.append(0)
            run.seen = False
        for o in outs:
            env[o] = None
    return step


def _identity(ins, outs):
    def step(env, run):
        for o, i in zip(outs, ins):
            env[o] = env[i]
    return step


def _rewriting(step, op, ins):
    """The op's step, with the operands a layout's rewrite reads through the new order mapped first."""
    def rewritten(env, run):
        hits = run.rewrites.get((tuple(run.stack), op)) if run.layout is not None else None
        if not hits:
            return step(env, run)
        saved = [(ins[i], env[ins[i]]) for i, _ in hits]
        for i, unit in hits:
            if env[ins[i]] is not None:
                env[ins[i]] = mapped(env[ins[i]], unit, *run.layout)
        step(env, run)
        for s, v in saved:
            env[s] = v
    return rewritten


__all__ = ["Counter", "Tiles", "Uncountable", "LIMIT"]
