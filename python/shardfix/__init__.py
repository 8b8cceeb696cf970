"""shardfix: repair JAX/Shardy shardings and balance ring collectives, as MLIR passes over StableHLO/Shardy."""

__version__ = "0.1.0"

from .api import ShardingFixWarning, correct_spec, get_corrected_named_sharding  # noqa: E402
from .jit import ShardingFixError, autofix_shardings  # noqa: E402
from .layout import reorder_sequence  # noqa: E402

__all__ = ["ShardingFixError", "ShardingFixWarning", "autofix_shardings", "correct_spec",
           "get_corrected_named_sharding", "reorder_sequence", "__version__"]
