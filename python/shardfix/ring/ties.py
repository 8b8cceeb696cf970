"""What JAX knew, while it differentiated a shard_map, about which result of the original ring each value of the
forward and backward regions stands for.

A ring region F differentiated by JAX's autodiff (no custom_vjp) leaves the module two regions: a forward region
(some of F's results, those anything reads as primal values, plus residuals) and a backward region B (the transpose of
F's linearisation: it reads cotangents of F's results and residuals). The module does not say which result of F a
cotangent of B differentiates, nor which of F's results the forward region still computes: JAX's partial evaluation
and dead-code elimination drop results and cotangents nobody reads, and two results of one type look alike
(autodiff.py). JAX knows it while it transforms the program, and @autofix_shardings traces the program itself, so
shardfix.jit._jax records it there: each region JAX stages for F gets a scope of its own in its name stack (which the
module keeps in the region's location), and the scope names a `Tie` here. Anything this module does not find, or finds
inconsistent with the region it names, is no tie: the caller refuses.
"""

from __future__ import annotations

import enum
import itertools
import re
import threading
import weakref
from dataclasses import dataclass


class Role(enum.Enum):
    FORWARD = "forward"  # the region computing F's primal results (and residuals)
    TANGENT = "tangent"  # F's linearisation (never lowered under jax.grad: it is transposed)
    BACKWARD = "backward"  # the transpose of the tangent region


@dataclass(frozen=True)
class Tie:
    """One region JAX staged while differentiating the ring shard_map number `ring` (which had `results` results).

    `slots`: FORWARD and TANGENT, one per result of the region: the original result it is (its primal value, or its
    tangent), None for a residual; BACKWARD, one per operand of the region: the original result whose cotangent it
    is, None for anything else (residuals, forwarded primal inputs, hoisted constants). `zero`: BACKWARD only, the
    original results whose cotangent was symbolically zero (no cotangent operand differentiates them). `rules`: the
    derivative rules JAX met in the ring's body that the module does not show (a stop_gradient lowers to nothing, a
    custom_jvp / custom_vjp function to its primal), each as "stop_gradient at file:line": where there is one, what
    jax.grad differentiates is not the function the forward region computes. `kinks`: the ops with a kink (max, min,
    abs) JAX differentiated in the ring's body by their standard rules ("abs at file:line"): at a tie max and min
    halve the cotangent and abs takes one side, which stabiliser.py and autodiff.py refuse where a log-sum-exp merge
    splits cases on such an op."""

    ring: int
    role: Role
    results: int
    slots: tuple[int | None, ...]
    zero: frozenset[int] = frozenset()
    rules: tuple[str, ...] = ()
    kinks: tuple[str, ...] = ()

    def cotangents(self) -> dict[int, int]:
        """BACKWARD: operand number -> the original result it is the cotangent of."""
        return {i: j for i, j in enumerate(self.slots) if j is not None}

    def kept(self, used: list[bool]) -> "Tie":
        """The tie of the region left when JAX's dead-code elimination keeps the `used` slots."""
        return Tie(self.ring, self.role, self.results, tuple(s for s, u in zip(self.slots, used) if u), self.zero,
                   self.rules, self.kinks)


PREFIX = "shardfix_tie"
# a region's own scope: the last of its name stack, followed only by the transforms' closing parentheses and the
# primitive's name (`jvp(shardfix_tie4)/shard_map`); a scope further out is an enclosing region's
_OWN_SCOPE = re.compile(PREFIX + r"(\d+)\)*/[^/()]*$")
# every tie scope in a location name: a whole segment with its slash, else the name alone (inside a transform's
# parentheses: `transpose(jvp(shardfix_tie1))/shardfix_tie2/shard_map` is JAX's `transpose(jvp())/shard_map`)
_ANY_SCOPE = re.compile(PREFIX + r"\d+/|" + PREFIX + r"\d+")


class _Holder:
    """What a scope names; alive while a jaxpr staged under the scope is (its name stack holds the scope's name,
    which holds this), so the registry frees the ties of programs JAX no longer keeps."""

    __slots__ = ("tie", "__weakref__")

    def __init__(self):
        self.tie: Tie | None = None


class _ScopeName(str):
    """A scope's name, holding what it names (JAX keeps the name object itself in its name stacks' scopes)."""

    holder: _Holder


_ties: "weakref.WeakValueDictionary[str, _Holder]" = weakref.WeakValueDictionary()
_numbers = itertools.count()
_rings = itertools.count()
_lock = threading.Lock()


def new_ring() -> int:
    """A number for an original ring shard_map being differentiated (never reused in this process)."""
    with _lock:
        return next(_rings)


def reserve() -> str:
    """A scope name fresh in this process, naming no tie yet (`bind` it once what it stands for is known). Stage
    under this very object: the registry keeps its tie only while something holds the name."""
    with _lock:
        name = _ScopeName(f"{PREFIX}{next(_numbers)}")
        name.holder = _Holder()
        _ties[str(name)] = name.holder
        return name


def bind(scope: str, tie: Tie | None) -> None:
    """Let `scope` (a name `reserve` gave) name `tie` (None: nothing, where what was staged under it could not be
    tied)."""
    with _lock:
        holder = getattr(scope, "holder", None) or _ties.get(str(scope))
        if holder is not None:
            holder.tie = tie


def register(tie: Tie) -> str:
    """A fresh scope name that names `tie`."""
    scope = reserve()
    bind(scope, tie)
    return scope


def lookup(scope: str) -> Tie | None:
    holder = _ties.get(str(scope))
    return holder.tie if holder is not None else None


def innermost(names: list[str]) -> tuple[str, Tie] | None:
    """The innermost registered tie scope among name-stack entries `names` (outermost first)."""
    for name in reversed(names):
        tie = lookup(name)
        if tie is not None:
            return name, tie
    return None


def of_location(name: str) -> Tie | None:
    """The tie a region's location name (a printed name stack: `jit(f)/transpose(jvp(shardfix_tie3))/
    shardfix_tie7/shard_map`) names: its own scope's, None where its last scope is no tie scope or an unknown one."""
    found = _OWN_SCOPE.search(name)
    return lookup(f"{PREFIX}{found.group(1)}") if found else None


def strip(text: str) -> str:
    """`text` (a module printed with its locations) without the tie scopes: the names JAX would have given."""
    return _ANY_SCOPE.sub("", text)


def recorded() -> int:
    """How many scopes the registry holds now (those of jaxprs JAX still keeps)."""
    return len(_ties)


__all__ = ["PREFIX", "Role", "Tie", "bind", "innermost", "lookup", "new_ring", "of_location", "recorded", "register",
           "reserve", "strip"]
