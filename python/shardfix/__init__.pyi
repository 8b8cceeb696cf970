# The types of shardfix's public names, for type checkers. At run time __init__.py imports each name on first use
# (so that `import shardfix` loads no JAX); tests/test_typing.py checks that these signatures are the run-time ones.

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, overload

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__version__: str
__all__: list[str]

Policy = Literal["auto", "subaxis", "prefix", "drop"]
RingReorder = Literal["auto", "zigzag", "striped", "off"]
OnFix = Literal["warn", "log", "error", "ignore"]

class ShardingFixWarning(UserWarning):
    """shardfix changed a sharding (the message says where, why, and from what to what)."""

class ShardingFixError(ValueError):
    """Raised with `on_fix="error"` when shardfix would have changed a sharding."""

# As jax.jit: bare (`@autofix_shardings`, or called on a function) it returns what jax.jit returns; with options
# only, a decorator that does.
@overload
def autofix_shardings(
    fun: Callable[..., Any],
    *,
    in_shardings: Any = ...,
    out_shardings: Any = ...,
    static_argnums: int | Sequence[int] | None = ...,
    static_argnames: str | Iterable[str] | None = ...,
    donate_argnums: int | Sequence[int] | None = ...,
    donate_argnames: str | Iterable[str] | None = ...,
    keep_unused: bool = ...,
    device: Any = ...,
    backend: str | None = ...,
    inline: bool = ...,
    compiler_options: dict[str, Any] | None = ...,
    mesh: Mesh | None = ...,
    policy: Policy = ...,
    ring_reorder: RingReorder = ...,
    on_fix: OnFix = ...,
) -> jax.stages.Wrapped: ...
@overload
def autofix_shardings(
    fun: None = None,
    *,
    in_shardings: Any = ...,
    out_shardings: Any = ...,
    static_argnums: int | Sequence[int] | None = ...,
    static_argnames: str | Iterable[str] | None = ...,
    donate_argnums: int | Sequence[int] | None = ...,
    donate_argnames: str | Iterable[str] | None = ...,
    keep_unused: bool = ...,
    device: Any = ...,
    backend: str | None = ...,
    inline: bool = ...,
    compiler_options: dict[str, Any] | None = ...,
    mesh: Mesh | None = ...,
    policy: Policy = ...,
    ring_reorder: RingReorder = ...,
    on_fix: OnFix = ...,
) -> Callable[[Callable[..., Any]], jax.stages.Wrapped]: ...
def enable(policy: Policy = "auto", ring_reorder: RingReorder = "auto", on_fix: OnFix = "warn") -> None: ...
def disable() -> None: ...
def is_enabled() -> bool: ...
def enabled(
    policy: Policy = "auto", ring_reorder: RingReorder = "auto", on_fix: OnFix = "warn"
) -> AbstractContextManager[None]: ...
def correct_spec(shape: Sequence[int], spec: PartitionSpec, mesh: Mesh, *, policy: Policy = "drop") -> PartitionSpec: ...
def get_corrected_named_sharding(shape: Sequence[int], spec: PartitionSpec, mesh: Mesh) -> NamedSharding: ...
def reorder_sequence(
    x: Any,
    cp_size: int,
    seq_dim: int = 1,
    to_contiguous: bool = False,
    *,
    strategy: Literal["zigzag", "striped"] = "zigzag",
    stripe: int = 1,
) -> jax.Array: ...
