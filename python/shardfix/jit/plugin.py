"""The process-wide plugin: every jax.jit in the process (outer and nested, library code, training loops) traced with
the trace-time repairs and compiled through shardfix's pipeline, reported as a decorated function is.

Enabled by `enable()`, `with enabled():`, or the SHARDFIX environment variable (read when shardfix is imported,
and by `python -m shardfix.run`). Executables JAX compiled before are not reused while it is enabled, and are used
again once it is disabled: JAX's caches are keyed on it.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Iterator

from .notify import user_stacklevel

from .session import DEFAULT_POLICY, Session, Settings, plugin_session, set_plugin

ENV_VAR = "SHARDFIX"
_OFF = ("", "0", "false", "off", "no")
_ON = ("1", "true", "on", "yes")


def enable(policy: str = DEFAULT_POLICY, ring_reorder: str = "auto", on_fix: str = "warn") -> None:
    """Run every jax.jit compile in the process through shardfix, with these settings (as autofix_shardings')."""
    set_plugin(Session(Settings(policy, ring_reorder, on_fix), collect=False))


def disable() -> None:
    """jax.jit behaves exactly as without shardfix again (what it compiled before is used again)."""
    set_plugin(None)


def is_enabled() -> bool:
    """Whether the plugin is on."""
    return plugin_session() is not None


@contextlib.contextmanager
def enabled(policy: str = DEFAULT_POLICY, ring_reorder: str = "auto", on_fix: str = "warn") -> Iterator[None]:
    """The plugin enabled for the block (process-wide), then back to what it was."""
    previous = plugin_session()
    enable(policy, ring_reorder, on_fix)
    try:
        yield
    finally:
        set_plugin(previous)


def settings_from_text(text: str, source: str = ENV_VAR) -> Settings | None:
    """The settings a SHARDFIX value asks for: "1" (defaults), "0" (off: None), or comma-separated `key=value`
    pairs, e.g. "policy=drop,ring_reorder=off,on_fix=log"."""
    value = text.strip()
    if value.lower() in _OFF:
        return None
    if value.lower() in _ON:
        return Settings()
    options = {}
    for item in value.split(","):
        key, eq, setting = (part.strip() for part in item.partition("="))
        key = key.replace("-", "_")
        if not eq or key not in ("policy", "ring_reorder", "on_fix"):
            raise ValueError(f"{source}={text!r}: expected 1, 0, or comma-separated policy=..., ring_reorder=..., "
                             f"on_fix=...; got {item.strip()!r}")
        options[key] = setting
    try:
        return Settings(**options)
    except ValueError as e:
        raise ValueError(f"{source}={text!r}: {e}") from None


def enable_from_environment(on_error: str = "raise") -> bool:
    """Enable the plugin as the SHARDFIX environment variable says; whether it did. A value that doesn't parse
    raises ValueError, or (on_error="warn", when shardfix is imported) is said in a warning and ignored."""
    try:
        settings = settings_from_text(os.environ.get(ENV_VAR, ""))
    except ValueError as e:
        if on_error != "warn":
            raise
        warnings.warn(f"{e}; shardfix is not enabled", RuntimeWarning, stacklevel=user_stacklevel())
        return False
    if settings is None:
        return False
    enable(settings.policy, settings.ring_reorder, settings.on_fix)
    return True
