"""shardfix: repair JAX/Shardy shardings and balance ring collectives, as MLIR passes over StableHLO/Shardy.

Public names are imported on first use: `import shardfix` alone loads neither JAX nor MLIR, unless the SHARDFIX
environment variable asks for the plugin (then every jax.jit in the process runs through shardfix).
"""

from __future__ import annotations

import importlib
import os

__version__ = "0.1.0"

_EXPORTS = {
    "autofix_shardings": "shardfix.jit.decorator",
    "enable": "shardfix.jit.plugin",
    "disable": "shardfix.jit.plugin",
    "enabled": "shardfix.jit.plugin",
    "is_enabled": "shardfix.jit.plugin",
    "correct_spec": "shardfix.jit.specs",
    "get_corrected_named_sharding": "shardfix.jit.specs",
    "reorder_sequence": "shardfix.jit.layout",
    "ShardingFixError": "shardfix.report",
    "ShardingFixWarning": "shardfix.report",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shardfix' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))


if os.environ.get("SHARDFIX"):  # e.g. SHARDFIX=1 or SHARDFIX="policy=drop,on_fix=log": see shardfix.run
    importlib.import_module("shardfix.jit.plugin").enable_from_environment(on_error="warn")
