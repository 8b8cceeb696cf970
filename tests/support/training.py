"""Helpers for the training tests (test_flax_lm.py, test_mlp_training.py): the meshes and the expected report."""

import jax
from jax.sharding import AxisType


def mesh_of(explicit: bool):
    """dp=2 x tp=4: jax.make_mesh's default (Explicit) axes, or Auto ones."""
    if explicit:
        return jax.make_mesh((2, 4), ("dp", "tp"))
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)


def line_ending_with(path: str, marker: str) -> int:
    """The line of `path` that ends with the comment `# marker`."""
    return next(i for i, text in enumerate(open(path), 1) if text.rstrip().endswith("# " + marker))


def expected_report(path: str, boundary: list, at_markers: list) -> list:
    """Sorted (location, reason, before, after, count) rows: `boundary` entries at the line of `def train_step(`,
    `at_markers` entries (marker first) at the line ending with that marker."""
    step_line = next(i for i, text in enumerate(open(path), 1) if "def train_step(" in text)
    rows = [(f"{path}:{step_line}", *entry) for entry in boundary]
    rows += [(f"{path}:{line_ending_with(path, marker)}", *entry) for marker, *entry in at_markers]
    return sorted(rows)


def report_rows(fixes) -> list:
    return sorted((f.location, f.reason, f.before, f.after, f.count) for f in fixes)
