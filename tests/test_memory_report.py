"""What a repair costs in memory: every fix says the value's bytes on each device before and after; at an entry
argument or result the auto policy keeps an array's shard count by moving an axis its dim can't hold to a dim that
holds it and no axis shards (the 32003-row embedding over tp=8 keeps 8 shards on its 1000 columns), where drop
replicates it. The report keeps values of other shapes apart (wq's 6 heads, wk's 2), and reports a repair for each
function that needs it."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import shardfix
from shardfix import ShardingFixWarning, autofix_shardings

TP = jax.make_mesh((8,), ("tp",), axis_types=(AxisType.Auto,))  # an argument on Explicit axes keeps its dims
DP_TP = jax.make_mesh((2, 4), ("dp", "tp"))
EMBEDDING = np.arange(13 * 16, dtype=np.float32).reshape(13, 16)  # 13 rows: no even split over 8
IDS = np.array([0, 5, 12, 3], dtype=np.int32)


def lookup(table, ids):
    return table[ids] * 2


def messages(caught) -> str:
    return "\n".join(str(w.message) for w in caught if issubclass(w.category, ShardingFixWarning))


@pytest.mark.parametrize("policy, spec, per_device", [
    ("auto", P(None, "tp"), "per device: 128 -> 104 bytes (x0.81)"),  # 2 padded rows of 16 asked; 13 x 2 kept
    ("drop", P(None, None), "per device: 128 -> 832 bytes (x6.50)"),
])
def test_auto_moves_the_axis_and_says_what_each_device_holds(policy, spec, per_device):
    with jax.set_mesh(TP), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = autofix_shardings(lookup, in_shardings=(P("tp", None), P()), out_shardings=P("tp", None), policy=policy)
        out = f(EMBEDDING, IDS)
    np.testing.assert_array_equal(np.asarray(out), EMBEDDING[IDS] * 2)
    text = messages(caught)
    assert f"in_shardings[0] (shape (13, 16)): P('tp', None) -> {spec}" in text, text
    assert per_device in text, text
    if policy == "auto":
        assert "axis 'tp' moved from dim 0 (13, which it doesn't divide) to dim 1 (16 over 8)" in text, text
        assert out.sharding.spec == P(None, "tp")  # the result (4, 16): rows over 8 don't divide either


def test_no_move_onto_a_dim_already_sharded():
    table = np.ones((6, 8), np.float32)
    with jax.set_mesh(DP_TP), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        autofix_shardings(lambda t: t + 1, in_shardings=P("tp", "dp"))(table)
    assert "P('tp', 'dp') -> P(None, 'dp') [indivisible]" in messages(caught)


def heads(wq, wk):
    return wq.sum() + wk.sum()


def test_values_of_other_shapes_are_reported_apart():
    wq, wk = np.ones((3, 6, 4), np.float32), np.ones((3, 2, 4), np.float32)  # 6 heads and 2 kv heads over tp=4
    with jax.set_mesh(DP_TP), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        autofix_shardings(heads, in_shardings=(P(None, "tp"), P(None, "tp")), policy="drop")(wq, wk)
    lines = [line for line in messages(caught).splitlines() if "in_shardings" in line]
    assert [line.split(": ", 1)[1] for line in lines] == [
        "in_shardings[0] (shape (3, 6, 4)): P(None, 'tp') -> P(None, None, None) [indivisible]",
        "in_shardings[1] (shape (3, 2, 4)): P(None, 'tp') -> P(None, None, None) [indivisible]"]


def constrained(x):
    return jax.sharding.reshard(x * 2, P("tp", "zz"))  # one helper line, used by two functions


def init(x):
    return constrained(x)


def train_step(x):
    return constrained(x) + 1


@pytest.mark.parametrize("how", ["decorator", "plugin"])
def test_each_function_reports_its_own_repair(how):
    x = jnp.ones((6, 8))
    with jax.set_mesh(DP_TP), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how == "decorator":
            autofix_shardings(init)(x)
            autofix_shardings(train_step)(x)
        else:
            with shardfix.enabled():
                jax.jit(init)(x)
                jax.jit(train_step)(x)
    heads_of = [str(w.message).splitlines()[0] for w in caught if issubclass(w.category, ShardingFixWarning)]
    assert heads_of == ["shardfix changed 1 sharding(s) of init:", "shardfix changed 1 sharding(s) of train_step:"]
