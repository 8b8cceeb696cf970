"""The decorated function's boundary: its in/out shardings (PartitionSpecs or NamedShardings) made valid and
evenly divisible for the arguments and results they apply to, the arguments to lower with, and clear errors for
in/out sharding trees that don't fit and for a `mesh=` that is no mesh."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from .._sentinel import Sentinel
from ..locations import SourceLoc, caller_loc
from ..report import Fix
from ..sharding import shard_count
from . import _jax, tracing
from .specs import itemsize_of, mesh_model, repair_spec, spec_bytes, spec_to_model, valid_names

UNSPECIFIED: Any = Sentinel("UNSPECIFIED")  # in/out shardings not given (None would mean "replicated")


def check_mesh(mesh) -> None:
    """`mesh=` must be a jax.sharding.Mesh (or None); anything else fails here, at decoration, in plain words."""
    if mesh is None or isinstance(mesh, jax.sharding.Mesh):
        return
    raise TypeError(f"autofix_shardings(mesh=...) takes a jax.sharding.Mesh, such as "
                    f"jax.make_mesh((2, 4), ('dp', 'tp')); got {type(mesh).__name__} {mesh!r}")


@dataclass
class Boundary:
    """A jax.jit of the function with corrected in/out shardings, what was corrected, and the arguments to lower it
    with (an argument committed to another sharding than its in_sharding goes in abstract form: it is moved when
    the executable is called)."""

    jitted: Any
    fixes: list[Fix] = field(default_factory=list)
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def corrected_jit(fun, options, static_positions: set[int], loc: SourceLoc, args, kwargs) -> Boundary:
    """The Boundary of one call of `fun` (a repair session must be active when out_shardings are given: finding
    the result shapes traces the function)."""
    o = options
    given = (o.in_shardings, o.out_shardings) != (UNSPECIFIED,) * 2
    mesh = resolve_mesh(o.mesh, args, kwargs) if given else None
    fixes: list[Fix] = []
    jit_kwargs = o.jit_kwargs()  # every jax.jit option besides the shardings
    lower_args = args
    if o.in_shardings is not UNSPECIFIED:
        if kwargs:  # jax.jit's own refusal, word for word
            raise ValueError("pjit does not support kwargs when in_shardings is specified.")
        positions = [i for i in range(len(args)) if i not in static_positions]
        dynamic = tuple(args[i] for i in positions)
        names = _parameter_names(fun, positions)
        in_shardings = _correct_tree(o.in_shardings, dynamic, mesh, "in_shardings", names, o.policy, loc, fixes)
        jit_kwargs["in_shardings"] = in_shardings
        lower_args = _lowering_arguments(args, positions, in_shardings, names, fixes)
    if o.out_shardings is not UNSPECIFIED:
        shape_jit = jax.jit(fun, **jit_kwargs)
        with tracing.repairing(o.policy, isolated=True):  # its repairs are the lowering's, recorded there
            shapes = shape_jit.eval_shape(*lower_args, **kwargs)
        jit_kwargs["out_shardings"] = _correct_tree(o.out_shardings, shapes, mesh, "out_shardings", ("result",),
                                                    o.policy, loc, fixes)
    return Boundary(jax.jit(fun, **jit_kwargs), fixes, lower_args, kwargs)


def resolve_mesh(mesh, args, kwargs):
    """`mesh` if given, else the context mesh (`jax.set_mesh`), else the mesh of the arguments' NamedShardings."""
    if mesh is not None:
        return mesh
    try:
        context = jax.sharding.get_mesh()
    except ValueError:  # under an outer jit only the abstract mesh is known
        context = jax.sharding.get_abstract_mesh()
    if context is not None and context.axis_names:
        return context
    for leaf in jax.tree.leaves((args, kwargs)):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(leaf, jax.Array) and isinstance(sharding, NamedSharding):
            return sharding.mesh
    return None


def _is_spec(x) -> bool:
    return x is None or isinstance(x, (PartitionSpec, jax.sharding.Sharding))


def _parameter_names(fun, positions: list[int]) -> tuple[str, ...]:
    """The parameter name of each dynamic positional argument (`args[i]` where the signature doesn't say)."""
    try:
        params = [p for p in inspect.signature(fun).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return tuple(params[i].name if i < len(params) else f"args[{i}]" for i in positions)


def _correct_tree(spec_tree, values, mesh, what: str, names: tuple[str, ...], policy: str, loc: SourceLoc,
                  fixes: list[Fix]):
    """Each PartitionSpec/NamedSharding leaf corrected for the shape of the value it applies to."""
    if what == "in_shardings" and not _is_spec(spec_tree) and isinstance(spec_tree, (tuple, list)):
        spec_tree = tuple(spec_tree)  # jax.jit reads a list of per-argument shardings as a tuple
    try:
        per_leaf = leaf_shardings(spec_tree, values)
    except ValueError:
        raise ValueError(f"{loc}: {_mismatch(spec_tree, values, what, names)}") from None
    paths_values = jax.tree_util.tree_flatten_with_path(values)[0]
    corrected = [_correct_leaf(spec, tuple(getattr(value, "shape", ())), itemsize_of(value), mesh,
                               f"{what}{jax.tree_util.keystr(path)}", policy, loc, fixes)
                 for (path, value), spec in zip(paths_values, per_leaf)]
    return jax.tree.unflatten(jax.tree.structure(values), corrected)


def leaf_shardings(spec_tree, values) -> list:
    """The sharding (or None) for each leaf of `values` from a prefix tree of them, as jax.jit reads in/out
    shardings: a None in the prefix is a sharding (a leaf) where the values have a leaf, and matches a None the
    values hold (no leaf: `((P('tp'), None),)` for the argument `(x, None)`). ValueError where it is no prefix."""
    full = jax.tree.broadcast(spec_tree, values, is_leaf=_is_spec)
    return jax.tree.structure(values).flatten_up_to(full)


def _correct_leaf(spec, shape: tuple, itemsize: int | None, mesh, site: str, policy: str, loc: SourceLoc,
                  fixes: list[Fix]):
    if not isinstance(spec, (PartitionSpec, NamedSharding)):
        return spec
    target_mesh = spec.mesh if isinstance(spec, NamedSharding) else mesh
    if target_mesh is None:
        raise ValueError(f"{loc}: {site} is the PartitionSpec {spec} but there is no mesh to apply it to: "
                         "pass mesh=..., use jax.set_mesh, or give NamedShardings")
    memory_kind = spec.memory_kind if isinstance(spec, NamedSharding) else None
    spec = spec.spec if isinstance(spec, NamedSharding) else spec
    # On Explicit axes an argument's sharding is the type the function body computes with (a contraction over two
    # differently sharded dims is an error there), so no axis moves; nor on results, whose shardings a training
    # loop feeds back as the next step's arguments (a spec given for both must be corrected alike, or each step
    # would move the state back).
    move = not _jax.has_explicit_axes(target_mesh)
    after, reasons = repair_spec(spec, target_mesh, shape, policy, move_axes=move)
    if reasons:
        model_mesh = mesh_model(target_mesh)
        fixes.append(Fix("autofix_shardings", f"{site} (shape {shape})", loc,
                         tuple((r.code, r.detail) for r in reasons), str(spec), str(after),
                         shard_count(spec_to_model(spec), model_mesh), shard_count(spec_to_model(after), model_mesh),
                         shape=shape, bytes_before=spec_bytes(valid_names(spec, target_mesh), target_mesh, shape,
                                                              itemsize),
                         bytes_after=spec_bytes(after, target_mesh, shape, itemsize)))
    return NamedSharding(target_mesh, after, memory_kind=memory_kind)


def _lowering_arguments(args: tuple, positions: list[int], in_shardings, names: tuple[str, ...],
                        fixes: list[Fix]) -> tuple:
    """`args` with each array committed to another sharding than its in_sharding in abstract form (lowering with
    it would fail; the compiled function moves it), each such move recorded."""
    args = list(args)
    for index, name, shardings in zip(positions, names, _per_argument(in_shardings, len(positions))):
        arg = args[index]
        if shardings is None:
            continue
        paths = jax.tree_util.tree_flatten_with_path(arg)[0]
        targets = leaf_shardings(shardings, arg)
        moved = [_abstract_if_elsewhere(leaf, target, f"{name}{jax.tree_util.keystr(path)}", fixes)
                 for (path, leaf), target in zip(paths, targets)]
        args[index] = jax.tree.unflatten(jax.tree.structure(arg), moved)
    return tuple(args)


def _per_argument(in_shardings, count: int) -> list:
    if _is_spec(in_shardings):
        return [in_shardings] * count
    return list(in_shardings)


def _abstract_if_elsewhere(leaf, target, where: str, fixes: list[Fix]):
    if not (isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer)
            and isinstance(target, jax.sharding.Sharding) and leaf.committed):
        return leaf
    if leaf.sharding.is_equivalent_to(target, leaf.ndim):
        return leaf
    before, after = _spec_text(leaf.sharding), _spec_text(target)
    shape, itemsize = tuple(leaf.shape), itemsize_of(leaf)
    fixes.append(Fix("autofix_shardings", f"argument {where} (shape {shape})", caller_loc(),
                     (("moved-argument", f"committed to {before}; moved to {after}, its in_sharding, on each call"),),
                     before, after, _shard_count(leaf.sharding, leaf.shape), _shard_count(target, leaf.shape),
                     shape=shape, bytes_before=_bytes(leaf.sharding, shape, itemsize),
                     bytes_after=_bytes(target, shape, itemsize)))
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=target, weak_type=getattr(leaf, "weak_type", False))


def _spec_text(sharding) -> str:
    return str(sharding.spec) if isinstance(sharding, NamedSharding) else str(sharding)


def _bytes(sharding, shape: tuple, itemsize: int | None) -> int | None:
    return None if itemsize is None else math.prod(sharding.shard_shape(shape)) * itemsize


def _shard_count(sharding, shape: tuple) -> int:
    """How many ways a sharding splits an array of `shape`."""
    return math.prod(n // k for n, k in zip(shape, sharding.shard_shape(shape)) if k)


def _mismatch(prefix, full, what: str, names: tuple[str, ...]) -> str:
    """jax.jit-like words for an in/out sharding tree that is not a prefix of the arguments/results: the first key
    path where they differ, and what each side has there."""
    head = f"{what} must be a tree prefix of the function's "
    head += "positional arguments" if what == "in_shardings" else "result"
    if what == "in_shardings" and isinstance(prefix, tuple) and len(prefix) != len(full):
        return (f"{head}: {what} is a tuple of length {len(prefix)} but the function takes {len(full)} positional "
                f"argument(s) ({', '.join(names)}); give one entry per argument, or one PartitionSpec or Sharding "
                f"for all")
    path, mine, theirs = _first_difference(prefix, full, ())
    where = what + jax.tree_util.keystr(path)
    if what == "in_shardings" and path:
        argument = names[path[0].idx] + jax.tree_util.keystr(path[1:])
    else:
        argument = "result" + jax.tree_util.keystr(path)
    return f"{head}: {where} is {mine}, but the {'argument' if what == 'in_shardings' else 'value'} it applies " \
           f"to, {argument}, is {theirs}"


def _first_difference(prefix, full, path: tuple):
    """(key path, description of the prefix there, description of the full tree there) where they first differ."""
    one_level = lambda tree: jax.tree.structure(tree, is_leaf=lambda x: x is not tree)  # noqa: E731
    if _is_spec(prefix):
        return path, _describe(prefix), _describe(full)  # not reached for trees that broadcast
    if one_level(prefix) != one_level(full):
        return path, _describe(prefix), _describe(full)
    prefix_children = jax.tree_util.tree_flatten_with_path(prefix, is_leaf=lambda x: x is not prefix)[0]
    full_children = jax.tree_util.tree_flatten_with_path(full, is_leaf=lambda x: x is not full)[0]
    for (key, p), (_, f) in zip(prefix_children, full_children):
        try:
            jax.tree.broadcast(p, f, is_leaf=_is_spec)
        except ValueError:
            return _first_difference(p, f, path + key)
    return path, _describe(prefix), _describe(full)


def _describe(x) -> str:
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) or hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"an array of shape {tuple(x.shape)}"
    if _is_spec(x):
        return "None" if x is None else f"the sharding {x}"
    children = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)[0]
    keys = [jax.tree_util.keystr(k) for k, _ in children]
    if isinstance(x, dict):
        return f"a dict with keys {sorted(str(k) for k in x)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of length {len(x)}"
    return f"a {type(x).__name__} with entries {keys}" if keys else f"a {type(x).__name__}"
