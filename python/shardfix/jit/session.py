"""What shardfix does while JAX traces and compiles.

A session says which options apply and where the report goes. A decorated function opens one for the length of
each of its own traces and compiles (the current context only); the process-wide plugin holds one while it is
enabled. Two hooks, installed once, consult the innermost session: around the tracing of every jax.jit, the
trace-time repairs run; around every XLA compile, the pipeline runs on a copy of the module. With no session they
call straight through to JAX.

While a session is active, a config value in JAX's trace context and jit cache key names its options, so JAX's
caches keep shardfix's traces and executables apart from plain JAX's (and from other options').
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
from typing import Callable, Iterator

from ..correct import POLICIES
from ..report import Report
from . import _jax, notify, tracing
from .lowering import is_patched, patch_module

RING_MODES = ("auto", "off", "zigzag", "striped")
DEFAULT_POLICY = "auto"


def default_pipeline(policy: str = DEFAULT_POLICY, ring_reorder: str = "auto") -> str:
    """The passes shardfix runs on a lowered module."""
    return ",".join(part for part in pipeline_parts(policy, ring_reorder) if part)


def pipeline_parts(policy: str, ring_reorder: str) -> tuple[str, str]:
    """The passes for every module, and the ring passes (which have work only where there are collective
    permutes)."""
    if ring_reorder == "off":
        return f"fix-shardings{{policy={policy}}}", ""
    # "auto": the layout the kernel's tile count picks, where it pays (ring-reorder's strategy=auto)
    return f"fix-shardings{{policy={policy}}}", f"ring-reorder{{strategy={ring_reorder}}},hoist-permutations"


@dataclasses.dataclass(frozen=True)
class Settings:
    """What shardfix does to a function: the correction policy, ring reordering, and how fixes are told."""

    policy: str = DEFAULT_POLICY
    ring_reorder: str = "auto"
    on_fix: str = "warn"

    def __post_init__(self):
        for name, value, choices in (("policy", self.policy, POLICIES), ("ring_reorder", self.ring_reorder, RING_MODES),
                                     ("on_fix", self.on_fix, notify.ON_FIX)):
            if value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")

    @property
    def pipeline(self) -> str:
        return default_pipeline(self.policy, self.ring_reorder)

    @property
    def passes(self) -> tuple[str, str]:
        return pipeline_parts(self.policy, self.ring_reorder)

    @property
    def cache_key(self) -> int:
        """A number for these settings in JAX's cache keys (never 0, which means no session)."""
        with _keys_lock:
            return _cache_keys.setdefault(self, len(_cache_keys) + 1)


_cache_keys: dict[Settings, int] = {}
_keys_lock = threading.Lock()


@dataclasses.dataclass(eq=False)
class Session:
    """Options, the report being gathered, and the name fixes are reported under.

    A decorated function's session gathers everything into `report` and tells it once (`collect=True`); the
    plugin's tells each trace's and each compile's fixes as they happen."""

    settings: Settings
    name: str = ""
    collect: bool = True
    report: Report = dataclasses.field(default_factory=Report)
    traces: int = 0  # functions JAX traced while this session was the innermost one
    compiles: int = 0  # modules it compiled through the pipeline
    said: set = dataclasses.field(default_factory=set)  # notes given (shared by the sessions of one owner)
    told: set = dataclasses.field(default_factory=set)  # fixes told (the plugin tells each once)

    def add(self, report: Report, name: str) -> None:
        if self.collect:
            self.report.extend(report)
        else:
            self.tell(report.fixes, name)

    def tell(self, fixes: list, name: str) -> None:
        """Tell the fixes not told before for the function `name` (a function compiled again for other arguments
        repeats them; another function that needs the same fix is told it too)."""
        if self.settings.on_fix == "error":  # every call that needs a fix raises, not only the first
            notify.tell(fixes, "error", name)
        key = lambda f: (name, f.location, f.site, f.before, f.after, f.reason)  # noqa: E731  (per function)
        new = [f for f in fixes if key(f) not in self.told]
        notify.tell(new, self.settings.on_fix, name)
        self.told.update(map(key, new))

    def repairs_modules(self) -> bool:
        """Whether the IR pipeline applies to the modules JAX makes now (Shardy's); if not, say so once."""
        if _jax.uses_shardy():
            return True
        self.say_once("gspmd", "shardfix repairs only Shardy modules; this program is lowered for GSPMD "
                               "(jax_use_shardy_partitioner=False), so its shardings are compiled as they are")
        return False

    def say_once(self, key: str, text: str) -> None:
        """A note the first time its owner (a decorated function, the plugin) has `key` to say."""
        if key not in self.said and self.settings.on_fix != "ignore":
            self.said.add(key)
            notify.note(text, self.settings.on_fix)


_active: contextvars.ContextVar[Session | None] = contextvars.ContextVar("shardfix_session", default=None)
_tracing: contextvars.ContextVar[tuple[Session, Report] | None] = contextvars.ContextVar("shardfix_tracing",
                                                                                       default=None)
_plugin: Session | None = None


def current() -> Session | None:
    """The innermost session: a decorated function's (this context only), else the plugin's, else None."""
    return _active.get() or _plugin


def plugin_session() -> Session | None:
    return _plugin


@contextlib.contextmanager
def active(session: Session) -> Iterator[Session]:
    """Make `session` the innermost one in the current context while the block runs."""
    install()
    token = _active.set(session)
    try:
        with _jax.session_state(session.settings.cache_key):
            yield session
    finally:
        _active.reset(token)


def set_plugin(session: Session | None) -> None:
    """Make `session` the process-wide one (None: none)."""
    global _plugin
    install()
    if _plugin is not None:
        _jax.forget_lenient_specs()  # what its eager session let through must not be served after it
    _plugin = session
    from .eager import EagerRepairs
    tracing.set_eager(None if session is None else EagerRepairs(session))
    _jax.set_global_session_state(0 if session is None else session.settings.cache_key)


def install() -> None:
    _jax.install_hooks(_on_trace, _on_compile)


# ---------------------------------------------------------------------------------------------------------------
# The hooks.


def _on_trace(trace: Callable, args: tuple, kwargs: dict):
    session = current()
    if session is None:
        return trace(*args, **kwargs)
    around = tracing.active()
    if around is None or not around.isolated:  # a trace made only for result shapes is no trace of the program
        session.traces += 1
    tracing_now = _tracing.get()
    if tracing_now is not None and tracing_now[0] is session:
        return trace(*args, **kwargs)  # nested in a trace this session already repairs
    # Complete: a library function (jnp.matmul, its JVP) that JAX traced for another function while repairing it
    # is traced again, so that each function's report says what was repaired in it (a fix in `init` and the same
    # one in `train_step` are both told). Only a trace that repaired something costs the next ones JAX's caches.
    with repairs(session, complete=True) as report:
        result = trace(*args, **kwargs)
    if not session.collect and report.fixes:
        # Told now, while the user's call (a jit call, `.trace()`, `jax.eval_shape`) is on the stack: a trace need
        # not be followed by a compile, and on_fix="error" must stop the call that made the fix.
        session.tell(report.fixes, _jax.trace_function_name(args))
    return result


def _on_compile(from_hlo: Callable, name: str, module, kwargs: dict):
    session = current()
    if session is None or is_patched(module) or not session.repairs_modules():
        return from_hlo(name, module, **kwargs)
    every_module, ring_passes = session.settings.passes
    patch = patch_module(module, tuple(kwargs["in_shardings"]), tuple(kwargs["out_shardings"]), every_module,
                         ring_passes, devices=kwargs.get("device_list"))
    session.compiles += 1
    session.add(patch.report, _function_name(name))
    return from_hlo(name, patch.module, **{**kwargs, "in_shardings": patch.in_shardings,
                                            "out_shardings": patch.out_shardings})


def _function_name(compile_name: str) -> str:
    """`f` from JAX's `jit(f)` / `jit_f`."""
    if compile_name.startswith("jit(") and compile_name.endswith(")"):
        return compile_name[4:-1]
    return compile_name[4:] if compile_name.startswith("jit_") else compile_name


@contextlib.contextmanager
def repairs(session: Session, *, complete: bool = False) -> Iterator[Report]:
    """The trace-time repairs (specs JAX would reject while tracing) while `session` traces in the block, added to
    the report it yields (the session's own when it collects). Traces nested in the block (jits inside the traced
    function) are part of it.

    With `complete=False`, JAX's caches are shared with the earlier traces of the same session options (a cached
    trace reports nothing again: its repairs were reported when it was made); with `complete`, nothing traced by an
    earlier session that repaired something is reused, so the report lists every repair of what the block traces.
    Inside a trace of another session (a decorated function called by a decorated function, or under the plugin)
    the repairs are also recorded in that session's report."""
    report = session.report if session.collect else Report()
    token = _tracing.set((session, report))
    try:
        with tracing.repairing(session.settings.policy, complete=complete) as made:
            yield report
    finally:
        _tracing.reset(token)
    if not made.isolated:
        report.fixes.extend(made.fixes)
