"""Shared helpers: A/B timing interleaved in one run (median of several rounds), and model builders."""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The models the benchmarks measure are the test suite's (tests/support).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))


def interleaved(a, b, rounds: int = 7, warmup: int = 1, clock=time.perf_counter) -> tuple[float, float]:
    """Median seconds of `a()` and of `b()`, run alternately so both see the same machine state. `clock`:
    wall time by default; `time.process_time` (this process's CPU time) is disturbed less by other work on a
    shared machine."""
    for _ in range(warmup):
        a(), b()
    ta, tb = [], []
    for i in range(rounds):
        for fn, out in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            start = clock()
            fn()
            out.append(clock() - start)
    return statistics.median(ta), statistics.median(tb)


def mesh_2x4(explicit: bool = True):
    """dp=2 x tp=4: Explicit axes (jax.make_mesh's default), or Auto for the benchmarks whose subject is an
    indivisible sharding inside the module (with Explicit axes JAX rejects it while tracing: no module has it)."""
    import jax
    if explicit:
        return jax.make_mesh((2, 4), ("dp", "tp"))
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def layered_model(mesh, layers: int, hidden: int = 64, indivisible: bool = True):
    """An MLP stack with a sharding constraint per layer; every third constraint is indivisible (hidden + 2 over
    tp=4) when `indivisible`, as when a layer width is tuned for another mesh."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    def f(x, ws):
        for i in range(layers):
            x = jnp.tanh(x @ ws[i])
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("dp", "tp")))
        return x

    width = hidden + 2 if indivisible else hidden
    x = jnp.ones((16, width), jnp.float32)
    ws = [jnp.ones((width, width), jnp.float32) * 0.01 for _ in range(layers)]
    return jax.jit(f), (x, ws)
