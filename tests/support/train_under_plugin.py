"""A training script that never imports shardfix: the library's documented flow (eager sharding, then a jitted
step) on every mesh and axis type of support.gqa, as a user would run it with `SHARDFIX=1`.

    python tests/support/train_under_plugin.py nnx|linen|eqx OUT

writes each setup's (losses, parameter leaves) to OUT.npz / OUT.json for the test that started it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from support import gqa  # noqa: E402


def train(library: str, mesh_name: str, mode: str):
    tokens, rules = gqa.tokens(), gqa.rules(mesh_name)
    kind = gqa.OPTIMIZER[mode]
    mesh = gqa.make_mesh(mesh_name, mode)
    with jax.set_mesh(mesh):
        if library == "nnx":
            from flax import nnx
            from support import nnx_gqa
            with nnx.logical_axis_rules(rules):
                return nnx_gqa.train_eagerly(kind, tokens)
        if library == "linen":
            from flax import linen as nn
            from support import linen_gqa
            with nn.logical_axis_rules(rules):
                return linen_gqa.eager(kind, tokens, mesh, rules)
        from support import eqx_gqa
        return eqx_gqa.eager(kind, tokens, mesh_name)


if __name__ == "__main__":
    library, out = sys.argv[1:]
    gqa.dump({f"{mesh}-{mode}": train(library, mesh, mode) for mesh, mode in gqa.SETUPS}, out)
