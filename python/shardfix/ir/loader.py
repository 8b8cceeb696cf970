"""Loading modules: strict (parse and verify), and lenient (a module the sdy verifier rejects because of its
shardings loads too, holding those shardings as written, so fix-shardings can repair it).

The bindings verify whatever they parse, so a lenient load parses the text with stand-ins the verifier accepts
(shardfix.standins) and then puts the original attributes back through the bindings.
"""

from __future__ import annotations

from jaxlib.mlir import ir

from .. import mlir_text
from ..report import Diagnostic
from ..standins import StandIns, quickly_rejected, stand_in
from .context import LoadError, diagnostics_of
from ..refusal import explain, explain_bytecode


# Above this size a lenient load first looks for shardings the verifier rejects anywhere, and if it finds one skips
# the strict parse: MLIR's error for a failing function prints all of it, which takes longer than the function.
_QUICK_LOOK_BYTES = 1 << 18


def parse_module(source: str | bytes, ctx: ir.Context, source_name: str = "-", lenient: bool = False) -> ir.Operation:
    """Parse and verify a module; with `lenient`, a module the sdy verifier rejects because of its shardings
    loads too, holding those shardings unchanged (it won't verify until they are repaired). A module that can't
    be loaded even so is a LoadError; for a lenient load, one that says why in shardfix's words."""
    return load_module(source, ctx, source_name, lenient)[0]


def load_module(source: str | bytes, ctx: ir.Context, source_name: str = "-",
                lenient: bool = False) -> tuple[ir.Operation, bool]:
    """parse_module, and whether the module needed stand-ins to load (it doesn't verify as it is)."""
    with ctx:
        quick = lenient and isinstance(source, str) and len(source) > _QUICK_LOOK_BYTES and quickly_rejected(source)
        if not quick:
            try:
                return _parse_op(source, source_name), False
            except ir.MLIRError as e:
                if isinstance(source, bytes) and lenient:
                    raise LoadError(explain_bytecode(diagnostics_of(e))) from None
                if not lenient or isinstance(source, bytes):
                    raise LoadError(diagnostics_of(e)) from None
        stand_ins = stand_in(source)
        if not stand_ins:  # nothing to hold aside: the module loads as it is (after a quick look that misread it)
            lines = frozenset(stand_ins.collective_lines) if stand_ins is not None else frozenset()
            return _strict(source, source_name, lines), False
        try:
            module = _parse_op(stand_ins.text, source_name)
        except ir.MLIRError as e:  # what even the stand-ins couldn't hold aside: the reason to give
            raise LoadError(explain(diagnostics_of(e), frozenset(stand_ins.collective_lines))) from None
        if not _restore(module, stand_ins):
            return _strict(source, source_name, frozenset()), False
        return module, True


def _strict(source: str, source_name: str, lines: frozenset[int]) -> ir.Operation:
    """The module parsed as it is, or a LoadError with MLIR's own errors explained (`lines`: those of shardings a
    collective reads)."""
    try:
        return _parse_op(source, source_name)
    except ir.MLIRError as e:
        raise LoadError(explain(diagnostics_of(e), lines)) from None


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
    """`module {` ... `}` around the text's ops, put on a blank line before the first op so no position moves.
    Attribute and type alias definitions (`#map = ...`, `!t = ...`) stay outside, where MLIR wants them."""
    lines = text.split("\n")
    aliases = _alias_ends(text)
    after = aliases[-1][1] + 1 if aliases else 0
    first = next((i for i in range(after, len(lines)) if lines[i].strip() and not lines[i].lstrip().startswith("//")),
                 len(lines))
    blank = next((i for i in range(first - 1, after - 1, -1) if not lines[i].strip()), None)
    if blank is not None:
        lines[blank] = "module {"
    elif first < len(lines):
        lines[first] = "module { " + lines[first]
    else:
        lines.append("module {")
    return "\n".join(lines) + "\n}"


def _alias_ends(text: str) -> list[tuple[int, int]]:
    """(first line, last line) of each top-level alias definition, 0-based, in order; the scan stops at the first
    top-level token that starts something else."""
    tokens = mlir_text.tokenize(text)
    partner = mlir_text.match_brackets(text, tokens)
    found, i = [], 0
    while i + 1 < len(tokens) and tokens[i].kind in (mlir_text.HASH, mlir_text.BANG) and \
            text[tokens[i + 1].start:tokens[i + 1].end] == "=":
        start_line = text.count("\n", 0, tokens[i].start)
        j = i + 2
        line = text.count("\n", 0, tokens[j].start) if j < len(tokens) else start_line
        # the value runs to the end of the line its brackets close on
        while j < len(tokens) and text.count("\n", 0, tokens[j].start) == line:
            if partner[j] > j:
                j = partner[j]
                line = text.count("\n", 0, tokens[j].start)
            j += 1
        found.append((start_line, line))
        i = j
    return found


def _restore(module: ir.Operation, stand_ins: StandIns) -> bool:
    """Put the held attributes back (each parsed from its original text); False if one doesn't parse or wasn't
    found where the stand-ins left it."""
    prefix, entry_prefix = stand_ins.prefix, stand_ins.prefix + "."
    try:  # an original that doesn't parse on its own: MLIR rejects the attribute itself, not its use
        parsed = [ir.Attribute.parse(text) for text in stand_ins.held]
    except ir.MLIRError:
        return False
    restored: set[int] = set()

    def attribute(number: int) -> ir.Attribute:
        restored.add(number)
        return parsed[number]

    def restore_dict(dictionary: ir.Attribute) -> ir.Attribute | None:
        entries = ir.DictAttr(dictionary)
        values = {entries[i].name: entries[i].attr for i in range(len(entries))}
        held = [name for name in values if name.startswith(entry_prefix)]
        if not held:
            return None
        for name in held:
            values[name[len(entry_prefix):]] = attribute(ir.IntegerAttr(values.pop(name)).value)
        return ir.DictAttr.get(values)

    def visit(op: ir.Operation):
        attrs = op.attributes
        names = [attrs[i].name for i in range(len(attrs))]
        for name in names:
            if name == prefix:
                for attr_name, number in stand_ins.tagged_ops[ir.IntegerAttr(attrs[name]).value].items():
                    attrs[attr_name] = attribute(number)
                del attrs[name]
            elif name.startswith(entry_prefix):
                attrs[name[len(entry_prefix):]] = attribute(ir.IntegerAttr(attrs[name]).value)
                del attrs[name]
        if op.name == "func.func":
            for key in ("arg_attrs", "res_attrs"):
                if key in attrs:
                    dicts = list(ir.ArrayAttr(attrs[key]))
                    new = [restore_dict(d) for d in dicts]
                    if any(d is not None for d in new):
                        attrs[key] = ir.ArrayAttr.get([n if n is not None else d for n, d in zip(new, dicts)])
        return ir.WalkResult.ADVANCE

    module.walk(visit, ir.WalkOrder.PRE_ORDER)
    return len(restored) == len(stand_ins.held)


__all__ = ["Diagnostic", "LoadError", "load_module", "parse_module"]
