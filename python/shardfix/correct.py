"""Pure correction core: (sharding, shape, meshes, policy) -> (valid, evenly divisible sharding, reasons).

The rules follow what Shardy's verifier rejects (see the reason codes) and, for indivisible dims, one of four
policies:
  auto     (the default) weigh the work a device gets: inside a function, where the partitioner pads an
           indivisible dim, keep the padded split when it leaves each device fewer rows than any repair would
           (2050 rows over 8 devices: 257 padded rows against 1025 for {"dp"}), else repair as subaxis does; at an
           entry function's boundary, where JAX rejects indivisible shardings, always repair;
  subaxis  major to minor, keep an axis while it divides what is left, then the largest dividing sub-axis (gcd);
  prefix   keep axes while the cumulative product divides;
  drop     drop the dim's (free) axes altogether.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from .sharding import AxisRef, DimSharding, Mesh, TensorSharding, describe_sub_axis

POLICIES = ("auto", "subaxis", "prefix", "drop")
KEPT_PADDING = "kept-padding"  # a reason that is a decision to change nothing (auto policy)


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
    # False at an entry function's boundary: JAX can express neither sub-axes nor a padded split there (it rejects
    # indivisible shardings), so the auto policy always repairs. Likewise where JAX checks a PartitionSpec while
    # tracing; `no_padding` says which, in the report.
    allow_subaxes: bool = True
    no_padding: str = "padding is not an option at an entry function's boundary"
    # An entry argument or result (the auto policy): an axis an indivisible dim can't hold goes to another dim of
    # the array that holds it and is not sharded, so the array keeps its shard count (and each device its bytes).
    move_axes: bool = False


def resolve_mesh(sharding: TensorSharding, meshes: Mapping[str, Mesh]) -> tuple[str | Mesh, Mesh, list[Reason]]:
    """The mesh a sharding refers to; an unknown name falls back to the module's only mesh, or to an empty mesh
    when the module has none and the sharding names no axis."""
    if not isinstance(sharding.mesh, str):
        return sharding.mesh, sharding.mesh, []
    if sharding.mesh in meshes:
        return sharding.mesh, meshes[sharding.mesh], []
    if len(meshes) == 1:
        (name, mesh), = meshes.items()
        return name, mesh, [Reason("unknown-mesh", f"mesh @{sharding.mesh} does not exist; using @{name}")]
    names = {ref.name for ref in sharding.all_axis_refs()}
    holding = [name for name, mesh in meshes.items() if names and all(mesh.has_axis(n) for n in names)]
    if len(holding) == 1:
        name = holding[0]
        return name, meshes[name], [Reason("unknown-mesh", f"mesh @{sharding.mesh} does not exist; using @{name}, "
                                                           f"the only mesh with the axes it names")]
    if not meshes and not names:
        empty = Mesh(())
        return empty, empty, [Reason("unknown-mesh", f"mesh @{sharding.mesh} does not exist and the sharding uses "
                                                     f"no axis; an empty mesh says the same")]
    known = ", ".join("@" + n for n in meshes) or "none"
    need = "one mesh in the module, or one mesh with the axes the sharding names" if meshes else \
        "an `sdy.mesh` definition for it"
    raise CorrectionError(f"the sharding refers to @{sharding.mesh}, which the module doesn't define (its meshes: "
                          f"{known}); a repair would need {need}")


def correct_sharding(sharding: TensorSharding, site: Site, meshes: Mapping[str, Mesh],
                     policy: str = "auto") -> tuple[TensorSharding, list[Reason]]:
    """Return a sharding the sdy verifier accepts for `site` whose every sharded dim divides evenly, or (auto
    policy, inside a function) keeps an indivisible dim's padded split with a `kept-padding` reason."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy '{policy}' (expected one of {', '.join(POLICIES)})")
    mesh_ref, mesh, reasons = resolve_mesh(sharding, meshes)
    if mesh.is_maximal:
        return _single_device(sharding, mesh_ref, reasons)
    dims = _fit_rank(sharding, site.shape, mesh, reasons)
    if site.shape is not None:
        dims = _place_duplicates(dims, site.shape, mesh, frozenset(site.manual_axes), reasons)
    checker = _AxisChecker(mesh, site.bound_axes, reasons, site.allow_subaxes)
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
        asked = dims
        dims = [_divisible_dim(d, n, i, mesh, site, policy, reasons) for i, (d, n) in enumerate(zip(dims, site.shape))]
        if site.move_axes and policy == "auto":
            dims = _move_dropped_axes(asked, dims, site.shape, mesh, reasons)
    for i, d in enumerate(dims):
        if d.is_closed and not d.axes and d.priority is not None:
            reasons.append(Reason("priority-on-empty", f"dim {i} is empty and closed; priority p{d.priority} dropped"))
            dims[i] = replace(d, priority=None)
    fixed = TensorSharding(mesh_ref, tuple(dims), extras["replicated"], extras["unreduced"])
    return fixed, reasons


def _single_device(sharding: TensorSharding, mesh_ref, reasons: list[Reason]) -> tuple[TensorSharding, list[Reason]]:
    """A maximal (single-device) sharding names one device and nothing else, whatever the value's rank."""
    if sharding.dims or sharding.replicated or sharding.unreduced:
        reasons.append(Reason("rank-mismatch", "a single-device sharding has no dims, replicated or unreduced axes; "
                                               "dropped"))
    return TensorSharding(mesh_ref), reasons


def _fit_rank(sharding: TensorSharding, shape, mesh: Mesh, reasons: list[Reason]) -> list[DimSharding]:
    dims = list(sharding.dims)
    rank = 0 if shape is None else len(shape)
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


def _place_duplicates(dims: list[DimSharding], shape, mesh: Mesh, manual: frozenset[str],
                      reasons: list[Reason]) -> list[DimSharding]:
    """An axis written on several dims stays on one only (the first use wins): here, where the first dim it is on
    doesn't divide by it and a later one does, it goes from the dims before that one, so the use that divides wins
    (`[{"a"}, {"a"}]` on 3x16 keeps `[{}, {"a"}]`). A manual axis stays where it is: it sets a body's shapes."""
    where: dict[str, list[int]] = {}
    for i, d in enumerate(dims):
        for ref in d.axes:
            if not ref.is_sub_axis and mesh.has_axis(ref.name) and ref.name not in manual and \
                    i not in where.get(ref.name, ()):
                where.setdefault(ref.name, []).append(i)
    out = list(dims)
    for name, places in where.items():
        size = mesh.axis_size(name)
        first = shape[places[0]]
        if len(places) < 2 or first is None or first < 0 or first % size == 0:
            continue
        home = next((i for i in places[1:] if shape[i] is not None and shape[i] >= 0 and shape[i] % size == 0), None)
        if home is None:
            continue
        for i in places[:places.index(home)]:
            out[i] = replace(out[i], axes=tuple(a for a in out[i].axes if a != AxisRef(name)))
            reasons.append(Reason("duplicate-axis", f"dim {i}: axis \"{name}\" is used on dim {home} too, which "
                                                    f"it divides ({shape[home]} over {size}) and dim {i} ({shape[i]}) "
                                                    f"it doesn't; dropped here"))
    return out


class _AxisChecker:
    """Validates axis refs one by one across a whole sharding; the first use of an axis wins."""

    def __init__(self, mesh: Mesh, bound_axes: frozenset[str], reasons: list[Reason], allow_subaxes: bool = True):
        self.mesh, self.bound, self.reasons = mesh, bound_axes, reasons
        self.allow_subaxes = allow_subaxes  # False: no new sub-axis where JAX can't express one
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
            if ref.size <= 1:
                return say("bad-sub-axis", f"sub-axis {ref} splits axis \"{ref.name}\" {ref.size} ways; dropped")
            if ref.pre_size < 1 or size % (ref.pre_size * ref.size):
                return self._nearest_sub_axis(ref, size, say)
            if ref.pre_size == 1 and ref.size == size:
                say("bad-sub-axis", f"sub-axis {ref} is the whole axis; written as \"{ref.name}\"")
                ref = AxisRef(ref.name)
        clash = self._clash(ref)
        if clash is not None:
            part = self._free_part(ref) if clash[0] == "bad-sub-axis" and self.allow_subaxes else None
            if part is None:
                return say(*clash)
            say("bad-sub-axis", f"axis {ref} overlaps one used already; {part}, the largest part of it still free, "
                                f"kept")
            return part
        return ref

    def _free_part(self, ref: AxisRef) -> AxisRef | None:
        """The largest sub-axis within `ref`'s span that no ref used already overlaps (`{"b":(1)2}, {"b"}` on b=4
        keeps `"b":(2)2` for the second), or None."""
        size = self.mesh.axis_size(ref.name)
        start, end = ref.span(self.mesh)
        for k in sorted((d for d in range(2, end // start + 1) if size % d == 0), reverse=True):
            for pre in range(start, end // k + 1):
                if size % (pre * k) or (end // start) % k or pre % start:
                    continue
                candidate = AxisRef(ref.name) if (pre, k) == (1, size) else AxisRef(ref.name, pre, k)
                if self._clash(candidate) is None:
                    return candidate
        return None

    def _clash(self, ref: AxisRef) -> tuple[str, str] | None:
        """Why `ref` can't be used next to the refs used already (a duplicate or an overlap), or None."""
        start, end = ref.span(self.mesh)
        for other in self.used:
            if other.name != ref.name:
                continue
            o_start, o_end = other.span(self.mesh)
            if (o_start, o_end) == (start, end):
                return "duplicate-axis", f"axis {ref} is used already; dropped"
            if max(start, o_start) < min(end, o_end):
                return "bad-sub-axis", f"axis {ref} overlaps {other}, used already; dropped"
        return None

    def _nearest_sub_axis(self, ref: AxisRef, size: int, say) -> AxisRef | None:
        """A sub-axis whose pre-size is invalid or doesn't fit the axis: the largest valid sub-axis of at most its
        size that fits beside the refs used already (`"a":(-1)2` and `"a":(3)2` become `"a":(1)2` on a=8)."""
        for k in sorted((d for d in range(2, min(ref.size, size) + 1) if size % d == 0 and ref.size % d == 0),
                        reverse=True):
            for pre in (p for p in range(1, size // k + 1) if (size // k) % p == 0):
                candidate = AxisRef(ref.name) if k == size else AxisRef(ref.name, pre, k)
                if self._clash(candidate) is None:
                    say("bad-sub-axis", f"sub-axis {ref} is not a part of axis \"{ref.name}\"={size}; "
                                        f"{candidate} keeps {k} of its {ref.size} ways")
                    return candidate
        return say("bad-sub-axis", f"sub-axis {ref} is not a part of axis \"{ref.name}\"={size} and no part of "
                                   f"it fits; dropped")

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
                              f"{manual_size}); another split would change the local shapes the manual computation's "
                              f"body is written for, so a repair needs a dim size {manual_size} divides")
    before = _axes_text(dim.axes)
    if policy == "auto":
        kept, why = _auto(free, n // manual_size, mesh, site.allow_subaxes, site.no_padding)
        if kept is None:
            reasons.append(Reason(KEPT_PADDING, f"dim {index} of size {n} over {before} (size {total}): {why}"))
            return dim
    else:
        kept, why = _keep_dividing(free, n // manual_size, mesh, policy, site.allow_subaxes), ""
    new = DimSharding(tuple(manual + kept), dim.is_closed, dim.priority)
    words = "".join(f"; {a} is {describe_sub_axis(a, mesh)}" for a in new.axes if a.is_sub_axis)
    reasons.append(Reason("indivisible", f"dim {index} of size {n} is not divisible by {before} (size {total}); "
                                         f"now {_axes_text(new.axes)} (size "
                                         f"{math.prod(a.size_in(mesh) for a in new.axes)}{words}){why}"))
    return new


def _move_dropped_axes(asked: list[DimSharding], kept: list[DimSharding], shape, mesh: Mesh,
                       reasons: list[Reason]) -> list[DimSharding]:
    """Each whole axis a dim lost for its indivisibility placed on the first dim that no axis shards and whose size
    it divides (the embedding's 32003 rows over tp=8: tp goes to its 1000 columns), said in the reasons."""
    out = list(kept)
    for i, (before, after) in enumerate(zip(asked, kept)):
        for ref in before.axes:
            if ref in after.axes or ref.is_sub_axis or not mesh.has_axis(ref.name):
                continue
            size = mesh.axis_size(ref.name)
            home = next((j for j, (d, n) in enumerate(zip(out, shape)) if j != i and d.is_closed and not d.axes
                         and not asked[j].axes and n is not None and n > 0 and n % size == 0), None)
            if home is None:
                continue
            out[home] = replace(out[home], axes=(ref,))
            reasons.append(Reason("moved-axis", f"axis {ref} moved from dim {i} ({shape[i]}, which it doesn't "
                                                f"divide) to dim {home} ({shape[home]} over {size}), which no axis "
                                                f"shards: the array keeps its shards and each device its share"))
    return out


def _axes_text(axes: Sequence[AxisRef]) -> str:
    return "{" + ", ".join(map(str, axes)) + "}"


def _auto(free: Sequence[AxisRef], n: int, mesh: Mesh, allow_subaxes: bool,
          no_padding: str) -> tuple[list[AxisRef] | None, str]:
    """The cheapest even split of `n` rows over `free`'s axes, or None when padding leaves each device less work
    (only where padding is possible: inside a function). The second value says why, for the report."""
    candidates = [_keep_dividing(free, n, mesh, p, allow_subaxes) for p in ("subaxis", "prefix")]
    best = max(candidates, key=lambda axes: math.prod(a.size_in(mesh) for a in axes))
    even_rows = n // math.prod(a.size_in(mesh) for a in best)
    padded_rows = -(-n // math.prod(a.size_in(mesh) for a in free))
    if not allow_subaxes:
        return best, f"; {no_padding}"
    if padded_rows < even_rows:
        return None, (f"kept the padded split, {_rows(padded_rows)} a device; the best even split, "
                      f"{_axes_text(best)}, would give each device {even_rows}")
    return best, f"; {_rows(even_rows)} a device, no more than the padded split's {padded_rows}"


def _rows(n: int) -> str:
    return f"{n} row" + ("" if n == 1 else "s")


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
