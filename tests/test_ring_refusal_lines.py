"""A refusal names a line of the program being compiled, whatever the process compiled before.

JAX caches the jaxprs of jitted functions (here jax.random's fold_in and threefry, traced while an op of the first
program was lowered, with that op's traceback) and reuses them in every later program that calls them with the
same types. Two ring programs, each keying a dropout mask by the device index on a line of its own, share those
functions: the second's refusal must cite the second's line, not the first's.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from shardfix import autofix_shardings
from support.ring_user_kernels import NEG, finish, init_state, merge_online, ring, scores
from support.ring_user_programs import meshes

CP, N = 4, 8


def _ring(q, k, v, keep):
    def step(i, carry):
        acc, k, v = carry
        s = jnp.where(keep, scores(q, k), NEG)
        return merge_online(acc, s, v, i), lax.ppermute(k, "cp", ring(CP)), lax.ppermute(v, "cp", ring(CP))

    acc, _, _ = lax.fori_loop(0, CP, step, (init_state(q, "online"), k, v))
    return finish(acc, "online")


def first(q, k, v):
    key = jax.random.fold_in(jax.random.key(0), lax.axis_index("cp"))  # first's line
    return _ring(q, k, v, jax.random.bernoulli(key, 0.9, (N, N)))


def second(q, k, v):
    scale = 2.0
    key = jax.random.fold_in(jax.random.key(0), lax.axis_index("cp"))  # second's line
    return _ring(q * scale, k, v, jax.random.bernoulli(key, 0.9, (N, N)))


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}"))


def _why(body) -> str:
    mesh = meshes()["explicit"]
    spec = jax.sharding.PartitionSpec("dp", "cp", None)
    fn = jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec, check_vma=False)
    x = jax.device_put(np.ones((2, CP * N, 4), np.float32), jax.NamedSharding(mesh, spec))
    (ring_,) = autofix_shardings(fn, on_fix="ignore").lower(x, x, x).rings
    assert not ring_.applied and ring_.why.startswith("not provably safe"), ring_.why
    return ring_.why


def test_a_refusal_inside_a_function_jax_traced_for_another_program_cites_this_programs_line():
    jax.clear_caches()  # the first program is the first to trace jax.random's helpers in this process
    assert _cited(_why(first)) == [_line("first's line")]
    why = _why(second)
    assert _cited(why) == [_line("second's line")], why


def _cited(why: str) -> list[int]:
    return [int(n) for n in re.findall(rf"{re.escape(__file__)}:(\d+)", why)]
