"""The JAX integration: the `autofix_shardings` decorator, the process-wide plugin, the sessions and hooks through
which JAX's traces and compiles reach shardfix, boundary corrections, lowering, and the one module of private JAX
accesses. Names are imported lazily so that `shardfix.jit._jax` can be reached without importing the decorator."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "autofix_shardings": "decorator", "AutofixFunction": "decorator", "default_pipeline": "session",
    "AutofixTraced": "stages", "AutofixLowered": "stages", "AutofixCompiled": "stages", "patch_lowered": "lowering",
    "enable": "plugin", "disable": "plugin", "enabled": "plugin", "is_enabled": "plugin",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shardfix.jit' has no attribute '{name}'")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
