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

from ..correct import POLICIES
from ..locations import SourceLoc, user_stacklevel
from ..pipeline import PassContext
from ..report import Fix, ShardingFixError, ShardingFixWarning, merge_fixes, render_fixes
from . import _jax, tracing
from .boundary import UNSPECIFIED, Boundary, check_mesh, corrected_jit
from .lowering import patch_lowered
from .stages import AutofixLowered

logger = logging.getLogger("shardfix")
# The trace-time hooks go in as soon as the decorator exists, so that JAX functions user code takes by reference
# later (a closure over jax.lax.with_sharding_constraint, say) are the hooked ones.
tracing.install()
RING_MODES = ("auto", "off", "zigzag", "striped")
ON_FIX = ("warn", "log", "error", "ignore")


def default_pipeline(policy: str = "subaxis", ring_reorder: str = "auto") -> str:
    """The passes autofix_shardings runs on a lowered module."""
    pipeline = f"fix-shardings{{policy={policy}}}"
    if ring_reorder != "off":
        strategy = "zigzag" if ring_reorder == "auto" else ring_reorder
        pipeline += f",ring-reorder{{strategy={strategy}}},hoist-permutations"
    return pipeline


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


def autofix_shardings(fun: Callable | None = None, *, mesh=None, in_shardings=UNSPECIFIED,
                      out_shardings=UNSPECIFIED, static_argnums=None, static_argnames=None, donate_argnums=None,
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
    check_mesh(mesh)
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
        if options[name] is UNSPECIFIED and not all(type(x).__name__ == "UnspecifiedValue" for x in leaves):
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
        self._dispatch = _jax.cpp_dispatcher(fun, self._cache_miss, self._static_argnums_list(),
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
            fast = _jax.fastpath_call(compiled._compiled, dyn_args, dyn_kwargs)
            if fast is not None:
                return fast[0], fast[1], False
        return self._run(*prepared), None, False

    def _run(self, compiled, dyn_args, dyn_kwargs, moved):
        if compiled is None:  # under a trace: dyn_args/dyn_kwargs are the full call
            return self._traced_call(dyn_args, dyn_kwargs)
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
        with tracing.repairing(self._options.policy) as repairs:  # specs JAX rejects while tracing
            boundary = self._corrected_jit(args, kwargs)
            lowered = boundary.jitted.lower(*boundary.args, **boundary.kwargs)
        pass_ctx = PassContext()
        patched, report = patch_lowered(lowered, self._pipeline(), pass_ctx)
        fixes = merge_fixes(boundary.fixes + repairs.fixes + report.fixes)
        _tell(fixes, self._options.on_fix, getattr(self._fun, "__name__", "function"), stacklevel)
        return AutofixLowered(patched, fixes, report.rings)

    def _pipeline(self) -> str:
        return default_pipeline(self._options.policy, self._options.ring_reorder)

    def _traced_call(self, args, kwargs):
        """Under an outer trace: the corrected jax.jit, its trace-time specs repaired. Inside an outer
        autofix_shardings the fixes go to its report; else they are told here."""
        with tracing.repairing(self._options.policy) as repairs:
            boundary = self._corrected_jit(args, kwargs)
            repairs.add(boundary.fixes)
            out = boundary.jitted(*args, **kwargs)
        if repairs.parent is None:
            _tell(merge_fixes(repairs.fixes), self._options.on_fix, getattr(self._fun, "__name__", "function"),
                  user_stacklevel())
        return out

    def _corrected_jit(self, args, kwargs) -> Boundary:
        """A jax.jit of the function whose in/out shardings are corrected for these arguments, and the fixes."""
        return corrected_jit(self._fun, self._options, self._static_positions(len(args)), self._loc, args, kwargs)


def _tell(fixes: list[Fix], on_fix: str, name: str, stacklevel: int) -> None:
    if not fixes or on_fix == "ignore":
        return
    text = render_fixes(fixes, name)
    if on_fix == "error":
        raise ShardingFixError(text)
    if on_fix == "log":
        logger.warning(text)
    else:
        warnings.warn(text, ShardingFixWarning, stacklevel=stacklevel)
