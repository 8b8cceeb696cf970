"""A training script that never imports shardfix: the library's documented flow (eager sharding, then a jitted
step) on a mesh of each kind and both axis types (support.gqa.PLUGIN_SETUPS), as a user would run it with `SHARDFIX=1`.

    python tests/support/train_under_plugin.py nnx|linen|eqx OUT

writes each setup's (losses, parameter leaves) to OUT.npz / OUT.json for the test that started it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from support import gqa  # noqa: E402


def train(library: str, mesh_name: str, mode: str):
    tokens, rules, mesh = gqa.tokens(), gqa.rules(mesh_name), gqa.make_mesh(mesh_name, mode)
    kind = gqa.OPTIMIZER[mode]
    if library == "linen":
        from support import linen_gqa
        return linen_gqa.eager(kind, tokens, mesh, rules)  # initialised on the host, then placed on the mesh
    with jax.set_mesh(mesh):
        if library == "nnx":
            from flax import nnx
            from support import nnx_gqa
            with nnx.logical_axis_rules(rules):
                return nnx_gqa.train_eagerly(kind, tokens)
        from support import eqx_gqa
        return eqx_gqa.eager(kind, tokens, mesh_name)


if __name__ == "__main__":
    library, out = sys.argv[1:]
    gqa.dump({f"{mesh}-{mode}": train(library, mesh, mode) for mesh, mode in gqa.PLUGIN_SETUPS}, out)
