"""Repairs of sharding structure the verifier rejects, which only a leniently loaded module can hold: per-value
lists of the wrong length or kind, shardings on values that can't have one, and manual computations (their manual
axes, their in/out shardings against the body's local shapes). Each repair goes through `Edits` and is recorded
with its reasons; what no sharding change can repair is a CorrectionError in shardfix's words."""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from ..correct import CorrectionError, Reason, Site, resolve_mesh
from ..locations import SourceLoc
from ..manual import manual_dims, valid_manual_axes
from ..sdy_syntax import drop_edges
from ..sharding import DimSharding, Mesh, TensorSharding, shard_count
from .attrs import manual_axes_list, manual_axes_to_attr, per_value_to_attr, sharding_from_attr
from .edits import Edits
from .locations import op_loc
from .walker import Problem, is_shardable, shape_of

Correct = Callable[[TensorSharding, Site], tuple[TensorSharding, list[Reason]]]


class Recorder(Protocol):
    def fix(self, description: str, loc: SourceLoc, reasons: Sequence[Reason], before: str, after: str,
            shards_before: int, shards_after: int) -> None: ...


def open_sharding(mesh_ref, type_: ir.Type) -> TensorSharding:
    """No constraint at all: every dim open (what a missing sharding means), rank 0 for a non-shaped value."""
    shape = shape_of(type_)
    return TensorSharding(mesh_ref, tuple(DimSharding(is_closed=False) for _ in (shape or ())))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _list_text(shardings: Sequence[TensorSharding]) -> str:
    return "[" + ", ".join(s.body() for s in shardings) + "]"


def _most_shards(shardings: Sequence[TensorSharding], meshes: dict[str, Mesh]) -> int:
    counts = [1]
    for s in shardings:
        mesh = s.mesh if isinstance(s.mesh, Mesh) else meshes.get(s.mesh)
        if mesh is not None:
            counts.append(shard_count(s, mesh))
    return max(counts)


def _default_mesh(meshes: dict[str, Mesh]):
    return next(iter(meshes)) if len(meshes) == 1 else Mesh(())


def repair_problem(problem: Problem, meshes: dict[str, Mesh], correct: Correct, edits: Edits,
                   record: Recorder) -> None:
    """Repair one structural problem the walker found (see Problem)."""
    op = problem.op
    if problem.attr_name in ("arg_attrs", "res_attrs"):
        _repair_function_value(problem, meshes, correct, edits, record)
    elif problem.attr_name == "sdy.sharding":
        _repair_op_results(problem, list(op.results), meshes, correct, edits, record)
    else:  # a named computation's in/out list of the wrong length
        types = list(op.operands if problem.attr_name == "in_shardings" else op.results)
        _repair_op_results(problem, types, meshes, correct, edits, record)


def _attribute_text(attr: ir.Attribute, entries: list[TensorSharding] | None) -> str:
    """How a report shows the attribute: from the model where it holds shardings (no printing of attributes)."""
    if entries is None:
        return str(attr)  # not a sharding at all: MLIR's own spelling is all there is to show
    if sdy.TensorShardingAttr.isinstance(attr):
        return str(entries[0])
    return "#sdy.sharding_per_value<" + _list_text(entries) + ">"


def _entries(attr: ir.Attribute) -> list[TensorSharding] | None:
    if sdy.TensorShardingPerValueAttr.isinstance(attr):
        return [sharding_from_attr(a) for a in sdy.TensorShardingPerValueAttr(attr).shardings]
    if sdy.TensorShardingAttr.isinstance(attr):
        return [sharding_from_attr(attr)]
    return None


def _repair_op_results(problem: Problem, values, meshes, correct: Correct, edits: Edits, record: Recorder) -> None:
    op, name = problem.op, problem.attr_name
    attr = op.attributes[name]
    types = [v.type for v in values]
    originals = _entries(attr)
    before_text = _attribute_text(attr, originals)
    reasons: list[Reason] = []
    if not types and originals and name == "sdy.sharding":  # an op without results may name its device
        new, why = correct(originals[0], Site(None, problem.bound_axes))
        reasons = [Reason("value-count", f"an op without results takes at most one sharding, of rank 0; "
                                         f"{len(originals)} given, the first kept")] + list(why)
        with op.context:
            edits.set_attribute(op, name, per_value_to_attr([new]))
        record.fix(problem.description, problem.locate(), reasons, before_text, _list_text([new]),
                   _most_shards(originals, meshes), _most_shards([new], meshes))
        return
    if originals is None or not all(is_shardable(t) for t in types) or not types:
        why = ("an attribute that is no sharding" if originals is None else
               "an op without results" if not types else
               "a result that can't carry a sharding (an unranked tensor or a tuple of other than one value)")
        if originals is None or name == "sdy.sharding":
            reasons.append(Reason("unshardable", f"{name} on {why}; removed"))
            edits.set_attribute(op, name, None)
            record.fix(problem.description, problem.locate(), reasons, before_text, "(none)",
                       _most_shards(originals or [], meshes), 1)
            return
        raise CorrectionError(f"{problem.description}: {why}; a repair would need the op changed, not a sharding")
    if problem.what == "wrong-kind":
        reasons.append(Reason("wrong-kind", f"{name} must list one sharding per value; the single sharding is "
                                            f"now a list"))
    if len(originals) != len(types):
        reasons.append(Reason("value-count", f"{_count(len(originals), 'sharding')} for {_count(len(types), 'value')}; "
                              + ("the surplus dropped" if len(originals) > len(types) else
                                 "the missing ones left open")))
    mesh_ref = next((s.mesh for s in originals), _default_mesh(meshes))
    fixed = []
    for i, t in enumerate(types):
        base = originals[i] if i < len(originals) else open_sharding(mesh_ref, t)
        new, why = correct(base, Site(shape_of(t), problem.bound_axes))
        reasons.extend(Reason(r.code, f"value {i}: {r.detail}") for r in why)
        fixed.append(new)
    with op.context:
        edits.set_attribute(op, name, per_value_to_attr(fixed))
    record.fix(problem.description, problem.locate(), reasons, before_text, _list_text(fixed),
               _most_shards(originals, meshes), _most_shards(fixed, meshes))


def _repair_function_value(problem: Problem, meshes, correct: Correct, edits: Edits, record: Recorder) -> None:
    fn, key, index = problem.op, problem.attr_name, problem.index
    attr = ir.DictAttr(ir.ArrayAttr(fn.attributes[key])[index])["sdy.sharding"]
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    types = ftype.inputs if key == "arg_attrs" else ftype.results
    originals = _entries(attr)
    if index >= len(types) or originals is None or problem.what == "unshardable" or not originals:
        why = ("a value that can't carry one (an unranked tensor or a tuple of other than one value)"
               if problem.what == "unshardable" else "an attribute that is no sharding" if originals is None
               else "an empty list")
        edits.set_entry(fn, key, index, "sdy.sharding", None)
        record.fix(problem.description, problem.locate(), [Reason("unshardable", f"sdy.sharding on {why}; removed")],
                   _attribute_text(attr, originals), "(none)", _most_shards(originals or [], meshes), 1)
        return
    reasons = [Reason("wrong-kind", "a function's argument or result takes one sharding, not a list; "
                      + ("its only entry kept" if len(originals) == 1 else f"the first of {len(originals)} kept"))]
    new, why = correct(originals[0], Site(shape_of(types[index]), allow_subaxes=not _is_public(fn)))
    reasons.extend(why)
    edits.set_entry(fn, key, index, "sdy.sharding", new)
    record.fix(problem.description, problem.locate(), reasons, _attribute_text(attr, originals), str(new),
               _most_shards(originals, meshes), _most_shards([new], meshes))


def _is_public(fn: ir.Operation) -> bool:
    attrs = fn.attributes
    return "sym_visibility" not in attrs or ir.StringAttr(attrs["sym_visibility"]).value == "public"


# -------------------------------------------------------------------------------------------------------------
# Manual computations


def manual_needs_repair(op: ir.Operation, meshes: dict[str, Mesh], bound: frozenset[str],
                        terminator: ir.Operation | None) -> bool:
    """Whether a manual computation holds what the verifier checks beyond each sharding on its own: a count of
    in/out shardings, one mesh, valid manual axes, manual axes first in each dim and giving the body's shapes."""
    attrs = op.attributes
    lists = {n: [sharding_from_attr(a) for a in sdy.TensorShardingPerValueAttr(attrs[n]).shardings]
             for n in ("in_shardings", "out_shardings")}
    sides = _sides(op, terminator)
    if any(len(lists[n]) != len(sides[n][0]) for n in lists):
        return True
    raw = manual_axes_list(op)
    shardings = lists["in_shardings"] + lists["out_shardings"]
    if not shardings:  # nothing goes in or out: the verifier asks nothing of the manual axes
        return False
    try:
        resolved = {m for m in (resolve_mesh(s, meshes)[1] for s in shardings) if not _is_empty(m)}
    except CorrectionError:
        return True
    if len(resolved) > 1:
        return True
    if not resolved:
        return bool(raw)
    mesh = next(iter(resolved))
    if set(raw) != set(valid_manual_axes(raw, mesh, bound)):
        return True
    manual = set(raw)
    for name, (global_types, local_types) in sides.items():
        for sharding, g, l in zip(lists[name], global_types, local_types):
            shape = shape_of(g)
            if shape is None:
                continue
            current = [tuple(a for a in d.axes if a.name in manual) for d in sharding.dims]
            if any(a.name in manual and any(b.name not in manual for b in d.axes[:i])
                   for d in sharding.dims for i, a in enumerate(d.axes)):
                return True
            if len(current) != len(shape) or manual_dims(sharding, shape, shape_of(l) or (), raw, mesh) != current:
                return True
    return False


def _sides(op: ir.Operation, terminator: ir.Operation | None) -> dict[str, tuple[list, list]]:
    """Global and local types of a manual computation's operands and results."""
    local_out = [v.type for v in terminator.operands] if terminator is not None else []
    return {"in_shardings": ([v.type for v in op.operands], [a.type for a in op.regions[0].blocks[0].arguments]),
            "out_shardings": ([v.type for v in op.results], local_out)}


def repair_manual(op: ir.Operation, bound: frozenset[str], terminator: ir.Operation | None,
                  meshes: dict[str, Mesh], correct: Correct, edits: Edits, record: Recorder) -> bool:
    """Make a manual computation verify: valid manual axes, one sharding per operand and result, each with the
    manual axes that give the body's local shapes. Returns whether anything changed."""
    attrs = op.attributes
    loc = op_loc(op)
    sides = _sides(op, terminator)
    originals = {name: [sharding_from_attr(a) for a in sdy.TensorShardingPerValueAttr(attrs[name]).shardings]
                 for name in sides}
    mesh_ref, mesh, mesh_reasons = _common_mesh(originals["in_shardings"] + originals["out_shardings"], meshes)
    raw_axes = manual_axes_list(op)
    axes = valid_manual_axes(raw_axes, mesh, bound)
    if not any(sides[n][0] for n in sides):
        axes = [a for a in axes if a in set(raw_axes)]
    changed = False
    for name, (global_types, local_types) in sides.items():
        values = originals[name]
        what = "operand" if name == "in_shardings" else "result"
        if len(global_types) != len(local_types):
            raise CorrectionError(f"'sdy.manual_computation' has {len(global_types)} {what}s but its body "
                                  f"{len(local_types)}; a repair would need the body changed, not a sharding")
        fixed: list[TensorSharding] = []
        for k, (g, l) in enumerate(zip(global_types, local_types)):
            original = values[k] if k < len(values) else None
            reasons = list(mesh_reasons) if original is not None else [
                Reason("value-count", f"{what} {k} had no sharding; it gets the manual axes its body's shape needs")]
            fixed.append(_manual_value(original, g, l, mesh_ref, mesh, axes, bound, correct, reasons,
                                       f"{what} {k} of 'sdy.manual_computation'"))
            if original is None or fixed[-1] != original:
                record.fix(f"{what} {k} of 'sdy.manual_computation'", loc, reasons,
                           original.body() if original is not None else "(none)", fixed[-1].body(),
                           _most_shards([original] if original else [], meshes), _most_shards([fixed[-1]], meshes))
        if len(values) > len(global_types):
            record.fix(f"{name} of 'sdy.manual_computation'", loc,
                       [Reason("value-count", f"{_count(len(values), 'sharding')} for {_count(len(global_types), what)}"
                                              f"; the surplus dropped")], _list_text(values), _list_text(fixed), 1, 1)
        if fixed != values:
            with op.context:
                edits.set_attribute(op, name, per_value_to_attr(fixed))
            changed = True
    if list(raw_axes) != axes:
        reasons = _manual_axes_reasons(raw_axes, axes, mesh, bound)
        with op.context:
            edits.set_attribute(op, "manual_axes", manual_axes_to_attr(axes))
        record.fix("manual axes of 'sdy.manual_computation'", loc, reasons, _axes_text(raw_axes), _axes_text(axes),
                   1, 1)
        changed = True
    return changed


def _axes_text(axes: Sequence[str]) -> str:
    return "{" + ", ".join(f'"{a}"' for a in axes) + "}"


def _manual_axes_reasons(raw: Sequence[str], kept: Sequence[str], mesh: Mesh, bound) -> list[Reason]:
    reasons = []
    for a in dict.fromkeys(raw):
        if not mesh.has_axis(a):
            reasons.append(Reason("unknown-axis", f"manual axis \"{a}\" is not in the mesh {mesh}; dropped"))
        elif a in bound:
            reasons.append(Reason("bound-manual-axis", f"manual axis \"{a}\" is manual in an enclosing manual "
                                                       f"computation already; dropped"))
    if len(set(raw)) != len(raw):
        reasons.append(Reason("duplicate-axis", "manual axes listed twice are kept once"))
    return reasons


def _is_empty(mesh: Mesh) -> bool:
    return not mesh.axes and not mesh.is_maximal


def _common_mesh(shardings: Sequence[TensorSharding], meshes: dict[str, Mesh]):
    """The one mesh a manual computation's shardings use (after resolving unknown names)."""
    found: list[tuple] = []
    reasons: list[Reason] = []
    for s in shardings:
        ref, mesh, why = resolve_mesh(s, meshes)
        reasons.extend(why)
        if not _is_empty(mesh) and not any(mesh == m for _, m in found):  # an empty mesh goes with any
            found.append((ref, mesh))
    if not found:
        ref = _default_mesh(meshes)
        return ref, (meshes[ref] if isinstance(ref, str) else ref), []
    if len(found) > 1:
        names = ", ".join(str(r) if isinstance(r, Mesh) else "@" + r for r, _ in found)
        raise CorrectionError(f"the shardings of this manual computation use different meshes ({names}); a repair "
                              f"would need them on one mesh, which is a choice about devices, not layouts")
    (ref, mesh), = found
    return ref, mesh, list(dict.fromkeys(reasons))


def _manual_value(original: TensorSharding | None, global_type: ir.Type, local_type: ir.Type, mesh_ref, mesh: Mesh,
                  axes: Sequence[str], bound: frozenset[str], correct: Correct, reasons: list[Reason],
                  what: str) -> TensorSharding:
    if not is_shardable(global_type):
        raise CorrectionError(f"{what} is an unranked tensor or a tuple, which can't be split over manual axes; a "
                              f"repair would need a ranked value")
    if original is not None:
        base = original  # on its own mesh: the common one, or an empty one, which goes with any
    else:  # a missing sharding: the manual axes the body needs (below), closed, nothing else
        base = TensorSharding(mesh_ref, tuple(DimSharding() for _ in (shape_of(global_type) or ())))
    global_shape, local_shape = shape_of(global_type), shape_of(local_type)
    site = Site(global_shape, bound, frozenset(axes))
    fixed, why = correct(base, site)
    reasons.extend(why)
    if global_shape is None:
        return fixed
    manual = set(axes)
    ordered = tuple(DimSharding(tuple(a for a in d.axes if a.name in manual) + tuple(a for a in d.axes
                                                                                   if a.name not in manual),
                                d.is_closed, d.priority) for d in fixed.dims)
    if ordered != fixed.dims:  # the verifier wants each dim's manual axes first: the block a body sees is whole
        moved = [i for i, (a, b) in enumerate(zip(ordered, fixed.dims)) if a != b]
        reasons.append(Reason("manual-order", f"manual axes moved before the free axes in dim(s) "
                                              f"{', '.join(map(str, moved))}, so each body gets a contiguous block"))
        fixed = TensorSharding(fixed.mesh, ordered, fixed.replicated, fixed.unreduced)
    needed = manual_dims(fixed, global_shape, local_shape or (), axes, mesh)
    if needed is None:
        raise CorrectionError(f"{what}: no split of the global shape {list(global_shape)} over the manual axes "
                              f"{_axes_text(axes)} gives the body's local shape {list(local_shape or ())}; a repair "
                              f"would need a body written for one of those splits")
    current = [tuple(a for a in dim.axes if a.name in manual) for dim in fixed.dims]
    if current == needed:
        return fixed
    used = {a.name for dim in needed for a in dim}
    dims = tuple(DimSharding(tuple(needed[d]) + tuple(a for a in dim.axes if a.name not in manual and a.name not in used),
                             dim.is_closed, dim.priority) for d, dim in enumerate(fixed.dims))
    per_dim = ", ".join(_axes_text([a.name for a in n]) for n in needed)
    reasons.append(Reason("manual-shape", f"manual axes per dim now [{per_dim}], which split {list(global_shape)} "
                                          f"into the body's {list(local_shape)}"))
    again, why = correct(TensorSharding(mesh_ref, dims, fixed.replicated, fixed.unreduced), site)
    reasons.extend(why)
    return again


# -------------------------------------------------------------------------------------------------------------
# Propagation-edge debug attributes


def repair_edges(op: ir.Operation, name: str, meshes: dict[str, Mesh], edits: Edits, record: Recorder) -> None:
    """Drop the propagation edges that name an axis no mesh of the module has (the verifier rejects them; they
    are debug information, not layout)."""
    attr = op.attributes[name]
    known = lambda axis: any(m.has_axis(axis) for m in meshes.values())  # noqa: E731
    elements = list(ir.ArrayAttr(attr)) if name != "sdy.propagation_edges" and isinstance(attr.maybe_downcast(), ir.ArrayAttr) \
        else [attr]
    new, dropped = [], []
    for element in elements:
        repaired = drop_edges(str(element), known)
        if repaired is None:
            return  # not edges as sdy writes them: left for the verifier to judge
        new.append(repaired[0])
        dropped += repaired[1]
    if not dropped:
        return
    axes = ", ".join(f'"{a}"' for a in dict.fromkeys(dropped))
    empty = "#sdy.propagation_edges<[]>"
    with op.context:
        if empty in new:  # no edge left in one of them: the debug attribute goes (sdy has no empty edges)
            value, after, what = None, "(none)", f"propagation edges of axes no mesh has ({axes}) dropped, and "\
                                                 f"with them the attribute, left without edges"
        else:
            parsed = [ir.Attribute.parse(text) for text in new]
            value = parsed[0] if name == "sdy.propagation_edges" else ir.ArrayAttr.get(parsed)
            after, what = ", ".join(new), f"propagation edges of axes no mesh has ({axes}) dropped"
        edits.set_attribute(op, name, value)
    record.fix(f"'{op.name}' {name}", op_loc(op), [Reason("unknown-axis", what)], str(attr), after, 1, 1)
