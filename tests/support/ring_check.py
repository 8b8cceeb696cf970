"""Running a ring program through `@autofix_shardings` beside jax.jit: the decisions, once the results agree."""

from __future__ import annotations

import jax
import numpy as np

from shardfix import autofix_shardings


def decisions_of_equal_run(fn, args, mesh, strategy: str) -> list:
    """The ring decisions `autofix_shardings(fn, ring_reorder=strategy)` makes, after checking that what it computes
    equals what jax.jit computes (to 1e-5 of each result's scale), rewritten or not."""
    fixed = autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore")
    rings = fixed.lower(*args).rings
    with jax.set_mesh(mesh):
        want, got = jax.jit(fn)(*args), fixed(*args)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5 * max(1.0, np.abs(a).max()))
    return rings


def normal_args(mesh, spec, shape, count: int, seed: int = 0) -> list:
    """`count` float32 arrays of standard normal values, placed with `spec` on `mesh`."""
    rng = np.random.default_rng(seed)
    return [jax.device_put(rng.standard_normal(shape).astype(np.float32), jax.sharding.NamedSharding(mesh, spec))
            for _ in range(count)]
