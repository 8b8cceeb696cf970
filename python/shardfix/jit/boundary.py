"""Corrections at the decorated function's boundary: its in/out shardings, given as PartitionSpecs or
NamedShardings, made valid and evenly divisible for the arguments and results they apply to."""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ..correct import Site, correct_sharding
from ..locations import SourceLoc
from ..report import Fix
from ..sharding import Mesh, shard_count
from .specs import spec_to_model, to_named_sharding

UNSPECIFIED = object()


def corrected_jit(fun, options, static_positions: set[int], loc: SourceLoc, args, kwargs):
    """(the fixes, a jax.jit of `fun` whose in/out shardings are corrected for these arguments)."""
    o = options
    mesh = resolve_mesh(o.mesh, args, kwargs) if (o.in_shardings, o.out_shardings) != (UNSPECIFIED,) * 2 else None
    fixes: list[Fix] = []
    jit_kwargs = o.jit_kwargs()  # every jax.jit option besides the shardings
    if o.in_shardings is not UNSPECIFIED:
        dynamic = tuple(a for i, a in enumerate(args) if i not in static_positions)
        jit_kwargs["in_shardings"] = _correct_tree(o.in_shardings, dynamic, mesh, "in_shardings", o.policy, loc,
                                                   fixes)
    if o.out_shardings is not UNSPECIFIED:
        shapes = jax.jit(fun, **{k: v for k, v in jit_kwargs.items() if k != "in_shardings"}).eval_shape(
            *args, **kwargs)
        jit_kwargs["out_shardings"] = _correct_tree(o.out_shardings, shapes, mesh, "out_shardings", o.policy, loc,
                                                    fixes)
    return fixes, jax.jit(fun, **jit_kwargs)


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


def _correct_tree(spec_tree, values, mesh, what: str, policy: str, loc: SourceLoc, fixes: list[Fix]):
    """Each PartitionSpec/NamedSharding leaf corrected for the shape of the value it applies to."""
    is_leaf = lambda x: x is None or isinstance(x, (PartitionSpec, jax.sharding.Sharding))  # noqa: E731
    try:
        full = jax.tree.broadcast(spec_tree, values, is_leaf=is_leaf)
    except ValueError:
        return spec_tree  # let jax.jit report the structure mismatch in its own words
    paths_specs = jax.tree_util.tree_flatten_with_path(full, is_leaf=is_leaf)[0]
    shapes = jax.tree.leaves(values)
    corrected = [_correct_leaf(spec, getattr(value, "shape", ()), mesh, f"{what}{jax.tree_util.keystr(path)}",
                               policy, loc, fixes)
                 for (path, spec), value in zip(paths_specs, shapes)]
    return jax.tree.unflatten(jax.tree.structure(full, is_leaf=is_leaf), corrected)


def _correct_leaf(spec, shape, mesh, site: str, policy: str, loc: SourceLoc, fixes: list[Fix]):
    if spec is None or not isinstance(spec, (PartitionSpec, NamedSharding)):
        return spec
    target_mesh = spec.mesh if isinstance(spec, NamedSharding) else mesh
    if target_mesh is None:
        raise ValueError(f"{loc}: {site} is the PartitionSpec {spec} but there is no mesh to apply it to: "
                         "pass mesh=..., use jax.set_mesh, or give NamedShardings")
    spec = spec.spec if isinstance(spec, NamedSharding) else spec
    model_mesh = Mesh.of(dict(target_mesh.shape))
    before = spec_to_model(spec, rank=len(shape))
    after, reasons = correct_sharding(before, Site(tuple(shape), allow_subaxes=False), {"mesh": model_mesh}, policy)
    if after != before:
        fixes.append(Fix("autofix_shardings", f"{site} (shape {tuple(shape)})", loc,
                         tuple((r.code, r.detail) for r in reasons), str(spec),
                         str(to_named_sharding(after, target_mesh).spec), shard_count(before, model_mesh),
                         shard_count(after, model_mesh)))
    return to_named_sharding(after, target_mesh)
