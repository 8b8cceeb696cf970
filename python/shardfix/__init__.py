"""shardfix: repair JAX/Shardy shardings and balance ring collectives, as MLIR passes over StableHLO/Shardy.

Public names are imported on first use: `import shardfix` alone loads neither JAX nor MLIR.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "autofix_shardings": "shardfix.jit.decorator",
    "correct_spec": "shardfix.jit.specs",
    "get_corrected_named_sharding": "shardfix.jit.specs",
    "reorder_sequence": "shardfix.layout",
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
