"""Loading modules: strict (parse and verify), and lenient (a module the sdy verifier rejects only because of its
shardings loads too, holding those shardings unchanged, so fix-shardings can repair it)."""

from __future__ import annotations

import re
from typing import Iterator

from jaxlib.mlir import ir

from ..sharding import DimSharding, Mesh, ShardingSyntaxError, TensorSharding, read_tensor_sharding_at
from .context import LoadError, diagnostics_of
from .walker import walk_shardings

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


