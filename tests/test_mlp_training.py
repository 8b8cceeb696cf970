"""A plain-JAX MLP classifier trained 3 optax steps through calls of an @autofix_shardings step, with wrong specs in
its parameters, activations (reshard, out_sharding=, constraints) and batch: 6 hidden units ("heads") over tp=4,
50257 classes over tp=4, a batch of 1 over dp=2, an axis the mesh lacks ("fsdp") and a spec longer than the rank.
On jax.make_mesh's default (Explicit) axes and on Auto ones: it runs, equals an unsharded jax.jit reference, and
reports each fix once at a line of this file; plain jax.jit raises on the same program."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from shardfix import ShardingFixWarning, autofix_shardings
from support.training import expected_report, mesh_of, report_rows

FEATURES, HIDDEN, CLASSES = 16, 6, 50257
PARAM_SPECS = {"w1": P("fsdp", "tp"), "b1": P("tp", None), "w2": P(None, "tp")}  # b1: one entry too many
OPTIMIZER = optax.sgd(0.5, momentum=0.9)


def mlp(params, x, explicit: bool | None):
    """Logits; `explicit` None is the unsharded reference."""
    h = x @ params["w1"] + params["b1"]
    if explicit:
        h = jax.sharding.reshard(h, P("dp", "tp"))  # hidden (explicit)
    elif explicit is not None:
        h = jax.lax.with_sharding_constraint(h, P("dp", "tp"))  # hidden (auto)
    h = jnp.tanh(h)
    if explicit:
        return jnp.dot(h, params["w2"], out_sharding=P("dp", "fsdp"))  # logits (explicit)
    logits = h @ params["w2"]
    if explicit is not None:
        logits = jax.lax.with_sharding_constraint(logits, P("dp", "fsdp", None))  # logits (auto)
    return logits


def make_step(explicit: bool | None):
    place = jax.sharding.reshard if explicit else jax.lax.with_sharding_constraint

    def train_step(params, opt_state, x, labels):
        if explicit is not None:
            x = place(x, P("dp", None))  # batch
            params = place(params, PARAM_SPECS)  # parameters

        def loss_fn(params):
            return optax.softmax_cross_entropy_with_integer_labels(mlp(params, x, explicit), labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return train_step


def initial_state():
    rng = np.random.default_rng(1)
    params = {"w1": rng.normal(0, 0.5, (FEATURES, HIDDEN)).astype(np.float32),
              "b1": rng.normal(0, 0.1, (HIDDEN,)).astype(np.float32),
              "w2": rng.normal(0, 0.5, (HIDDEN, CLASSES)).astype(np.float32)}
    x = rng.normal(size=(1, FEATURES)).astype(np.float32)
    labels = np.asarray([CLASSES - 1], np.int32)
    return params, OPTIMIZER.init(params), x, labels


def train(step, params, opt_state, x, labels):
    losses = []
    for _ in range(3):
        params, opt_state, loss = step(params, opt_state, x, labels)
        losses.append(float(loss))
    return params, losses


@pytest.fixture(scope="module")
def reference():
    return train(jax.jit(make_step(None)), *initial_state())


def decorated(explicit: bool):
    params, opt_state, _, _ = initial_state()
    opt_specs = optax.tree_map_params(OPTIMIZER, lambda _, spec: spec, opt_state, PARAM_SPECS,
                                      transform_non_params=lambda _: P(), is_leaf=lambda x: isinstance(x, P))
    return autofix_shardings(make_step(explicit), mesh=mesh_of(explicit),
                             in_shardings=(PARAM_SPECS, opt_specs, P("dp"), P("dp")),
                             out_shardings=(PARAM_SPECS, opt_specs, P()))


@pytest.fixture(scope="module", params=[True, False], ids=["explicit", "auto"])
def run(request):
    """(explicit, the decorated step, (trained params, losses), the warnings of the three calls)."""
    explicit = request.param
    step = decorated(explicit)
    with jax.set_mesh(mesh_of(explicit)), warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        trained = train(step, *initial_state())
    return explicit, step, trained, [w for w in told if issubclass(w.category, ShardingFixWarning)]


def test_trains_like_the_unsharded_reference(run, reference):
    _, _, (params, losses), _ = run
    ref_params, ref_losses = reference
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for name in params:
        np.testing.assert_allclose(np.asarray(params[name]), np.asarray(ref_params[name]), rtol=1e-5, atol=1e-7)


BOUNDARY = [  # at the step's def line: each parameter spec counts the parameter and its momentum, in and out
    ("unknown-axis,indivisible", "P('fsdp', 'tp')", "P(None, None)", 4),
    ("rank-mismatch,indivisible", "P('tp', None)", "P(None,)", 4),
    ("indivisible", "P(None, 'tp')", "P(None, None)", 4),
    ("indivisible", "P('dp',)", "P(None, None)", 1),  # x
    ("indivisible", "P('dp',)", "P(None,)", 1),  # labels
]
EXPLICIT = [
    ("parameters", "unknown-axis,indivisible", "P('fsdp', 'tp')", "P(None, None)", 1),
    ("parameters", "rank-mismatch,indivisible", "P('tp', None)", "P(None,)", 1),
    ("parameters", "indivisible", "P(None, 'tp')", "P(None, None)", 1),
    ("batch", "indivisible", "P('dp', None)", "P(None, None)", 1),
    ("hidden (explicit)", "indivisible", "P('dp', 'tp')", "P(None, None)", 1),
    ("logits (explicit)", "unknown-axis,indivisible", "P('dp', 'fsdp')", "P(None, None)", 1),
]
# Under Auto axes JAX rejects only the unknown axes and the over-long spec while tracing; the indivisible constraints
# reach the module, where the default policy (auto) keeps JAX's padded split wherever it leaves each device less work
# than an even one: w1's and b1's 6 units over tp=4 (2 a device, against 3 over "tp":(1)2) and w2's 50257 classes (no
# even split at all) stay as they are, and so does "tp" where the batch's "dp" (1 row) is dropped. The module's fixes
# of what the user wrote as PartitionSpecs are said as PartitionSpecs, and the logits' spec, repaired while tracing
# (its unknown axis) and then in the module (its batch dim), is one fix from what was written to what runs.
# Under Auto axes the auto policy keeps a spec's shard count at the boundary where another dim holds the axis (w1's
# tp goes to its 8 rows; x's dp to its 4 features); the lowering's arguments, committed replicated, are moved to it.
BOUNDARY_AUTO = [
    ("unknown-axis,indivisible,moved-axis", "P('fsdp', 'tp')", "P('tp', None)", 4),
    ("rank-mismatch,indivisible", "P('tp', None)", "P(None,)", 4),
    ("indivisible", "P(None, 'tp')", "P(None, None)", 4),
    ("indivisible,moved-axis", "P('dp',)", "P(None, 'dp')", 1),  # x
    ("indivisible", "P('dp',)", "P(None,)", 1),  # labels
]
AUTO = [
    ("lowered", "moved-argument", "P()", "P('tp', None)", 1),
    ("parameters", "unknown-axis", "P('fsdp', 'tp')", "P(None, 'tp')", 1),
    ("parameters", "rank-mismatch", "P('tp', None)", "P('tp',)", 1),
    ("batch", "indivisible", "P('dp', None)", "P(None, None)", 1),  # no gradient: forward only
    ("hidden (auto)", "indivisible,kept-padding", "P('dp', 'tp')", "P(None, 'tp')", 2),  # forward, backward
    ("logits (auto)", "rank-mismatch,unknown-axis,indivisible", "P('dp', 'fsdp', None)", "P(None, None)", 2),
]


def test_report(run):
    explicit, step, _, told = run
    assert step.lower_count == 2  # the first call, then the second with its arguments committed by the first
    with jax.set_mesh(mesh_of(explicit)), warnings.catch_warnings():
        warnings.simplefilter("ignore", ShardingFixWarning)
        fixes = step.lower(*initial_state()).fixes  # lowered
    assert report_rows(fixes) == expected_report(__file__, BOUNDARY if explicit else BOUNDARY_AUTO,
                                                 EXPLICIT if explicit else AUTO)
    assert len(told) == 1 and told[0].filename == __file__  # at the call; the second compile repeats it: not told


@pytest.mark.parametrize("explicit, error", [
    (True, "Sharding spec ('dp',) implies that array axis 0 is partitioned 2 times, but does not evenly divide the "
           "dimension size 1."),  # the batch, placed first
    (False, "Resource axis: fsdp of P('fsdp', 'tp') is not found in mesh: ('dp', 'tp')."),  # w1
], ids=["explicit", "auto"])
def test_plain_jit_rejects_the_same_program(explicit, error):
    params, opt_state, x, labels = initial_state()
    with jax.set_mesh(mesh_of(explicit)):
        with pytest.raises(ValueError, match=re.escape(error)):
            jax.jit(make_step(explicit)).trace(params, opt_state, x, labels)
