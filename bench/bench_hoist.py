"""hoist-permutations: run time of an 8-layer ring transformer with a permutation around every layer's ring
region (ring-reorder alone) against the hoisted program (one at the input, one at the output), in one run."""

from __future__ import annotations

import common  # noqa: F401  (sets XLA_FLAGS first)
from common import interleaved


def main() -> str:
    import jax
    import numpy as np

    from support.hlo import collective_bytes
    from shardfix.jit.lowering import patch_lowered
    from support.ring_models import ring_transformer

    mesh = jax.make_mesh((2, 4), ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rows = ["| layers | sequence x hidden | variant | permutations in the module | permutation bytes per device "
            "| run time (ms) | ratio hoisted / per-layer |", "|---:|---|---|---:|---:|---:|---:|"]
    for layers, length, hidden in ((8, 512, 64), (8, 2048, 64)):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, length, hidden)).astype(np.float32)
        pos = np.broadcast_to(np.arange(length, dtype=np.int32), (2, length)).copy()
        weights = [[(rng.standard_normal((hidden, hidden)) * 0.1).astype(np.float32) for _ in range(6)]
                   for _ in range(layers)]
        args = (x, pos, weights)
        lowered = jax.jit(ring_transformer(mesh, layers)).lower(*args)
        base = collective_bytes(lowered.compile().as_text()).get("collective-permute", [])
        variants = {}
        for name, pipeline in (("per-layer", "ring-reorder{strategy=zigzag}"),
                               ("hoisted", "ring-reorder{strategy=zigzag},hoist-permutations")):
            patched, _ = patch_lowered(lowered, pipeline)
            compiled = patched.compile()
            moved = collective_bytes(compiled.as_text()).get("collective-permute", [])
            for b in base:
                moved.remove(b)
            variants[name] = (compiled, patched.as_text().count("shardfix.sequence_permutation"), sum(moved))
        expected = np.asarray(variants["per-layer"][0](*args))
        np.testing.assert_allclose(np.asarray(variants["hoisted"][0](*args)), expected, atol=1e-4, rtol=1e-4)
        t_layer, t_hoist = interleaved(lambda: variants["per-layer"][0](*args).block_until_ready(),
                                       lambda: variants["hoisted"][0](*args).block_until_ready(), rounds=11, warmup=2)
        for name, t in (("per-layer", t_layer), ("hoisted", t_hoist)):
            _, count, moved = variants[name]
            ratio = f"{t_hoist / t_layer:.2f}x" if name == "hoisted" else ""
            rows.append(f"| {layers} | {length} x {hidden} | {name} | {count} | {moved} | {t * 1e3:.2f} | {ratio} |")
    return ("## hoist-permutations: per-layer permutations vs hoisted (8 simulated CPU devices, dp=2 x cp=4)\n\n"
            "Each layer: position-carrying causal ring attention (zigzag) with q/k/v/o projections and an MLP, "
            "residual adds. Results checked equal.\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    print(main())
