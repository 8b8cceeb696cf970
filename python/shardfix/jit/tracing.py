"""Trace-time repairs: sharding specs JAX would reject while tracing, repaired where JAX checks them.

JAX checks a spec as soon as it meets it: with an Explicit mesh (`jax.make_mesh`'s default) `reshard`,
`out_sharding=` on jnp/lax ops, `with_sharding_constraint` and `device_put` reject an indivisible spec, and in any
mode a spec naming an axis the mesh lacks or longer than the array's rank is rejected, as are bad in/out shardings
of a jit traced inside the function. All of this happens before any module exists, so the IR passes never see it.

Inside `repairing(...)` (this thread or task only), each such spec is repaired with the correction core and the
policy the IR pass uses (a PartitionSpec holds no sub-axes: there the longest dividing prefix is kept, and the fix
says so), recorded as a `Fix` at the user's line, and handed on to JAX, which then traces the repaired program.

    from shardfix.jit import tracing
    with tracing.repairing(policy="subaxis") as repairs:
        lowered = jax.jit(step).trace(params, batch).lower()
    repairs.fixes        # one Fix per repaired spec: .location (the user's line), .site, .before, .after, .reasons

Any traced function works (jax.jit, eval_shape, grad under jit, ...). Outside a session JAX behaves exactly as
before: hooks are installed once and stand aside, and JAX's trace and compilation caches are keyed on the session
(a private config state), so a trace repaired in one session is never served outside it.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import itertools
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from ..correct import POLICIES, Reason
from ..locations import SourceLoc, caller_frame, is_library_file
from ..report import Fix
from ..sharding import shard_count
from . import _jax
from .specs import (TRACE_NO_PADDING, mesh_model, names_rejected, repair_spec, spec_bytes, spec_to_model,
                    valid_names)

_active: contextvars.ContextVar["Repairs | None"] = contextvars.ContextVar("shardfix_repairs", default=None)


class Repairs:
    """One repair session: its policy and the fixes made while it was active."""

    def __init__(self, policy: str, parent: "Repairs | None" = None, isolated: bool = False):
        self.policy = policy
        self.fixes: list[Fix] = []
        self.parent = parent
        # An isolated session's repairs (and those of the sessions nested in it) are made for a trace whose results
        # are only looked at; another trace will record them.
        self.isolated = isolated or (parent is not None and parent.isolated)
        self.scope: tuple | None = None  # what its key is made for (None: the stable key of its policy)
        self.aval_checks_suspended = 0  # read by the jit in/out hooks
        self.used_leniency = False
        self._memo: dict = {}  # (mesh, spec, shape, divisibility) -> (repaired spec, reasons)
        self._api_of: dict = {}  # spec of an out_sharding= -> the API it was given to
        # An out_sharding= is canonicalized (axis names repaired) before its value's type is made with the shape.
        # Each canonicalized spec waits here, by (spec object, location), for the first value typed with it: that
        # value is the user's call's, and one fix goes from what the user wrote to what the value got (else the
        # names-only fix is recorded when the session ends). Later values typed with the same spec object inherit
        # the sharding that call made and record nothing. The spec objects are held, so their ids stay theirs.
        self._awaiting_shape: dict = {}
        self._awaiting_ids: collections.Counter = collections.Counter()  # spec id -> entries awaiting its shape
        self._typed: dict = {}  # id -> spec object, for the specs whose first value is typed
        self._typed_fix: dict = {}  # (spec id, location) -> the fix recorded when its first value was typed
        self._calls: dict = {}  # (fix, user frame id, instruction) -> that frame

    def repair(self, sharding: Any, shape: tuple | None, api: str, divisibility: bool = True,
               accepted: bool = False, itemsize: int | None = None) -> Any:
        """`sharding` (a PartitionSpec or NamedSharding) made valid for `shape` (None: axis names only), the fix
        recorded; anything else is returned as is. `accepted`: JAX took it as it is for `shape`: nothing more to
        repair, only what its canonicalization repaired earlier to record."""
        from jax.sharding import NamedSharding, PartitionSpec
        if isinstance(sharding, NamedSharding):
            mesh, spec = sharding.mesh, sharding.spec
        elif isinstance(sharding, PartitionSpec):
            mesh, spec = _jax.context_mesh(), sharding
            if mesh is None:
                return sharding  # JAX says there is no mesh for it
        else:
            return sharding
        # JAX's own sharding rules build their results' NamedShardings with the construction checks this session
        # makes lenient: a rule that puts one axis on two dims (a dot of x[b@fsdp, ...] with w[..., e@fsdp]) would
        # hand JAX a type with a duplicate axis where JAX itself raises. What JAX takes for a shape is checked here
        # for what only those construction checks reject, and repaired like any other spec.
        accepted = accepted and not names_rejected(spec, mesh)
        key = (mesh, spec, shape, divisibility)
        outcome = (spec, []) if accepted else self._memo.get(key)
        if outcome is None:
            outcome = self._memo[key] = repair_spec(spec, mesh, shape, self.policy, divisibility=divisibility,
                                                    no_padding=TRACE_NO_PADDING)
        fixed, reasons = outcome
        if shape is None:
            self._api_of[fixed] = api
            call = caller_frame(2)
            loc = user_loc(call)
            if (id(fixed), loc) not in self._awaiting_shape:
                self._awaiting_shape[(id(fixed), loc)] = _Canonicalized(api, spec, fixed, reasons, mesh, call, loc)
                self._awaiting_ids[id(fixed)] += 1
        else:
            self._record_with_shape(self._api_of.get(spec, api), shape, spec, fixed, reasons, mesh, itemsize)
        if not reasons:
            return sharding
        if isinstance(sharding, PartitionSpec):
            return fixed
        return NamedSharding(mesh, fixed, memory_kind=sharding.memory_kind)

    def explicit_reshard(self, before, after, shape: tuple, mesh, itemsize: int | None = None) -> None:
        """Record that a with_sharding_constraint, an assert of the value's sharding on Explicit axes, was made the
        reshard the code meant."""
        call = caller_frame(3)
        reason = Reason("explicit-constraint", f"with_sharding_constraint asserts the value's sharding where every "
                                               f"mesh axis is Explicit, and the value is {before}; resharded to the "
                                               f"constraint, as jax.sharding.reshard does")
        self._record(self._fix("with_sharding_constraint", shape, before, after, [reason], mesh, call,
                               itemsize=itemsize), call)

    def lenient(self) -> None:
        self.used_leniency = True

    def add(self, fixes: list[Fix]) -> None:
        """Record fixes made elsewhere (a nested function's boundary, say) in this session and those around it."""
        session = self
        while session is not None:
            session.fixes.extend(fixes)
            session = session.parent

    def close(self) -> None:
        """Record the canonicalized specs whose value JAX never typed here: where the same call typed a value with
        that spec before (a jitted library function traced once, its trace reused by a later call, in this session
        or an earlier one), the same fix as then; else the names-only fix."""
        for (spec_id, loc), names in self._awaiting_shape.items():
            fix = self._typed_fix.get((spec_id, loc))
            if fix is None:
                earlier = _typed_earlier.get((self.policy, names.before, names.mesh, loc), ())
                fix = earlier[0] if len(earlier) == 1 else None  # several shapes met there: which one is unknown
            if fix is None and names.reasons:
                fix = self._fix(names.api, None, names.before, names.after, names.reasons, names.mesh, names.call,
                                loc)
            if fix is not None:
                self._record(fix, names.call)
        self._awaiting_shape.clear()
        self._awaiting_ids.clear()

    def _record_with_shape(self, api: str, shape: tuple, spec, fixed, reasons, mesh, itemsize=None) -> None:
        awaited = self._awaiting_ids[id(spec)] > 0 or id(spec) in self._typed
        if not (awaited or reasons):
            return  # the common case, valid and not canonicalized here: no stack walk
        call = caller_frame(3)
        if awaited:
            loc = user_loc(call)
            canonicalized = self._awaiting_shape.pop((id(spec), loc), None)
            if canonicalized is not None:
                self._awaiting_ids[id(spec)] -= 1
                self._typed[id(spec)] = spec
                reasons = canonicalized.reasons + reasons
                if reasons:
                    fix = self._typed_fix[(id(spec), loc)] = self._fix(api, shape, canonicalized.before, fixed,
                                                                        reasons, mesh, call, loc, itemsize)
                    _remember_typed((self.policy, canonicalized.before, mesh, loc), fix)
                    self._record(fix, call)
                return
            if id(spec) in self._typed:
                return
        if reasons:
            self._record(self._fix(api, shape, spec, fixed, reasons, mesh, call, itemsize=itemsize), call)

    @staticmethod
    def _fix(api: str, shape, before, after, reasons, mesh, call, loc: SourceLoc | None = None,
             itemsize: int | None = None) -> Fix:
        model = mesh_model(mesh)
        where = api if shape is None else f"{api} (shape {shape})"
        sized = shape is not None and itemsize is not None
        return Fix("trace", where, loc or user_loc(call), tuple((r.code, r.detail) for r in reasons), str(before),
                   str(after), shard_count(spec_to_model(before), model), shard_count(spec_to_model(after), model),
                   shape=shape, bytes_before=spec_bytes(valid_names(before, mesh), mesh, shape, itemsize)
                   if sized else None, bytes_after=spec_bytes(after, mesh, shape, itemsize) if sized else None)

    def _record(self, fix: Fix, call) -> None:
        """Record a fix once per call of the user's code: JAX may apply one spec several times while tracing one
        call (abstract evaluation, then JVP), and those are one fix."""
        key = (fix, id(call), getattr(call, "f_lasti", None))
        if key in self._calls:
            return
        self._calls[key] = call  # holding the frame keeps its id from being reused by a later call
        self.add([fix])


# What the spec a call canonicalized became once a value was typed with it, by (policy, spec, mesh, the user's line):
# a later session whose trace of that call JAX serves from its cache (the value is not typed again) records the
# same fix rather than the names-only one. A handful of entries per program; the oldest go past the limit.
_typed_earlier: dict[tuple, tuple[Fix, ...]] = {}
_TYPED_EARLIER_LIMIT = 4096
_typed_lock = threading.Lock()


def _remember_typed(key: tuple, fix: Fix) -> None:
    with _typed_lock:
        known = _typed_earlier.pop(key, ())
        _typed_earlier[key] = known if fix in known else known + (fix,)
        while len(_typed_earlier) > _TYPED_EARLIER_LIMIT:
            del _typed_earlier[next(iter(_typed_earlier))]


@dataclass
class _Canonicalized:
    api: str
    before: Any
    after: Any
    reasons: list
    mesh: Any
    call: Any
    loc: SourceLoc


def user_loc(call=None) -> SourceLoc:
    """The user's line for what JAX is tracing now: JAX's own record of the operation (in a backward pass, the
    forward operation's) where it reaches the user's code, else the user's frame `call` of the Python stack."""
    for file, line in _jax.traceback_frames():
        if not is_library_file(file):
            return SourceLoc(file, line)
    if call is None:
        return SourceLoc()
    return SourceLoc(call.f_code.co_filename, call.f_lineno)


def install() -> None:
    """Install the hooks around JAX's trace-time spec checks (once per process; thread-safe). `repairing` calls it;
    call it early to have the hooks in place before other threads trace."""
    _jax.install_spec_hooks(_current)
    _jax.install_autodiff_ties(_current)


# The repairs of the checks JAX makes outside any trace (device_put, make_array_from_callback, an eager reshard or
# constraint, a jax.jit's shardings as it is made) while the plugin is on: see eager.py.
_eager: "Repairs | None" = None


def set_eager(repairs: "Repairs | None") -> None:
    global _eager
    install()
    _eager = repairs


def _current() -> "Repairs | None":
    """The repairs JAX's spec checks consult here: this context's trace session, else the plugin's eager one."""
    return _active.get() or _eager


# Each distinct session key separates JAX's caches. A stable key per policy lets repeated traces share JAX's caches
# (a repair is then recorded by the session that traced it first). A `complete` session must see every repair of
# what it traces, so it takes a key no earlier session that repaired anything has used (one per generation, the
# generation retired when such a session ends). An isolated session takes a key of its own, so that what it traces is
# never served to another session. Sessions nested in one of these take keys of its scope, so that what they trace
# is as fresh, and kept as far apart.
_keys: dict[tuple[str, tuple | None], int] = {}
_key_counter = itertools.count(1)
_isolated_counter = itertools.count(1)
_generation = 0
_keys_lock = threading.Lock()


def _session_key(policy: str, scope: tuple | None) -> int:
    with _keys_lock:
        name = (policy, scope)
        if name not in _keys:
            _keys[name] = next(_key_counter)
        return _keys[name]


def _retire_scope(scope: tuple) -> None:
    """Forget the keys made for `scope`: later sessions of a scope like it get new ones (a retired generation is
    followed by the next)."""
    global _generation
    with _keys_lock:
        for name in [name for name in _keys if name[1] == scope]:
            del _keys[name]
        if scope == ("generation", _generation):
            _generation += 1


@contextlib.contextmanager
def repairing(policy: str = "subaxis", *, complete: bool = True, isolated: bool = False) -> Iterator[Repairs]:
    """Within this block (this thread or task only), JAX's trace-time spec checks repair what they would reject.

    `policy` is the correction core's ("auto", "subaxis", "prefix", "drop"). The session's `.fixes` lists every
    repair made while tracing, located at the user's line. With `complete` (the default) nothing traced by an
    earlier session that repaired something is reused, so every repair of this trace is recorded (at the cost of
    retracing jitted library functions such as jnp.dot); `complete=False` shares JAX's caches with earlier sessions
    of the same policy, each repair then being recorded once, by the session that traced it first. Sessions nest: an
    inner session's fixes are also recorded in the outer one, and an inner session in a complete or isolated one
    traces as that one does. An `isolated` session is for a trace made only to learn something, such as result
    shapes: what it traces is never reused elsewhere, and its repairs (`.isolated` is true for it and the sessions
    nested in it) are for another trace to record.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    install()
    parent = None if isolated else _active.get()
    session = Repairs(policy, parent=parent, isolated=isolated)
    if isolated:
        session.scope = ("isolated", next(_isolated_counter))
    elif complete:
        session.scope = ("generation", _generation)
    elif parent is not None:
        session.scope = parent.scope
    token = _active.set(session)
    try:
        with _jax.repair_key(_session_key(policy, session.scope)):
            yield session
    finally:
        _active.reset(token)
        session.close()
        if session.used_leniency:
            _jax.forget_lenient_specs()
        if isolated or (complete and session.fixes):
            _retire_scope(session.scope)


def active() -> Repairs | None:
    """The repair session of the current thread or task, if any."""
    return _active.get()
