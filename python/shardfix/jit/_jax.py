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


# ---------------------------------------------------------------------------------------------------------------
# Trace-time spec checks. JAX checks sharding specs while it traces (unknown axes, rank, divisibility of explicit
# shardings, jit in/out shardings), before any module exists. `install_spec_hooks` wraps the functions where those
# checks happen. Each wrapper asks `active()` for the repair session of the current context and, when there is none,
# calls JAX's function at once: outside a session (other threads included) JAX behaves as it always does. A session
# also sets a private config state that is part of JAX's trace context and jit key, so traces and executables made
# inside a session are never served outside it (or to a session with another key), and vice versa.
#
# The session object (shardfix.jit.tracing) provides:
#   repair(sharding, shape, api, divisibility=True) -> the sharding (PartitionSpec or NamedSharding) made valid for
#       `shape` (None: names only), recording what changed; anything else comes back unchanged
#   lenient() -> None                      a lenient construction check let a spec through (fixed later)
#   aval_checks_suspended: int             > 0 while a jit in/out wrapper runs JAX's (uncached) canonicalization

import functools
import os
import sys
import threading

_hooks_lock = threading.Lock()
_hooks_installed = False
_repair_key_state = None


def install_spec_hooks(active) -> None:
    """Wrap JAX's trace-time spec checks (once per process; later calls do nothing)."""
    global _hooks_installed, _repair_key_state
    with _hooks_lock:
        if _hooks_installed:
            return
        from jax._src import (api, config, core, named_sharding, pjit, sharding_impls, source_info_util,
                              traceback_util)

        package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        traceback_util.register_exclusion(package_dir)  # our wrappers stay out of filtered tracebacks
        source_info_util.register_exclusion(package_dir + os.sep)  # ... and out of op locations
        _repair_key_state = config.int_state(
            "shardfix_trace_repair_key", 0, "shardfix: the trace-time repair session's key (private)",
            include_in_jit_key=True, include_in_trace_context=True)

        _rebind(named_sharding._check_unique_resources, _lenient(named_sharding._check_unique_resources, active,
                                                                 None))
        _rebind(named_sharding._check_mesh_resource_axis, _lenient(named_sharding._check_mesh_resource_axis, active,
                                                                   _without_unknown_axes))
        _rebind(sharding_impls.canonicalize_sharding, _canonicalize_sharding(sharding_impls.canonicalize_sharding,
                                                                             active))
        _rebind(core.get_sharding, _get_sharding(core.get_sharding, active))
        _rebind(pjit.with_sharding_constraint, _on_tree(pjit.with_sharding_constraint, active,
                                                        "with_sharding_constraint", _constraint_divides))
        _rebind(pjit.reshard, _on_tree(pjit.reshard, active, "reshard", lambda: True))
        _rebind(api.device_put, _device_put(api.device_put, active))
        check = pjit.pjit_check_aval_sharding
        _rebind(check, _suspendable_check(check, active))
        _rebind(pjit._process_in_axis_resources,
                _jit_boundary(pjit._process_in_axis_resources, check, active, "in_avals", 4, "jit in_shardings"))
        _rebind(pjit._check_and_canonicalize_out_shardings,
                _jit_boundary(pjit._check_and_canonicalize_out_shardings, check, active, "out_avals", 5,
                              "jit out_shardings"))
        _hooks_installed = True


def repair_key(value: int):
    """A context manager setting the private config state that keys JAX's trace and jit caches."""
    return _repair_key_state(value)


def forget_lenient_specs() -> None:
    """Drop what lenient construction checks left in JAX's spec-check cache (its key has no trace context)."""
    from jax._src import named_sharding
    named_sharding.check_pspec.cache_clear()


def context_mesh():
    """The mesh a bare PartitionSpec refers to where JAX resolves it: the context's (jax.set_mesh, or the legacy
    `with mesh:`); None when there is none."""
    from jax._src import mesh as mesh_lib
    abstract = mesh_lib.get_abstract_mesh()
    if not abstract.empty:
        return abstract
    physical = mesh_lib.thread_resources.env.physical_mesh
    return None if physical.empty else physical


def all_axes_explicit() -> bool:
    """Whether JAX treats with_sharding_constraint as an assert here (every context mesh axis Explicit)."""
    from jax._src import mesh as mesh_lib
    mesh = mesh_lib.get_abstract_mesh()
    return not mesh.empty and mesh.are_all_axes_explicit


def traceback_frames() -> list[tuple[str, int]]:
    """(file, line) of the frames JAX attributes the current operation to, innermost first. JAX's own record: in a
    transpose or partial evaluation it is the forward operation's. It stops at jitted callees (jnp.dot, say)."""
    from jax._src import source_info_util
    traceback = source_info_util.current().traceback
    if traceback is None:
        return []
    return [(f.file_name, f.start_line) for f in source_info_util.user_frames(traceback)]


def _rebind(original, wrapper) -> None:
    """Put `wrapper` in place of every module-level binding of `original`: JAX imports these functions by name
    into many modules, and user modules may have done the same."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if value is original:
                namespace[name] = wrapper


def _gated(original, active, body):
    """A wrapper that runs `body(session, *args)` inside a repair session and JAX's `original` elsewhere."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        session = active()
        if session is None:
            return original(*args, **kwargs)
        return body(session, *args, **kwargs)
    wrapper.__wrapped__ = original
    return wrapper


def _lenient(original, active, known_axes_only):
    """A construction check that lets unknown or duplicate axes through (they are repaired where the spec's shape
    is known); any other complaint (UNCONSTRAINED on an Explicit mesh, say) still raises."""
    def body(session, *args, **kwargs):
        try:
            return original(*args, **kwargs)
        except Exception:  # DuplicateSpecError is not a ValueError
            if known_axes_only is not None:
                original(*known_axes_only(*args, **kwargs))
            session.lenient()
            return None
    return _gated(original, active, body)


def _without_unknown_axes(mesh, pspec):
    """_check_mesh_resource_axis's arguments with the axes the mesh lacks taken out of the spec."""
    names = set(mesh.axis_names)
    keep = lambda entry: tuple(a for a in entry if a in names) if isinstance(entry, tuple) else (  # noqa: E731
        entry if not isinstance(entry, str) or entry in names else None)
    return mesh, pspec.update(partitions=tuple(keep(e) for e in pspec.partitions))


def _canonicalize_sharding(original, active):
    def body(session, sharding, api_name, *args, **kwargs):
        return original(session.repair(sharding, None, f"{api_name} out_sharding"), api_name, *args, **kwargs)
    return _gated(original, active, body)


def _get_sharding(original, active):
    """Every typed value's sharding passes here with its shape (reshard, out_sharding=, device_put results)."""
    def body(session, sharding, shape):
        return original(session.repair(sharding, tuple(shape), "out_sharding"), shape)
    return _gated(original, active, body)


def _constraint_divides() -> bool:
    # Under an all-Explicit mesh with_sharding_constraint asserts the value's (divisible) type; elsewhere it allows
    # uneven shardings (XLA pads them), which fix-shardings then repairs with sub-axes.
    return all_axes_explicit()


def _on_tree(original, active, api_name: str, divisibility):
    """with_sharding_constraint / reshard: each spec of the (prefix) tree repaired for the leaf it applies to."""
    def body(session, values, shardings, *args, **kwargs):
        fixed = _repair_tree(session, values, shardings, api_name, divisibility())
        return original(values, shardings if fixed is None else fixed, *args, **kwargs)
    return _gated(original, active, body)


def _device_put(original, active):
    def body(session, x, device=None, *args, **kwargs):
        if device is None:
            return original(x, device, *args, **kwargs)
        fixed = _repair_tree(session, x, device, "device_put", True)
        return original(x, device if fixed is None else fixed, *args, **kwargs)
    return _gated(original, active, body)


def _repair_tree(session, values, shardings, api_name: str, divisibility: bool):
    """The sharding tree broadcast over `values` with each leaf repaired, or None where it doesn't broadcast (JAX
    then reports the structure) or holds nothing to repair."""
    from jax.sharding import NamedSharding, PartitionSpec
    is_spec = lambda s: s is None or isinstance(s, (PartitionSpec, jax.sharding.Sharding))  # noqa: E731
    if not any(isinstance(s, (PartitionSpec, NamedSharding)) for s in jax.tree.leaves(shardings, is_leaf=is_spec)):
        return None
    try:
        full = jax.tree.broadcast(shardings, values, is_leaf=is_spec)
    except (ValueError, TypeError):
        return None
    shapes = [getattr(v, "shape", None) for v in jax.tree.leaves(values)]
    leaves, tree = jax.tree.flatten(full, is_leaf=is_spec)
    if len(leaves) != len(shapes):
        return None
    return jax.tree.unflatten(tree, [session.repair(s, None if shape is None else tuple(shape), api_name,
                                                    divisibility) for s, shape in zip(leaves, shapes)])


def _suspendable_check(original, active):
    def body(session, *args, **kwargs):
        if session.aval_checks_suspended:
            return None
        return original(*args, **kwargs)
    return _gated(original, active, body)


def _jit_boundary(original, check, active, avals_name: str, avals_index: int, api_name: str):
    """A jit's in/out shardings (of jits traced inside a session): JAX's canonicalization runs uncached with the
    aval check suspended, each flat sharding is repaired for its aval, then JAX's check runs on the result. Uncached
    because its cache key has no trace context: a lenient result must not be served outside the session."""
    uncached = getattr(original, "__wrapped__", original)

    def body(session, *args, **kwargs):
        session.aval_checks_suspended += 1
        try:
            flat, layouts = uncached(*args, **kwargs)
        finally:
            session.aval_checks_suspended -= 1
        avals = kwargs[avals_name] if avals_name in kwargs else args[avals_index]
        fixed = tuple(session.repair(s, tuple(a.shape), api_name) for s, a in zip(flat, avals))
        check(fixed, avals, ("",) * len(avals), f"pjit {api_name}", allow_uneven_sharding=False)
        return fixed, layouts
    return _gated(original, active, body)
