"""A GQA transformer in Equinox trained 3 optax steps (Adam on Explicit axes, SGD with momentum on Auto ones, the
optimizer's state sharded like the parameters), written as Equinox's parallelism example writes it (`eqx.filter_shard`
on the model, its optimizer state, the batch and the activations), with specs from logical-axis rules made for
another mesh: on (2,4) data/model, (1,8) fsdp/tp with MaxText's rules and (8,) data. Plain jax.jit raises on each
(on Explicit axes `filter_shard` is an assert); through `@autofix_shardings` (in/out shardings too) and under the
plugin (the example's eager placement and an `eqx.filter_jit` step, in a script that never imports shardfix) it
trains as the unsharded run does, each `filter_shard` on Explicit axes repaired as the reshard it meant. And a
prediction of 6 sequences over 8 devices constrained on the way out, which JAX rejects at the result under Auto axes,
runs under the default policy, through the decorator and the plugin."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardfix
from shardfix import ShardingFixWarning, autofix_shardings
from support import eqx_gqa, gqa


@pytest.fixture(scope="module")
def references():
    return {kind: eqx_gqa.reference(kind) for kind in set(gqa.OPTIMIZER.values())}


@pytest.mark.parametrize(**gqa.decorator_setups("eqx"))
def test_the_example_through_the_decorator(references, mesh_name, mode):
    kind, tokens = gqa.OPTIMIZER[mode], jnp.asarray(gqa.tokens())
    with jax.set_mesh(gqa.make_mesh(mesh_name, mode)):
        with pytest.raises((ValueError, AssertionError), match=gqa.REJECTED):
            eqx_gqa.traced(kind, jax.jit, tokens, mesh_name)
        with pytest.warns(ShardingFixWarning):
            trained = eqx_gqa.traced(kind, autofix_shardings, tokens, mesh_name)
    gqa.assert_same_run(trained, references[kind])


def test_the_example_under_the_plugin(references, tmp_path):
    done, runs = gqa.train_under_plugin("eqx", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ShardingFixWarning" in done.stderr
    assert sorted(runs) == sorted(gqa.PLUGIN_SETUP_IDS)
    for (mesh_name, mode), setup in zip(gqa.PLUGIN_SETUPS, gqa.PLUGIN_SETUP_IDS):
        gqa.assert_same_run(runs[setup], references[gqa.OPTIMIZER[mode]])
    plain, _ = gqa.train_under_plugin("eqx", tmp_path, plugin=False)
    assert plain.returncode != 0 and re.search(gqa.REJECTED, plain.stderr), plain.stderr[-3000:]


def predict(model, tokens):
    return eqx.filter_shard(model(tokens), P("data"))  # 6 sequences over data=8, on the way out


def test_a_constraint_on_a_result_of_6_rows_over_8_devices_runs_under_the_default_policy():
    model = eqx_gqa.GQA(jax.random.key(0))
    tokens = np.random.default_rng(1).integers(0, gqa.VOCAB, size=(6, gqa.LENGTH)).astype(np.int32)
    want = np.asarray(jax.jit(lambda m, t: m(t))(model, tokens))
    with jax.set_mesh(gqa.make_mesh("data", "auto")):
        if jax.__version_info__ >= (0, 11):  # JAX 0.10 pads the result; later ones reject it
            with pytest.raises(ValueError, match="is not divisible by axis_size=8"):  # at the result
                jax.jit(predict)(model, tokens)
        with pytest.warns(ShardingFixWarning):
            decorated = autofix_shardings(predict)(model, tokens)
        with shardfix.enabled():  # the same fix, told once above
            plugged = jax.jit(predict)(model, tokens)
    for got in (decorated, plugged):
        np.testing.assert_allclose(np.asarray(got), want, rtol=gqa.RTOL, atol=gqa.ATOL)
