"""Pure data model of Shardy (`sdy`) shardings.

Values here mirror the sdy attributes one to one, including forms the sdy verifier rejects (an unknown axis, a
duplicate, a bad sub-axis), because a repair tool has to be able to hold them. Nothing in this module imports MLIR
or JAX: conversion to and from attributes lives in `shardfix.ir`, to and from JAX objects in `shardfix.jit.specs`.

Printed syntax (what `str()` gives and shardfix.sdy_syntax's `parse_*` read) is the sdy assembly syntax:
    mesh            <["a"=2, "b"=4], device_ids=[...]>
    axis ref        "a"   or   "a":(pre)size
    dim sharding    {"a", "b":(1)2}   {"a", ?}   {?}   {}p1
    tensor sharding <@mesh, [{"a"}, {}], replicated={"b"}, unreduced={"c"}>   (or <mesh<[...]>, [...]>)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence, Union

from .mlir_text import quote


# The sdy collectives: each checks its own sharding against the sharding of the value it reads.
COLLECTIVES = frozenset({"sdy.all_gather", "sdy.all_slice", "sdy.all_to_all", "sdy.collective_permute",
                         "sdy.all_reduce", "sdy.reduce_scatter", "sdy.sharded_to_unreduced",
                         "sdy.replicated_to_unreduced"})


class ShardingSyntaxError(ValueError):
    """Text is not in sdy sharding syntax; `offset` is where reading stopped."""

    def __init__(self, message: str, offset: int = 0):
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True)
class AxisRef:
    """A mesh axis, or the sub-axis `(pre_size)size` of it."""

    name: str
    pre_size: int | None = None
    size: int | None = None

    @property
    def is_sub_axis(self) -> bool:
        return self.size is not None

    def span(self, mesh: "Mesh") -> tuple[int, int]:
        """The multiplicative range [start, end) of the named axis this ref covers."""
        if self.is_sub_axis:
            return self.pre_size, self.pre_size * self.size
        return 1, mesh.axis_size(self.name)

    def size_in(self, mesh: "Mesh") -> int:
        return self.size if self.is_sub_axis else mesh.axis_size(self.name)

    def __str__(self) -> str:
        text = quote(self.name)
        if self.is_sub_axis:
            text += f":({self.pre_size}){self.size}"
        return text


@dataclass(frozen=True)
class Mesh:
    """Named axes with sizes, in major-to-minor order, and optional explicit device ids."""

    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...] | None = None

    def __post_init__(self):
        # sdy leaves out device ids that are just 0..n-1 (the default order); so does the model.
        if self.axes and self.device_ids is not None and self.device_ids == tuple(range(self.size)):
            object.__setattr__(self, "device_ids", None)

    @classmethod
    def of(cls, axes: dict[str, int] | Iterable[tuple[str, int]],
           device_ids: Sequence[int] | None = None) -> "Mesh":
        items = tuple(axes.items()) if isinstance(axes, dict) else tuple(axes)
        return cls(tuple((str(n), int(s)) for n, s in items),
                   None if device_ids is None else tuple(int(d) for d in device_ids))

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def size(self) -> int:
        return math.prod(size for _, size in self.axes)

    @property
    def is_maximal(self) -> bool:
        return not self.axes and self.device_ids is not None and len(self.device_ids) == 1

    def has_axis(self, name: str) -> bool:
        return any(n == name for n, _ in self.axes)

    def axis_size(self, name: str) -> int:
        for n, size in self.axes:
            if n == name:
                return size
        raise KeyError(name)

    def axis_index(self, name: str) -> int:
        return self.axis_names.index(name)

    def __str__(self) -> str:
        text = "<[" + ", ".join(f"{quote(n)}={s}" for n, s in self.axes) + "]"
        if self.device_ids is not None:
            text += ", device_ids=[" + ", ".join(map(str, self.device_ids)) + "]"
        return text + ">"


@dataclass(frozen=True)
class DimSharding:
    """The axes one tensor dimension is sharded over (major to minor), whether it is closed, its priority."""

    axes: tuple[AxisRef, ...] = ()
    is_closed: bool = True
    priority: int | None = None

    def __str__(self) -> str:
        parts = [str(a) for a in self.axes]
        if not self.is_closed:
            parts.append("?")
        text = "{" + ", ".join(parts) + "}"
        if self.priority is not None:
            text += f"p{self.priority}"
        return text


MeshRef = Union[str, Mesh]


@dataclass(frozen=True)
class TensorSharding:
    """A tensor's sharding: a mesh (by symbol name or inline), one DimSharding per dim, replicated/unreduced axes."""

    mesh: MeshRef
    dims: tuple[DimSharding, ...] = ()
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()

    @property
    def rank(self) -> int:
        return len(self.dims)

    def all_axis_refs(self) -> list[AxisRef]:
        return [a for d in self.dims for a in d.axes] + list(self.replicated) + list(self.unreduced)

    def body(self) -> str:
        """The text between `#sdy.sharding` and the end: `<@mesh, [...]...>`."""
        mesh = f"@{_symbol(self.mesh)}" if isinstance(self.mesh, str) else f"mesh{self.mesh}"
        text = f"<{mesh}, [" + ", ".join(map(str, self.dims)) + "]"
        for keyword, refs in (("replicated", self.replicated), ("unreduced", self.unreduced)):
            if refs:
                text += f", {keyword}={{" + ", ".join(map(str, refs)) + "}"
        return text + ">"

    def __str__(self) -> str:
        return "#sdy.sharding" + self.body()


@dataclass(frozen=True)
class ShardingPerValue:
    """One TensorSharding per value of an op (its results, or a manual computation's operands)."""

    shardings: tuple[TensorSharding, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        return "#sdy.sharding_per_value<[" + ", ".join(s.body() for s in self.shardings) + "]>"


def shard_count(sharding: TensorSharding, mesh: Mesh) -> int:
    """How many ways the tensor's data is split: the product of the sizes of the dim axes the mesh knows."""
    count = 1
    for dim in sharding.dims:
        for ref in dim.axes:
            if mesh.has_axis(ref.name):
                count *= ref.size if ref.is_sub_axis else mesh.axis_size(ref.name)
    return count


def dim_shard_count(dim: DimSharding, mesh: Mesh) -> int:
    """How many ways one dim is split: the product of its axes' sizes (every axis must be in the mesh)."""
    return math.prod(ref.size_in(mesh) for ref in dim.axes)


def describe_sub_axis(ref: AxisRef, mesh: Mesh) -> str:
    """A sub-axis in plain words: `"tp":(1)2` on tp=4 is "2 of tp's 4 devices"."""
    return f"{ref.size} of {ref.name}'s {mesh.axis_size(ref.name)} devices"


# ---------------------------------------------------------------------------------------------------------------
# Printing names; reading sdy syntax is shardfix.sdy_syntax's (on MLIR tokens), which builds on this model.

_SYMBOL_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_SYMBOL_CHARS = _SYMBOL_START | frozenset("0123456789$.")
AXIS_SIZE_MAX = 2**31 - 1  # mhlo.num_partitions is a 32-bit integer


def _symbol(name: str) -> str:
    """A symbol name as MLIR prints it: bare when it is a valid identifier, quoted otherwise."""
    if name and name[0] in _SYMBOL_START and all(c in _SYMBOL_CHARS for c in name):
        return name
    return quote(name)


def parse_mesh_spec(text: str) -> Mesh:
    """Read the command-line form `dp=4,tp=2` (an empty string is not a mesh); sizes from 1 to 2**31-1, and so
    is the product (the device count)."""
    axes: list[tuple[str, int]] = []
    for part in text.split(","):
        name, eq, size_text = (s.strip() for s in part.partition("="))
        if not eq or not name or name[0] not in _SYMBOL_START or not all(c in _SYMBOL_CHARS - {"$", "."} for c in name) \
                or not size_text.isdigit() or not size_text.isascii():
            raise ValueError(f"expected NAME=SIZE[,NAME=SIZE...], got '{text}'")
        size = int(size_text)
        if size < 1:
            raise ValueError(f"axis '{name}' must have a positive size, got {size}")
        if size > AXIS_SIZE_MAX:
            raise ValueError(f"axis '{name}' size {size} is out of range (at most {AXIS_SIZE_MAX})")
        if any(n == name for n, _ in axes):
            raise ValueError(f"axis '{name}' appears twice in '{text}'")
        axes.append((name, size))
    mesh = Mesh(tuple(axes))
    if mesh.size > AXIS_SIZE_MAX:
        raise ValueError(f"a mesh of {mesh.size} devices is out of range (at most {AXIS_SIZE_MAX})")
    return mesh


# ---------------------------------------------------------------------------------------------------------------
# PartitionSpec entries (no JAX import: a spec is any sequence of None | str | tuple[str, ...] | UNCONSTRAINED).

UNCONSTRAINED = "?"  # stands for PartitionSpec.UNCONSTRAINED once shardfix.jit.specs has translated it


def from_spec_entries(entries: Sequence, mesh: MeshRef, rank: int | None = None) -> TensorSharding:
    """A TensorSharding from PartitionSpec entries; `rank` pads with replicated dims (JAX's own convention)."""
    dims = []
    for entry in entries:
        if entry is UNCONSTRAINED:
            dims.append(DimSharding((), is_closed=False))
        elif entry is None:
            dims.append(DimSharding())
        else:
            names = (entry,) if isinstance(entry, str) else tuple(entry)
            dims.append(DimSharding(tuple(AxisRef(n) for n in names)))
    if rank is not None and len(dims) < rank:
        dims += [DimSharding()] * (rank - len(dims))
    return TensorSharding(mesh, tuple(dims))


def to_spec_entries(sharding: TensorSharding) -> tuple:
    """PartitionSpec entries for a sharding, or ValueError where a spec can't say it (sub-axes, priorities)."""
    entries = []
    for i, dim in enumerate(sharding.dims):
        if any(a.is_sub_axis for a in dim.axes) or dim.priority is not None:
            raise ValueError(f"dim {i} ({dim}) has no PartitionSpec form: specs hold neither sub-axes nor priorities")
        if not dim.is_closed:
            if dim.axes:
                raise ValueError(f"dim {i} ({dim}) is open with axes: no PartitionSpec form")
            entries.append(UNCONSTRAINED)
        elif not dim.axes:
            entries.append(None)
        elif len(dim.axes) == 1:
            entries.append(dim.axes[0].name)
        else:
            entries.append(tuple(a.name for a in dim.axes))
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)
