"""Loading modules: strict (parse and verify), and lenient (a module the sdy verifier rejects because of its
shardings loads too, holding those shardings as written, so fix-shardings can repair it).

The bindings verify whatever they parse. A lenient load parses the module as it is first (a valid one, the usual
case, costs nothing more); if the verifier rejects it, the text is parsed again with the changes shardfix.lenient
plans, and the bindings then put every original in its place (setting an attribute verifies nothing). What jaxlib's
bindings allow, probed on jax 0.10.2 and 0.12.0.1, and what the design takes from it:
  - a sharding in an attribute dictionary (`sdy.sharding = ...` on an op or a function argument) parses and verifies
    when only its key is renamed to a dialect nobody registered (`sd_.sharding`: the same length, every column
    kept), so those shardings need no placeholder;
  - `ir.Attribute.parse`, and the parser for a discardable attribute, take a `#sdy.sharding` naming unknown meshes
    or axes, duplicates, bad sub-axes or unsorted axes (only the op's verifier rejects them; an inline mesh with an
    axis of size 0 is refused by the attribute's own parser): the shardings sdy's own ops verify get placeholders,
    and their originals are written beside them as discardable attributes for MLIR to parse, aliases and all;
  - a module in MLIR's generic form parses with only stablehlo and func registered and unregistered dialects
    allowed, sdy's attributes unverified; its sdy ops are then no sdy ops for the passes, so the generic form gets
    the same placeholders as sdy's syntax instead;
  - sdy's ops look their mesh up when they verify, and `sdy.mesh` must sit in a `builtin.module`: a root that is no
    symbol table (an unregistered op around the functions) leaves them with an unknown mesh, so the placeholders
    can't be avoided that way either (probed on jax 0.12.0.1).
"""

from __future__ import annotations

from jaxlib.mlir import ir

from .. import mlir_text
from ..lenient import INHERENT, KEYS, REPAIRED, WRAP, looks_valid, plan, quick_plan
from ..refusal import explain
from ..report import Diagnostic
from .context import LoadError, diagnostics_of


_QUICK_FIRST_BYTES = 4 << 20


def parse_module(source: str | bytes, ctx: ir.Context, source_name: str = "-", lenient: bool = False) -> ir.Operation:
    """Parse and verify a module; with `lenient`, a module the sdy verifier rejects because of its shardings
    loads too, holding those shardings unchanged (it won't verify until they are repaired). A module that can't
    be loaded even so is a LoadError; for a lenient load, one that says why in shardfix's words."""
    return load_module(source, ctx, source_name, lenient)[0]


def load_module(source: str | bytes, ctx: ir.Context, source_name: str = "-",
                lenient: bool = False) -> tuple[ir.Operation, bool]:
    """parse_module, and whether the module may hold what the verifier rejects (it was loaded with keys renamed)."""
    with ctx:
        # MLIR's error for a function that doesn't verify prints all of it, which takes longer than the function (12 s
        # for a 10 MiB function against 0.7 s to parse it): above this size a lenient load tries the renamed keys
        # before the strict parse, unless a quick look finds nothing wrong (then the strict parse verifies the
        # module once, and a pass that leaves it alone needn't verify it again)
        quick_first = lenient and isinstance(source, str) and len(source) > _QUICK_FIRST_BYTES and \
            not looks_valid(source)
        if quick_first:
            module = _quick(source, source_name)
            if module is not None:
                return module, True
        try:
            return _parse_op(source, source_name), False
        except ir.MLIRError as e:
            if not lenient:
                raise LoadError(diagnostics_of(e)) from None
            if isinstance(source, bytes):
                raise LoadError(explain(diagnostics_of(e), bytecode=True)) from None
            strict = diagnostics_of(e)
        module = None if quick_first else _quick(source, source_name)
        if module is not None:
            return module, True
        first: list[Diagnostic] | None = None  # the error of the plan that keeps what collectives read, reported
        # a sharding a collective reads is held aside too only if it must be; last, with the collective verifying
        # against it without the axes the mesh lacks
        for freeze in (True, False, REPAIRED):
            changed = plan(source, freeze)
            frozen = frozenset(changed.frozen_lines if changed else ())
            try:
                if changed is None or not changed.changes:  # nothing the verifier rejects could be held aside
                    raise LoadError(explain(strict, frozen))
                module = _parse_op(changed.text, source_name)
                if _put_back(module, changed.prefix + ".") != changed.changes:
                    raise LoadError(explain(strict, frozen))
                return module, True
            except ir.MLIRError as e:
                found = diagnostics_of(e)
                # a syntax error is the text's own, where it is written (not in an original held beside a placeholder)
                verifier = found[0].message.startswith("'") or "' op " in found[0].message
                first = first or explain(found if verifier else strict, frozen)
            except LoadError as e:
                first = first or e.diagnostics
            if freeze is True and not frozen:
                break  # no sharding a collective reads: the other plans are this one
        raise LoadError(first or strict) from None


def _quick(source: str, source_name: str) -> ir.Operation | None:
    """The module loaded with its keys renamed as text (shardfix.lenient.quick_plan), or None where that doesn't
    load it: an sdy op's own sharding is wrong too, or a renamed key wasn't one (then the full plan decides)."""
    quick = quick_plan(source)
    if quick is None or not quick.changes:
        return None
    try:
        module = _parse_op(quick.text, source_name)
    except ir.MLIRError:
        return None
    return module if _put_back(module, quick.prefix + ".", held=False) == quick.changes else None


def _put_back(module: ir.Operation, prefix: str, held: bool = True) -> int:
    """Rename the renamed keys back and (`held`) move each held original into place; how many there were."""
    renamed = {prefix + key[len("sdy."):]: key for key in KEYS}
    renamed.update((f"{prefix}{INHERENT}{key}", key) for key in WRAP if held)
    names = tuple(renamed)  # looked up in each op's attributes (in C++): listing them all costs more
    count = 0

    def dictionary(attr: ir.Attribute) -> ir.Attribute:
        nonlocal count
        entries = ir.DictAttr(attr)
        entries = [entries[i] for i in range(len(entries))]
        count += sum(e.name in renamed for e in entries)
        # a renamed key's value takes the place of one written for the parse alone (entries come sorted by name)
        kept = {e.name: e.attr for e in entries if e.name not in renamed}
        return ir.DictAttr.get(kept | {renamed[e.name]: e.attr for e in entries if e.name in renamed})

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal count
        attrs = op.attributes
        for name in names:
            if name in attrs:
                value = attrs[name]
                del attrs[name]
                attrs[renamed[name]] = value
                count += 1
        if op.name == "func.func":
            for key in ("arg_attrs", "res_attrs"):
                if key in attrs and prefix in str(attrs[key]):
                    attrs[key] = ir.ArrayAttr.get([dictionary(d) for d in ir.ArrayAttr(attrs[key])])
        return ir.WalkResult.ADVANCE

    module.walk(visit, ir.WalkOrder.PRE_ORDER)
    return count


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
    return ir.Operation.parse(mlir_text.wrap_in_module(source), source_name=source_name).operation


__all__ = ["Diagnostic", "LoadError", "load_module", "parse_module"]
