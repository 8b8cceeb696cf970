"""MLIR glue: the context, strict and lenient loading, sdy attribute conversion, and the sharding-site walker."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator

import jax  # noqa: F401  (importing jax registers the sdy/stablehlo passes with MLIR)
from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib.mlir import ir
from jaxlib.mlir.dialects import sdy, stablehlo

from .sharding import AxisRef, DimSharding, Mesh, ShardingSyntaxError, TensorSharding, read_tensor_sharding_at

# ---------------------------------------------------------------------------------------------------------------
# Context and diagnostics.


@functools.cache
def make_context(allow_unregistered: bool = False) -> ir.Context:
    """A context with every dialect JAX's lowering emits (stablehlo, sdy, chlo, mhlo, func, ...); one per process
    and setting, since creating one costs milliseconds and modules of one context are independent."""
    _register_passes()
    ctx = jax_mlir.make_ir_context()
    ctx.allow_unregistered_dialects = allow_unregistered
    return ctx


@functools.cache
def _register_passes() -> None:
    stablehlo.register_stablehlo_passes()


@dataclass(frozen=True)
class SourceLoc:
    """A source position read off an MLIR location; line and col are 0 when unknown."""

    file: str = ""
    line: int = 0
    col: int = 0
    name: str = ""  # a NameLoc's name when there is no file position (JAX names arguments so)

    def __str__(self) -> str:
        if not self.file:
            return self.name
        if self.file.endswith(".py"):
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.line}:{self.col}"

    def __bool__(self) -> bool:
        return bool(self.file or self.name)


_FILE_LOC = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):(\d+)')
_NAME_LOC = re.compile(r'^loc\("((?:[^"\\]|\\.)*)"\)$')


def source_loc(location: ir.Location | str) -> SourceLoc:
    """The first file position in a location (for JAX's call-site chains, the user's frame), else its name."""
    text = str(location)
    m = _FILE_LOC.search(text)
    if m:
        return SourceLoc(m.group(1), int(m.group(2)), int(m.group(3)))
    m = _NAME_LOC.match(text)
    return SourceLoc(name=m.group(1)) if m else SourceLoc()


@dataclass(frozen=True)
class Diagnostic:
    severity: str  # "error" | "warning" | "remark" | "note"
    message: str
    loc: SourceLoc = SourceLoc()

    def render(self, fallback: str = "") -> str:
        where = str(self.loc) if self.loc.file else fallback
        return f"{where}: {self.severity}: {self.message}" if where else f"{self.severity}: {self.message}"


class LoadError(Exception):
    """A module could not be loaded (or verified); carries located diagnostics."""

    def __init__(self, diagnostics: list[Diagnostic]):
        super().__init__("\n".join(d.render() for d in diagnostics))
        self.diagnostics = diagnostics


def diagnostics_of(error: ir.MLIRError) -> list[Diagnostic]:
    out = []
    for d in error.error_diagnostics:
        out.append(Diagnostic("error", d.message, source_loc(d.location)))
        out.extend(Diagnostic("note", n.message, source_loc(n.location)) for n in d.notes
                   if not n.message.startswith("see current operation"))
    return out or [Diagnostic("error", str(error))]


# ---------------------------------------------------------------------------------------------------------------
# Loading.

_PLACEHOLDER_BASE = 1_000_000_007  # device id tag of a placeholder sharding; far above any real device count


def parse_module(source: str | bytes, ctx: ir.Context, source_name: str = "-", lenient: bool = False) -> ir.Operation:
    """Parse and verify a module; with `lenient`, a module the sdy verifier rejects only because of its shardings
    loads too, holding those shardings unchanged (it won't verify until they are repaired)."""
    with ctx:
        try:
            return _parse_op(source, source_name)
        except ir.MLIRError as e:
            strict_error = e
        if not lenient or isinstance(source, bytes):
            raise LoadError(diagnostics_of(strict_error))
        sanitized, originals = _sanitize_shardings(source)
        if not originals:
            raise LoadError(diagnostics_of(strict_error))
        try:
            module = _parse_op(sanitized, source_name)
        except ir.MLIRError:
            raise LoadError(diagnostics_of(strict_error)) from None
        _restore_shardings(module, originals)
        return module


_MANUAL_AXES = re.compile(r'manual_axes\s*=\s*(?:#sdy<manual_axes)?\{([^}]*)\}')


def _sanitize_shardings(text: str) -> tuple[str, dict]:
    """Replace each tensor sharding in the text by a stand-in the verifier accepts for any tensor.

    Ordinary shardings become a maximal sharding whose device id tags the original; a manual computation's
    in/out shardings keep only their manual axes, which the op needs to check its body's local shapes.
    """
    out, originals, pos = [], {"tagged": {}, "manual": []}, 0
    manual_seen: dict[int, int] = {}  # manual computation line start -> shardings met so far
    for start in _code_positions(text):
        if start < pos:
            continue
        try:
            sharding, end = read_tensor_sharding_at(text, start)
        except ShardingSyntaxError:
            continue
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", start)
        line = text[line_start:line_end if line_end >= 0 else len(text)]
        manual = _MANUAL_AXES.search(line) if "manual_computation" in line else None
        if manual:
            axes = set(re.findall(r'"((?:[^"\\]|\\.)*)"', manual.group(1)))
            dims = [DimSharding(tuple(a for a in d.axes if a.name in axes)) for d in sharding.dims]
            index = manual_seen.get(line_start, 0)
            manual_seen[line_start] = index + 1
            ranks = _manual_computation_ranks(text, line_start + line.index("manual_computation"))
            if ranks is not None and index < len(ranks):
                dims = dims[:ranks[index]] + [DimSharding()] * (ranks[index] - len(dims))
            stand_in = TensorSharding(sharding.mesh, tuple(dims)).body()
            originals["manual"].append(sharding)
        else:
            tag = _PLACEHOLDER_BASE + len(originals["tagged"])
            stand_in = f"<mesh<[], device_ids=[{tag}]>, []>"
            originals["tagged"][tag] = sharding
        out.append(text[pos:start])
        out.append(stand_in)
        pos = end
    out.append(text[pos:])
    found = originals["tagged"] or originals["manual"]
    return "".join(out), (originals if found else {})


def _parse_op(source: str | bytes, source_name: str) -> ir.Operation:
    """Parse a module; like mlir-opt, anything but a single `builtin.module` is wrapped in one."""
    if isinstance(source, bytes):  # MLIR bytecode
        return ir.Module.parse(source).operation
    try:
        op = ir.Operation.parse(source, source_name=source_name).operation
        if op.name == "builtin.module":
            return op
    except ir.MLIRError as e:
        if "single top-level operation" not in str(e):
            raise
    return ir.Operation.parse(_wrap_in_module(source), source_name=source_name).operation


def _wrap_in_module(text: str) -> str:
    """`module {` ... `}` around the text, put on a blank line before the first op so no position moves."""
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("//")),
                 len(lines))
    blank = next((i for i in range(first - 1, -1, -1) if not lines[i].strip()), None)
    if blank is not None:
        lines[blank] = "module {"
    else:
        lines[first] = "module { " + lines[first] if first < len(lines) else "module {"
    return "\n".join(lines) + "\n}"


_CODE_TOKENS = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|<(?=\s*(?:@|mesh\s*<))')


_TENSOR_RANK = re.compile(r"tensor<((?:[0-9?]+x)*)")


def _manual_computation_ranks(text: str, start: int) -> list[int] | None:
    """Ranks of a manual computation's operands then results, read off the signature after its body."""
    body = text.find("{", text.find(")", text.find("manual_axes", start)))
    if body < 0:
        return None
    depth = 0
    for m in re.finditer(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|[{}]', text[body:]):
        depth += {"{": 1, "}": -1}.get(m.group(), 0)
        if depth == 0:
            signature = re.match(r"\s*:\s*\(([^)]*)\)\s*->\s*(\([^)]*\)|[^\n]*)", text[body + m.end():])
            if not signature:
                return None
            types = signature.group(1) + "," + signature.group(2)
            return [m2.group(1).count("x") for m2 in _TENSOR_RANK.finditer(types)]
    return None


def _code_positions(text: str) -> Iterator[int]:
    """Where a tensor sharding may start, outside string literals and `//` comments."""
    for m in _CODE_TOKENS.finditer(text):
        if m.group() == "<":
            yield m.start()


def _restore_shardings(module: ir.Operation, originals: dict) -> None:
    manual = iter(originals["manual"])
    for site in walk_shardings(module):
        mesh = site.sharding.mesh
        if isinstance(mesh, Mesh) and mesh.is_maximal and mesh.device_ids[0] in originals["tagged"]:
            site.replace(originals["tagged"][mesh.device_ids[0]])
        elif site.kind in ("manual-in", "manual-out"):
            site.replace(next(manual))


# ---------------------------------------------------------------------------------------------------------------
# sdy attributes <-> model.


def mesh_from_attr(attr: ir.Attribute) -> Mesh:
    mesh = sdy.MeshAttr(attr)
    axes = tuple((a.name, a.size) for a in map(sdy.MeshAxisAttr, mesh.axes))
    ids = list(mesh.device_ids)
    return Mesh(axes, tuple(ids) if ids else None)


def mesh_to_attr(mesh: Mesh) -> ir.Attribute:
    axes = [sdy.MeshAxisAttr.get(n, s) for n, s in mesh.axes]
    return sdy.MeshAttr.get(axes, list(mesh.device_ids or ()))


def _axis_from_attr(attr: ir.Attribute) -> AxisRef:
    ref = sdy.AxisRefAttr(attr)
    if ref.sub_axis_info is None:
        return AxisRef(ref.name)
    info = sdy.SubAxisInfoAttr(ref.sub_axis_info)
    return AxisRef(ref.name, info.pre_size, info.size)


def _axis_to_attr(ref: AxisRef) -> ir.Attribute:
    info = sdy.SubAxisInfoAttr.get(ref.pre_size, ref.size) if ref.is_sub_axis else None
    return sdy.AxisRefAttr.get(ref.name, info)


@functools.lru_cache(maxsize=8192)
def sharding_from_attr(attr: ir.Attribute) -> TensorSharding:
    """The model of a sharding attribute (attributes are uniqued by MLIR, so this is cached)."""
    ts = sdy.TensorShardingAttr(attr)
    ref = ts.mesh_or_ref
    mesh = ref.value if isinstance(ref, ir.FlatSymbolRefAttr) else mesh_from_attr(ref)
    dims = tuple(DimSharding(tuple(map(_axis_from_attr, d.axes)), d.is_closed, d.priority)
                 for d in map(sdy.DimensionShardingAttr, ts.dimension_shardings))
    return TensorSharding(mesh, dims, tuple(map(_axis_from_attr, ts.replicated_axes)),
                          tuple(map(_axis_from_attr, ts.unreduced_axes)))


def sharding_to_attr(sharding: TensorSharding) -> ir.Attribute:
    """The sdy attribute for a sharding, in the current context."""
    return _sharding_to_attr_in(sharding, ir.Context.current)


@functools.lru_cache(maxsize=8192)
def _sharding_to_attr_in(sharding: TensorSharding, _context: ir.Context) -> ir.Attribute:
    mesh = sharding.mesh if isinstance(sharding.mesh, str) else mesh_to_attr(sharding.mesh)
    dims = [sdy.DimensionShardingAttr.get([_axis_to_attr(a) for a in d.axes], d.is_closed, d.priority)
            for d in sharding.dims]
    return sdy.TensorShardingAttr.get(mesh, dims, [_axis_to_attr(a) for a in sharding.replicated],
                                      [_axis_to_attr(a) for a in sharding.unreduced])


def per_value_to_attr(shardings) -> ir.Attribute:
    return sdy.TensorShardingPerValueAttr.get([sharding_to_attr(s) for s in shardings])


def module_meshes(module: ir.Operation) -> dict[str, Mesh]:
    """The module's `sdy.mesh` symbols, in order."""
    meshes = {}
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name == "sdy.mesh":
            attrs = op.operation.attributes
            meshes[ir.StringAttr(attrs["sym_name"]).value] = mesh_from_attr(attrs["mesh"])
    return meshes


def manual_axes_of(op: ir.Operation) -> frozenset[str]:
    return frozenset(re.findall(r'"((?:[^"\\]|\\.)*)"', str(op.attributes["manual_axes"])))


# ---------------------------------------------------------------------------------------------------------------
# The sharding-site walker.


@dataclass
class ShardingSite:
    """One place a sharding lives, with what a pass needs to judge and replace it."""

    op: ir.Operation  # the op holding the attribute (the func.func for argument and result shardings)
    attr: ir.Attribute  # the sdy.TensorShardingAttr as found (uniqued by MLIR: cheap to hash and compare)
    kind: str  # arg | result | op-result | constraint | reshard | manual-in | manual-out | named-in | named-out | edge | collective
    index: int  # which argument / result / value
    sharding: TensorSharding
    type: ir.Type | None
    bound_axes: frozenset[str]  # manual in an enclosing manual computation
    manual_axes: frozenset[str]  # made manual by this site's own manual computation
    is_entry_boundary: bool  # an argument or result of a public function
    description: str
    _locate: Callable[[], SourceLoc] = field(repr=False, default=None)
    _replace: Callable[[TensorSharding], None] = field(repr=False, default=None)

    @functools.cached_property
    def loc(self) -> SourceLoc:
        """Where the sharding comes from: the op's (or argument's) source location."""
        return self._locate()

    @property
    def shape(self) -> tuple[int | None, ...] | None:
        """The tensor shape (None entries for dynamic dims), or None for a value that isn't shaped."""
        try:
            shaped = ir.ShapedType(self.type)
        except (TypeError, ValueError):
            return None
        if not shaped.has_rank:
            return None
        return tuple(None if shaped.is_dynamic_dim(i) else shaped.get_dim_size(i) for i in range(shaped.rank))

    def replace(self, new: TensorSharding) -> None:
        with self.op.context:
            self._replace(new)
            self.attr = sharding_to_attr(new)
        self.sharding = new


_KIND_BY_ATTR = {"in_shardings": "in", "out_shardings": "out"}
_SINGLE_KIND = {"sdy.sharding_constraint": "constraint", "sdy.reshard": "reshard", "sdy.data_flow_edge": "edge"}


def walk_shardings(module: ir.Operation) -> list[ShardingSite]:
    """Every sharding in the module, in textual order: func arguments and results, `sdy.sharding` on ops, and the
    shardings of sdy ops (constraints, reshards, manual and named computations, data-flow edges, collectives)."""
    sites: list[ShardingSite] = []

    def visit(op: ir.Operation):
        # MLIR walks in C++ and hands over each op; only ops that can carry a sharding get a closer look.
        name = op.name
        if name == "func.func":
            _func_sites(op, _enclosing_manual_axes(op), sites)
        elif name.startswith("sdy.") or "sdy.sharding" in op.attributes:
            own = manual_axes_of(op) if name == "sdy.manual_computation" else frozenset()
            _op_sites(op, _enclosing_manual_axes(op), own, sites)
        return ir.WalkResult.ADVANCE

    module.walk(visit, ir.WalkOrder.PRE_ORDER)
    return sites


def _enclosing_manual_axes(op: ir.Operation) -> frozenset[str]:
    """The axes made manual by the sdy.manual_computation ops around `op`."""
    axes: frozenset[str] = frozenset()
    parent = op.parent
    while parent is not None:
        if parent.name == "sdy.manual_computation":
            axes |= manual_axes_of(parent)
        parent = parent.parent
    return axes


def function_boundary_shardings(module: ir.Operation) -> list[ShardingSite]:
    """Only the argument and result shardings of the module's top-level functions (cheap: no walk of bodies)."""
    sites: list[ShardingSite] = []
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name == "func.func":
            _func_sites(op.operation, frozenset(), sites)
    return sites


def transform_shardings(module: ir.Operation, fn: Callable[[ShardingSite], TensorSharding | None]) -> int:
    """Replace each site's sharding with `fn(site)` (None keeps it); returns how many changed."""
    changed = 0
    for site in walk_shardings(module):
        new = fn(site)
        if new is not None and new != site.sharding:
            site.replace(new)
            changed += 1
    return changed


def _func_sites(fn: ir.Operation, bound, sites) -> None:
    attrs = fn.attributes
    name = ir.StringAttr(attrs["sym_name"]).value
    public = "sym_visibility" not in attrs or ir.StringAttr(attrs["sym_visibility"]).value == "public"
    ftype = ir.FunctionType(ir.TypeAttr(attrs["function_type"]).value)
    body = fn.regions[0].blocks[0] if len(fn.regions[0].blocks) else None
    for key, kind, types in (("arg_attrs", "arg", ftype.inputs), ("res_attrs", "result", ftype.results)):
        if key not in attrs:
            continue
        for i, dict_attr in enumerate(ir.ArrayAttr(attrs[key])):
            dict_attr = ir.DictAttr(dict_attr)
            if "sdy.sharding" not in dict_attr:
                continue
            loc = _func_value_loc(fn, body, kind, i)
            what = "argument" if kind == "arg" else "result"
            label = f" ({loc.name!r})" if loc.name and not loc.file else ""
            attr = dict_attr["sdy.sharding"]
            sites.append(ShardingSite(
                fn, attr, kind, i, sharding_from_attr(attr), types[i], bound, frozenset(), public,
                f"{what} {i}{label} of @{name}", lambda loc=loc: loc, functools.partial(_set_func_sharding, fn, key, i)))


def _func_value_loc(fn, body, kind: str, index: int) -> SourceLoc:
    if body is not None and kind == "arg":
        loc = source_loc(body.arguments[index].location)
        return loc if loc else source_loc(fn.location)
    if body is not None and len(body.operations):
        ret = body.operations[len(body.operations) - 1].operation
        loc = source_loc(ret.location)
        if loc:
            return loc
    return source_loc(fn.location)


def _set_func_sharding(fn: ir.Operation, key: str, index: int, new: TensorSharding) -> None:
    entries = list(ir.ArrayAttr(fn.attributes[key]))
    current = ir.DictAttr(entries[index])
    values = {current[i].name: current[i].attr for i in range(len(current))}
    values["sdy.sharding"] = sharding_to_attr(new)
    entries[index] = ir.DictAttr.get(values)
    fn.attributes[key] = ir.ArrayAttr.get(entries)


def _op_sites(op: ir.Operation, bound, own_manual, sites) -> None:
    attributes = op.attributes
    if op.name.startswith("sdy."):
        names = [attributes[i].name for i in range(len(attributes))]
    else:  # other dialects' ops carry shardings only as `sdy.sharding` (the walk checked it is there)
        names = ["sdy.sharding"]
    loc = functools.partial(_op_loc, op)
    for attr_name in names:
        attr = attributes[attr_name]
        if sdy.TensorShardingPerValueAttr.isinstance(attr):
            values = list(sdy.TensorShardingPerValueAttr(attr).shardings)
            side = _KIND_BY_ATTR.get(attr_name, "out")
            for i, value in enumerate(values):
                types = op.operands if side == "in" else op.results
                value_type = types[i].type if i < len(types) else None
                kind = _per_value_kind(op.name, side)
                what = "operand" if side == "in" else "result"
                sites.append(ShardingSite(
                    op, value, kind, i, sharding_from_attr(value), value_type, bound,
                    own_manual if kind.startswith("manual") else frozenset(), False,
                    f"{what} {i} of '{op.name}'", loc, functools.partial(_set_per_value, op, attr_name, i)))
        elif sdy.TensorShardingAttr.isinstance(attr):
            kind = _SINGLE_KIND.get(op.name, "collective")
            value = op.results[0] if len(op.results) else (op.operands[0] if len(op.operands) else None)
            sites.append(ShardingSite(
                op, attr, kind, 0, sharding_from_attr(attr), value.type if value is not None else None, bound,
                frozenset(), False, f"'{op.name}' {attr_name}", loc,
                functools.partial(_set_single, op, attr_name)))


def _op_loc(op: ir.Operation) -> SourceLoc:
    return _source_loc_of_attr(op.location.attr)


@functools.lru_cache(maxsize=65536)
def _source_loc_of_attr(location: ir.Attribute) -> SourceLoc:
    return source_loc(str(location))


def _per_value_kind(op_name: str, side: str) -> str:
    if op_name == "sdy.manual_computation":
        return f"manual-{side}"
    if op_name == "sdy.named_computation":
        return f"named-{side}"
    return "op-result"


def _set_per_value(op: ir.Operation, attr_name: str, index: int, new: TensorSharding) -> None:
    values = list(sdy.TensorShardingPerValueAttr(op.attributes[attr_name]).shardings)
    values[index] = sharding_to_attr(new)
    op.attributes[attr_name] = sdy.TensorShardingPerValueAttr.get(values)


def _set_single(op: ir.Operation, attr_name: str, new: TensorSharding) -> None:
    op.attributes[attr_name] = sharding_to_attr(new)
