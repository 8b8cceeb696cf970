"""What the library-shaped training tests share: a small GQA transformer's sizes (odd, so that most specs are
indivisible on every mesh), the three meshes with the logical-axis rules written for each (MaxText-style on
fsdp/tp: the batch over ("data", "fsdp"), an axis that mesh lacks, and the embedding over fsdp too), the data, and
the comparison with the unsharded run. Imports neither shardfix nor any model library: the scripts run under
SHARDFIX=1 import it too."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from jax.sharding import AxisType, PartitionSpec as P

VOCAB, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP, BATCH, LENGTH = 67, 10, 6, 2, 3, 14, 2, 5
STEPS, LEARNING_RATE = 3, 0.05
# Every result equals the unsharded run's to 1e-5, relative, and 1e-6 absolute for values near zero, Adam's too:
# Adam divides by sqrt(nu) + 1e-8, so a gradient entry whose sharded and unsharded sums differ in their last bits moves
# its update by up to the learning rate when the entry is tiny; with these sizes and inits no gradient entry is that
# small (Adam's parameters differ by at most 3.3e-7 after 3 steps), so no wider tolerance is needed.
RTOL, ATOL = 1e-5, 1e-6

# name: (shape, axis names, the rules written for it). Logical names: batch, length, vocab, embed, heads, kv_heads,
# head_dim, mlp.
MESHES = {
    "data_model": ((2, 4), ("data", "model"),
                   (("batch", "data"), ("vocab", "model"), ("embed", None), ("heads", "model"),
                    ("kv_heads", "model"), ("mlp", "model"))),
    "fsdp_tp": ((1, 8), ("fsdp", "tp"),  # MaxText's: batch over data and fsdp, parameters over fsdp (and tp)
                (("batch", ("data", "fsdp")), ("vocab", "tp"), ("embed", "fsdp"), ("heads", "tp"),
                 ("kv_heads", "tp"), ("mlp", "tp"))),
    "data": ((8,), ("data",),  # the data_model rules, on a mesh without "model"
             (("batch", "data"), ("vocab", "model"), ("embed", None), ("heads", "model"), ("kv_heads", "model"),
              ("mlp", "model"))),
}
MODES = ("explicit", "auto")
OPTIMIZER = {"explicit": "adam", "auto": "sgd"}  # each library trains with both, each on every mesh
SETUPS = [(mesh, mode) for mesh in MESHES for mode in MODES]
SETUP_IDS = [f"{mesh}-{mode}" for mesh, mode in SETUPS]
# Through the decorator, per library: each mesh once (each kind of broken rule: an indivisible spec, an axis the mesh
# lacks in a tuple, one it lacks alone) and both axis types (Explicit: the error raised while tracing, repaired as
# the reshard meant, with Adam; Auto: the constraints repaired in the lowered module, with SGD), and across the three
# libraries every mesh on both axis types: each library's way of placing values meets every kind of rule and both
# repairs, and every rule meets both repairs.
DECORATOR_SETUPS = {"linen": [("data_model", "explicit"), ("fsdp_tp", "auto"), ("data", "auto")],
                    "nnx": [("data_model", "auto"), ("fsdp_tp", "explicit"), ("data", "explicit")],
                    "eqx": [("data_model", "explicit"), ("fsdp_tp", "explicit"), ("data", "auto")]}


def decorator_setups(library: str) -> dict:
    """pytest.mark.parametrize's arguments for a library's setups through the decorator."""
    chosen = DECORATOR_SETUPS[library]
    return {"argnames": "mesh_name, mode", "argvalues": chosen, "ids": [f"{mesh}-{mode}" for mesh, mode in chosen]}


# Under the plugin (a fresh interpreter training eagerly, then a jitted step: the flow, not the repairs, which the
# decorator's tests run on every setup): each mesh once, so each kind of broken rule (an indivisible spec, an axis
# the mesh lacks in a tuple, one it lacks alone), and each axis type (an assert vs a constraint; Adam vs SGD).
PLUGIN_SETUPS = [("data_model", "explicit"), ("fsdp_tp", "auto"), ("data", "explicit")]
PLUGIN_SETUP_IDS = [f"{mesh}-{mode}" for mesh, mode in PLUGIN_SETUPS]


def make_mesh(name: str, mode: str) -> jax.sharding.Mesh:
    shape, axes, _ = MESHES[name]
    kind = AxisType.Explicit if mode == "explicit" else AxisType.Auto
    return jax.make_mesh(shape, axes, axis_types=(kind,) * len(axes))


def rules(name: str) -> tuple:
    return MESHES[name][2]


def mesh_spec(names: tuple, name: str) -> P:
    """The PartitionSpec the rules of mesh `name` give logical `names` (None for a name without a rule)."""
    table = dict(rules(name))
    return P(*(table.get(n) if n is not None else None for n in names))


def place(x, spec: P):
    """What these libraries do with an activation's spec: `reshard` on Explicit axes, a sharding constraint on Auto
    ones (Flax's `_apply_sharding`)."""
    if jax.sharding.get_abstract_mesh().are_all_axes_explicit:
        return jax.sharding.reshard(x, spec)
    return jax.lax.with_sharding_constraint(x, spec)


def tokens() -> np.ndarray:
    """A batch of (BATCH, LENGTH + 1) tokens: inputs and next-token labels."""
    return np.random.default_rng(0).integers(0, VOCAB, size=(BATCH, LENGTH + 1)).astype(np.int32)


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_same_run(got: tuple[list, list], want: tuple[list, list]) -> None:
    """(losses, parameter leaves) equal to the unsharded run's."""
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL)
    assert len(got[1]) == len(want[1])
    for a, b in zip(got[1], want[1]):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def dump(results: dict, path: str) -> None:
    """A script's runs, {setup id: (losses, parameter leaves)}, written for the test that started it."""
    np.savez(path, **{f"{key}/{i}": leaf for key, (_, params) in results.items() for i, leaf in enumerate(params)})
    with open(path + ".json", "w") as f:
        json.dump({key: losses for key, (losses, _) in results.items()}, f)
    print("done", sorted(results), file=sys.stderr)


def load(path: str) -> dict:
    with open(path + ".json") as f:
        losses = json.load(f)
    arrays = np.load(path if path.endswith(".npz") else path + ".npz")
    return {key: (value, [arrays[f"{key}/{i}"] for i in range(sum(1 for k in arrays.files if k.startswith(key + "/")))])
            for key, value in losses.items()}


def attention(x, wq, wk, wv, wo, constrain):
    """Grouped-query causal attention: HEADS query heads share KV_HEADS key/value heads. `constrain(value, logical
    names)` places an activation as the library does."""
    import jax.numpy as jnp
    q = constrain(jnp.einsum("bld,dhk->blhk", x, wq), ("batch", "length", "heads", None))
    k = jnp.einsum("bld,dgk->blgk", x, wk)
    v = jnp.einsum("bld,dgk->blgk", x, wv)
    batch, length = x.shape[:2]
    q = q.reshape(batch, length, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
    scores = jnp.einsum("blgrk,bmgk->bgrlm", q, k) / np.sqrt(HEAD_DIM)
    causal = jnp.tril(jnp.ones((length, length), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    out = jnp.einsum("bgrlm,bmgk->blgrk", weights, v).reshape(batch, length, HEADS, HEAD_DIM)
    return jnp.einsum("blhk,hkd->bld", out, wo)


def unconstrained(x, names):
    return x


# What plain JAX says on these setups: an axis the mesh lacks, an indivisible spec (while tracing on Explicit axes,
# at a jit's boundary or in an eager placement), or a sharding constraint on Explicit axes.
REJECTED = r"is not found in mesh|evenly divide|acts as an assert"
SCRIPT = __file__.replace("gqa.py", "train_under_plugin.py")


def train_under_plugin(library: str, directory, plugin: bool = True):
    """Run the script for `library` in a fresh interpreter, with SHARDFIX=1 (or without the plugin at all);
    (the finished process, {setup id: (losses, parameter leaves)} or None when it failed)."""
    import os
    import subprocess
    out = os.path.join(str(directory), library)
    env = {k: v for k, v in os.environ.items() if k != "SHARDFIX"}
    if plugin:
        env["SHARDFIX"] = "1"
    command = [sys.executable, SCRIPT, library, out]  # as a user runs it: `SHARDFIX=1 python train.py`
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    return done, (load(out) if done.returncode == 0 else None)
