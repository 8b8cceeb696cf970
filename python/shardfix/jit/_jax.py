"""Every private JAX access shardfix makes, in one place.

shardfix needs a few things JAX has no public API for: an MLIR context with JAX's dialects, a Lowered whose module
was replaced, and JAX's C++ call dispatcher for its own executables. Each is reached here and nowhere else;
tests/test_jax_internals.py exercises every one of them on the installed JAX so that a move fails loudly there.
"""

from __future__ import annotations

import copy

import jax
from jaxlib.mlir import ir

# ---------------------------------------------------------------------------------------------------------------
# MLIR.


def new_ir_context() -> ir.Context:
    """A fresh context with every dialect JAX's lowering emits, and JAX's C++ passes registered."""
    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir.dialects import chlo, mhlo, sdy, stablehlo

    _register_passes()
    ctx = ir.Context()
    ctx.append_dialect_registry(jax_mlir.upstream_dialects)
    ctx.load_all_available_dialects()
    sdy.register_dialect(ctx)
    mhlo.register_mhlo_dialect(ctx)
    chlo.register_dialect(ctx)
    stablehlo.register_dialect(ctx)
    mpmd = getattr(jax_mlir.dialects, "mpmd", None)
    if mpmd is not None:
        mpmd.register_dialect(ctx)
    return ctx


_passes_registered = False


def _register_passes() -> None:
    global _passes_registered
    if not _passes_registered:
        from jaxlib.mlir.dialects import stablehlo
        stablehlo.register_stablehlo_passes()
        _passes_registered = True


# ---------------------------------------------------------------------------------------------------------------
# A Lowered with another module.


def relowered(lowered: jax.stages.Lowered, module: ir.Module, in_shardings: tuple | None = None,
              out_shardings: tuple | None = None) -> jax.stages.Lowered:
    """A Lowered that compiles `module` in place of `lowered`'s, with the entry shardings JAX should expect."""
    new = copy.copy(lowered._lowering)
    new._hlo = module
    new._executable = None
    args = dict(new.compile_args)
    if in_shardings is not None:
        args["in_shardings"] = in_shardings
    if out_shardings is not None:
        args["out_shardings"] = out_shardings
    new.compile_args = args
    return jax.stages.Lowered(new, lowered.args_info, lowered.out_tree, no_kwargs=lowered._no_kwargs,
                              in_types=lowered._in_types, out_types=lowered._out_types)


def compile_shardings(lowered: jax.stages.Lowered) -> tuple[tuple, tuple]:
    """The (in, out) shardings JAX will compile `lowered`'s entry computation with."""
    args = lowered._lowering.compile_args
    return tuple(args["in_shardings"]), tuple(args["out_shardings"])


# ---------------------------------------------------------------------------------------------------------------
# C++ dispatch. jax.jit checks a call's signature in C++ and only calls back into Python on a miss; the same
# dispatcher serves shardfix's executables, so a cached call costs what a jax.jit call costs. Where these
# internals are missing, calls take the Python path.


def cpp_dispatcher(fun, cache_miss, static_argnums, static_argnames):
    """JAX's C++ dispatcher calling `cache_miss` for signatures it hasn't seen; None where it can't be built."""
    if static_argnums is None:
        return None
    try:
        from jax._src import tree_util
        from jax._src.interpreters import pxla
        from jax._src.lib import _jax
        return _jax.pjit(getattr(fun, "__name__", "autofix"), None, cache_miss, static_argnums, static_argnames,
                         pxla.JitGlobalCppCacheKeys(), tree_util.dispatch_registry, pxla.cc_shard_arg)
    except (ImportError, AttributeError, TypeError):
        return None


def fastpath_call(compiled: jax.stages.Compiled, dyn_args, dyn_kwargs):
    """Run `compiled` once through JAX's compiled-call path; return (outputs, the data that lets the C++
    dispatcher call it directly next time), or None (without running) where JAX wouldn't take the fast path."""
    from jax._src import core, dtypes, sharding_impls, stages
    from jax._src.interpreters import pxla
    from jax._src.lib import xla_client as xc

    executable = compiled._executable
    if not (isinstance(executable, pxla.MeshExecutable) and isinstance(executable.unsafe_call, pxla.ExecuteReplicated)
            and not executable.unsafe_call.has_unordered_effects and not executable.unsafe_call.has_host_callbacks
            and not executable.unsafe_call.ordered_effects and not compiled._params.is_high):
        return None
    params = compiled._params._replace(const_args=executable.shard_const_args(compiled._params.const_args))
    outs, out_flat, args_flat = stages.Compiled.call(params, *dyn_args, **dyn_kwargs)
    out_flat, out_tree = pxla.reflatten_outputs_for_dispatch(params.out_tree, out_flat)
    if not all(isinstance(x, xc.ArrayImpl) for x in out_flat) or getattr(executable, "_mut", None):
        return None
    in_shardings = [sharding_impls.physical_sharding(a, s)
                    if a is not core.abstract_token and dtypes.issubdtype(a.dtype, dtypes.extended) else s
                    for s, a in zip(executable._in_shardings, executable.in_avals)]
    kept = [i in executable._kept_var_idx for i in range(len(params.const_args) + len(args_flat))]
    data = pxla.MeshExecutableFastpathData(
        executable.xla_executable, out_tree, in_shardings, executable._out_shardings, [o.aval for o in out_flat],
        [o._committed for o in out_flat], kept, executable._dispatch_in_layouts, params.const_args)
    return outs, data


# ---------------------------------------------------------------------------------------------------------------
# Inlining (jaxlib's registered `inline` pass inlines nothing in JAX's dialect setup; its own helper does).


def inline_call(call: ir.Operation, callee: ir.Operation) -> list:
    """Inline one func.call of `callee` at its place; returns the values that replace the call's results."""
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    with ir.InsertionPoint(call):
        return list(_jax_mlir_ext.inlined_func_call(callee, list(call.operands), call.location))
