"""JAX-facing corrections: PartitionSpec / NamedSharding in, corrected PartitionSpec / NamedSharding out.

A PartitionSpec's `unreduced` and `reduced` axes are kept exactly as given by every helper here: only its
partitions (one entry per dimension) are corrected.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from jax.sharding import NamedSharding, PartitionSpec

from .. import mlir_text as mt
from ..correct import Reason, Site, correct_sharding
from ..sdy_syntax import Cursor, parse_tensor_sharding, read_dim, read_mesh
from ..report import Fix, bytes_per_device
from ..sharding import (UNCONSTRAINED, Mesh, ShardingSyntaxError, TensorSharding, describe_sub_axis,
                        from_spec_entries, to_spec_entries)


def mesh_model(mesh) -> Mesh:
    """The pure model of a JAX Mesh or AbstractMesh (axis names and sizes)."""
    return Mesh.of(dict(mesh.shape))


def partitions(spec) -> tuple:
    """A PartitionSpec's per-dimension entries, with UNCONSTRAINED translated to the model's marker."""
    from jax.sharding import PartitionSpec
    return tuple(UNCONSTRAINED if e is PartitionSpec.UNCONSTRAINED else e for e in spec.partitions)


def with_partitions(spec, entries: Sequence) -> "PartitionSpec":
    """`spec` with other partitions, keeping its unreduced/reduced axes (and their kind)."""
    from jax.sharding import PartitionSpec
    jax_entries = tuple(PartitionSpec.UNCONSTRAINED if e is UNCONSTRAINED else e for e in entries)
    if isinstance(spec, PartitionSpec):
        return spec.update(partitions=jax_entries)
    return PartitionSpec(*jax_entries)


def to_named_sharding(sharding: TensorSharding, mesh, like=None) -> "NamedSharding":
    """The NamedSharding on the JAX `mesh` for a model sharding (with `like`'s unreduced/reduced axes);
    ValueError where a spec can't say it (sub-axes, priorities, open dims with axes)."""
    from jax.sharding import NamedSharding
    return NamedSharding(mesh, with_partitions(like, to_spec_entries(sharding)))


def from_named_sharding(named, rank: int | None = None, mesh_name: str = "mesh") -> TensorSharding:
    """The model sharding of a NamedSharding's partitions (padded to `rank` with replicated dims)."""
    return spec_to_model(named.spec, rank, mesh_name)


def spec_to_model(spec, rank: int | None = None, mesh_name: str = "mesh") -> TensorSharding:
    """The model sharding of a PartitionSpec's partitions, whatever axes they name (padded to `rank`)."""
    return from_spec_entries(partitions(spec), mesh_name, rank)


def spec_bytes(spec, mesh, shape: Sequence[int], itemsize: int | None) -> int | None:
    """The bytes each device holds of an array of `shape` (of `itemsize`-byte elements) with `spec` on `mesh`."""
    if itemsize is None:
        return None
    sizes = dict(mesh.shape)
    entries = _padded(tuple(spec.partitions), len(shape))
    shards = [math.prod(sizes.get(a, 1) for a in (e if isinstance(e, tuple) else (e,) if isinstance(e, str) else ()))
              for e in entries]
    return bytes_per_device(shape, shards, itemsize)


def valid_names(spec, mesh):
    """`spec` with the axes `mesh` lacks and repeated uses of an axis taken out (what a device holds of a spec
    that names them is what it holds without them)."""
    names, seen, entries = set(mesh.axis_names), set(), []
    for entry in spec.partitions:
        axes = entry if isinstance(entry, tuple) else (entry,) if isinstance(entry, str) else None
        if axes is None:
            entries.append(entry)
            continue
        kept = tuple(a for a in axes if a in names and not (a in seen or seen.add(a)))
        entries.append(kept if len(kept) > 1 else kept[0] if kept else None)
    return with_partitions(spec, entries)


def itemsize_of(value) -> int | None:
    dtype = getattr(value, "dtype", None)
    return getattr(dtype, "itemsize", None) if dtype is not None else None


def names_rejected(spec, mesh) -> bool:
    """Whether a NamedSharding's construction rejects `spec` on `mesh`: an axis the mesh lacks, or one used twice."""
    names, seen = mesh.axis_names, set()
    for entry in spec.partitions:
        for axis in entry if isinstance(entry, tuple) else (entry,) if isinstance(entry, str) else ():
            if axis in seen or axis not in names:
                return True
            seen.add(axis)
    return False


# Where a PartitionSpec is repaired: the boundary of the decorated function (its in/out shardings), or a spec JAX
# checks while tracing (reshard, out_sharding=, with_sharding_constraint, device_put, a nested jit's in/out).
BOUNDARY_NO_PADDING = "padding is not an option at an entry function's boundary"
TRACE_NO_PADDING = "JAX rejects an indivisible spec here rather than padding it"


def repair_spec(spec, mesh, shape: Sequence[int] | None, policy: str, *, divisibility: bool = True,
                no_padding: str = BOUNDARY_NO_PADDING, move_axes: bool = False
                ) -> tuple["PartitionSpec", list[Reason]]:
    """`spec` made valid for an array of `shape` on `mesh` (a Mesh or AbstractMesh), and the reasons.

    Unknown and duplicate axes are dropped, the spec gets one entry per dimension, and with `divisibility` each
    indivisible dim is corrected by `policy`. A PartitionSpec holds no sub-axes: where the policy would keep one,
    the longest dividing prefix is kept and a reason says so. `shape=None` (not known) corrects axis names only
    and keeps the spec's length. With `move_axes` (an entry argument or result) the auto policy moves an axis an
    indivisible dim can't hold to a dim that holds it and no axis shards. Reasons are in PartitionSpec words; a
    valid spec comes back as the same object.
    """
    model_mesh = mesh_model(mesh)
    entries = list(partitions(spec))  # PartitionSpec itself keeps unreduced/reduced axes out of its partitions
    if shape is None:
        site_shape: tuple = (None,) * len(entries)
    else:  # a shorter spec means replicated trailing dims (JAX's own reading): padding it is no fix
        entries += [None] * (len(shape) - len(entries))
        site_shape = tuple(shape) if divisibility else (None,) * len(shape)
    sharding = from_spec_entries(entries, "mesh")
    meshes = {"mesh": model_mesh}
    fixed, reasons = correct_sharding(sharding, Site(site_shape, allow_subaxes=False, no_padding=no_padding,
                                                     move_axes=move_axes), meshes, policy)
    reasons = [Reason(r.code, spec_words(r.detail)) for r in reasons]
    if any(r.code == "indivisible" for r in reasons) and not any(r.code == "moved-axis" for r in reasons):
        reasons += _sub_axis_fallback(sharding, site_shape, meshes, policy, fixed, model_mesh)
    fixed_entries = list(to_spec_entries(fixed))
    fixed_entries += [None] * (len(site_shape) - len(fixed_entries))
    if not reasons:
        return spec, []
    return with_partitions(spec, fixed_entries), reasons


def spec_words(detail: str) -> str:
    """A correction-core detail in PartitionSpec words: dims `{"tp"}`, `{"dp", "tp"}`, `{}`, `{?}` become 'tp',
    ('dp', 'tp'), None, UNCONSTRAINED; a mesh `<["dp"=2, "tp"=4]>` becomes (dp=2, tp=4); axis names take quotes.
    The detail is read as MLIR tokens with sdy's readers (its notation is sdy's), the words around them kept."""
    tokens = mt.tokenize(detail)
    partner = mt.match_brackets(detail, tokens)
    out, pos, i = [], 0, 0
    while i < len(tokens):
        replacement, last = _spec_word(detail, tokens, partner, i)
        if replacement is None:
            i += 1
            continue
        out += [detail[pos:tokens[i].start], replacement]
        pos, i = tokens[last].end, last + 1
    return "".join(out) + detail[pos:]


def _spec_word(detail: str, tokens, partner: list[int], i: int) -> tuple[str | None, int]:
    """What the sdy notation starting at token i says in PartitionSpec words, and its last token; None where it is
    none of a dim of plain axes, a mesh or an axis name."""
    spelling = detail[tokens[i].start:tokens[i].end]
    try:
        if spelling == "{" and partner[i] > i:
            dim = read_dim(Cursor(detail, tokens, i, partner[i] + 1))
            if not any(a.is_sub_axis for a in dim.axes):
                names = [f"'{a.name}'" for a in dim.axes]
                word = ("UNCONSTRAINED" if not dim.is_closed else "None" if not names else names[0]
                        if len(names) == 1 else f"({', '.join(names)})")
                return word, partner[i]
        elif spelling == "<" and partner[i] > i:
            c = Cursor(detail, tokens, i, partner[i] + 1)
            mesh = read_mesh(c)
            if c.pos == partner[i] + 1 and mesh.device_ids is None:
                return "(" + ", ".join(f"{name}={size}" for name, size in mesh.axes) + ")", partner[i]
    except ShardingSyntaxError:
        pass
    if tokens[i].kind == mt.STRING:
        return f"'{mt.unquote(spelling)}'", i
    return None, i


def in_user_terms(fixes: Sequence[Fix]) -> list[Fix]:
    """Fixes as a JAX user reads them. A fix the IR passes made to a sharding a PartitionSpec can say (on a named
    mesh, closed dims, no sub-axes, priorities or replicated axes: what the user wrote as a spec) is said in
    PartitionSpec words (what it became too, unless that has a sub-axis, which sdy notation and the details' words
    say); where it repairs further, at the same line, what a trace-time repair made of the user's
    spec (an unknown axis dropped while tracing, then the dim found indivisible in the module), the two are one fix
    from what the user wrote to what the program got. Other IR fixes keep sdy notation."""
    traced: dict[tuple, Fix] = {}
    for fix in fixes:
        if fix.pass_name == "trace":
            traced.setdefault((fix.location, fix.after), fix)
    continued: set[tuple] = set()
    out = []
    for fix in fixes:
        if fix.pass_name == "trace":
            out.append(fix)
            continue
        before, after = _spec_text(fix.before), _spec_text(fix.after)
        if before is None:
            out.append(fix)
            continue
        if after is None:  # a sub-axis, say: sdy notation for it, and for the details that name it
            after, reasons = fix.after, fix.reasons
        else:
            reasons = tuple((code, spec_words(detail)) for code, detail in fix.reasons)
        earlier = traced.get((fix.location, before))
        if earlier is not None:
            continued.add((fix.location, before))
            out.append(replace(fix, site=earlier.site, reasons=earlier.reasons + reasons, before=earlier.before,
                               after=after, shards_before=earlier.shards_before))
        else:
            out.append(replace(fix, reasons=reasons, before=before, after=after))
    return [fix for fix in out if fix.pass_name != "trace" or (fix.location, fix.after) not in continued]


def _spec_text(text: str) -> str | None:
    """`<@mesh, [{"dp"}, {}]>` as `P('dp', None)` (one entry a dim), or None where a PartitionSpec can't say it."""
    try:
        sharding = parse_tensor_sharding(text)
    except ShardingSyntaxError:
        return None
    if not isinstance(sharding.mesh, str) or sharding.replicated or sharding.unreduced:
        return None
    entries = []
    for dim in sharding.dims:
        if not dim.is_closed or dim.priority is not None or any(a.is_sub_axis for a in dim.axes):
            return None
        names = tuple(a.name for a in dim.axes)
        entries.append(None if not names else names[0] if len(names) == 1 else names)
    return f"P({repr(tuple(entries))[1:-1]})"


def _sub_axis_fallback(sharding: TensorSharding, shape: tuple, meshes: dict, policy: str, fixed: TensorSharding,
                       mesh: Mesh) -> list[Reason]:
    """Where the policy would keep a sub-axis, a reason saying that a PartitionSpec can't, and what it kept. (The
    auto policy, which can't keep a padded split here either, would take the best even split: subaxis's.)"""
    ideal, _ = correct_sharding(sharding, Site(shape, allow_subaxes=True), meshes,
                                "subaxis" if policy == "auto" else policy)
    notes = []
    for i, (want, got) in enumerate(zip(ideal.dims, fixed.dims)):
        subs = [a for a in want.axes if a.is_sub_axis]
        if subs and want != got:
            kept = ", ".join(f'"{a.name}"' for a in got.axes) or "none"
            words = "; ".join(f"{a} is {describe_sub_axis(a, mesh)}" for a in subs)
            notes.append(Reason("indivisible", f"dim {i}: the {policy} policy would keep the sub-axis "
                                               f"{{{', '.join(map(str, want.axes))}}} ({words}), which a "
                                               f"PartitionSpec can't hold; kept the longest dividing prefix "
                                               f"of axes instead ({kept})"))
    return notes


def correct_spec(shape: Sequence[int], spec, mesh, *, policy: str = "drop") -> "PartitionSpec":
    """`spec` made valid and evenly divisible for an array of `shape` on the JAX `mesh`.

    Unknown and duplicate axes are dropped, the spec is fitted to the rank, and each indivisible dim is corrected by
    `policy` ("drop": the dim becomes replicated; "prefix" or "subaxis": the longest dividing prefix of its axes,
    since a PartitionSpec can't hold sub-axes). Like `get_corrected_named_sharding`, the result has one entry per
    dimension, or none at all when every dimension is replicated; unreduced/reduced axes are kept.
    """
    fixed, _ = repair_spec(spec, mesh, shape, policy)
    return _replicated_as_empty(with_partitions(spec, _padded(partitions(fixed), len(shape))))


def get_corrected_named_sharding(shape: Sequence[int], spec, mesh) -> "NamedSharding":
    """A NamedSharding on `mesh` for an array of `shape`, with ejkernel's semantics.

    The spec is padded with None or truncated to the rank; an entry that names an axis the mesh lacks, whose axes'
    sizes don't divide its dimension, or that is not a name or a tuple of names (UNCONSTRAINED, say) becomes None;
    when every entry is None the spec is `P()`. Size-1 axes are kept; an axis used twice in the result raises
    JAX's DuplicateSpecError (as constructing the NamedSharding does). Unreduced/reduced axes are kept.
    """
    from jax.sharding import NamedSharding
    sizes = dict(mesh.shape)
    entries = []
    for dim, entry in zip(shape, _padded(tuple(spec.partitions), len(shape))):
        names = (entry,) if isinstance(entry, str) else entry if isinstance(entry, tuple) else None
        valid = names is not None and all(n in sizes for n in names)
        entries.append(entry if valid and dim % math.prod(sizes[n] for n in names) == 0 else None)
    if not spec.partitions:
        entries = []
    return NamedSharding(mesh, _replicated_as_empty(with_partitions(spec, entries)))


def _padded(entries: Sequence, rank: int) -> tuple:
    return tuple(entries[:rank]) + (None,) * (rank - len(entries))


def _replicated_as_empty(spec) -> Any:
    return with_partitions(spec, ()) if all(e is None for e in spec.partitions) else spec


