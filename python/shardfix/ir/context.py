"""The MLIR context shardfix parses into, and MLIR's diagnostics as shardfix's."""

from __future__ import annotations

import functools

from jaxlib.mlir import ir

from ..report import Diagnostic
from .locations import source_loc


@functools.cache
def make_context(allow_unregistered: bool = False) -> ir.Context:
    """A context with every dialect JAX's lowering emits (stablehlo, sdy, chlo, mhlo, func, ...) and JAX's MLIR
    passes registered; one per process and setting, since creating one costs milliseconds and modules of one
    context are independent.

    It is shardfix's own (never JAX's shared one) and single-threaded: MLIR's verifier and parser can deadlock in
    JAX's thread pool, and shardfix's passes run in Python anyway. It is built from jaxlib's MLIR modules alone, as
    JAX builds its own, without importing JAX (a second a process): `register_jax_passes` does, for a pipeline
    that names a pass JAX registers (sdy-propagation-pipeline, ...).
    """
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    from jaxlib.mlir.dialects import chlo, mhlo, sdy, stablehlo

    _register_stablehlo_passes()
    upstream = ir.DialectRegistry()  # func, arith, math, scf, ...: the upstream dialects JAX registers
    _jax_mlir_ext.register_dialects(upstream)
    ctx = ir.Context()
    ctx.append_dialect_registry(upstream)
    ctx.load_all_available_dialects()
    sdy.register_dialect(ctx)
    mhlo.register_mhlo_dialect(ctx)
    chlo.register_dialect(ctx)
    stablehlo.register_dialect(ctx)
    try:  # Shardy's MPMD dialect, in the jaxlibs that ship it
        from jaxlib.mlir.dialects import mpmd
        mpmd.register_dialect(ctx)
    except (ImportError, AttributeError):
        pass
    ctx.enable_multithreading(False)
    ctx.allow_unregistered_dialects = allow_unregistered
    return ctx


def new_context(allow_unregistered: bool = False) -> ir.Context:
    """A context like make_context's, but a new one, shared with nothing: for a scratch copy of a module whose ops'
    Python handles must never meet another module's (make_context's docstring)."""
    return make_context.__wrapped__(allow_unregistered)


@functools.cache
def register_jax_passes() -> None:
    """The MLIR passes JAX registers as it is imported (Shardy's sdy-propagation-pipeline, ...), for a pipeline
    that names one."""
    import jax  # noqa: F401


@functools.cache
def _register_stablehlo_passes() -> None:
    from jaxlib.mlir.dialects import stablehlo
    stablehlo.register_stablehlo_passes()


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
