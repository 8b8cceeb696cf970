"""`make demo`: a small transformer block on 8 simulated CPU devices with the shardings people really get wrong.

- vocab 50257 over tp=4 (the logits constraint XLA would silently pad),
- batch 1 over dp=2 (the activations constraint),
- a spec written for another mesh, naming an axis this mesh lacks ("fsdp"),
and a .mlir file with shardings the sdy verifier rejects, repaired by tools/opt. Results are checked against the
unsharded reference.
"""

import os
import subprocess
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from shardfix import autofix_shardings, correct_spec  # noqa: E402
from support.hlo import pad_count  # noqa: E402
from support.ring_models import (axis_index_ring_attention, dense_causal_attention,  # noqa: E402
                                  position_ring_attention)

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, HIDDEN, FFN, SEQ, BATCH = 50257, 64, 256, 16, 1


def make_block(mesh, constrain: bool):
    wsc = jax.lax.with_sharding_constraint if constrain else (lambda x, _: x)
    spec = NamedSharding(mesh, P("dp", None, "tp"))

    def block(tokens, embed, w1, w2):
        x = wsc(embed[tokens], spec)                  # batch 1 over dp=2
        h = wsc(jax.nn.gelu(x @ w1), spec)
        x = x + h @ w2
        logits = wsc(x @ embed.T, spec)               # vocab 50257 over tp=4
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], axis=-1))
    return block


def main() -> int:
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)
    embed = (rng.standard_normal((VOCAB, HIDDEN)) * 0.02).astype(np.float32)
    w1 = (rng.standard_normal((HIDDEN, FFN)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((FFN, HIDDEN)) * 0.05).astype(np.float32)

    print("== 1. A spec written for another mesh, corrected by hand (correct_spec)")
    print(f"   P('fsdp', 'tp') for w1 {w1.shape} -> {correct_spec(w1.shape, P('fsdp', 'tp'), mesh)}")

    print("\n== 2. @autofix_shardings in place of @jax.jit, given those specs as they are (the fixes it reports)")
    in_shardings = (P("dp"), P("tp", None), P("fsdp", "tp"), None)   # batch 1 over dp, 50257 rows over tp, no fsdp
    step = autofix_shardings(make_block(mesh, True), mesh=mesh, in_shardings=in_shardings, on_fix="ignore")
    lowered = step.lower(tokens, embed, w1, w2)
    for fix in lowered.fixes:
        print(f"   {fix.location}: {fix.site}: {fix.before} -> {fix.after} [{fix.reason}]")
    pads = pad_count(lowered.compile().as_text())
    loss = float(step(tokens, embed, w1, w2))
    reference = float(jax.jit(make_block(mesh, False))(tokens, embed, w1, w2))
    print(f"   compiled HLO pads after the fix: {pads}")
    print(f"   loss sharded+fixed {loss:.6f}  unsharded reference {reference:.6f}")
    ok = abs(loss - reference) <= 1e-5 * max(1.0, abs(reference)) and pads == 0

    print("\n== 3. Causal ring attention (shard_map + ppermute over cp=4, positions carried as data)")
    ring_mesh = jax.make_mesh((2, 4), ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    q, k, v = (rng.standard_normal((2, 64, 16)).astype(np.float32) for _ in range(3))
    pos = np.broadcast_to(np.arange(64, dtype=np.int32), (2, 64)).copy()
    dense = np.asarray(dense_causal_attention(q, k, v))
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
