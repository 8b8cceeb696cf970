"""The options of an autofix_shardings function: jax.jit's own (taken over from a wrapped jax.jit, explicit ones
winning), the mesh for in/out shardings given as PartitionSpecs, and shardfix's settings."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from . import _jax
from .boundary import UNSPECIFIED
from .session import Settings

# jax.jit's keyword arguments with their defaults (the same in every supported JAX version), in/out shardings aside.
JIT_DEFAULTS: dict[str, Any] = dict(static_argnums=None, static_argnames=None, donate_argnums=None,
                                    donate_argnames=None, keep_unused=False, device=None, backend=None, inline=False,
                                    compiler_options=None)


@dataclasses.dataclass(frozen=True)
class Options:
    mesh: Any
    in_shardings: Any
    out_shardings: Any
    static_argnums: Any
    static_argnames: Any
    donate_argnums: Any
    donate_argnames: Any
    keep_unused: bool
    device: Any
    backend: Any
    inline: Any
    compiler_options: Any
    policy: str
    ring_reorder: str
    on_fix: str

    @property
    def settings(self) -> Settings:
        return Settings(self.policy, self.ring_reorder, self.on_fix)

    def jit_kwargs(self) -> dict:
        """jax.jit's keyword arguments, in/out shardings aside."""
        return {name: getattr(self, name) for name in JIT_DEFAULTS}

    @property
    def has_boundary_shardings(self) -> bool:
        return self.in_shardings is not UNSPECIFIED or self.out_shardings is not UNSPECIFIED


def resolve(fun: Callable, given: dict) -> tuple[Callable, Options]:
    """The function to trace and its options. `given` holds what the caller passed (jax.jit's arguments that were
    not passed are absent); when `fun` is a jax.jit object its function and options are taken over, explicit
    arguments winning."""
    options = {"in_shardings": UNSPECIFIED, "out_shardings": UNSPECIFIED, **JIT_DEFAULTS}
    if _jax.is_jax_jit(fun):
        fun, taken = _jax.jit_options_of(fun)
        options.update(taken)
    options.update(given)
    Settings(options["policy"], options["ring_reorder"], options["on_fix"])  # validates them
    return fun, Options(**options)
