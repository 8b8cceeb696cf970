"""MLIR glue: the context, strict and lenient loading, sdy attributes <-> the sharding model, the sharding-site
walker and its batched edits, structural repairs, retargeting, and source locations."""

from .attrs import (manual_axes_of, mesh_from_attr, mesh_to_attr, module_meshes, per_value_to_attr,
                    sharding_from_attr, sharding_to_attr)
from .context import LoadError, diagnostics_of, make_context, new_context
from .loader import parse_module
from .locations import op_loc, source_loc
from .walker import ShardingSite, function_boundary_shardings, transform_shardings, walk_shardings

__all__ = ["LoadError", "ShardingSite", "diagnostics_of", "function_boundary_shardings", "make_context", "new_context",
           "manual_axes_of", "mesh_from_attr", "mesh_to_attr", "module_meshes", "op_loc", "parse_module",
           "per_value_to_attr", "sharding_from_attr", "sharding_to_attr", "source_loc", "transform_shardings",
           "walk_shardings"]
