"""What a repair costs in memory: bytes each device holds of a GQA transformer's parameters and Adam state (6 heads,
2 KV heads, vocabulary 32003, hidden 1000) on each mesh of the library tests, with the specs the logical-axis rules
give (tests/support/gqa.py), as requested and as what runs, under the policies auto and drop. Abstract arguments
only: a step that takes and returns the state is lowered and compiled through @autofix_shardings, and the compiled
input shardings are read."""

from __future__ import annotations

import math

import common  # noqa: F401  (sets XLA_FLAGS first)

TITLE = ("## Memory of a repair: per-device bytes of a GQA transformer's parameters and Adam state, requested vs "
         "what runs, auto vs drop (8 simulated CPU devices)")
VOCAB, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP, LAYERS = 32003, 1000, 6, 2, 16, 4000, 2
PARAMS = {  # name: (shape, logical names), per layer unless named "embed" or "final_norm"
    "embed": ((VOCAB, EMBED), ("vocab", "embed")),
    "wq": ((EMBED, HEADS, HEAD_DIM), ("embed", "heads", None)),
    "wk": ((EMBED, KV_HEADS, HEAD_DIM), ("embed", "kv_heads", None)),
    "wv": ((EMBED, KV_HEADS, HEAD_DIM), ("embed", "kv_heads", None)),
    "wo": ((HEADS, HEAD_DIM, EMBED), ("heads", None, "embed")),
    "up": ((EMBED, MLP), ("embed", "mlp")),
    "down": ((MLP, EMBED), ("mlp", "embed")),
    "norm": ((EMBED,), ("embed",)),
    "final_norm": ((EMBED,), ("embed",)),
}


def _abstract_state():
    """(parameters as ShapeDtypeStructs, their logical names, the Adam state's ShapeDtypeStructs, the optimizer)."""
    import jax
    import jax.numpy as jnp
    import optax
    params, names = {}, {}
    for name, (shape, logical) in PARAMS.items():
        for layer in ([None] if name in ("embed", "final_norm") else range(LAYERS)):
            key = name if layer is None else f"layer{layer}.{name}"
            params[key], names[key] = jax.ShapeDtypeStruct(shape, jnp.float32), logical
    optimizer = optax.adam(1e-3)
    return params, names, jax.eval_shape(optimizer.init, params), optimizer


def _requested_bytes(shape, spec, mesh) -> int:
    """Bytes a device would hold with `spec` as written, padded as XLA pads (axes the mesh lacks count as 1)."""
    sizes = dict(mesh.shape)
    entries = tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))
    per_device = 1
    for n, entry in zip(shape, entries):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        per_device *= -(-n // math.prod(sizes.get(a, 1) for a in axes))
    return per_device * 4


def _running_bytes(shape, sharding) -> int:
    return math.prod(sharding.shard_shape(shape)) * 4


def measure(mesh_name: str, mode: str, policy: str) -> dict:
    import jax
    import optax
    from jax.sharding import PartitionSpec as P

    from shardfix import autofix_shardings
    from support.gqa import make_mesh, mesh_spec

    params, names, opt_state, optimizer = _abstract_state()
    param_specs = {key: mesh_spec(logical, mesh_name) for key, logical in names.items()}
    opt_specs = optax.tree_map_params(optimizer, lambda _, spec: spec, opt_state, param_specs,
                                      transform_non_params=lambda _: P(), is_leaf=lambda x: isinstance(x, P))
    mesh = make_mesh(mesh_name, mode)
    step = autofix_shardings(lambda p, o: (p, o), in_shardings=(param_specs, opt_specs),
                             out_shardings=(param_specs, opt_specs), mesh=mesh, policy=policy, on_fix="ignore")
    with jax.set_mesh(mesh):
        lowered = step.lower(params, opt_state)
        compiled = lowered.compile()
    (param_shardings, opt_shardings), _ = compiled.input_shardings
    row = {"fixes": len(lowered.fixes)}
    for part, values, specs, shardings in (("params", params, param_specs, param_shardings),
                                           ("adam", opt_state, opt_specs, opt_shardings)):
        shapes = [v.shape for v in jax.tree.leaves(values)]
        spec_leaves = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))
        row[part + "_requested"] = sum(_requested_bytes(s, sp, mesh) for s, sp in zip(shapes, spec_leaves))
        row[part + "_runs"] = sum(_running_bytes(s, sh) for s, sh in zip(shapes, jax.tree.leaves(shardings)))
        row[part + "_total"] = sum(math.prod(s) * 4 for s in shapes)
    embed = next(f for f in lowered.fixes if f.shape == (VOCAB, EMBED)) if any(
        f.shape == (VOCAB, EMBED) for f in lowered.fixes) else None
    row["embed"] = "unchanged" if embed is None else f"{embed.before} -> {embed.after}"
    return row


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:.2f}"


def main() -> str:
    from support.gqa import MESHES
    rows = ["| mesh | axes | policy | parameters requested (MiB/device) | parameters that run (MiB/device) "
            "| Adam state requested | Adam state that runs | the embedding's spec (requested -> runs) |",
            "|---|---|---|---:|---:|---:|---:|---|"]
    totals = None
    for mesh_name, (shape, axes, _) in MESHES.items():
        for mode, policy in ((mode, policy) for mode in ("auto", "explicit") for policy in ("auto", "drop")):
            r = measure(mesh_name, mode, policy)
            totals = (r["params_total"], r["adam_total"])
            label = " x ".join(f"{a}={n}" for a, n in zip(axes, shape))
            rows.append(f"| {label} ({mesh_name}) | {mode} | {policy} | {_mib(r['params_requested'])} | "
                        f"{_mib(r['params_runs'])} | {_mib(r['adam_requested'])} | {_mib(r['adam_runs'])} | "
                        f"{r['embed']} |")
    return (f"{TITLE}\n\nCommand: `python bench/run_all.py bench_memory`. {LAYERS} layers, float32: "
            f"{_mib(totals[0])} MiB of parameters and {_mib(totals[1])} MiB of Adam state unsharded. Specs from the "
            "logical-axis rules of tests/support/gqa.py (data/model: vocab, heads, kv_heads and mlp over model; "
            "fsdp/tp, MaxText's: embed over fsdp, the rest over tp; data: the data/model rules on a mesh without "
            "model). *Requested*: what a device would hold if the spec ran as written, padded as XLA pads an "
            "indivisible dim (axes the mesh lacks count as 1); *runs*: the compiled step's input shardings, after "
            "@autofix_shardings repaired them at the boundary (where JAX allows no padding). Where a dim can't hold its "
            "axis but another dim of the array can, auto moves the axis there (the embedding's 32003 rows over "
            "model=4 become its 1000 columns over model), on Auto axes; drop replicates the dim. On the (8,) mesh "
            "the rules name only an axis it lacks: every parameter is whole on every device, as requested.\n\n"
            + "\n".join(rows) + "\n")


if __name__ == "__main__":
    print(main())
