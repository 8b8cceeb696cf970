"""fix-shardings: every sharding valid for its tensor and mesh and evenly divisible (or, under the auto policy,
padded where that is cheaper), every change reported."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from jaxlib.mlir import ir

from shardfix.correct import KEPT_PADDING, CorrectionError, Reason, Site, correct_sharding, resolve_mesh
from shardfix.ir import module_meshes, source_loc
from shardfix.ir.edits import Edits
from shardfix.ir.retarget import RetargetError, retarget
from shardfix.ir.structure import manual_needs_repair, repair_edges, repair_manual, repair_problem
from shardfix.ir.walker import ShardingSite, enclosing_manual_axes, walk_module
from shardfix.locations import SourceLoc
from shardfix.report import Fix, Remark
from shardfix.sharding import Mesh, parse_mesh_spec, shard_count

from . import Pass, PassContext, PassError

# Reasons that only make an indivisible dim even (or keep it padded): a sharding read by a collective may keep
# them; any other reason means the verifier rejects the sharding as it is.
_DIVISIBILITY = frozenset({"indivisible", KEPT_PADDING})


@dataclass(frozen=True)
class FixShardings(Pass):
    name: ClassVar[str] = "fix-shardings"
    description: ClassVar[str] = ("repair invalid and indivisible sdy shardings, keeping as much parallelism as "
                                  "the policy allows (auto: padding where it costs a device less)")
    accepts_invalid_shardings: ClassVar[bool] = True

    policy: Literal["auto", "subaxis", "prefix", "drop"] = "auto"
    target_mesh: str = ""  # 'dp=4,tp=2': retarget the module's mesh first

    def apply(self, module: ir.Operation, ctx: PassContext) -> int:
        target = ctx.target_mesh
        if self.target_mesh:
            try:
                target = parse_mesh_spec(self.target_mesh)
            except ValueError as e:
                raise PassError(f"fix-shardings: bad target-mesh: {e}") from None
        inline: tuple[Mesh, Mesh] | None = None
        if target is not None:
            try:
                original, fixes = retarget(module, target)
            except RetargetError as e:
                raise PassError(f"fix-shardings: {e}", e.loc) from None
            ctx.report.fixes.extend(Fix(self.name, *fields) for fields in fixes)
            inline = (original, target)
        return _Run(self, module, ctx, inline).run() + (target is not None)


class _Run:
    """One application of the pass: one walk, the corrections (each distinct one computed once), one write."""

    def __init__(self, pass_: FixShardings, module: ir.Operation, ctx: PassContext,
                 inline: tuple[Mesh, Mesh] | None = None):
        self.pass_, self.module, self.ctx = pass_, module, ctx
        self.inline = inline  # (old, new): a retargeted mesh, for shardings holding a copy of it inline
        self.meshes = module_meshes(module)
        self.memo: dict = {}
        self.edits = Edits()
        self.flagged: list[ir.Operation] = []

    # -- recording ---------------------------------------------------------------------------------------------

    def fix(self, description: str, loc: SourceLoc, reasons, before: str, after: str, shards_before: int,
            shards_after: int) -> None:
        self.ctx.report.fixes.append(Fix(self.pass_.name, description, loc, tuple((r.code, r.detail) for r in reasons),
                                         before, after, shards_before, shards_after))

    def remark(self, message: str, loc: SourceLoc) -> None:
        self.ctx.report.remarks.append(Remark(self.pass_.name, message, loc))

    def refuse(self, what: str, error: CorrectionError, loc: SourceLoc):
        raise PassError(f"fix-shardings can't repair this: {what}: {error}", loc)

    # -- correcting --------------------------------------------------------------------------------------------

    def correct(self, sharding, site: Site) -> tuple:
        if self.inline is not None and sharding.mesh == self.inline[0]:
            old, new = self.inline
            fixed, reasons = correct_sharding(replace(sharding, mesh=new), site, self.meshes, self.pass_.policy)
            return fixed, [Reason("retarget", f"inline mesh {old} replaced by {new}")] + reasons
        return correct_sharding(sharding, site, self.meshes, self.pass_.policy)

    def site_outcome(self, site: ShardingSite):
        """(new sharding, reasons, whether it differs) or the CorrectionError, computed once per distinct
        (sharding, site) pair."""
        key = (site.attr, site.shape, site.bound_axes, site.manual_axes, site.is_entry_boundary)
        outcome = self.memo.get(key)
        if outcome is None:
            where = Site(site.shape, site.bound_axes, site.manual_axes, not site.is_entry_boundary)
            try:
                new, reasons = self.correct(site.sharding, where)
                outcome = (new, reasons, new != site.sharding)
            except CorrectionError as e:
                outcome = e
            self.memo[key] = outcome
        return outcome

    # -- the pass ----------------------------------------------------------------------------------------------

    def run(self) -> int:
        """How many changes were written."""
        found = walk_module(self.module)
        flagged = self._manual_to_repair(found)
        if found.problems or flagged:
            self._repair_structure(found)
            found = walk_module(self.module)
        for site in found.sites:
            self._fix_site(site)
        for op, name in found.edges:
            repair_edges(op, name, self.meshes, self.edits, self)
        self.edits.apply()
        return self.edits.changed

    def _manual_to_repair(self, found) -> list[ir.Operation]:
        """Manual computations the site-by-site corrections can't repair: wrong counts, invalid manual axes, or a
        sharding with more wrong than its divisibility."""
        flagged = {op: None for op in found.manual_ops
                   if manual_needs_repair(op, self.meshes, enclosing_manual_axes(op), found.terminators.get(op))}
        for site in found.sites:
            if site.kind in ("manual-in", "manual-out") and site.op not in flagged:
                outcome = self.site_outcome(site)
                if isinstance(outcome, CorrectionError) or any(r.code not in _DIVISIBILITY for r in outcome[1]):
                    flagged[site.op] = None
        self.flagged = list(flagged)
        return self.flagged

    def _repair_structure(self, found) -> None:
        for problem in found.problems:
            try:
                repair_problem(problem, self.meshes, self.correct, self.edits, self)
            except CorrectionError as e:
                self.refuse(problem.description, e, problem.locate())
        for op in self.flagged:
            try:
                repair_manual(op, enclosing_manual_axes(op), found.terminators.get(op), self.meshes, self.correct,
                              self.edits, self)
            except CorrectionError as e:
                self.refuse("'sdy.manual_computation'", e, source_loc(op.location))
        self.edits.apply()
        self.memo.clear()

    def _fix_site(self, site: ShardingSite) -> None:
        outcome = self.site_outcome(site)
        if isinstance(outcome, CorrectionError):
            self.refuse(site.description, outcome, site.loc)
        new, reasons, changed = outcome
        # A sharding an sdy collective checks keeps a mere indivisibility (changing it alone would break the
        # collective). One the verifier rejects is repaired like any other: the verifier after the pass says whether
        # the collective agrees with the repair (dropping an unknown axis often is what it expects).
        if site.frozen_by and all(r.code in _DIVISIBILITY for r in reasons):
            if changed or any(r.code == KEPT_PADDING for r in reasons):
                self.remark(f"{site.description} left as it is: the sdy collective {site.frozen_by} checks it, so "
                            f"changing it alone would break that ({'; '.join(r.detail for r in reasons)})", site.loc)
            return
        if not changed:
            for r in reasons:
                if r.code == KEPT_PADDING:
                    self.remark(f"{site.description}: {r.detail}", site.loc)
            return
        mesh = resolve_mesh(new, self.meshes)[1]
        self.edits.set_site(site, new)
        self.fix(site.description, site.loc, reasons, site.sharding.body(), new.body(),
                 shard_count(site.sharding, mesh), shard_count(new, mesh))


__all__ = ["FixShardings"]
