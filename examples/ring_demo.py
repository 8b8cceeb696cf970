"""`make demo` (second part): ejkernel's causal ring attention, unmodified, balanced by @autofix_shardings.

ejkernel's XLA `ring_attention` walks the key/value blocks around a ring of collective_permutes and, inside each
step, scans over chunks, skipping a (query chunk, key chunk) tile when every key follows every query. With the
sequence in its natural order the first device skips almost everything and the last computes everything, at every
step. @autofix_shardings proves that the kernel's results follow their tokens, puts the sequence in zigzag order
before the ring and back after it, and the tiles each device computes, counted on the running program, even out.
A ring that is not attention (an all-gather written with ppermute) is left alone, and the report says why, at its
line. ejkernel needs jax~=0.10, so this part runs in the oldest supported environment (.venv-oldest).
"""

import os
import sys
import warnings

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardfix import autofix_shardings  # noqa: E402
from support import ejkernel_models as ejk  # noqa: E402
from support import tiles  # noqa: E402

CHUNK = 8


def _matrix(counts: np.ndarray) -> str:
    return "\n".join(f"      device {d}: {' '.join(f'{n:2d}' for n in row)}" for d, row in enumerate(counts))


def balance(cp: int) -> bool:
    mesh = jax.make_mesh((8 // cp, cp), ("dp", "cp"))  # Explicit axes: jax.make_mesh's default
    spec = P("dp", "cp", None, None)
    q, k, v = (jax.device_put(x, NamedSharding(mesh, spec)) for x in ejk.inputs(mesh, 2 * CHUNK * cp)[:3])
    dense = np.asarray(ejk.dense_causal(*(np.asarray(x) for x in (q, k, v))))
    # ejkernel's kernel as users call it, with one more output: the tiles it computed (for counting only)
    logged = tiles.with_skip_log(lambda q, k, v: ejk.ring_attention(q, k, v, axis="cp", chunk=CHUNK), mesh,
                                 (spec,) * 3, spec, entries=cp * 4)
    fixed = autofix_shardings(logged).lower(q, k, v)
    for ring in fixed.rings:  # the default strategy picks the layout from the tiles it counts at compile time
        print(f"   {ring.loc}: ring on \"{ring.axis}\": {'reordered, ' + ring.strategy if ring.applied else ring.why}"
              f" (tiles on the critical path, counted at compile time: {ring.critical_before} as written, "
              f"{ring.critical_after} {ring.strategy}, ideal {ring.ideal})")
    ok = all(r.applied for r in fixed.rings)
    for name, program in (("jax.jit", jax.jit(logged).lower(q, k, v)), ("@autofix_shardings", fixed)):
        out, log = tiles.instrumented(program).compile()(q, k, v)
        counts = tiles.tiles_per_step(np.asarray(log), cp)[:cp]
        error = float(np.abs(np.asarray(out) - dense).max())
        ratio = tiles.critical_path_over_ideal(counts)
        print(f"   {name}: tiles computed per ring step (first {cp} devices); critical path / ideal {ratio:.3f}; "
              f"max error vs dense causal attention {error:.1e}")
        print(_matrix(counts))
        ok &= error < 1e-5
    return ok and ratio <= 1.05


def ring_all_gather(x):
    parts = [x]
    for _ in range(3):
        x = jax.lax.ppermute(x, "cp", [(j, (j + 1) % 4) for j in range(4)])
        parts.append(x)
    return jnp.concatenate(parts, axis=0)


def refused() -> bool:
    mesh = jax.make_mesh((2, 4), ("dp", "cp"))
    gather = jax.shard_map(ring_all_gather, mesh=mesh, in_specs=P("cp"), out_specs=P("cp"))
    x = jax.device_put(jnp.arange(64.0).reshape(16, 4), NamedSharding(mesh, P("cp")))
    fixed = autofix_shardings(gather)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (ring,) = fixed.lower(x).rings
        same = bool((np.asarray(fixed(x)) == np.asarray(jax.jit(gather)(x))).all())
    print(f"   {ring.loc}: {'reordered' if ring.applied else 'left alone'}: {ring.why}")
    print(f"   result equal to jax.jit's: {same}")
    return same and not ring.applied


def main() -> int:
    ok = True
    for cp in (4, 8):
        print(f"== ejkernel ring_attention, causal, dp x cp = {8 // cp} x {cp}, chunk {CHUNK}, two chunks a device")
        ok &= balance(cp)
        print()
    print("== A ring that is not attention: an all-gather written with ppermute + concatenate")
    ok &= refused()
    print("\nOK: balanced where proved, results equal to dense attention and to jax.jit" if ok else "\nFAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
