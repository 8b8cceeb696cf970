"""`autofix_shardings`: a drop-in for `jax.jit` that repairs shardings and balances ring attention.

The function is a real `jax.jit` of the user's function, with all of jax.jit's options, run through shardfix: its
own C++ dispatcher (the one jax.jit uses, with a cache of its own) serves cached calls without entering Python; a
miss lets JAX trace, lower, compile and run as jax.jit would, inside a session in which the trace-time repairs run
around the trace and the pipeline runs on a copy of the module before XLA compiles it. Under an outer
transformation (an enclosing jit, grad or vmap) there is no module of its own: the trace-time repairs still run, and
the IR passes run where the outermost call is compiled through shardfix (a decorated function, or the plugin).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable

import jax

from .._sentinel import Sentinel
from ..locations import SourceLoc
from ..report import Report
from . import _jax, notify, stages, tracing
from .boundary import UNSPECIFIED, Boundary, check_mesh, corrected_jit
from .lowering import patch_lowered
from .options import Options, resolve
from .session import DEFAULT_POLICY, Session, active, current, default_pipeline, repairs
from .specs import in_user_terms

__all__ = ["autofix_shardings", "AutofixFunction", "default_pipeline"]

# The trace-time hooks go in as soon as the decorator exists, so that JAX functions user code takes by reference
# later (a closure over jax.lax.with_sharding_constraint, say) are the hooked ones.
tracing.install()

# jax.jit's options not given: jax.jit's default, or the option of a jax.jit being wrapped (see options.resolve)
NOT_GIVEN: Any = Sentinel("NOT_GIVEN")


@_jax.api_boundary  # JAX's own errors about the options (raised by jax.jit as it is made) show no shardfix frame
def autofix_shardings(fun: Callable | None = None, *, in_shardings=UNSPECIFIED, out_shardings=UNSPECIFIED,
                      static_argnums=NOT_GIVEN, static_argnames=NOT_GIVEN, donate_argnums=NOT_GIVEN,
                      donate_argnames=NOT_GIVEN, keep_unused=NOT_GIVEN, device=NOT_GIVEN, backend=NOT_GIVEN,
                      inline=NOT_GIVEN, compiler_options=NOT_GIVEN, mesh=None, policy: str = DEFAULT_POLICY,
                      ring_reorder: str = "auto", on_fix: str = "warn"):
    """Like `jax.jit` (every jax.jit argument is accepted and honoured), with every sharding made valid and
    evenly divisible and ring attention balanced.

    Bare (`@autofix_shardings`) or with options; `autofix_shardings(jax.jit(f, ...))` takes over the jit's options
    (explicit ones win). `mesh` is what in/out shardings given as PartitionSpecs apply to; it defaults to the
    context mesh (`jax.set_mesh`), else the mesh of the arguments' NamedShardings. `policy`: how an indivisible
    dimension is corrected; `ring_reorder`: "auto" (where provably safe, the layout the kernel's tile count
    picks, where it pays), "zigzag", "striped" or "off";
    `on_fix`: "warn" (one ShardingFixWarning per compile), "log", "error" (ShardingFixError), or "ignore".
    """
    check_mesh(mesh)
    given = {name: value for name, value in dict(
        static_argnums=static_argnums, static_argnames=static_argnames, donate_argnums=donate_argnums,
        donate_argnames=donate_argnames, keep_unused=keep_unused, device=device, backend=backend, inline=inline,
        compiler_options=compiler_options).items() if value is not NOT_GIVEN}
    if in_shardings is not UNSPECIFIED:
        given["in_shardings"] = in_shardings
    if out_shardings is not UNSPECIFIED:
        given["out_shardings"] = out_shardings
    given.update(mesh=mesh, policy=policy, ring_reorder=ring_reorder, on_fix=on_fix)
    if fun is None:
        return functools.partial(_decorate, given=given)
    return _decorate(fun, given)


@_jax.api_boundary
def _decorate(fun: Callable, given: dict):
    fun, options = resolve(fun, given)
    return AutofixFunction(fun, options).function


class AutofixFunction:
    """What stands behind an autofix_shardings function: its jax.jit objects, its sessions and its stages.

    The function users get is `.function`: JAX's own C++ jit dispatcher (the type jax.jit returns, with its
    descriptor protocol for methods), with a cache of its own, so a cached call never enters Python. It carries
    this object's `trace`, `lower`, `eval_shape` and `clear_cache`, and counts `cache_misses` (calls that came back
    to Python) and `lower_count` (modules shardfix patched for it).
    """

    def __init__(self, fun: Callable, options: Options):
        self._fun, self._options, self._settings = fun, options, options.settings
        self._name = getattr(fun, "__name__", None) or type(fun).__name__
        self._said: set = set()
        self._told: set = set()  # (location, reason, before, after) of every fix told for this function
        self._jits: dict = {}  # jax.jit objects by in/out shardings (the base one, and corrected ones)
        self._moving: dict = {}  # call signature -> _Moves, for the calls that move arguments (they come back here)
        self._jit = self._base_jit()
        source = inspect.unwrap(fun)
        try:
            self._loc = SourceLoc(inspect.getsourcefile(source) or "", source.__code__.co_firstlineno)
        except (TypeError, AttributeError):
            self._loc = SourceLoc(name=self._name)
        self._static_argnums, self._static_argnames = _jax.static_arguments(self._jit)
        function = _jax.cpp_dispatcher(fun, self._name, _jax.api_boundary(self._cache_miss), self._static_argnums,
                                       self._static_argnames)
        _jax.wraps(fun)(function)  # the name, docstring, module and __wrapped__ jax.jit gives its functions
        _jax.mark_as_jit(function, fun, self._jit)
        function._shardfix = self
        function.trace, function.lower, function.eval_shape = self.trace, self.lower, self.eval_shape
        function.clear_cache = self.clear_cache
        function.cache_misses = function.lower_count = 0
        self.function = function

    # -- the jax.jit objects ----------------------------------------------------------------------------------

    def _base_jit(self):
        """A jax.jit with every option as given: JAX validates them here, as jax.jit does when it is made. In/out
        shardings JAX refuses already (a spec naming an axis twice) are left to the per-call corrections."""
        kwargs = self._options.jit_kwargs()
        boundary = {side: value for side, value in (("in_shardings", self._options.in_shardings),
                                                    ("out_shardings", self._options.out_shardings))
                    if value is not UNSPECIFIED}
        with notify.warnings_at_user_line():  # what jax.jit warns about (deprecated options) points at the user
            jitted = None
            if boundary:
                try:
                    jitted = jax.jit(self._fun, **kwargs, **boundary)
                except _jax.DuplicateSpecError:
                    pass
            if jitted is None:
                jitted = jax.jit(self._fun, **kwargs)
        self._jits[_jax.jit_shardings_key(jitted)] = jitted
        return jitted

    def _jit_for(self, args: tuple, kwargs: dict, report: Report) -> Boundary:
        """The jax.jit to run for these arguments (in/out shardings given as specs corrected for them first), and
        the arguments to trace it with (an argument committed to another sharding than its corrected in_sharding
        in abstract form)."""
        if not self._options.has_boundary_shardings:
            return Boundary(self._jit, [], args, kwargs)
        positions = _jax.static_positions(self._static_argnums, len(args))
        boundary = corrected_jit(self._fun, self._options, positions, self._loc, args, kwargs)
        report.fixes.extend(boundary.fixes)
        boundary.jitted = self._jits.setdefault(_jax.jit_shardings_key(boundary.jitted), boundary.jitted)
        return boundary

    def _session(self) -> Any:
        return active(Session(self._settings, self._name, said=self._said))

    # -- calling ----------------------------------------------------------------------------------------------

    def _cache_miss(self, *args, **kwargs):
        """What the C++ dispatcher calls for a signature it hasn't seen: JAX's own miss path (trace, lower, compile,
        run), inside a session. Returns what JAX's returns: (outputs, data for the dispatcher's fast path, flag).

        Called inside another function's trace that shardfix repairs (a decorated function's, or any jit's under the
        plugin), the fixes go into that trace's report; else they are told here, once per call signature (a call
        that only moves arguments for an executable made before says nothing again)."""
        self.function.cache_misses += 1
        nested = _jax.under_trace()
        enclosing = tracing.active() if nested else None
        unrepaired_outer = nested and current() is None
        with self._session() as session:
            moves, again = self._moves_for(args, kwargs, session.report, enclosing)
            moved = moves.apply(args)
            result = _jax.jit_cache_miss(moves.jitted)(*moved, **kwargs)
            if moved is not args:  # arguments are moved on every call: no fast path that would skip the move
                result = (result[0], None, *result[2:])
        self.function.lower_count += session.compiles
        if enclosing is None:
            note = None
            if unrepaired_outer and "nested" not in self._said and self._settings.on_fix != "ignore":
                self._said.add("nested")
                note = (f"{self._name} runs inside another transformation (jit, grad, vmap, ...): shardfix repairs "
                        "specs while tracing it, but the sharding and ring passes run only where the outermost call "
                        "is compiled; decorate the outermost function, or enable shardfix for every jit with "
                        "shardfix.enable()")
            # A call made again (arguments moved for a known signature; a call under an outer trace that JAX had
            # traced before) has nothing new to tell unless JAX traced or compiled something for it; and what a
            # compile for other arguments (committed ones, another shape) repeats was told before.
            fresh = session.traces or session.compiles or not (again or nested)
            fixes = [f for f in in_user_terms(session.report.fixes) if _told_key(f) not in self._told] \
                if fresh else []
            self._told.update(_told_key(f) for f in fixes)
            notify.tell(fixes, self._settings.on_fix, self._name, also=note)
        return result

    def _moves_for(self, args: tuple, kwargs: dict, report: Report, enclosing) -> tuple["_Moves", bool]:
        """The jax.jit to call and the arguments to move for it, and whether this call signature was seen before;
        the boundary's fixes go to `report` (and to the repairs of an enclosing trace). A call that moves arguments
        comes back here each time: what it needs is kept by call signature, so that it corrects (and traces
        out_shardings' result shapes) once."""
        key = None
        if self._options.in_shardings is not UNSPECIFIED and not _jax.under_trace():  # only top-level calls move
            key = _jax.call_signature(args, kwargs, self._static_argnums, self._static_argnames)
            known = self._moving.get(key)
            if known is not None:
                report.fixes.extend(known.fixes)
                return known, True
        boundary = self._jit_for(args, kwargs, report)
        if enclosing is not None:
            enclosing.add(boundary.fixes)  # its trace-time repairs reach it too: their session nests in its
        moves = _Moves.of(boundary, args)
        if key is not None and moves.targets:
            if len(self._moving) >= _MOVING_LIMIT:
                for oldest in list(self._moving)[:len(self._moving) - _MOVING_LIMIT + 1]:
                    self._moving.pop(oldest, None)  # another thread may have taken it out already
            self._moving[key] = moves
        return moves, False

    # -- stages -----------------------------------------------------------------------------------------------

    @_jax.api_boundary
    def trace(self, *args, **kwargs) -> "stages.AutofixTraced":
        """JAX's Traced for these arguments (the trace-time repairs done; `.fixes` lists every one of them, and
        the boundary corrections, which are told as on_fix says)."""
        return self._trace(args, kwargs, tell=True)

    @_jax.api_boundary
    def lower(self, *args, **kwargs) -> "stages.AutofixLowered":
        """Trace and lower with JAX, then run the pipeline on a copy of the module: `.as_text()` is the patched
        module, `.fixes` and `.rings` what changed (told, with the trace's, as on_fix says), `.compile()` compiles
        it."""
        return self._trace(args, kwargs, tell=False).lower()

    @_jax.api_boundary
    def eval_shape(self, *args, **kwargs):
        """The shapes, dtypes and shardings of the outputs, as jax.jit's `eval_shape` gives them (`jax.eval_shape`
        of the function comes here too)."""
        return self._trace(args, kwargs, tell=True).out_info

    def _trace(self, args: tuple, kwargs: dict, tell: bool) -> "stages.AutofixTraced":
        with self._session() as session, repairs(session, complete=True):
            boundary = self._jit_for(args, kwargs, session.report)
            traced = boundary.jitted.trace(*boundary.args, **boundary.kwargs)
        if tell:  # while the user's call is on the stack: on_fix="error" raises there
            notify.tell(session.report.fixes, self._settings.on_fix, self._name)
        return stages.traced(traced, self, session.report)

    def clear_cache(self) -> None:
        """Forget every trace, lowering and executable of this function."""
        for jitted in self._jits.values():
            jitted.clear_cache()
        self._moving.clear()
        _jax.clear_dispatcher(self.function)

    @_jax.api_boundary
    def _lower_traced(self, traced: "stages.AutofixTraced", **lower_kwargs) -> "stages.AutofixLowered":
        with self._session() as session:
            lowered = traced._jax_lower(**lower_kwargs)
            patched, ir_report = lowered, Report()
            if session.repairs_modules():
                every_module, ring_passes = self._settings.passes
                patched, ir_report = patch_lowered(lowered, every_module, ring_passes=ring_passes,
                                                   cls=stages.AutofixLowered)
        self.function.lower_count += 1
        report = Report()
        report.extend(traced.report)
        report.extend(ir_report)
        notify.tell(report.fixes, self._settings.on_fix, self._name)
        return stages.lowered(patched, report)



def _told_key(fix) -> tuple:
    return fix.location, fix.reason, fix.before, fix.after


_MOVING_LIMIT = 256  # call signatures that move arguments, kept per function (the oldest go first)


@dataclasses.dataclass(frozen=True)
class _Moves:
    """The jax.jit for a call, the fixes of its boundary, and where the call's arguments go: flat argument index ->
    the sharding an array committed elsewhere is moved to (its corrected in_sharding)."""

    jitted: Any
    fixes: tuple
    targets: dict

    @staticmethod
    def of(boundary: Boundary, args: tuple) -> "_Moves":
        targets = {}
        if boundary.args is not args:
            leaves = jax.tree.leaves(args)
            targets = {i: t.sharding for i, (x, t) in enumerate(zip(leaves, jax.tree.leaves(boundary.args)))
                       if isinstance(t, jax.ShapeDtypeStruct) and isinstance(x, jax.Array)}
        return _Moves(boundary.jitted, tuple(boundary.fixes), targets)

    def apply(self, args: tuple) -> tuple:
        """`args` with each array to move moved; `args` itself when nothing moves."""
        if not self.targets:
            return args
        leaves, tree = jax.tree.flatten(args)
        return jax.tree.unflatten(tree, [jax.device_put(x, self.targets[i]) if i in self.targets else x
                                         for i, x in enumerate(leaves)])
