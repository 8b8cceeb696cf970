"""A GQA transformer in Flax Linen trained 3 optax steps (Adam on Explicit axes, SGD with momentum on Auto ones, a
TrainState whose optimizer state is sharded like the parameters), written as Flax's Linen guides write it
(`nn.with_logical_partitioning`, `nn.with_logical_constraint`, `nn.logical_axis_rules`), with rules made for another
mesh: on (2,4) data/model, (1,8) fsdp/tp with MaxText's rules and (8,) data. Plain jax.jit raises on each (on
Explicit axes Linen's constraints are asserts); through `@autofix_shardings` (the guide's jitted init and step,
in/out shardings from `nn.get_partition_spec` + `nn.logical_to_mesh`) and under the plugin (`nn.unbox` +
`nn.logical_to_mesh_sharding` + `jax.device_put`, then a jax.jit step, in a script that never imports shardfix) it
trains as the unsharded run does."""

import re

import jax
import pytest
from flax import linen as nn

from shardfix import ShardingFixWarning, autofix_shardings
from support import gqa, linen_gqa


@pytest.fixture(scope="module")
def references():
    return {kind: linen_gqa.reference(kind) for kind in set(gqa.OPTIMIZER.values())}


@pytest.mark.parametrize(**gqa.decorator_setups("linen"))
def test_the_functional_form_through_the_decorator(references, mesh_name, mode):
    kind, tokens, rules = gqa.OPTIMIZER[mode], gqa.tokens(), gqa.rules(mesh_name)
    with jax.set_mesh(gqa.make_mesh(mesh_name, mode)), nn.logical_axis_rules(rules):
        with pytest.raises((ValueError, AssertionError), match=gqa.REJECTED):
            linen_gqa.functional(kind, jax.jit, tokens, rules)
        with pytest.warns(ShardingFixWarning):
            trained = linen_gqa.functional(kind, autofix_shardings, tokens, rules)
    gqa.assert_same_run(trained, references[kind])


def test_the_guides_eager_flow_under_the_plugin(references, tmp_path):
    done, runs = gqa.train_under_plugin("linen", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ShardingFixWarning" in done.stderr
    assert sorted(runs) == sorted(gqa.PLUGIN_SETUP_IDS)
    for (mesh_name, mode), setup in zip(gqa.PLUGIN_SETUPS, gqa.PLUGIN_SETUP_IDS):
        gqa.assert_same_run(runs[setup], references[gqa.OPTIMIZER[mode]])
    plain, _ = gqa.train_under_plugin("linen", tmp_path, plugin=False)
    assert plain.returncode != 0 and re.search(gqa.REJECTED, plain.stderr), plain.stderr[-3000:]
