"""Manual computations: which manual axes each dim of an operand or result needs so that the global shape, split
over them, is the body's local shape. Both the lenient loader (for its placeholders) and fix-shardings (for repairs)
decide it here. Pure: imports neither MLIR nor JAX.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

from .mlir_text import quote, tensor_shape
from .sharding import AxisRef, DimSharding, Mesh, TensorSharding

Shape = tuple  # dims: int, or None for a dynamic dim


def valid_manual_axes(axes: Sequence[str], mesh: Mesh, bound: frozenset[str]) -> list[str]:
    """The manual axes the verifier accepts: known to the mesh and not bound by an enclosing manual computation,
    once each, in the order written (the verifier takes them in any order)."""
    return [a for a in dict.fromkeys(axes) if mesh.has_axis(a) and a not in bound]


def manual_dims(original: TensorSharding | None, global_shape: Shape, local_shape: Shape,
                manual_axes: Sequence[str], mesh: Mesh) -> list[tuple[AxisRef, ...]] | None:
    """Per dim, the manual axes that split `global_shape` into `local_shape`: the original's manual axes of that
    dim where they do, else the first combination of unused manual axes (in mesh order) whose size is the split.
    None when no assignment gives the local shape (ranks differ, a local dim doesn't divide its global dim, no
    combination fits)."""
    if len(global_shape) != len(local_shape):
        return None
    manual = set(manual_axes)
    used: set[str] = set()
    dims: list[tuple[AxisRef, ...]] = []
    originals = original.dims if original is not None else ()
    for d, (g, l) in enumerate(zip(global_shape, local_shape)):
        wanted = [a for a in (originals[d].axes if d < len(originals) else ()) if a.name in manual and
                  _is_part_of(a, mesh)]
        if any(a.name in used for a in wanted) or len({a.name for a in wanted}) != len(wanted):
            wanted = []
        if g is None or l is None:
            if (g is None) != (l is None):
                return None
            dims.append(tuple(wanted))
            used.update(a.name for a in wanted)
            continue
        if l == 0 or g % l:
            return None
        split = g // l
        if math.prod(a.size_in(mesh) for a in wanted) != split:
            wanted = _combination(split, [a for a in manual_axes if a not in used], mesh)
            if wanted is None:
                return None
        dims.append(tuple(wanted))
        used.update(a.name for a in wanted)
    return dims


def _is_part_of(ref: AxisRef, mesh: Mesh) -> bool:
    """A full axis, or a sub-axis that is a proper part of its axis."""
    if not ref.is_sub_axis:
        return True
    size = mesh.axis_size(ref.name)
    return ref.size > 1 and ref.pre_size >= 1 and size % (ref.pre_size * ref.size) == 0 and ref.size < size


def _combination(split: int, free: Sequence[str], mesh: Mesh) -> list[AxisRef] | None:
    if split == 1:
        return []
    for count in range(1, len(free) + 1):
        for names in itertools.combinations(free, count):
            if math.prod(mesh.axis_size(n) for n in names) == split:
                return [AxisRef(n) for n in names]
    return None


def placeholder_parts(originals: dict[str, list[TensorSharding]], axes: Sequence[str], bound: frozenset[str],
                      types: dict[str, tuple[list[str], list[str]]], meshes: dict[str, Mesh]):
    """For a manual computation: in and out sharding lists (`[...]`) and manual axes (`{...}`) that the verifier
    accepts for its body (each value with just the manual axes its local shape needs, valid manual axes only), and
    those axes, for either form of the op (custom syntax, or the generic form's properties); None when no such
    placeholder exists. `types`: the global and local type texts of the operands ("in_shardings") and of the results
    ("out_shardings")."""
    # the mesh of the first original sharding that names a known one, else the module's only mesh, else none
    mesh_ref = next((s.mesh for s in originals["in_shardings"] + originals["out_shardings"]
                     if isinstance(s.mesh, Mesh) or s.mesh in meshes), None)
    if mesh_ref is None:
        mesh_ref = next(iter(meshes)) if len(meshes) == 1 else Mesh(())
    mesh = mesh_ref if isinstance(mesh_ref, Mesh) else meshes[mesh_ref]
    if any(g is None or l is None or len(g) != len(l) for g, l in types.values()):
        return None
    kept = valid_manual_axes(axes, mesh, bound) if any(g for g, _ in types.values()) else []
    lists = []
    for name in ("in_shardings", "out_shardings"):
        global_types, local_types = types[name]
        shardings = []
        for k, (g, l) in enumerate(zip(global_types, local_types)):
            g_shape, l_shape = tensor_shape(g), tensor_shape(l)
            if g_shape is None and l_shape is None:  # a token or another non-tensor value
                shardings.append(TensorSharding(mesh_ref, ()))
                continue
            if g_shape is None or l_shape is None or "unranked" in (g_shape, l_shape):
                return None
            original = originals[name][k] if k < len(originals[name]) else None
            dims = manual_dims(original, g_shape, l_shape, kept, mesh)
            if dims is None:
                return None
            shardings.append(TensorSharding(mesh_ref, tuple(DimSharding(axes) for axes in dims)))  # manual axes only
        lists.append("[" + ", ".join(x.body() for x in shardings) + "]")
    manual = "{" + ", ".join(quote(a) for a in kept) + "}"
    return lists[0], lists[1], manual, kept
