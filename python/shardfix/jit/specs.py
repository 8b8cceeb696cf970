"""JAX-facing corrections: PartitionSpec / NamedSharding in, corrected PartitionSpec / NamedSharding out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from jax.sharding import NamedSharding

from ..correct import Site, correct_sharding
from ..sharding import UNCONSTRAINED, Mesh, TensorSharding, from_spec_entries, to_spec_entries


def _mesh_model(mesh) -> Mesh:
    return Mesh.of(dict(mesh.shape))


def _entries(spec) -> list:
    from jax.sharding import PartitionSpec
    return [UNCONSTRAINED if e is PartitionSpec.UNCONSTRAINED else e for e in tuple(spec)]


def _to_spec(entries):
    from jax.sharding import PartitionSpec
    return PartitionSpec(*(PartitionSpec.UNCONSTRAINED if e is UNCONSTRAINED else e for e in entries))


def to_named_sharding(sharding: TensorSharding, mesh) -> "NamedSharding":
    """The NamedSharding on the JAX `mesh` for a model sharding; ValueError where a spec can't say it
    (sub-axes, priorities, open dims with axes)."""
    from jax.sharding import NamedSharding
    return NamedSharding(mesh, _to_spec(to_spec_entries(sharding)))


def from_named_sharding(named, rank: int | None = None, mesh_name: str = "mesh") -> TensorSharding:
    """The model sharding of a NamedSharding (padded to `rank` with replicated dims)."""
    return spec_to_model(named.spec, rank, mesh_name)


def spec_to_model(spec, rank: int | None = None, mesh_name: str = "mesh") -> TensorSharding:
    """The model sharding of a PartitionSpec, whatever axes it names (padded to `rank` with replicated dims)."""
    return from_spec_entries(_entries(spec), mesh_name, rank)


def correct_spec(shape: Sequence[int], spec, mesh, *, policy: str = "drop"):
    """`spec` made valid and evenly divisible for an array of `shape` on the JAX `mesh`.

    Unknown and duplicate axes are dropped, the spec is fitted to the rank, and each indivisible dim is corrected by
    `policy` ("drop": the dim becomes replicated; "prefix" or "subaxis": the longest dividing prefix of its axes,
    since a PartitionSpec can't hold sub-axes). Returns a PartitionSpec.
    """
    model = _mesh_model(mesh)
    sharding = spec_to_model(spec)
    fixed, _ = correct_sharding(sharding, Site(tuple(shape), allow_subaxes=False), {"mesh": model}, policy)
    return _to_spec(to_spec_entries(fixed))


def get_corrected_named_sharding(shape: Sequence[int], spec, mesh):
    """A NamedSharding on `mesh` for an array of `shape`: each dim entry of `spec` that names an axis the mesh
    lacks, or whose axes don't divide the dim, becomes None (replicated); UNCONSTRAINED becomes None; the spec is
    padded or truncated to the rank. Size-1 axes are kept; a duplicate axis raises JAX's DuplicateSpecError."""
    from jax.sharding import NamedSharding
    names = set(mesh.axis_names)
    entries = []
    for entry in _entries(spec)[:len(shape)]:
        axes = () if entry is None or entry is UNCONSTRAINED else ((entry,) if isinstance(entry, str) else entry)
        entries.append(entry if axes and all(a in names for a in axes) else None)
    NamedSharding(mesh, _to_spec(entries))  # a duplicate axis raises here, as in JAX and ejkernel
    return NamedSharding(mesh, correct_spec(shape, _to_spec(entries), mesh, policy="drop"))
