"""Pure correction core: (sharding, shape, meshes, policy) -> (valid, evenly divisible sharding, reasons).

The rules follow what Shardy's verifier rejects (see the reason codes) and, for indivisible dims, one of three
policies:
  subaxis  major to minor, keep an axis while it divides what is left, then the largest dividing sub-axis (gcd);
  prefix   keep axes while the cumulative product divides;
  drop     drop the dim's (free) axes altogether.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from .sharding import AxisRef, DimSharding, Mesh, TensorSharding, describe_sub_axis

POLICIES = ("subaxis", "prefix", "drop")


class CorrectionError(ValueError):
    """A sharding no rule can repair without changing what the program computes."""


@dataclass(frozen=True)
class Reason:
    code: str
    detail: str

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


@dataclass(frozen=True)
class Site:
    """What the core needs to know about where a sharding sits."""

    shape: tuple[int | None, ...] | None  # None: not a shaped value (a token)
    bound_axes: frozenset[str] = frozenset()  # bound by an enclosing manual computation
    manual_axes: frozenset[str] = frozenset()  # made manual by this very site (manual_computation in/out)
    allow_subaxes: bool = True  # False at an entry function's boundary


def resolve_mesh(sharding: TensorSharding, meshes: Mapping[str, Mesh]) -> tuple[str | Mesh, Mesh, list[Reason]]:
    """The mesh a sharding refers to; an unknown name falls back to the module's only mesh."""
    if not isinstance(sharding.mesh, str):
        return sharding.mesh, sharding.mesh, []
    if sharding.mesh in meshes:
        return sharding.mesh, meshes[sharding.mesh], []
    if len(meshes) == 1:
        (name, mesh), = meshes.items()
        return name, mesh, [Reason("unknown-mesh", f"mesh @{sharding.mesh} does not exist; using @{name}")]
    known = ", ".join("@" + n for n in meshes) or "none"
    raise CorrectionError(f"unknown mesh: @{sharding.mesh} (meshes in the module: {known})")


def correct_sharding(sharding: TensorSharding, site: Site, meshes: Mapping[str, Mesh],
                     policy: str = "subaxis") -> tuple[TensorSharding, list[Reason]]:
    """Return a sharding the sdy verifier accepts for `site` whose every sharded dim divides evenly."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy '{policy}' (expected one of {', '.join(POLICIES)})")
    mesh_ref, mesh, reasons = resolve_mesh(sharding, meshes)
    dims = _fit_rank(sharding, site.shape, mesh, reasons)
    checker = _AxisChecker(mesh, site.bound_axes, reasons)
    dims = [replace(d, axes=tuple(checker.merge(checker.keep_valid(d.axes, f"dim {i}"), f"dim {i}")))
            for i, d in enumerate(dims)]
    extras = {}
    for keyword in ("replicated", "unreduced"):
        refs = getattr(sharding, keyword)
        if site.shape is None and refs:
            reasons.append(Reason("rank-mismatch", f"a non-shaped value can't have {keyword} axes; dropped"))
            refs = ()
        refs = checker.keep_valid(refs, keyword)
        ordered = sorted(refs, key=lambda a: (mesh.axis_index(a.name), a.pre_size or 1))
        if ordered != list(refs):
            reasons.append(Reason("unordered-axes", f"{keyword} axes sorted in mesh order"))
        extras[keyword] = tuple(checker.merge(ordered, keyword))
    if site.shape is not None:
        dims = [_divisible_dim(d, n, i, mesh, site, policy, reasons) for i, (d, n) in enumerate(zip(dims, site.shape))]
    for i, d in enumerate(dims):
        if d.is_closed and not d.axes and d.priority is not None:
            reasons.append(Reason("priority-on-empty", f"dim {i} is empty and closed; priority p{d.priority} dropped"))
            dims[i] = replace(d, priority=None)
    fixed = TensorSharding(mesh_ref, tuple(dims), extras["replicated"], extras["unreduced"])
    return fixed, reasons


def _fit_rank(sharding: TensorSharding, shape, mesh: Mesh, reasons: list[Reason]) -> list[DimSharding]:
    dims = list(sharding.dims)
    rank = 0 if shape is None else len(shape)
    if mesh.is_maximal and not dims:
        return dims  # a maximal sharding names one device and no dims, whatever the rank
    if shape is None and dims:
        reasons.append(Reason("rank-mismatch", f"a non-shaped value takes a rank-0 sharding; {len(dims)} dims dropped"))
        return []
    if len(dims) > rank:
        dropped = ", ".join(map(str, dims[rank:]))
        reasons.append(Reason("rank-mismatch", f"sharding has {len(dims)} dims for a rank-{rank} tensor; "
                                               f"dropped {dropped}"))
        return dims[:rank]
    if len(dims) < rank:
        reasons.append(Reason("rank-mismatch", f"sharding has {len(dims)} dims for a rank-{rank} tensor; "
                                               f"{rank - len(dims)} replicated dims added"))
        return dims + [DimSharding()] * (rank - len(dims))
    return dims


class _AxisChecker:
    """Validates axis refs one by one across a whole sharding; the first use of an axis wins."""

    def __init__(self, mesh: Mesh, bound_axes: frozenset[str], reasons: list[Reason]):
        self.mesh, self.bound, self.reasons = mesh, bound_axes, reasons
        self.used: list[AxisRef] = []

    def keep_valid(self, refs: Sequence[AxisRef], where: str) -> list[AxisRef]:
        kept = []
        for ref in refs:
            ref = self._check(ref, where)
            if ref is not None:
                self.used.append(ref)
                kept.append(ref)
        return kept

    def _check(self, ref: AxisRef, where: str) -> AxisRef | None:
        say = lambda code, text: self.reasons.append(Reason(code, f"{where}: {text}"))
        if not self.mesh.has_axis(ref.name):
            return say("unknown-axis", f"axis {ref} is not in the mesh {self.mesh}; dropped")
        if ref.name in self.bound:
            return say("bound-manual-axis", f"axis {ref} is already manual in an enclosing manual computation; "
                                            f"dropped")
        size = self.mesh.axis_size(ref.name)
        if ref.is_sub_axis:
            if ref.size <= 1 or ref.pre_size < 1 or size % (ref.pre_size * ref.size):
                return say("bad-sub-axis", f"sub-axis {ref} is not a valid part of axis \"{ref.name}\"={size}; "
                                           f"dropped")
            if ref.pre_size == 1 and ref.size == size:
                say("bad-sub-axis", f"sub-axis {ref} is the whole axis; written as \"{ref.name}\"")
                ref = AxisRef(ref.name)
        start, end = ref.span(self.mesh)
        for other in self.used:
            if other.name != ref.name:
                continue
            o_start, o_end = other.span(self.mesh)
            if (o_start, o_end) == (start, end):
                return say("duplicate-axis", f"axis {ref} is used already; dropped")
            if max(start, o_start) < min(end, o_end):
                return say("bad-sub-axis", f"axis {ref} overlaps {other}, used already; dropped")
        return ref

    def merge(self, refs: Sequence[AxisRef], where: str) -> list[AxisRef]:
        """Merge consecutive sub-axes that are adjacent parts of one axis (the verifier wants them merged)."""
        out: list[AxisRef] = []
        for ref in refs:
            prev = out[-1] if out else None
            if (prev is not None and prev.is_sub_axis and ref.is_sub_axis and prev.name == ref.name
                    and prev.pre_size * prev.size == ref.pre_size):
                merged = AxisRef(ref.name, prev.pre_size, prev.size * ref.size)
                if merged.pre_size == 1 and merged.size == self.mesh.axis_size(ref.name):
                    merged = AxisRef(ref.name)
                self.reasons.append(Reason("bad-sub-axis", f"{where}: sub-axes {prev} and {ref} merged into {merged}"))
                out[-1] = merged
            else:
                out.append(ref)
        return out


def _divisible_dim(dim: DimSharding, n: int | None, index: int, mesh: Mesh, site: Site, policy: str,
                   reasons: list[Reason]) -> DimSharding:
    if n is None or n < 0 or not dim.axes:
        return dim
    total = math.prod(a.size_in(mesh) for a in dim.axes)
    if n % total == 0:
        return dim
    manual = [a for a in dim.axes if a.name in site.manual_axes]
    free = [a for a in dim.axes if a.name not in site.manual_axes]
    manual_size = math.prod(a.size_in(mesh) for a in manual)
    if n % manual_size:
        names = ", ".join(map(str, manual))
        raise CorrectionError(f"dim {index} of size {n} is not divisible by its manual axes {names} (size "
                              f"{manual_size}); fixing it would change the local shapes inside the manual computation")
    kept = _keep_dividing(free, n // manual_size, mesh, policy, site.allow_subaxes)
    new = DimSharding(tuple(manual + kept), dim.is_closed, dim.priority)
    before = "{" + ", ".join(map(str, dim.axes)) + "}"
    after = "{" + ", ".join(map(str, new.axes)) + "}"
    words = "".join(f"; {a} is {describe_sub_axis(a, mesh)}" for a in new.axes if a.is_sub_axis)
    reasons.append(Reason("indivisible", f"dim {index} of size {n} is not divisible by {before} (size {total}); "
                                         f"now {after} (size {math.prod(a.size_in(mesh) for a in new.axes)}{words})"))
    return new


def _keep_dividing(axes: Sequence[AxisRef], n: int, mesh: Mesh, policy: str, allow_subaxes: bool) -> list[AxisRef]:
    if policy == "drop":
        return []
    kept, left = [], n
    for ref in axes:
        size = ref.size_in(mesh)
        if left % size == 0:
            kept.append(ref)
            left //= size
            continue
        g = math.gcd(size, left)
        if policy == "subaxis" and allow_subaxes and g > 1:
            kept.append(AxisRef(ref.name, ref.pre_size or 1, g))
        break
    return kept
