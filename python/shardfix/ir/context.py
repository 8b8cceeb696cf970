"""The MLIR context shardfix parses into, and MLIR's diagnostics as shardfix's."""

from __future__ import annotations

import functools

from jaxlib.mlir import ir

from ..report import Diagnostic
from .locations import source_loc


@functools.cache
def make_context(allow_unregistered: bool = False) -> ir.Context:
    """A context with every dialect JAX's lowering emits (stablehlo, sdy, chlo, mhlo, func, ...); one per process
    and setting, since creating one costs milliseconds and modules of one context are independent.

    It is shardfix's own (never JAX's shared one) and single-threaded: MLIR's verifier and parser can deadlock in
    JAX's thread pool, and shardfix's passes run in Python anyway.
    """
    from ..jit import _jax
    ctx = _jax.new_ir_context()
    ctx.enable_multithreading(False)
    ctx.allow_unregistered_dialects = allow_unregistered
    return ctx


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
