"""`autofix_shardings`: a drop-in for `jax.jit` that lowers, fixes shardings, reorders rings, compiles and runs.

At the outermost level (concrete arguments) the function is lowered with JAX, the pipeline runs on a copy of the
module, and the patched module is compiled; executables are cached per input signature. Under an outer
transformation (tracer arguments: an enclosing jit, grad or vmap) there is no module of our own to patch, so the
function acts as `jax.jit` with corrected in/out shardings and the IR passes run only where the outermost call is
an `autofix_shardings` function.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import warnings
from typing import Any, Callable

import jax
from jax.sharding import NamedSharding, PartitionSpec

from .api import ShardingFixWarning, spec_to_model, to_named_sharding
from .correct import POLICIES, Site, correct_sharding
from .ir import SourceLoc
from .lowering import patch_lowered
from .pipeline import PassContext
from .report import Fix, RingDecision
from .sharding import Mesh, shard_count

logger = logging.getLogger("shardfix")
RING_MODES = ("auto", "off", "zigzag", "striped")
ON_FIX = ("warn", "log", "error", "ignore")


def default_pipeline(policy: str = "subaxis", ring_reorder: str = "auto") -> str:
    """The passes autofix_shardings runs on a lowered module."""
    pipeline = f"fix-shardings{{policy={policy}}}"
    if ring_reorder != "off":
        strategy = "zigzag" if ring_reorder == "auto" else ring_reorder
        pipeline += f",ring-reorder{{strategy={strategy}}},hoist-permutations"
    return pipeline


class ShardingFixError(ValueError):
    """Raised with `on_fix="error"` when shardfix would have changed a sharding."""


@dataclasses.dataclass(frozen=True)
class _Options:
    mesh: Any
    in_shardings: Any
    out_shardings: Any
    static_argnums: Any
    static_argnames: Any
    donate_argnums: Any
    donate_argnames: Any
    policy: str
    ring_reorder: str
    on_fix: str


_UNSPECIFIED = object()


def autofix_shardings(fun: Callable | None = None, *, mesh=None, in_shardings=_UNSPECIFIED,
                      out_shardings=_UNSPECIFIED, static_argnums=None, static_argnames=None, donate_argnums=None,
                      donate_argnames=None, policy: str = "subaxis", ring_reorder: str = "auto",
                      on_fix: str = "warn"):
    """Like `jax.jit`, with every sharding made valid and evenly divisible and ring attention balanced.

    Bare (`@autofix_shardings`) or with options; `autofix_shardings(jax.jit(f, ...))` takes over the jit's options.
    `mesh` defaults to the context mesh (`jax.set_mesh`), else the mesh of the arguments' NamedShardings.
    `on_fix`: "warn" (one ShardingFixWarning per compile), "log", "error" (ShardingFixError), or "ignore".
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    if ring_reorder not in RING_MODES:
        raise ValueError(f"ring_reorder must be one of {', '.join(RING_MODES)}; got {ring_reorder!r}")
    if on_fix not in ON_FIX:
        raise ValueError(f"on_fix must be one of {', '.join(ON_FIX)}; got {on_fix!r}")
    options = dict(mesh=mesh, in_shardings=in_shardings, out_shardings=out_shardings, static_argnums=static_argnums,
                   static_argnames=static_argnames, donate_argnums=donate_argnums, donate_argnames=donate_argnames,
                   policy=policy, ring_reorder=ring_reorder, on_fix=on_fix)
    if fun is None:
        return functools.partial(autofix_shardings, **options)
    fun, options = _unwrap_jit(fun, options)
    return AutofixFunction(fun, _Options(**options))


def _unwrap_jit(fun, options: dict):
    """Take the function and the jit options out of a `jax.jit` object (explicit options win)."""
    info = getattr(fun, "_jit_info", None)
    if info is None or not hasattr(fun, "_fun"):
        return fun, options
    options = dict(options)
    for name in ("in_shardings", "out_shardings"):
        leaves = getattr(info, f"{name}_leaves")
        if options[name] is _UNSPECIFIED and not all(type(x).__name__ == "UnspecifiedValue" for x in leaves):
            options[name] = jax.tree.unflatten(getattr(info, f"{name}_treedef"), leaves)
    for name in ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames"):
        if options[name] is None and getattr(info, name):
            options[name] = getattr(info, name)
    return fun._fun, options


class AutofixFunction:
    """The decorated function: call it, or `.lower(...)` it to look at the patched module and the fixes."""

    def __init__(self, fun: Callable, options: _Options):
        functools.update_wrapper(self, fun)
        self._fun, self._options = fun, options
        self._executables: dict = {}
        self._dispatch = _fast_dispatcher(fun, self._cache_miss, self._static_argnums_list(),
                                          list(options.static_argnames or ()))
        self.lower_count = 0  # how many times a call had to lower and compile (the cache's misses)
        source = inspect.unwrap(fun)
        try:
            self._loc = SourceLoc(inspect.getsourcefile(source) or "", source.__code__.co_firstlineno)
        except (TypeError, AttributeError):
            self._loc = SourceLoc(name=getattr(fun, "__name__", "function"))

    # -- calling -------------------------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        if self._dispatch is not None:
            return self._dispatch(*args, **kwargs)
        return self._run(*self._prepare(args, kwargs, stacklevel=5))

    def _cache_miss(self, *args, **kwargs):
        """Called by the C++ dispatcher for a signature it hasn't seen: (outputs, fast-path data or None, False).
        The executable runs exactly once here (donated arguments can't be used twice)."""
        prepared = self._prepare(args, kwargs, stacklevel=6)  # user, __call__, the C++ dispatcher, here, ...
        compiled, dyn_args, dyn_kwargs, moved = prepared
        if compiled is not None and not moved:
            fast = _fastpath_call(compiled._compiled, dyn_args, dyn_kwargs)
            if fast is not None:
                return fast[0], fast[1], False
        return self._run(*prepared), None, False

    def _run(self, compiled, dyn_args, dyn_kwargs, moved):
        if compiled is None:  # under a trace: dyn_args/dyn_kwargs are the full call
            return self._inner_jit(dyn_args, dyn_kwargs)(*dyn_args, **dyn_kwargs)
        return compiled._compiled(*dyn_args, **dyn_kwargs)

    def _static_argnums_list(self) -> list[int] | None:
        nums = self._options.static_argnums
        nums = () if nums is None else ((nums,) if isinstance(nums, int) else tuple(nums))
        if any(n < 0 for n in nums):
            return None  # negative positions depend on the call; keep to the Python path
        return sorted(nums)

    def _prepare(self, args, kwargs, stacklevel: int):
        """(the AutofixCompiled for this signature, compiling it on first sight, the dynamic arguments moved where
        it wants them, whether any moved); (None, args, kwargs, False) under an outer trace."""
        dyn_args, dyn_kwargs, statics = self._split_static(args, kwargs)
        leaves, tree = jax.tree.flatten((dyn_args, dyn_kwargs))
        signature = [tree, statics]
        for x in leaves:
            if isinstance(x, jax.core.Tracer):  # under an outer jit/grad/vmap
                return None, args, kwargs, False
            signature.append((x.shape, x.dtype, x.sharding, x.weak_type) if isinstance(x, jax.Array)
                             else (getattr(x, "shape", None), getattr(x, "dtype", type(x))))
        key = tuple(signature)
        compiled = self._executables.get(key)
        if compiled is None:
            compiled = self._executables[key] = self._lower(args, kwargs, stacklevel).compile()
        moves = compiled.moves(leaves)
        if moves:  # arguments committed to another sharding go where the executable wants them
            leaves = [jax.device_put(x, moves[i]) if i in moves else x for i, x in enumerate(leaves)]
            dyn_args, dyn_kwargs = jax.tree.unflatten(tree, leaves)
        return compiled, dyn_args, dyn_kwargs, bool(moves)

    def _split_static(self, args, kwargs):
        """(dynamic positional args, dynamic kwargs, hashable static values)."""
        if self._options.static_argnums is None and not self._options.static_argnames:
            return args, kwargs, ()
        static = self._static_positions(len(args))
        names = set(self._options.static_argnames or ())
        dyn_args = tuple(a for i, a in enumerate(args) if i not in static)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in names}
        statics = (tuple(args[i] for i in sorted(static) if i < len(args)),
                   tuple(sorted((k, v) for k, v in kwargs.items() if k in names)))
        return dyn_args, dyn_kwargs, statics

    def _static_positions(self, nargs: int) -> set[int]:
        nums = self._options.static_argnums
        nums = () if nums is None else ((nums,) if isinstance(nums, int) else tuple(nums))
        positions = {n % nargs if nargs else n for n in nums}
        params = list(inspect.signature(self._fun).parameters) if self._options.static_argnames else []
        positions |= {params.index(n) for n in self._options.static_argnames or () if n in params}
        return positions

    # -- lowering ------------------------------------------------------------------------------------------------

    def lower(self, *args, **kwargs) -> "AutofixLowered":
        """Lower with JAX, correct in/out shardings, run fix-shardings and ring-reorder on a copy of the module."""
        return self._lower(args, kwargs, stacklevel=4)

    def _lower(self, args, kwargs, stacklevel: int) -> "AutofixLowered":
        self.lower_count += 1
        boundary_fixes, jitted = self._corrected_jit(args, kwargs)
        lowered = jitted.lower(*args, **kwargs)
        pass_ctx = PassContext()
        patched, report = patch_lowered(lowered, self._pipeline(), pass_ctx)
        fixes = boundary_fixes + report.fixes
        _tell(fixes, self._options.on_fix, getattr(self._fun, "__name__", "function"), stacklevel)
        return AutofixLowered(patched, fixes, report.rings)

    def _pipeline(self) -> str:
        return default_pipeline(self._options.policy, self._options.ring_reorder)

    def _inner_jit(self, args, kwargs):
        return self._corrected_jit(args, kwargs)[1]

    def _corrected_jit(self, args, kwargs):
        """A jax.jit of the function whose in/out shardings are corrected for these arguments."""
        o = self._options
        mesh = self._resolve_mesh(args, kwargs) if (o.in_shardings, o.out_shardings) != (_UNSPECIFIED,) * 2 else None
        fixes: list[Fix] = []
        jit_kwargs = dict(static_argnums=o.static_argnums, static_argnames=o.static_argnames,
                          donate_argnums=o.donate_argnums, donate_argnames=o.donate_argnames)
        if o.in_shardings is not _UNSPECIFIED:
            static = self._static_positions(len(args))
            dynamic = tuple(a for i, a in enumerate(args) if i not in static)
            jit_kwargs["in_shardings"] = self._correct_tree(o.in_shardings, dynamic, mesh, "in_shardings", fixes)
        if o.out_shardings is not _UNSPECIFIED:
            shapes = jax.jit(self._fun, **{k: v for k, v in jit_kwargs.items() if k != "in_shardings"}) \
                .eval_shape(*args, **kwargs)
            jit_kwargs["out_shardings"] = self._correct_tree(o.out_shardings, shapes, mesh, "out_shardings", fixes)
        return fixes, jax.jit(self._fun, **jit_kwargs)

    def _resolve_mesh(self, args, kwargs):
        if self._options.mesh is not None:
            return self._options.mesh
        try:
            context = jax.sharding.get_mesh()
        except ValueError:  # under an outer jit only the abstract mesh is known
            context = jax.sharding.get_abstract_mesh()
        if context is not None and context.axis_names:
            return context
        for leaf in jax.tree.leaves((args, kwargs)):
            sharding = getattr(leaf, "sharding", None)
            if isinstance(leaf, jax.Array) and isinstance(sharding, NamedSharding):
                return sharding.mesh
        return None

    def _correct_tree(self, spec_tree, values, mesh, what: str, fixes: list[Fix]):
        """Each PartitionSpec/NamedSharding leaf corrected for the shape of the value it applies to."""
        is_leaf = lambda x: x is None or isinstance(x, (PartitionSpec, jax.sharding.Sharding))  # noqa: E731
        try:
            full = jax.tree.broadcast(spec_tree, values, is_leaf=is_leaf)
        except ValueError:
            return spec_tree  # let jax.jit report the structure mismatch in its own words
        paths_specs = jax.tree_util.tree_flatten_with_path(full, is_leaf=is_leaf)[0]
        shapes = jax.tree.leaves(values)
        corrected = [self._correct_leaf(spec, getattr(value, "shape", ()), mesh, f"{what}{jax.tree_util.keystr(path)}",
                                        fixes)
                     for (path, spec), value in zip(paths_specs, shapes)]
        return jax.tree.unflatten(jax.tree.structure(full, is_leaf=is_leaf), corrected)

    def _correct_leaf(self, spec, shape, mesh, site: str, fixes: list[Fix]):
        if spec is None or not isinstance(spec, (PartitionSpec, NamedSharding)):
            return spec
        target_mesh = spec.mesh if isinstance(spec, NamedSharding) else mesh
        if target_mesh is None:
            raise ValueError(f"{self._loc}: {site} is the PartitionSpec {spec} but there is no mesh to apply it to: "
                             "pass mesh=..., use jax.set_mesh, or give NamedShardings")
        spec = spec.spec if isinstance(spec, NamedSharding) else spec
        model_mesh = Mesh.of(dict(target_mesh.shape))
        before = spec_to_model(spec, rank=len(shape))
        after, reasons = correct_sharding(before, Site(tuple(shape), allow_subaxes=False), {"mesh": model_mesh},
                                          self._options.policy)
        if after != before:
            fixes.append(Fix("autofix_shardings", f"{site} (shape {tuple(shape)})", self._loc,
                             tuple((r.code, r.detail) for r in reasons), str(spec),
                             str(to_named_sharding(after, target_mesh).spec), shard_count(before, model_mesh),
                             shard_count(after, model_mesh)))
        return to_named_sharding(after, target_mesh)


def _tell(fixes: list[Fix], on_fix: str, name: str, stacklevel: int) -> None:
    if not fixes or on_fix == "ignore":
        return
    lines = [f"shardfix changed {len(fixes)} sharding(s) of {name}:"]
    for f in fixes:
        lines.append(f"  {f.location or '?'}: {f.site}: {f.before} -> {f.after} [{f.reason}]")
        lines += [f"      {detail}" for _, detail in f.reasons]
    text = "\n".join(lines)
    if on_fix == "error":
        raise ShardingFixError(text)
    if on_fix == "log":
        logger.warning(text)
    else:
        warnings.warn(text, ShardingFixWarning, stacklevel=stacklevel)


class AutofixLowered:
    """What `f.lower(...)` returns: the patched module, the fixes, the ring decisions."""

    def __init__(self, lowered: jax.stages.Lowered, fixes: list[Fix], rings: list[RingDecision]):
        self._lowered, self.fixes, self.rings = lowered, fixes, rings

    def as_text(self, *args, **kwargs) -> str:
        return self._lowered.as_text(*args, **kwargs)

    def compile(self) -> "AutofixCompiled":
        return AutofixCompiled(self._lowered.compile())


class AutofixCompiled:
    """A compiled executable that moves arguments placed with another sharding to the shardings it expects."""

    def __init__(self, compiled: jax.stages.Compiled):
        self._compiled = compiled
        self._expected = jax.tree.leaves(compiled.input_shardings)

    def as_text(self) -> str:
        return self._compiled.as_text()

    def __getattr__(self, name):
        return getattr(self._compiled, name)

    def moves(self, leaves) -> dict:
        """leaf index -> sharding, for the argument leaves committed to a sharding the executable doesn't take."""
        if len(leaves) != len(self._expected):
            return {}
        return {i: s for i, (x, s) in enumerate(zip(leaves, self._expected))
                if isinstance(x, jax.Array) and x.committed and x.sharding != s}

    def __call__(self, *args, **kwargs):
        leaves, tree = jax.tree.flatten((args, kwargs))
        moves = self.moves(leaves)
        if moves:
            leaves = [jax.device_put(x, moves[i]) if i in moves else x for i, x in enumerate(leaves)]
            args, kwargs = jax.tree.unflatten(tree, leaves)
        return self._compiled(*args, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# C++ dispatch. jax.jit checks a call's signature in C++ and only calls back into Python on a miss; the same
# dispatcher serves shardfix's executables, so a cached call costs what a jax.jit call costs. Private JAX 0.10.2
# internals (tests/test_jax_internals.py guards them); where they are missing, calls take the Python path.


def _fast_dispatcher(fun, cache_miss, static_argnums, static_argnames):
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


def _fastpath_call(compiled: jax.stages.Compiled, dyn_args, dyn_kwargs):
    """Run `compiled` once through JAX's compiled-call path; return (outputs, the data that lets the C++
    dispatcher call it directly next time), or None (without running) where JAX wouldn't take the fast path."""
    from jax._src import core, dtypes, stages, sharding_impls
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
