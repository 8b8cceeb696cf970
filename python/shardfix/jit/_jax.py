"""Every private JAX access shardfix makes, in one place.

shardfix needs a few things JAX has no public API for: a Lowered whose module was replaced, JAX's C++ call
dispatcher for its own functions, two hooks (around the tracing of every jit and around every XLA compile), wrappers
around the functions where JAX checks sharding specs while tracing, config values that keep JAX's caches apart while
shardfix is at work, JAX's trace context, its traceback filtering, and jaxlib's call inliner. Each is reached here
and nowhere else, switched by version where JAX differs (the tested range is 0.10.2 to 0.12.0.1: so far none of
these differ); tests/test_jax_internals.py exercises every one of them on the installed JAX
so that a move fails loudly there."""

from __future__ import annotations

import copy
import functools
import inspect
import os
import sys
import threading
from typing import Any, Callable

import jax
import jaxlib
from jax._src import config as _config
from jax._src import core as _core
from jax._src import pjit as _pjit
from jax._src import source_info_util, traceback_util
from jax._src import tree_util as _tree_util
from jax._src import util as _util
from jax._src.named_sharding import DuplicateSpecError
from jax._src.named_sharding import UnspecifiedValue as _UNSPECIFIED_TYPE
from jax._src.interpreters import pxla as _pxla
from jax._src.lib import _jax as _xla_ext
from jaxlib.mlir import ir

JAX_VERSION = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())

# ---------------------------------------------------------------------------------------------------------------
# Tracebacks: shardfix's frames are hidden from user tracebacks, and never taken for the user's frame, exactly as
# JAX treats its own (traceback filtering and source_info have separate registries; the latter needs a trailing
# separator to match a directory).

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
traceback_util.register_exclusion(PACKAGE_DIR)
source_info_util.register_exclusion(PACKAGE_DIR + os.sep)

api_boundary = traceback_util.api_boundary
wraps = _util.wraps  # how jax.jit names its functions after the user's


# ---------------------------------------------------------------------------------------------------------------
# MLIR (the context itself is shardfix.ir's, built from jaxlib's MLIR modules).


def uses_shardy() -> bool:
    """Whether JAX lowers to Shardy (`sdy`) shardings rather than GSPMD's `mhlo.sharding` strings."""
    return bool(_config.use_shardy_partitioner.value)


# ---------------------------------------------------------------------------------------------------------------
# Stages: a Lowered with another module, and JAX's stage objects as instances of shardfix's subclasses.


def lowered_module(lowered: jax.stages.Lowered) -> ir.Module:
    """JAX's own module object of `lowered` (read it; never change it: JAX caches it)."""
    return lowered._lowering.stablehlo()


def compile_shardings(lowered: jax.stages.Lowered) -> tuple[tuple, tuple]:
    """The (in, out) shardings JAX will compile `lowered`'s entry computation with."""
    args = lowered._lowering.compile_args
    return tuple(args["in_shardings"]), tuple(args["out_shardings"])


def lowering_devices(lowered: jax.stages.Lowered):
    """The devices JAX compiles `lowered` for (None where it has none yet)."""
    return getattr(lowered._lowering, "_device_list", None)


def mesh_on(devices, axes: tuple, device_ids: tuple | None = None) -> jax.sharding.Mesh:
    """A Mesh of the named `axes` ((name, size), ...) over a compile's devices (a module's mesh lays them out in
    their order, or in the order of its device ids), with Auto axes."""
    import numpy as np
    devices = list(devices)
    ordered = devices if not device_ids else [devices[i] for i in device_ids]
    return jax.sharding.Mesh(np.array(ordered).reshape([size for _, size in axes]), tuple(n for n, _ in axes))


def relowered(lowered: jax.stages.Lowered, module: ir.Module, in_shardings: tuple, out_shardings: tuple,
              cls: type) -> jax.stages.Lowered:
    """A `cls` (a jax.stages.Lowered subclass) that compiles `module` in place of `lowered`'s, with the entry
    shardings JAX should expect. JAX's own lowering object is copied, never changed."""
    new = copy.copy(lowered._lowering)
    new._hlo = module
    new._executable = None
    new.compile_args = {**new.compile_args, "in_shardings": in_shardings, "out_shardings": out_shardings}
    result = cls.__new__(cls)
    jax.stages.Lowered.__init__(result, new, lowered.args_info, lowered.out_tree, no_kwargs=lowered._no_kwargs,
                                in_types=lowered._in_types, out_types=lowered._out_types)
    return result


def as_subclass(stage: Any, cls: type) -> Any:
    """A shallow copy of a JAX stage object (Traced, Lowered, Compiled) whose class is `cls`, a subclass of its
    own: JAX's stage classes have no public constructors, and their fields differ between versions."""
    new = copy.copy(stage)
    new.__class__ = cls
    return new


def compiled_input_shardings(compiled: jax.stages.Compiled) -> list:
    """The executable's flat input shardings, one per argument leaf (None for a leaf it doesn't use)."""
    return list(compiled._input_shardings_flat())


def is_input_sharding_mismatch(error: BaseException) -> bool:
    """Whether `error` is a Compiled call's refusal of arguments committed to other shardings than it takes."""
    return isinstance(error, ValueError) and str(error).startswith(
        "Computation was compiled for input shardings that disagree")


# ---------------------------------------------------------------------------------------------------------------
# jax.jit objects.


def is_jax_jit(fun: Any) -> bool:
    """Whether `fun` is what jax.jit returns."""
    return isinstance(fun, _xla_ext.PjitFunction) and hasattr(fun, "_jit_info")


def jit_options_of(jitted: Any) -> tuple[Callable, dict]:
    """The function and the jax.jit keyword arguments of a `jax.jit` object, as JAX resolved them (static and
    donated arguments by number and by name; in/out shardings as trees, with their layouts as Formats)."""
    info = jitted._jit_info
    options: dict = dict(static_argnums=info.static_argnums, static_argnames=info.static_argnames,
                         donate_argnums=info.donate_argnums, donate_argnames=info.donate_argnames,
                         keep_unused=info.keep_unused, device=info.device, backend=info.backend, inline=info.inline,
                         compiler_options=dict(info.compiler_options_kvs) or None)
    for side in ("in", "out"):
        leaves = getattr(info, f"{side}_shardings_leaves")
        layouts = getattr(info, f"{side}_layouts_leaves")
        if all(isinstance(x, _UNSPECIFIED_TYPE) for x in leaves) and not any(layouts):
            continue
        if any(layouts):
            from jax._src.layout import Format
            leaves = [s if layout is None else Format(layout, None if isinstance(s, _UNSPECIFIED_TYPE) else s)
                      for s, layout in zip(leaves, layouts)]
        options[f"{side}_shardings"] = getattr(info, f"{side}_shardings_treedef").unflatten(leaves)
    return jitted._fun, options


def mark_as_jit(function: Callable, fun: Callable, jitted: Any) -> None:
    """Give a C++ dispatcher the attributes jax.jit's functions carry (the function, its jit info), which JAX's
    own tools (jax.export, AOT lowering, the stage API) read."""
    function._fun, function._jit_info = fun, jit_info(jitted)


def jit_info(jitted: Any) -> Any:
    """A jax.jit object's resolved options (what JAX reads off a jit function, as its NaN checks do)."""
    return jitted._jit_info


def jit_shardings_key(jitted: Any) -> tuple:
    """A jax.jit object's in/out shardings and layouts, hashable: jits made with equal ones behave the same."""
    info = jitted._jit_info
    return tuple((getattr(info, f"{name}_treedef"), getattr(info, f"{name}_leaves"))
                 for name in ("in_shardings", "out_shardings", "in_layouts", "out_layouts"))


def static_arguments(jitted: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(static_argnums, static_argnames) of a jax.jit object as JAX resolved them against the signature (0.12
    normalises negative numbers when the jit is made; older versions per call, as the C++ dispatcher does)."""
    info = jitted._jit_info
    return tuple(info.static_argnums), tuple(info.static_argnames)


def static_positions(static_argnums: tuple[int, ...], nargs: int) -> set[int]:
    """The positions of a call with `nargs` positional arguments that are static, resolved as JAX's dispatcher
    resolves them: a negative number counts from the end of this call's arguments; numbers out of range are
    ignored (JAX validated them against the signature when the jit was made)."""
    return {n + nargs if n < 0 else n for n in static_argnums if -nargs <= n < nargs}


def call_signature(args: tuple, kwargs: dict, static_argnums: tuple[int, ...], static_argnames: tuple[str, ...]
                   ) -> tuple:
    """A hashable key for everything a call's in/out sharding corrections depend on, as the dispatcher tells calls
    apart: the arguments' tree, the static values, each leaf's type, shape, dtype, weak type and sharding (with
    whether it is committed), JAX's trace context and the context meshes. Top level only (no tracers)."""
    from jax._src import mesh as mesh_lib
    positions = static_positions(static_argnums, len(args))
    names = set(static_argnames)
    statics = (tuple(args[i] for i in sorted(positions)),
               tuple(sorted((k, v) for k, v in kwargs.items() if k in names)))
    dynamic = (tuple(a for i, a in enumerate(args) if i not in positions),
               {k: v for k, v in kwargs.items() if k not in names})
    leaves, tree = jax.tree.flatten(dynamic)
    return (tree, statics, tuple(_leaf_signature(x) for x in leaves), _config.trace_context(),
            jax.sharding.get_mesh(), mesh_lib.thread_resources.env.physical_mesh)


def _leaf_signature(x: Any) -> tuple:
    if isinstance(x, jax.Array):
        # a typed PRNG key is a jax.Array without weak_type
        return type(x), x.shape, x.dtype, getattr(x, "weak_type", False), x.sharding, x.committed
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return type(x), tuple(x.shape), x.dtype
    return (type(x),)


def jit_cache_miss(jitted: Any) -> Callable:
    """The Python function a jax.jit object's C++ dispatcher calls on a miss: it traces, lowers, compiles and runs,
    and returns (outputs, the data that lets the dispatcher run the executable itself next time, a flag)."""
    return jitted._cache_miss


def cpp_dispatcher(fun: Callable, name: str, cache_miss: Callable, static_argnums: tuple[int, ...],
                   static_argnames: tuple[str, ...]) -> Callable:
    """JAX's C++ dispatcher for `fun` (the object jax.jit returns), calling `cache_miss` for call signatures it
    hasn't seen, with a cache of its own (never JAX's: its executables are shardfix's); `jax.clear_caches()` empties
    it."""
    return _xla_ext.pjit(name, fun, cache_miss, list(static_argnums), list(static_argnames),
                         _pxla.JitGlobalCppCacheKeys(), _tree_util.dispatch_registry, _pxla.cc_shard_arg,
                         _xla_ext.PjitFunctionCache())


def clear_dispatcher(dispatcher: Callable) -> None:
    dispatcher._clear_cache()


def under_trace() -> bool:
    """Whether the caller runs inside a JAX transformation's trace (an enclosing jit, grad, vmap, ...)."""
    return not _core.trace_state_clean()


# ---------------------------------------------------------------------------------------------------------------
# JAX's caches.


def register_cache(obj: Any, what: str) -> None:
    """Have `jax.clear_caches()` call `obj.cache_clear()` (JAX holds `obj` weakly: keep it alive)."""
    _util.register_cache(obj, what)


# A config value in JAX's trace context and jit cache key: 0 normally, another number while shardfix traces and
# compiles (one per set of shardfix options). Every JAX cache keyed on the trace context (traced jaxprs, lowerings,
# the C++ dispatch caches) therefore keeps shardfix's traces and executables apart from plain JAX's.
SESSION_STATE_NAME = "shardfix_session"
_session_state = _config.int_state(
    SESSION_STATE_NAME, 0, help="shardfix's options while it traces and compiles (0: none); keys JAX's caches",
    include_in_jit_key=True, include_in_trace_context=True)


def session_state(value: int):
    """A context manager setting the session value for the current thread."""
    return _session_state(value)


def set_global_session_state(value: int) -> None:
    jax.config.update(SESSION_STATE_NAME, value)


def global_session_state() -> int:
    return _session_state.get_global()


# ---------------------------------------------------------------------------------------------------------------
# Hooks: one around the tracing of every jax.jit (JAX's trace cache miss), one around every XLA compile of a module
# (jit calls, AOT compiles, eager operations, library jits). Installed once; each calls JAX's own function at once
# unless shardfix has work to do (the callbacks decide).

TraceHook = Callable[[Callable, tuple, dict], Any]  # (JAX's trace function, its args, its kwargs) -> its result
CompileHook = Callable[[Callable, str, ir.Module, dict], Any]  # (JAX's from_hlo, name, module, its kwargs)

_hooks_lock = threading.Lock()
_original_trace: Callable | None = None
_original_from_hlo: Callable | None = None


def install_hooks(on_trace: TraceHook, on_compile: CompileHook) -> None:
    """Route every jit trace through `on_trace` and every compile through `on_compile` (idempotent)."""
    global _original_trace, _original_from_hlo
    with _hooks_lock:
        if _original_trace is not None:
            return
        _original_trace = _pjit._trace_for_jit  # looked up as a module global by pjit._infer_params
        _original_from_hlo = _pxla.UnloadedMeshExecutable.from_hlo  # a staticmethod: a plain function here
        trace, from_hlo = _original_trace, _original_from_hlo

        def _trace_for_jit(*args, **kwargs):
            return on_trace(trace, args, kwargs)

        def _from_hlo(name, hlo, *args, **kwargs):
            if args:  # JAX passes everything after the module by keyword; keep any other call as it is
                return from_hlo(name, hlo, *args, **kwargs)
            return on_compile(from_hlo, name, hlo, kwargs)

        _pjit._trace_for_jit = _trace_for_jit
        _pxla.UnloadedMeshExecutable.from_hlo = staticmethod(_from_hlo)


def hooks_installed() -> bool:
    return _original_trace is not None


def trace_function_name(args: tuple) -> str:
    """The traced function's name, from `_trace_for_jit(fun, jit_info, ...)`'s arguments."""
    fun = args[0] if args else None
    return getattr(fun, "__name__", None) or type(fun).__name__


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

_spec_hooks_lock = threading.Lock()
_spec_hooks_installed = False
_repair_key_state = None


def install_spec_hooks(active) -> None:
    """Wrap JAX's trace-time spec checks (once per process; later calls do nothing)."""
    global _spec_hooks_installed, _repair_key_state
    with _spec_hooks_lock:
        if _spec_hooks_installed:
            return
        from jax._src import api, array, config, core, named_sharding, pjit, sharding_impls

        # shardfix's frames (these wrappers among them) are already out of filtered tracebacks and op locations:
        # PACKAGE_DIR is registered with both when this module is imported.
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
        _rebind(pjit.with_sharding_constraint, _constraint(pjit.with_sharding_constraint, pjit.reshard,
                                                           pjit.assert_shardings_equal, active))
        _rebind(pjit.reshard, _on_tree(pjit.reshard, active, "reshard", lambda: True))
        _rebind(api.device_put, _device_put(api.device_put, active))
        _rebind(array.make_array_from_callback, _from_callback(array.make_array_from_callback, active))
        check = pjit.pjit_check_aval_sharding
        _rebind(check, _suspendable_check(check, active))
        _rebind(pjit._process_in_axis_resources,
                _jit_boundary(pjit._process_in_axis_resources, check, active, "in_avals", 4, "in_shardings"))
        _rebind(pjit._check_and_canonicalize_out_shardings,
                _jit_boundary(pjit._check_and_canonicalize_out_shardings, check, active, "out_avals", 5,
                              "out_shardings"))
        _spec_hooks_installed = True


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


def has_explicit_axes(mesh) -> bool:
    """Whether any axis of `mesh` (a Mesh or AbstractMesh) is Explicit."""
    from jax.sharding import AxisType
    return any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()) or ())


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
    """Every typed value's sharding passes here with its shape (reshard, out_sharding=, device_put results). What JAX
    takes as it is stays as it is (JAX 0.10 takes a spec with more trailing None entries than the value has dims
    where libraries such as Flax give one); what it rejects is repaired."""
    def body(session, sharding, shape):
        try:
            result = original(sharding, shape)
        except Exception:  # noqa: BLE001  (JAX says no in several ways; the repaired spec goes to it again)
            return original(session.repair(sharding, tuple(shape), "out_sharding"), shape)
        # What canonicalization fixed is recorded; what only the (lenient) construction checks reject (a duplicate
        # axis in the result a sharding rule built, say) is repaired.
        fixed = session.repair(sharding, tuple(shape), "out_sharding", accepted=True)
        return result if fixed is sharding else original(fixed, shape)
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


def _constraint(original, reshard, assert_equal, active):
    """with_sharding_constraint: each spec repaired for its leaf; and where every mesh axis is Explicit, where JAX
    makes the constraint an assert of the value's sharding, a value sharded otherwise is resharded to it first, as
    the code meant (Equinox's filter_shard, Flax's logical constraints), the move recorded as a fix."""
    from jax.sharding import NamedSharding, PartitionSpec

    def body(session, values, shardings, *args, **kwargs):
        divides = all_axes_explicit()
        fixed = _repair_tree(session, values, shardings, "with_sharding_constraint", divides)
        if divides:
            full = fixed if fixed is not None else _leaf_tree(values, shardings)
            if full is not None:
                leaves, tree = jax.tree.flatten(values)
                targets = tree.flatten_up_to(full)
                moved = [_reshard_if_elsewhere(session, x, s, reshard, assert_equal) for x, s in zip(leaves, targets)]
                values = jax.tree.unflatten(tree, moved)
                fixed = full
        return original(values, shardings if fixed is None else fixed, *args, **kwargs)

    def _leaf_tree(values, shardings):
        is_spec = lambda s: s is None or isinstance(s, (PartitionSpec, jax.sharding.Sharding))  # noqa: E731
        try:
            return jax.tree.broadcast(shardings, values, is_leaf=is_spec)
        except (ValueError, TypeError):
            return None

    def _reshard_if_elsewhere(session, x, target, reshard, assert_equal):
        if not isinstance(target, (PartitionSpec, NamedSharding)) or not hasattr(x, "shape"):
            return x
        named = target if isinstance(target, NamedSharding) else NamedSharding(context_mesh(), target)
        aval = _core.typeof(x)
        try:
            assert_equal(aval, named)
            return x
        except AssertionError:
            pass
        session.explicit_reshard(aval.sharding.spec, named.spec, tuple(aval.shape), named.mesh,
                                 getattr(aval.dtype, "itemsize", None))
        return reshard(x, target)

    return _gated(original, active, body)


def _device_put(original, active):
    def body(session, x, device=None, *args, **kwargs):
        if device is None:
            return original(x, device, *args, **kwargs)
        fixed = _repair_tree(session, x, device, "device_put", True)
        return original(x, device if fixed is None else fixed, *args, **kwargs)
    return _gated(original, active, body)


def _from_callback(original, active):
    def body(session, shape, *args, **kwargs):
        fix = lambda s: session.repair(s, tuple(shape), "make_array_from_callback")  # noqa: E731
        if "sharding" in kwargs:
            return original(shape, *args, **{**kwargs, "sharding": fix(kwargs["sharding"])})
        return original(shape, fix(args[0]), *args[1:], **kwargs)
    return _gated(original, active, body)


def _repair_tree(session, values, shardings, api_name: str, divisibility: bool):
    """The sharding tree broadcast over `values` with each leaf repaired, or None where it doesn't broadcast (JAX
    then reports the structure) or holds nothing to repair."""
    from jax.sharding import NamedSharding, PartitionSpec
    is_spec = lambda s: s is None or isinstance(s, (PartitionSpec, jax.sharding.Sharding))  # noqa: E731
    if not any(isinstance(s, (PartitionSpec, NamedSharding)) for s in jax.tree.leaves(shardings, is_leaf=is_spec)):
        return None
    try:  # one sharding per leaf of `values` (a None among the values has none), as JAX broadcasts them
        full = jax.tree.broadcast(shardings, values, is_leaf=is_spec)
        tree = jax.tree.structure(values)
        leaves = tree.flatten_up_to(full)
    except (ValueError, TypeError):
        return None
    values = jax.tree.leaves(values)
    return jax.tree.unflatten(tree, [session.repair(s, _shape(v), api_name, divisibility, itemsize=_itemsize(v))
                                     for s, v in zip(leaves, values)])


def _shape(value) -> tuple | None:
    shape = getattr(value, "shape", None)
    return None if shape is None else tuple(shape)


def _itemsize(value) -> int | None:
    return getattr(getattr(value, "dtype", None), "itemsize", None)


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
    signature = inspect.signature(uncached)

    def body(session, *args, **kwargs):
        session.aval_checks_suspended += 1
        try:
            flat, layouts = uncached(*args, **kwargs)
        finally:
            session.aval_checks_suspended -= 1
        avals = kwargs[avals_name] if avals_name in kwargs else args[avals_index]
        sites = _boundary_sites(signature, api_name, args, kwargs, len(flat))
        fixed = tuple(session.repair(s, tuple(a.shape), site, itemsize=_itemsize(a))
                      for s, a, site in zip(flat, avals, sites))
        check(fixed, avals, ("",) * len(avals), f"pjit {api_name}", allow_uneven_sharding=False)
        return fixed, layouts
    return _gated(original, active, body)


def _boundary_sites(signature: inspect.Signature, what: str, args: tuple, kwargs: dict, count: int) -> list[str]:
    """The decorator's words for each flat in/out sharding of a jit: `in_shardings[0]['w']`, `out_shardings[1]`
    (the key path over the positional arguments, or the results), read off the tree JAX flattened them with."""
    bound = signature.bind(*args, **kwargs).arguments
    if what == "out_shardings":
        tree = bound["out_tree"]
    else:  # 0.12 passes the arguments' tree; 0.10 a flat tree of avals that holds it
        tree = bound["in_tree"] if "in_tree" in bound else bound["in_avals"].tree_without_statics
        if not bound["kws"]:
            tree = tree.children()[0]
    if tree.num_leaves != count:
        return [what] * count
    paths = jax.tree_util.tree_flatten_with_path(jax.tree.unflatten(tree, [0] * count))[0]
    return [what + jax.tree_util.keystr(path) for path, _ in paths]


# ---------------------------------------------------------------------------------------------------------------
# Autodiff ties (ring/ties.py): while a repair session traces, each shard_map JAX linearizes (jax.grad, jax.vjp)
# gets its forward and tangent regions staged under scopes of their own, and the transpose of the tangent region
# under one more, each scope naming what its region's results (forward, tangent) or operands (backward) are in
# terms of the original shard_map's results. JAX's dead-code elimination of such a region renames its scope to one
# naming what it kept. Wrapped: LinearizeTrace.process_shard_map, DynamicJaxprTrace.process_shard_map (staging),
# the shard_map transpose rule (ad.fancy_transposes on JAX 0.12, ad.primitive_transposes on 0.10) and its DCE rule
# (which takes live_ins before the eqn on 0.12). What is not found as expected is left untied (callers refuse).
# While a tied shard_map's body is linearized, LinearizeTrace.process_primitive and its custom_jvp / custom_vjp
# calls are wrapped too: each derivative rule the module won't show (any primitive outside _STANDARD), met there or
# in a jaxpr bound there, is recorded in the ring's ties (Tie.rules).

import contextvars as _contextvars

_ties_installed = False
_linearizing: _contextvars.ContextVar = _contextvars.ContextVar("shardfix_linearizing", default=None)
_transposing: _contextvars.ContextVar = _contextvars.ContextVar("shardfix_transposing", default=None)
# the shard_maps whose bodies JAX is linearizing now, innermost last (a rule met in a nested one is the outer's too)
_deriving: _contextvars.ContextVar = _contextvars.ContextVar("shardfix_deriving", default=())
# The primitives whose derivative JAX computes as the derivative of what they lower to (an allow-list): element-wise
# arithmetic, comparisons and converts, reductions, data movement, calls, loops and branches (their bodies are walked
# and bound one by one), collectives and layout assertions. Any other primitive a tied ring's body differentiates is
# a derivative rule the module does not show (stop_gradient lowers to nothing, a custom rule's call, a linear solve
# or a hijax primitive to its primal), so the stabiliser check fails naming it: a primitive JAX adds later is refused
# until it is listed here.
_STANDARD = frozenset("""
    abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp clz complex conj convert_element_type
    bitcast_convert_type copy copy_p cos cosh div eq ne lt le gt ge erf erf_inv erfc exp exp2 expm1 floor imag
    integer_pow is_finite log log1p log2 logistic max min mul neg nextafter not one_minus_square or population_count pow
    real rem round
    rsqrt select_n shift_left shift_right_arithmetic shift_right_logical sign sin sinh sqrt square sub tan tanh xor
    broadcast_in_dim concatenate dynamic_slice dynamic_update_slice gather iota pad reshape rev slice squeeze
    transpose split stack unstack tile scatter-add argmax argmin cumsum reduce_sum reduce_max reduce_min reduce_prod reduce_and
    reduce_or reduce_xor reduce_precision dot_general zeros_like empty empty2
    jit pjit closed_call core_call call remat2 checkpoint scan while cond shard_map
    ppermute psum pmax pmin all_gather all_gather_invariant all_to_all reduce_scatter axis_index psum_invariant
    pbroadcast pvary pcast sharding_constraint reshard mesh_cast optimization_barrier
""".split())
# how the tie's reason names the rules people meet most
_RULES = {"stop_gradient": "stop_gradient", "custom_jvp_call": "custom_jvp", "custom_vjp_call": "custom_vjp",
          "custom_vjp_call_jaxpr": "custom_vjp", "custom_lin": "custom_vjp"}


def _rule(primitive: Any, params: dict) -> str | None:
    """How a tie names the derivative rule `primitive` is (None: a standard one, in _STANDARD, or a custom_jvp call
    of a rule `_exact_rule` knows)."""
    name = primitive.name
    if name in _STANDARD:
        return None
    if name == "custom_jvp_call" and _exact_rule(params.get("jvp_jaxpr_fun")):
        return None
    hijax = params.get("_prim")  # a hijax primitive (custom_root, custom_vjp under jax_custom_vjp3) names its kind
    return _RULES.get(name) or (type(hijax).__name__ if hijax is not None else name)


# JAX's own custom_jvp rules that are the derivative of their primal wherever its arguments are finite, or one of
# them -inf (which gets weight exp(-inf - out) = 0, as in the derivative's limit; both -inf give nan): jax.numpy.logaddexp (and so
# jax.nn.softplus and log_sigmoid, which call it), whose primal is smooth there and whose rule is t1 e^(x1 - out) +
# t2 e^(x2 - out). A ring that differentiates through it differentiates the function the forward computes, so such
# a call is no rule the module does not show. Known by where JAX defined the rule (its `fun_sourceinfo`, which the
# rule's traced function carries as debug info), so a user's custom_jvp of the same name is still recorded.
_exact_rules: frozenset[str] | None = None


def _exact_rule(jvp: Any) -> bool:
    """Whether `jvp` (a custom_jvp call's traced rule, a WrappedFun) is one of the rules above."""
    global _exact_rules
    if _exact_rules is None:
        from jax._src import api_util
        from jax._src.lax import other
        _exact_rules = frozenset({api_util.fun_sourceinfo(other.logaddexp.jvp)})
    where = getattr(getattr(jvp, "debug_info", None), "func_src_info", None)
    return where is not None and where in _exact_rules


# JAX's own functions whose stop_gradient and abs leave the derivative the function's: jax.nn.logsumexp stops
# the maximum c it shifts by, and log(sum(exp(a - c))) + c is the same for every c, so holding c constant changes no
# derivative; its abs is of that sum, which holds exp(0) = 1 wherever the maximum is finite and no weight `b` is
# given (a row whose scores are all -inf is refused before: logsum.py; with `b` its kink is where the sum is 0 and
# the result -inf), so it is not at its kink where the result is finite. Known by the function's code object: the op
# is that function's own where, going out from the binding, that function's frame comes before any frame outside
# JAX, this package and the standard library (the function converts its arguments, which may run a user's
# `__jax_array__`: an op bound there is the user's).
_exact_functions: frozenset | None = None
_internal_dirs: tuple[str, ...] = ()
_standard: list[str] = []  # the standard library's directory
_installed: list[str] = []  # where packages are installed (under the standard library's directory on some Pythons)


def _bound_by_exact_function(source_info: Any) -> bool:
    """Whether the op `source_info` describes was bound by one of the functions above."""
    global _exact_functions, _internal_dirs
    if _exact_functions is None:
        import sysconfig
        from jax._src.ops import special
        _internal_dirs = tuple(os.path.join(os.path.dirname(os.path.abspath(m.__file__)), "") for m in (jax, jaxlib))
        _internal_dirs += (os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ""),)
        paths = sysconfig.get_paths()
        _standard[:] = [os.path.join(paths["stdlib"], "")]
        _installed[:] = [os.path.join(paths[k], "") for k in ("purelib", "platlib")]
        _exact_functions = frozenset({special.logsumexp.__code__})  # last: set, the others are
    traceback = getattr(source_info, "traceback", None)
    if traceback is None:
        return False
    codes, _ = traceback.raw_frames()
    for code in codes:  # innermost first
        if code in _exact_functions:
            return True
        where = os.path.abspath(code.co_filename)
        if not (where.startswith(_internal_dirs) or where.startswith(tuple(_standard))
                and not where.startswith(tuple(_installed))):
            return False
    return False


class _Staged:
    """What one staging call under a tie scope made: the scope, the eqn's operands and results, the call's args."""

    def __init__(self, scope: str, eqn: Any, args: list, outs: list):
        self.scope, self.eqn, self.args, self.outs = scope, eqn, args, outs


class _Linearizing:
    def __init__(self, trace: Any):
        self.trace = trace
        self.forward: _Staged | None = None
        self.tangent: _Staged | None = None
        self.rules: list[str] = []  # derivative rules met in the body the module won't show ("stop_gradient at ...")
        self.kinks: list[str] = []  # ops differentiated in the body that _KINKED names ("abs at ...")


class _Transposing:
    def __init__(self):
        self.staged: _Staged | None = None


def _scopes(name_stack) -> list[str]:
    return [s.name for s in name_stack.stack if isinstance(s, source_info_util.Scope)]


def _renamed(name_stack, old: str, new: str):
    stack = tuple(source_info_util.Scope(new) if isinstance(s, source_info_util.Scope) and s.name == old else s
                  for s in name_stack.stack)
    return source_info_util.NameStack(stack)


def install_autodiff_ties(active) -> None:
    """Wrap JAX's shard_map autodiff rules to record ties (once per process), while `active()` is not None."""
    global _ties_installed
    with _spec_hooks_lock:
        if _ties_installed:
            return
        from jax._src import shard_map as sm
        from jax._src.interpreters import ad, partial_eval as pe
        prim = sm.shard_map_p
        table = getattr(ad, "fancy_transposes", {})
        table = table if prim in table else ad.primitive_transposes
        ad.LinearizeTrace.process_shard_map = _tie_linearize(ad.LinearizeTrace.process_shard_map, active, ad)
        ad.LinearizeTrace.process_primitive = _rules_primitive(ad.LinearizeTrace.process_primitive)
        for method, kind in (("process_custom_jvp_call", "custom_jvp"), ("process_custom_vjp_call", "custom_vjp")):
            setattr(ad.LinearizeTrace, method, _rules_custom(getattr(ad.LinearizeTrace, method), kind))
        pe.DynamicJaxprTrace.process_shard_map = _tie_staging(pe.DynamicJaxprTrace.process_shard_map, prim)
        table[prim] = _tie_transpose(table[prim], active, ad)
        pe.dce_rules[prim] = _tie_dce(pe.dce_rules[prim])
        _ties_installed = True


def _tie_linearize(original, active, ad):
    from ..ring import ties

    @functools.wraps(original)
    def linearize(trace, shard_map_p, f, tracers, **params):
        if active() is None:
            return original(trace, shard_map_p, f, tracers, **params)
        record = _Linearizing(trace)
        token, deriving = _linearizing.set(record), _deriving.set(_deriving.get() + (record,))
        try:
            outs = original(trace, shard_map_p, f, tracers, **params)
        finally:
            _deriving.reset(deriving)
            _linearizing.reset(token)
        if record.forward is not None:  # what the body's linearization itself staged (a stop_gradient's primal)
            # (primal ops: their kinks are not differentiated there)
            _note_jaxprs(record.forward.eqn.params.values(), (record,), set(), kinks=False)
        rules, kinks = tuple(dict.fromkeys(record.rules)), tuple(dict.fromkeys(record.kinks))
        results = list(outs)
        primals = {id(o.primal if isinstance(o, ad.LinearizeTracer) else o): j for j, o in enumerate(results)}
        tangents = {id(o.tangent): j for j, o in enumerate(results) if isinstance(o, ad.LinearizeTracer)}
        ring = ties.new_ring()
        if record.forward is not None:
            slots = tuple(primals.get(id(x)) for x in record.forward.outs)
            ok = sorted(j for j in slots if j is not None) == list(range(len(results)))
            ties.bind(record.forward.scope, ties.Tie(ring, ties.Role.FORWARD, len(results), slots, rules=rules,
                                                     kinks=kinks) if ok else None)
        if record.tangent is not None:
            slots = tuple(tangents.get(id(x)) for x in record.tangent.outs)
            ok = None not in slots and len(set(slots)) == len(slots)
            ties.bind(record.tangent.scope, ties.Tie(ring, ties.Role.TANGENT, len(results), slots, rules=rules,
                                                     kinks=kinks) if ok else None)
        return outs
    return linearize


def _note(records: tuple, kind: str, source_info: Any) -> None:
    if kind == "stop_gradient" and _bound_by_exact_function(source_info):
        return
    where = source_info_util.summarize(source_info) if source_info is not None else "unknown"
    for record in records:
        record.rules.append(f"{kind} at {where}")


# Standard rules with a kink: at a tie between max's or min's operands, or at abs's 0, JAX's derivative splits the
# cotangent evenly (max, min) or takes one side (abs's derivative at 0 is 1), and where such ops nest at one tie
# (max(max(a, b), b)) the splits multiply. A merge of log-sum-exps differentiated through one is not differentiated
# as the function it computes where its operands tie (stabiliser.py, `_lse_invariant`); a block's maximum is a
# reduce_max, which the maxima check covers.
_KINKED = frozenset({"abs", "max", "min"})


def _note_kink(records: tuple, primitive: Any, source_info: Any) -> None:
    if primitive.name in _KINKED and not _bound_by_exact_function(source_info):
        where = source_info_util.summarize(source_info) if source_info is not None else "unknown"
        for record in records:
            record.kinks.append(f"{primitive.name} at {where}")


def _note_jaxprs(values, records: tuple, seen: set, kinks: bool = True) -> None:
    """Note every eqn of the jaxprs among `values` (params: a jaxpr, closed or not, or a tuple of them), nested ones
    included (loop and branch bodies, jit/closed_call/remat callees, custom rules' primals), whose primitive is not
    in _STANDARD: a jaxpr the body binds was traced before its linearization (and JAX caches the derivative of a
    jaxpr it has met, so its eqns' rules may never run again), and, with `kinks`, every eqn _KINKED names outside the
    primal of a rule `_exact_rule` knows (such a jaxpr's eqns are differentiated by their standard rules)."""
    for value in values:
        for item in value if isinstance(value, (tuple, list)) else (value,):
            jaxpr = getattr(item, "jaxpr", item)  # a ClosedJaxpr's open jaxpr
            if not isinstance(jaxpr, _core.Jaxpr) or id(jaxpr) in seen:
                continue
            seen.add(id(jaxpr))
            for eqn in jaxpr.eqns:
                if _constant(getattr(v, "aval", None) for v in eqn.invars):
                    continue  # nothing it computes is differentiated, its nested jaxprs included
                kind = _rule(eqn.primitive, eqn.params)
                if kind is not None:
                    _note(records, kind, eqn.source_info)
                if kinks:
                    _note_kink(records, eqn.primitive, eqn.source_info)
                if eqn.primitive.name == "custom_jvp_call" and kind is None:
                    continue  # a rule `_exact_rule` knows: its primal's ops are not differentiated
                _note_jaxprs(eqn.params.values(), records, seen, kinks)


def _constant(avals) -> bool:
    """Whether a primitive with operands of these types is constant in every value autodiff differentiates: none is
    of an inexact type (integers, booleans, PRNG keys; none at all). A JVP is linear in its operands' tangents,
    which are all zero there, so whatever the primitive's rule (random_bits, a key's split or fold_in), its result's
    tangent is zero, as the derivative of what it lowers to is."""
    for aval in avals:
        dtype = getattr(aval, "dtype", None)
        if dtype is None or jax.dtypes.issubdtype(dtype, jax.numpy.inexact):
            return False
    return True


def _rules_primitive(original):
    @functools.wraps(original)
    def process_primitive(trace, primitive, tracers, params, /):
        records = _deriving.get()
        if records and not _constant(jax.typeof(t) for t in tracers):
            kind = _rule(primitive, params)
            if kind is not None:
                _note(records, kind, source_info_util.current())
            _note_kink(records, primitive, source_info_util.current())
            _note_jaxprs(params.values(), records, set())
        return original(trace, primitive, tracers, params)
    return process_primitive


def _rules_custom(original, kind: str):
    @functools.wraps(original)
    def process_custom(trace, *args, **kwargs):
        records = _deriving.get()
        # process_custom_jvp_call(primitive, fun, jvp, tracers, ...): a rule `_exact_rule` knows is not noted
        if records and not (kind == "custom_jvp" and len(args) > 2 and _exact_rule(args[2])):
            _note(records, kind, source_info_util.current())
        return original(trace, *args, **kwargs)
    return process_custom


def _tie_staging(original, prim):
    from ..ring import ties

    @functools.wraps(original)
    def staging(trace, shard_map_p, f, args, **params):
        linearizing, transposing = _linearizing.get(), _transposing.get()
        role = None
        if linearizing is not None and trace is linearizing.trace.parent_trace and linearizing.forward is None:
            role = "forward"
        elif linearizing is not None and trace is getattr(linearizing.trace, "tangent_trace", None) \
                and linearizing.tangent is None:
            role = "tangent"
        elif transposing is not None and transposing.staged is None:
            role = "backward"
        if role is None:
            return original(trace, shard_map_p, f, args, **params)
        scope = ties.reserve()
        # shard_maps staged in this one's body are no part of its tie
        tokens = _linearizing.set(None), _transposing.set(None)
        try:
            with source_info_util.extend_name_stack(scope):
                out = original(trace, shard_map_p, f, args, **params)
        finally:
            _transposing.reset(tokens[1])
            _linearizing.reset(tokens[0])
        eqn = trace.frame.tracing_eqns[-1] if trace.frame.tracing_eqns else None
        eqn = eqn() if callable(eqn) and not hasattr(eqn, "primitive") else eqn
        # JAX 0.12 stages a vjp's tangent region as a VJPNode wrapping shard_map_p
        if eqn is None or getattr(eqn.primitive, "prim", eqn.primitive) is not prim \
                or scope not in _scopes(eqn.source_info.name_stack):
            return out  # not the eqn expected: the scope names no tie
        staged = _Staged(scope, eqn, list(args), list(out))
        if role == "forward":
            linearizing.forward = staged
        elif role == "tangent":
            linearizing.tangent = staged
        else:
            transposing.staged = staged
        return out
    return staging


def _tie_transpose(original, active, ad):
    from ..ring import ties

    @functools.wraps(original)
    def transpose(out_cts, *args, **params):
        scopes = _scopes(source_info_util.current().name_stack) if active() is not None else []
        found = ties.innermost(scopes)
        # the eqn transposed is the tangent region itself only where the tie's scope is its last
        if found is None or found[0] != scopes[-1] or found[1].role is not ties.Role.TANGENT \
                or len(found[1].slots) != len(out_cts):
            return original(out_cts, *args, **params)
        tangent = found[1]
        nonzero = [(j, ct) for j, ct in zip(tangent.slots, out_cts) if type(ct) is not ad.Zero]
        record = _Transposing()
        token = _transposing.set(record)
        try:
            result = original(out_cts, *args, **params)
        finally:
            _transposing.reset(token)
        staged = record.staged
        if staged is not None:
            # JAX binds the transpose on the nonzero cotangents, in order, then the rest; the staged eqn holds the
            # body's hoisted constants first
            consts = len(staged.eqn.in_tracers) - len(staged.args)
            lead = staged.args[:len(nonzero)]
            ok = consts >= 0 and len(lead) == len(nonzero) and all(
                _aval_key(a) == _aval_key(ct) for a, (_, ct) in zip(lead, nonzero))
            slots = (None,) * consts + tuple(j for j, _ in nonzero) + (None,) * (len(staged.args) - len(nonzero))
            zero = frozenset(range(tangent.results)) - {j for j, _ in nonzero}
            ties.bind(staged.scope, ties.Tie(tangent.ring, ties.Role.BACKWARD, tangent.results, slots, zero,
                                             tangent.rules, tangent.kinks) if ok else None)
        return result
    return transpose


def _aval_key(x: Any) -> tuple:
    """Shape and dtype of a traced value (what a cotangent and the operand bound for it share)."""
    aval = _core.typeof(x)
    return tuple(getattr(aval, "shape", ())), str(getattr(aval, "dtype", ""))


def _tie_dce(original):
    from ..ring import ties

    @functools.wraps(original)
    def dce(used_outputs, *rest):
        used_inputs, new_eqn = original(used_outputs, *rest)
        eqn = rest[-1]
        scopes = _scopes(eqn.source_info.name_stack)
        found = ties.innermost(scopes)
        # only the eqn staged right under its scope is tied (an eqn in its body may see the scope too)
        if new_eqn is None or found is None or scopes[-1] != found[0]:
            return used_inputs, new_eqn
        scope, tie = found
        used = used_inputs if tie.role is ties.Role.BACKWARD else used_outputs
        kept = tie.kept(list(used)) if len(used) == len(tie.slots) else None
        if kept == tie:
            return used_inputs, new_eqn
        renamed = ties.reserve()
        ties.bind(renamed, kept)
        source_info = new_eqn.source_info.replace(name_stack=_renamed(new_eqn.source_info.name_stack, scope,
                                                                      renamed))
        return used_inputs, new_eqn.replace(source_info=source_info)
    return dce
