"""shardfix: repair JAX/Shardy shardings and balance ring collectives, as MLIR passes over StableHLO/Shardy.

Public names are imported on first use: `import shardfix` alone loads neither JAX nor MLIR. With the SHARDFIX
environment variable set, the plugin (every jax.jit in the process runs through shardfix) is switched on when JAX
is imported, or at once if it already is (see shardfix._startup). Type checkers read `__init__.pyi`.
"""

from __future__ import annotations

import importlib
import os
import sys

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
    if name == "__version__":
        value = _version()
    else:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'shardfix' has no attribute '{name}'")
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)


def _version() -> str:
    """The installed distribution's version (pyproject.toml is the one place it is written); for a source tree on
    PYTHONPATH that was never installed, pyproject.toml's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardfix")
    except PackageNotFoundError:
        import tomllib

        pyproject = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                 "pyproject.toml")
        try:
            with open(pyproject, "rb") as f:
                return tomllib.load(f)["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


if os.environ.get("SHARDFIX", "").strip() or any("shardfix" in option for option in sys.warnoptions):
    from . import _startup  # noqa: F401  (SHARDFIX: the plugin when JAX is imported; -W filters naming shardfix)
