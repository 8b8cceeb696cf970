"""`make demo`: a small transformer block on 8 simulated CPU devices with the shardings people really get wrong,
on the mesh `jax.make_mesh` makes by default (Explicit axes):

- vocab 50257 over tp=4 (the logits' out_sharding),
- batch 1 over dp=2 (the activations' reshard and the batch's in_sharding),
- a spec written for another mesh, naming an axis this mesh lacks ("fsdp").
Plain jax.jit rejects the block while tracing; @autofix_shardings repairs it, says so in a warning, and matches the
unsharded reference. Then a causal ring attention, and a .mlir file with shardings the sdy verifier rejects,
repaired by tools/opt.
"""

import os
import subprocess
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

from shardfix import autofix_shardings, correct_spec  # noqa: E402
from support.hlo import pad_count  # noqa: E402
from support.ring_models import (axis_index_ring_attention, dense_causal_attention,  # noqa: E402
                                  position_ring_attention)

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, HIDDEN, FFN, SEQ, BATCH = 50257, 64, 256, 16, 1


def make_block(sharded: bool):
    def block(tokens, embed, w1, w2):
        x = embed[tokens]
        if sharded:
            x = jax.sharding.reshard(x, P("dp", None, "fsdp"))  # batch 1 over dp=2; no fsdp axis here
        x = x + jax.nn.gelu(x @ w1) @ w2
        if sharded:  # vocab 50257 over tp=4
            logits = jnp.einsum("bsh,vh->bsv", x, embed, out_sharding=P("dp", None, "tp"))
        else:
            logits = jnp.einsum("bsh,vh->bsv", x, embed)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], axis=-1))
    return block


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def boundary_table(names, args, written, running) -> list[str]:
    """One row per argument: its shape, the spec written, the sharding the compiled program takes, and the bytes
    each device holds (of the whole array)."""
    rows = [("argument", "shape", "you wrote", "runs as", "bytes a device (whole array)")]
    for name, arg, spec, sharding in zip(names, args, written, running):
        shard = int(np.prod(sharding.shard_shape(arg.shape))) * arg.dtype.itemsize
        share = "replicated" if shard == arg.nbytes else f"1/{arg.nbytes // shard}"
        rows.append((name, str(arg.shape), "None" if spec is None else str(spec), str(sharding.spec),
                     f"{_bytes(shard)} ({_bytes(arg.nbytes)}, {share})"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def main() -> int:
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))  # Explicit axes, jax.make_mesh's default
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)
    embed = (rng.standard_normal((VOCAB, HIDDEN)) * 0.02).astype(np.float32)
    w1 = (rng.standard_normal((HIDDEN, FFN)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((FFN, HIDDEN)) * 0.05).astype(np.float32)
    args = (tokens, embed, w1, w2)
    in_shardings = (P("dp"), P("tp", None), P("fsdp", "tp"), None)   # batch 1 over dp, 50257 rows over tp, no fsdp

    print("== 1. Plain jax.jit rejects the block while tracing, before any module exists")
    with jax.set_mesh(mesh):
        try:
            jax.jit(make_block(True), in_shardings=in_shardings)(*args)
            ok = False
        except ValueError as error:
            print(f"   {type(error).__name__}: {str(error).splitlines()[0]}")
            ok = True

    print("\n== 2. @autofix_shardings in place of @jax.jit repairs it where JAX checks it; the warning you see:")
    step = autofix_shardings(make_block(True), in_shardings=in_shardings)
    with jax.set_mesh(mesh), warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        loss = float(step(*args))
        pads = pad_count(step.lower(*args).compile().as_text())
        compiled = step.lower(*args).compile()
    shown = told[0]
    text = warnings.formatwarning(shown.message, shown.category, shown.filename, shown.lineno, None)
    # every path in it relative to the current directory, the header's and the entries' alike
    print("   " + text.strip().replace(os.getcwd() + os.sep, "").replace("\n", "\n   "))
    print("\n   Before and after, per argument: plain jax.jit raised (1. above); this is what runs now:")
    print("   " + "\n   ".join(boundary_table(("tokens", "embed", "w1", "w2"), args, in_shardings,
                                              compiled.input_shardings[0])))
    reference = float(jax.jit(make_block(False))(*args))
    print(f"   padded splits in the compiled program: {pads} (every sharded dimension now divides evenly)")
    print(f"   loss: sharded and repaired {loss:.6f}, unsharded reference {reference:.6f}")
    ok &= abs(loss - reference) <= 1e-5 * max(1.0, abs(reference)) and pads == 0
    print(f"   the same specs, corrected by hand (correct_spec): P('fsdp', 'tp') for w1 {w1.shape} -> "
          f"{correct_spec(w1.shape, P('fsdp', 'tp'), mesh)}")

    print("\n== 3. Causal ring attention (shard_map + ppermute over cp=4, positions carried as data)")
    ring_mesh = jax.make_mesh((2, 4), ("dp", "cp"))  # Explicit axes: the arrays are placed where shard_map takes them
    q, k, v = (rng.standard_normal((2, 64, 16)).astype(np.float32) for _ in range(3))
    pos = np.broadcast_to(np.arange(64, dtype=np.int32), (2, 64)).copy()
    dense = np.asarray(dense_causal_attention(q, k, v))
    q, k, v, pos = (jax.device_put(a, NamedSharding(ring_mesh, P("dp", "cp"))) for a in (q, k, v, pos))
    for name, fn, args in (("positions as data", position_ring_attention(ring_mesh), (q, k, v, pos, pos)),
                           ("positions from axis_index", axis_index_ring_attention(ring_mesh), (q, k, v))):
        attention = autofix_shardings(fn, ring_reorder="zigzag")
        for ring in attention.lower(*args).rings:
            state = "applied" if ring.applied else "not applied"
            print(f"   {name}: ring on \"{ring.axis}\", {ring.strategy}: {state} ({ring.why})")
        err = float(np.abs(np.asarray(attention(*args)) - dense).max())
        print(f"   {name}: max error vs dense causal attention {err:.1e}")
        ok &= err < 1e-5

    print("\n== 4. tools/opt on a module the sdy verifier rejects (examples/broken.mlir)")
    opt = [sys.executable, os.path.join(HERE, "..", "tools", "opt"), os.path.join(HERE, "broken.mlir")]
    strict = subprocess.run(opt, capture_output=True, text=True)
    print(f"   plain load: exit {strict.returncode}: {strict.stderr.strip()}")
    fixed_run = subprocess.run(opt + ["-p", "fix-shardings,sdy-propagation-pipeline", "--report"],
                               capture_output=True, text=True)
    print(f"   -p fix-shardings,sdy-propagation-pipeline --report: exit {fixed_run.returncode}")
    print("   " + fixed_run.stderr.strip().replace("\n", "\n   "))
    print("   " + fixed_run.stdout.strip().replace("\n", "\n   "))
    ok &= strict.returncode == 1 and fixed_run.returncode == 0

    print("\nOK: results match the unsharded reference" if ok else "\nFAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
