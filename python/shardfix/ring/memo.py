"""One proof per distinct group of ring regions: a model whose every layer is its own shard_map (no function shared
between layers) repeats the same regions, and a group of regions (a layer's forward and backward rings) that is
the same program as a group already proved, in the same surroundings, has the same verdict, with its ops in the
same places.

The key of a group (linear in its size): each region's structural key (structural.StructuralKeys: the program up to
the names of the functions it calls), which region of the group produces each operand and which of its results (for
an operand from outside the group, whether it is a finite constant: the proof reads that), whether each result
is read only by the group's regions, and what JAX recorded while differentiating each region (its tie and the
derivative rules met in its ring's body: a plain-autodiff backward is rewritten on them) — what prove.py's verdict
depends on besides the regions' own programs. A verdict is
carried over by position: every op a rewrite or a unit names is found at the same place (region, block and op
indices from the holder down) of the region's body, or of the function the same call reaches. Nothing here reads
the analysis: only the verdicts' fields.
"""

from __future__ import annotations

import dataclasses

from jaxlib.mlir import ir

from .analysis import Rewrite
from .autodiff import tie
from .detect import RingRegion
from .structural import StructuralKeys
from .dims import origin, readers
from .finite import finite_constant


class GroupMemo:
    """Verdicts of proved groups, by group key; `get` gives a group's verdicts carried over from an equal one."""

    def __init__(self, funcs: dict[str, ir.Operation]):
        self.funcs = funcs
        self.keys = StructuralKeys(funcs)
        self._found: dict[tuple, tuple[list[RingRegion], list]] = {}
        self._paths: dict = {}  # op of a proved group -> where it sits in its holder (`_path`)
        self._places: dict = {}  # block of a proved group -> its ops' places
        self._callees: dict = {}  # func.call op -> the function it calls
        self._resolved: dict = {}  # (holder, path) -> the op there (`_op_at`)

    def key(self, group: list[RingRegion]) -> tuple:
        members = {r.region: i for i, r in enumerate(group)}
        rings: dict[int, int] = {}  # a tie's ring number -> its number in this group (first seen first)
        parts = []
        for r in group:
            producers = []
            for operand in r.region.operands:
                source = origin(operand)
                owner = source.owner
                if isinstance(owner, ir.Block) or owner not in members:
                    # from outside the group: what the proof reads of it is whether it is a finite constant
                    producers.append(finite_constant(source))
                else:  # which region of the group, and which of its results
                    producers.append((members[owner], ir.OpResult(source).result_number))
            inside = tuple(all(reader in members for reader in readers(result)) for result in r.region.results)
            parts.append((self.keys.of_ring(r), tuple(producers), inside, _tie_key(r, rings)))
        return tuple(parts)

    def put(self, key: tuple, group: list[RingRegion], verdicts: list) -> None:
        self._found.setdefault(key, (group, verdicts))

    def get(self, key: tuple, group: list[RingRegion]) -> list | None:
        """The verdicts of `group` (in its order), carried over from the proved group of that key, or None."""
        found = self._found.get(key)
        if found is None:
            return None
        source, verdicts = found
        try:
            return [self._carry(v, old, new) for v, old, new in zip(verdicts, source, group)]
        except (KeyError, IndexError):  # an op outside the places compared: prove this group on its own
            return None

    def _carry(self, verdict, old: RingRegion, new: RingRegion):
        chains: dict = {}  # the chains of calls of this verdict's ops (they share a few), each moved once
        moved = self._moved
        # a Rewrite's fields are its read (op, operand), its unit and its calls: the read moved, the rest kept
        rewrites = [Rewrite(*moved(r.op, r.calls, old, new, chains, r.operand, r.unit)) for r in verdict.rewrites]
        units = {unit: moved(op, calls, old, new, chains) for unit, (op, calls) in verdict.units.items()}
        return dataclasses.replace(verdict, ring=new, rewrites=rewrites, units=units,
                                   sequence_operands=dict(verdict.sequence_operands),
                                   sequence_results=dict(verdict.sequence_results))

    def _moved(self, op: ir.Operation, calls: tuple, old: RingRegion, new: RingRegion, chains: dict,
               *kept) -> tuple:
        """(op, *kept, calls): the op at the same place in `new`, through the same chain of calls. `chains`: the
        chains already moved from `old` to `new` (calls -> (moved calls, the functions both chains reach))."""
        chain = chains.get(calls)
        if chain is None:
            old_holder, new_holder = old.region, new.region
            moved_calls = []
            for call in calls:
                # once both chains reach the same function (the layers share the kernel), ops stay where they are
                new_call = call if old_holder is new_holder else \
                    self._op_at(new_holder, self._path(old_holder, call))
                moved_calls.append(new_call)
                old_holder, new_holder = self._callee(call), self._callee(new_call)
            chain = chains[calls] = (tuple(moved_calls), old_holder, new_holder)
        moved_calls, old_holder, new_holder = chain
        moved = op if old_holder is new_holder else self._op_at(new_holder, self._path(old_holder, op))
        return (moved, *kept, moved_calls)

    def _callee(self, call: ir.Operation) -> ir.Operation:
        """The function a func.call calls (a group's rewrites mostly go through the same few calls)."""
        found = self._callees.get(call)
        if found is None:
            found = self._callees[call] = self.funcs[ir.FlatSymbolRefAttr(call.attributes["callee"]).value]
        return found

    def _op_at(self, holder: ir.Operation, path: tuple) -> ir.Operation:
        """The op at `path` in `holder` (IndexError where the holder has no such place), once per holder and path
        (the calls a group's rewrites go through are looked up once)."""
        found = self._resolved.get((holder, path))
        if found is None:
            if not path:
                return holder
            # the op holding the last step's block, resolved once for every op of that block asked for (a
            # region's rewrites sit in a few loop bodies)
            region, block, place = path[-1]
            above = self._op_at(holder, path[:-1])
            found = self._resolved[(holder, path)] = above.regions[region].blocks[block].operations[place].operation
        return found

    def _path(self, holder: ir.Operation, op: ir.Operation) -> tuple:
        """Where `op` sits in `holder`: (region, block, op) indices from the holder down (KeyError if it isn't in
        it). Read upwards from the op, each block's ops numbered once: the proved group's holders are asked for
        every group carried over, the others never walked."""
        found = self._paths.get((holder, op))
        if found is None:
            steps: list = []
            current = op
            while current != holder:
                try:
                    block = current.block
                except ValueError:  # the top reached: `op` is not in `holder`
                    raise KeyError(op) from None
                if block is None:
                    raise KeyError(op)
                region = block.region
                owner = region.owner.operation
                steps.append((_index(owner.regions, region), _index(region.blocks, block),
                              self._place(block, current)))
                current = owner
            found = self._paths[(holder, op)] = tuple(reversed(steps))
        return found

    def _place(self, block: ir.Block, op: ir.Operation) -> int:
        places = self._places.get(block)
        if places is None:
            places = self._places[block] = {o.operation: i for i, o in enumerate(block.operations)}
        return places[op]


def _tie_key(r: RingRegion, rings: dict[int, int]) -> tuple | None:
    """What JAX recorded while differentiating the region (ring/ties.py), which a plain-autodiff backward's verdict
    rests on: its role, which result each slot is, the zero cotangents, the derivative rules and kinked ops met in
    the ring's body, and which ring of the group it belongs to. None: nothing recorded."""
    found = tie(r)
    if found is None:
        return None
    return (found.role.value, rings.setdefault(found.ring, len(rings)), found.results, found.slots,
            tuple(sorted(found.zero)), found.rules, found.kinks)


def _index(items, item) -> int:
    for i, candidate in enumerate(items):
        if candidate == item:
            return i
    raise KeyError(item)


__all__ = ["GroupMemo"]
