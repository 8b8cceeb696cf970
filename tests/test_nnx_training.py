"""A GQA transformer in Flax NNX trained 3 optax steps (Adam on Explicit axes, SGD with momentum on Auto ones, the
optimizer's state sharded like the parameters), written as Flax's NNX sharding guide writes it, with logical-axis
rules made for another mesh: on (2,4) data/model, (1,8) fsdp/tp with MaxText's rules (the batch over ("data",
"fsdp"), an axis the mesh lacks; the embedding over fsdp too) and (8,) data. Plain jax.jit raises on each; through
`@autofix_shardings` (the functional form Flax documents for jax.jit, with out_shardings) and under the plugin
(the guide's eager flow and an nnx.jit step, in a script that never imports shardfix) it trains as the unsharded
run does."""

import re

import jax
import pytest
from flax import nnx

from shardfix import ShardingFixWarning, autofix_shardings
from support import gqa, nnx_gqa


@pytest.fixture(scope="module")
def references():
    return {kind: nnx_gqa.reference(kind) for kind in set(gqa.OPTIMIZER.values())}


@pytest.mark.parametrize(**gqa.decorator_setups("nnx"))
def test_the_functional_form_through_the_decorator(references, mesh_name, mode):
    kind, tokens, batch = gqa.OPTIMIZER[mode], gqa.tokens(), gqa.mesh_spec(("batch", None), mesh_name)
    with jax.set_mesh(gqa.make_mesh(mesh_name, mode)), nnx.logical_axis_rules(gqa.rules(mesh_name)):
        with pytest.raises((ValueError, AssertionError), match=gqa.REJECTED):
            nnx_gqa.functional(kind, jax.jit, tokens, batch)
        with pytest.warns(ShardingFixWarning):
            trained = nnx_gqa.functional(kind, autofix_shardings, tokens, batch)
    gqa.assert_same_run(trained, references[kind])


def test_the_guides_eager_flow_under_the_plugin(references, tmp_path):
    done, runs = gqa.train_under_plugin("nnx", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ShardingFixWarning" in done.stderr
    assert sorted(runs) == sorted(gqa.PLUGIN_SETUP_IDS)
    for (mesh_name, mode), setup in zip(gqa.PLUGIN_SETUPS, gqa.PLUGIN_SETUP_IDS):
        gqa.assert_same_run(runs[setup], references[gqa.OPTIMIZER[mode]])
    plain, _ = gqa.train_under_plugin("nnx", tmp_path, plugin=False)
    assert plain.returncode != 0 and re.search(gqa.REJECTED, plain.stderr), plain.stderr[-3000:]
