"""JAX glue: run a pipeline on a copy of a `jax.stages.Lowered`'s module and get a Lowered that compiles it.

Uses private fields of jax 0.10.2 (`Lowered._lowering`, its `_hlo` and `compile_args`); tests/test_jax_internals.py
fails loudly if they move. JAX's own cached module is never edited: the pipeline runs on a re-parsed copy.
"""

from __future__ import annotations

import copy
import io

import jax
from jax._src.lib.mlir import ir
from jax.sharding import NamedSharding

from .api import to_named_sharding
from .ir import function_boundary_shardings, make_context, parse_module
from .pipeline import PassContext, parse_pipeline, run_pipeline
from .report import Report


def patch_lowered(lowered: jax.stages.Lowered, pipeline: str = "fix-shardings",
                  pass_ctx: PassContext | None = None) -> tuple[jax.stages.Lowered, Report]:
    """Run `pipeline` on a copy of the lowered module; return a Lowered for the patched module and the report.

    When nothing changed, the original Lowered is returned as is.
    """
    pass_ctx = pass_ctx or PassContext()
    ctx = make_context()
    with ctx:
        try:  # a bytecode copy of JAX's module (five times cheaper than text), locations included
            patched = ir.Module.parse(_bytecode(lowered))
            module = patched.operation
        except ir.MLIRError:  # only a module the verifier rejects, which JAX does not produce; load it leniently
            patched, module = None, parse_module(lowered.as_text(debug_info=True), ctx, "<lowered>", lenient=True)
    before = _entry_shardings(module)
    run_pipeline(module, parse_pipeline(pipeline), ctx, pass_ctx, verify_each=False)
    if not pass_ctx.report.fixes and not any(r.applied for r in pass_ctx.report.rings):
        return lowered, pass_ctx.report
    after = _entry_shardings(module)
    if patched is None:
        with ctx:
            patched = ir.Module.parse(module.get_asm(enable_debug_info=True, assume_verified=True))
    return _relowered(lowered, patched, before, after), pass_ctx.report


def _bytecode(lowered: jax.stages.Lowered) -> bytes:
    buffer = io.BytesIO()
    lowered.compiler_ir("stablehlo").operation.write_bytecode(buffer)  # reads JAX's module, never changes it
    return buffer.getvalue()


def _entry_shardings(module: ir.Operation) -> dict:
    return {(s.kind, s.index): s.sharding for s in function_boundary_shardings(module)
            if s.is_entry_boundary and s.description.endswith(" of @main")}


def _relowered(lowered, patched: ir.Module, before: dict, after: dict) -> jax.stages.Lowered:
    new = copy.copy(lowered._lowering)
    new._hlo = patched
    new._executable = None
    args = dict(new.compile_args)
    for key, name in (("arg", "in_shardings"), ("result", "out_shardings")):
        current = list(args[name])
        for (kind, index), sharding in after.items():
            if kind == key and before.get((kind, index)) != sharding and index < len(current):
                mesh = getattr(current[index], "mesh", None) or _any_mesh(args)
                current[index] = to_named_sharding(sharding, mesh)
        args[name] = tuple(current)
    new.compile_args = args
    return jax.stages.Lowered(new, lowered.args_info, lowered.out_tree, no_kwargs=lowered._no_kwargs,
                              in_types=lowered._in_types, out_types=lowered._out_types)


def _any_mesh(compile_args: dict):
    for name in ("in_shardings", "out_shardings"):
        for s in compile_args[name]:
            if isinstance(s, NamedSharding):
                return s.mesh
    raise ValueError("no mesh to express a changed entry sharding with")
