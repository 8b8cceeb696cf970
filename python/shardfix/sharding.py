"""Pure data model of Shardy (`sdy`) shardings.

Values here mirror the sdy attributes one to one, including forms the sdy verifier rejects (an unknown axis, a
duplicate, a bad sub-axis), because a repair tool has to be able to hold them. Nothing in this module imports MLIR
or JAX: conversion to and from attributes lives in `shardfix.ir`, to and from JAX objects in `shardfix.api`.

Printed syntax (what `str()` gives and `parse_*` reads) is the sdy assembly syntax:
    mesh            <["a"=2, "b"=4], device_ids=[...]>
    axis ref        "a"   or   "a":(pre)size
    dim sharding    {"a", "b":(1)2}   {"a", ?}   {?}   {}p1
    tensor sharding <@mesh, [{"a"}, {}], replicated={"b"}, unreduced={"c"}>   (or <mesh<[...]>, [...]>)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence, Union


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
        text = _quote(self.name)
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
        text = "<[" + ", ".join(f"{_quote(n)}={s}" for n, s in self.axes) + "]"
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


def describe_sub_axis(ref: AxisRef, mesh: Mesh) -> str:
    """A sub-axis in plain words: `"tp":(1)2` on tp=4 is "2 of tp's 4 devices"."""
    return f"{ref.size} of {ref.name}'s {mesh.axis_size(ref.name)} devices"


def dim_shard_count(dim: DimSharding, mesh: Mesh) -> int:
    return math.prod(ref.size_in(mesh) for ref in dim.axes)


# ---------------------------------------------------------------------------------------------------------------
# Reading sdy syntax.

_NAME_CHARS = re.compile(r"[A-Za-z0-9_$.\-]+")
_INT = re.compile(r"-?\d+")


def _quote(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _symbol(name: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$.]*", name):
        return name
    return _quote(name)


class _Reader:
    def __init__(self, text: str, pos: int = 0):
        self.text, self.pos = text, pos

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def peek(self, token: str) -> bool:
        self.skip()
        return self.text.startswith(token, self.pos)

    def accept(self, token: str) -> bool:
        if self.peek(token):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str) -> None:
        if not self.accept(token):
            found = self.text[self.pos:self.pos + 12] or "end of input"
            raise ShardingSyntaxError(f"expected '{token}' but found '{found}'", self.pos)

    def integer(self) -> int:
        self.skip()
        m = _INT.match(self.text, self.pos)
        if not m:
            raise ShardingSyntaxError("expected an integer", self.pos)
        self.pos = m.end()
        return int(m.group())

    def string(self) -> str:
        self.skip()
        if not self.text.startswith('"', self.pos):
            raise ShardingSyntaxError("expected a quoted axis name", self.pos)
        out, i = [], self.pos + 1
        while i < len(self.text) and self.text[i] != '"':
            if self.text[i] == "\\" and i + 1 < len(self.text):
                i += 1
            out.append(self.text[i])
            i += 1
        if i >= len(self.text):
            raise ShardingSyntaxError("unterminated string", self.pos)
        self.pos = i + 1
        return "".join(out)

    def symbol(self) -> str:
        self.expect("@")
        if self.peek('"'):
            return self.string()
        m = _NAME_CHARS.match(self.text, self.pos)
        if not m:
            raise ShardingSyntaxError("expected a symbol name", self.pos)
        self.pos = m.end()
        return m.group()

    def separated(self, close: str, item):
        """Items separated by commas up to `close` (consumed)."""
        items = []
        if self.accept(close):
            return items
        while True:
            items.append(item())
            if self.accept(close):
                return items
            self.expect(",")


def _read_axis_ref(r: _Reader) -> AxisRef:
    name = r.string()
    if r.accept(":"):
        r.expect("(")
        pre = r.integer()
        r.expect(")")
        return AxisRef(name, pre, r.integer())
    return AxisRef(name)


def _read_mesh(r: _Reader) -> Mesh:
    r.expect("<")
    r.expect("[")

    def axis():
        name = r.string()
        r.expect("=")
        return name, r.integer()

    axes = r.separated("]", axis)
    device_ids = None
    if r.accept(","):
        r.expect("device_ids")
        r.expect("=")
        r.expect("[")
        device_ids = tuple(r.separated("]", r.integer))
    r.expect(">")
    return Mesh(tuple(axes), device_ids)


def _read_dim(r: _Reader) -> DimSharding:
    r.expect("{")
    axes, closed = [], True
    if not r.accept("}"):
        while True:
            if r.accept("?"):
                closed = False
                r.expect("}")
                break
            axes.append(_read_axis_ref(r))
            if r.accept("}"):
                break
            r.expect(",")
    priority = None
    if r.peek("p") and _INT.match(r.text, r.pos + 1):
        r.pos += 1
        priority = r.integer()
    return DimSharding(tuple(axes), closed, priority)


def _read_tensor_sharding_body(r: _Reader) -> TensorSharding:
    r.expect("<")
    mesh: MeshRef = r.symbol() if r.peek("@") else (r.expect("mesh"), _read_mesh(r))[1]
    r.expect(",")
    r.expect("[")
    dims = r.separated("]", lambda: _read_dim(r))
    extra: dict[str, tuple[AxisRef, ...]] = {"replicated": (), "unreduced": ()}
    while r.accept(","):
        keyword = "replicated" if r.accept("replicated") else (r.expect("unreduced"), "unreduced")[1]
        r.expect("=")
        r.expect("{")
        extra[keyword] = tuple(r.separated("}", lambda: _read_axis_ref(r)))
    r.expect(">")
    return TensorSharding(mesh, tuple(dims), extra["replicated"], extra["unreduced"])


def _whole(text: str, read):
    r = _Reader(text)
    value = read(r)
    r.skip()
    if r.pos != len(text):
        raise ShardingSyntaxError(f"unexpected trailing text '{text[r.pos:r.pos + 12]}'", r.pos)
    return value


def parse_mesh(text: str) -> Mesh:
    """Read `<["a"=2, ...]>` or `#sdy.mesh<[...]>`."""
    text = text.strip()
    return _whole(text[len("#sdy.mesh"):] if text.startswith("#sdy.mesh") else text, _read_mesh)


def parse_tensor_sharding(text: str) -> TensorSharding:
    """Read `#sdy.sharding<...>` or the bare `<...>` form used in op assembly."""
    text = text.strip()
    return _whole(text[len("#sdy.sharding"):] if text.startswith("#sdy.sharding<") else text,
                  _read_tensor_sharding_body)


def parse_sharding_per_value(text: str) -> ShardingPerValue:
    text = text.strip()
    prefix = "#sdy.sharding_per_value"
    if not text.startswith(prefix):
        raise ShardingSyntaxError(f"expected '{prefix}'", 0)

    def read(r: _Reader) -> ShardingPerValue:
        r.pos = len(prefix)
        r.expect("<")
        r.expect("[")
        values = r.separated("]", lambda: _read_tensor_sharding_body(r))
        r.expect(">")
        return ShardingPerValue(tuple(values))

    return _whole(text, read)


def parse_manual_axes(text: str) -> tuple[str, ...]:
    """Read `#sdy<manual_axes{"a", "b"}>` or `{"a", "b"}` (a manual computation's manual axes)."""
    text = text.strip()
    for prefix in ("#sdy<manual_axes", "manual_axes"):
        if text.startswith(prefix):
            text = text[len(prefix):].strip()
            if text.endswith(">") and prefix.startswith("#"):
                text = text[:-1]
            break

    def read(r: _Reader) -> tuple[str, ...]:
        r.expect("{")
        return tuple(r.separated("}", r.string))

    return _whole(text, read)


def read_tensor_sharding_at(text: str, pos: int) -> tuple[TensorSharding, int]:
    """Read one bare `<...>` tensor sharding starting at `pos`; returns it and the offset just past it."""
    r = _Reader(text, pos)
    value = _read_tensor_sharding_body(r)
    return value, r.pos


def parse_mesh_spec(text: str) -> Mesh:
    """Read the command-line form `dp=4,tp=2` (an empty string is not a mesh)."""
    axes = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)\s*", part)
        if not m:
            raise ValueError(f"expected NAME=SIZE[,NAME=SIZE...], got '{text}'")
        name, size = m.group(1), int(m.group(2))
        if size < 1:
            raise ValueError(f"axis '{name}' must have a positive size, got {size}")
        if any(n == name for n, _ in axes):
            raise ValueError(f"axis '{name}' appears twice in '{text}'")
        axes.append((name, size))
    return Mesh(tuple(axes))


# ---------------------------------------------------------------------------------------------------------------
# PartitionSpec entries (no JAX import: a spec is any sequence of None | str | tuple[str, ...] | UNCONSTRAINED).

UNCONSTRAINED = "?"  # stands for PartitionSpec.UNCONSTRAINED once shardfix.api has translated it


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
