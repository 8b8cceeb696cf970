"""A Flax linen transformer LM trained 3 optax steps under @autofix_shardings, with wrong specs in its parameters
(Flax logical partitioning), activations (reshard, out_sharding=, constraints) and batch: 6 heads over tp=4, a
50257-token vocabulary over tp=4, a batch of 1 over dp=2, an axis the mesh lacks ("fsdp") and a spec longer than
the rank. On jax.make_mesh's default (Explicit) axes and on Auto ones: it runs, equals an unsharded jax.jit
reference, and reports each fix once at a line of this file; plain jax.jit raises on the same program."""

import re
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from shardfix import ShardingFixWarning, autofix_shardings
from support.training import expected_report, mesh_of, report_rows

VOCAB, EMBED, HEADS, HEAD_DIM, MLP, LAYERS, LENGTH = 50257, 12, 6, 2, 16, 2, 8
# Logical axis -> mesh axis. "fsdp" is an axis of another mesh: this one has only dp and tp.
RULES = (("batch", "dp"), ("length", None), ("vocab", "tp"), ("embed", "fsdp"), ("heads", "tp"), ("kv", None),
         ("mlp", "tp"))
STEPS, LEARNING_RATE = 3, 0.1


def param(module, name, shape, names):
    init = nn.with_logical_partitioning(nn.initializers.normal(0.2), names)
    return module.param(name, init, shape)


class Attention(nn.Module):
    explicit: bool  # Explicit mesh axes: activations are placed with reshard/out_sharding; Auto ones: constraints
    sharded: bool  # False: the unsharded reference (no mesh)

    @nn.compact
    def __call__(self, x):
        wq = param(self, "wq", (EMBED, HEADS, HEAD_DIM), ("embed", "heads", "kv"))
        wk = param(self, "wk", (EMBED, HEADS, HEAD_DIM), ("embed", "heads", "kv"))
        wv = param(self, "wv", (EMBED, HEADS, HEAD_DIM), ("embed", "heads", "kv"))
        wo = param(self, "wo", (HEADS, HEAD_DIM, EMBED), ("heads", "kv", "embed"))
        q, k, v = (jnp.einsum("bld,dhk->blhk", x, w) for w in (wq, wk, wv))
        if self.sharded and self.explicit:
            q = jax.sharding.reshard(q, P("dp", None, "tp", None))  # heads (explicit)
        elif self.sharded:
            q = jax.lax.with_sharding_constraint(q, P("dp", None, "tp", None))  # heads (auto)
        scores = jnp.einsum("blhk,bmhk->bhlm", q, k) / np.sqrt(HEAD_DIM)
        if self.sharded:
            scores = jax.lax.with_sharding_constraint(scores, P("dp", "tp", None, None, None))  # too long
        causal = jnp.tril(jnp.ones((LENGTH, LENGTH), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        out = jnp.einsum("bhlm,bmhk->blhk", weights, v)
        return jnp.einsum("blhk,hkd->bld", out, wo)


class Block(nn.Module):
    explicit: bool
    sharded: bool

    @nn.compact
    def __call__(self, x):
        x = x + Attention(self.explicit, self.sharded)(nn.LayerNorm(use_bias=False)(x))
        w1 = param(self, "w1", (EMBED, MLP), ("embed", "mlp"))
        w2 = param(self, "w2", (MLP, EMBED), ("mlp", "embed"))
        h = jax.nn.gelu(nn.LayerNorm(use_bias=False)(x) @ w1)
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))  # flax constraint
        if self.sharded and self.explicit:  # the contraction over mlp is sharded: say where the sum goes
            return x + jnp.einsum("blf,fd->bld", h, w2, out_sharding=P("dp", None, "fsdp"))  # contraction
        return x + jnp.einsum("blf,fd->bld", h, w2)


class LM(nn.Module):
    explicit: bool = True
    sharded: bool = True

    @nn.compact
    def __call__(self, tokens):
        table = param(self, "embedding", (VOCAB, EMBED), ("vocab", "embed"))
        x = jnp.take(table, tokens, axis=0)
        for _ in range(LAYERS):
            x = Block(self.explicit, self.sharded)(x)
        x = nn.LayerNorm(use_bias=False)(x)
        if self.sharded and self.explicit:
            return jnp.einsum("bld,vd->blv", x, table, out_sharding=P("dp", None, "tp"))  # logits (explicit)
        logits = jnp.einsum("bld,vd->blv", x, table)
        if self.sharded:
            logits = jax.lax.with_sharding_constraint(logits, P("dp", None, "tp"))  # logits (auto)
        return logits


OPTIMIZER = optax.sgd(LEARNING_RATE, momentum=0.9)  # Adam would magnify float rounding in tiny gradients


def make_step(model, param_specs=None):
    """One training step; with `param_specs` it first places the parameters and the batch where the specs say
    (reshard under Explicit axes, a sharding constraint under Auto ones)."""
    place = jax.sharding.reshard if model.explicit else jax.lax.with_sharding_constraint

    def train_step(params, opt_state, tokens):
        if param_specs is not None:
            params = place(params, param_specs)  # parameters
            tokens = place(tokens, P("dp", None))  # batch

        def loss_fn(params):
            logits = model.apply({"params": params}, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return train_step


def initial_state():
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, size=(1, LENGTH + 1)), jnp.int32)
    boxed = LM(sharded=False).init(jax.random.key(0), tokens[:, :-1])["params"]
    params = nn.meta.unbox(boxed)
    return boxed, params, OPTIMIZER.init(params), tokens


def specs(boxed, opt_state):
    """The (wrong) specs the rules give the parameters and the optimizer state; the final norm's scale gets one
    entry too many."""
    with nn.logical_axis_rules(RULES):
        param_specs = nn.logical_to_mesh(nn.get_partition_spec(boxed))
    param_specs["LayerNorm_0"] = {"scale": P(None, "tp")}  # rank 1
    opt_specs = optax.tree_map_params(OPTIMIZER, lambda _, spec: spec, opt_state, param_specs,
                                      transform_non_params=lambda _: P(), is_leaf=lambda x: isinstance(x, P))
    return param_specs, opt_specs


def train(step, params, opt_state, tokens):
    losses = []
    for _ in range(STEPS):
        params, opt_state, loss = step(params, opt_state, tokens)
        losses.append(float(loss))
    return params, losses


@pytest.fixture(scope="module")
def state():
    return initial_state()


@pytest.fixture(scope="module")
def reference(state):
    _, params, opt_state, tokens = state
    return train(jax.jit(make_step(LM(sharded=False))), params, opt_state, tokens)


@pytest.fixture(scope="module", params=[True, False], ids=["explicit", "auto"])
def run(request, state):
    """(explicit, the lowered step, (trained params, losses), the warnings): one lowering, three steps."""
    explicit = request.param
    boxed, params, opt_state, tokens = state
    param_specs, opt_specs = specs(boxed, opt_state)
    mesh = mesh_of(explicit)
    step = autofix_shardings(make_step(LM(explicit=explicit), param_specs),
                             in_shardings=(param_specs, opt_specs, P("dp")),
                             out_shardings=(param_specs, opt_specs, P()), mesh=mesh)
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            trained = train(step, params, opt_state, tokens)  # three calls of the decorated step
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ShardingFixWarning)
            lowered = step.lower(params, opt_state, tokens)  # every fix, listed again
    return explicit, lowered, trained, [w for w in told if issubclass(w.category, ShardingFixWarning)]


def test_trains_like_the_unsharded_reference(run, reference):
    _, _, (params, losses), _ = run
    ref_params, ref_losses = reference
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_every_fix_is_reported_once_at_a_line_of_this_file(run):
    _, lowered, _, told = run
    fixes = lowered.fixes
    assert fixes and all(re.fullmatch(re.escape(__file__) + r":\d+", f.location) for f in fixes)
    keys = [(f.location, f.reason, f.before, f.after, f.shape) for f in fixes]  # values of other shapes apart
    assert len(keys) == len(set(keys))
    # told once (the second call compiles again for its committed arguments: nothing new), in the words a user reads:
    # 57 sites at the step's boundary (BOUNDARY) and 16 repaired while tracing (EXPLICIT), or 21 in the module (AUTO)
    first = (f"{__file__}:100: in_shardings[0]['Block_0']['Attention_0']['wk'] (shape (12, 6, 2)) and 23 more "
             "site(s): P('fsdp', 'tp', None) -> ")
    expected = (f"shardfix changed 73 sharding(s) of train_step:\n  {first}P(None, None, None) "
                "[unknown-axis,indivisible] (x24)\n") if run[0] else \
        (f"shardfix changed 78 sharding(s) of train_step:\n  {first}P('tp', None, None) "
         "[unknown-axis,indivisible,moved-axis] (x24)\n")
    assert len(told) == 1 and str(told[0].message).startswith(expected)
    assert sum(f.count for f in fixes) == (73 if run[0] else 78)  # the lowering lists what was told


# What the boundary (in/out shardings of the step) reports, at the step's `def` line, in both modes: each parameter
# spec counts its parameters, their momentum, as argument and as result.
BOUNDARY = [
    ("unknown-axis,indivisible", "P('fsdp', 'tp', None)", "P(None, None, None)", 24),  # wq, wk, wv x 2 layers
    ("unknown-axis,indivisible", "P('tp', None, 'fsdp')", "P(None, None, None)", 8),  # wo
    ("unknown-axis", "P('fsdp', 'tp')", "P(None, 'tp')", 8),  # w1
    ("unknown-axis", "P('tp', 'fsdp')", "P('tp', None)", 8),  # w2
    ("rank-mismatch", "P(None, 'tp')", "P(None,)", 4),  # the final norm's scale
    ("unknown-axis,indivisible", "P('tp', 'fsdp')", "P(None, None)", 4),  # the embedding
    ("indivisible", "P('dp',)", "P(None, None)", 1),  # the batch
]
# Under Auto axes the auto policy keeps a spec's shard count at the boundary where another dim holds the axis
# (wq/wk/wv's tp goes to their 12 rows, wo's and the embedding's to their 12 columns).
BOUNDARY_AUTO = [
    ("unknown-axis,indivisible,moved-axis", "P('fsdp', 'tp', None)", "P('tp', None, None)", 24),
    ("unknown-axis,indivisible,moved-axis", "P('tp', None, 'fsdp')", "P(None, None, 'tp')", 8),
    ("unknown-axis", "P('fsdp', 'tp')", "P(None, 'tp')", 8),
    ("unknown-axis", "P('tp', 'fsdp')", "P('tp', None)", 8),
    ("rank-mismatch", "P(None, 'tp')", "P(None,)", 4),
    ("unknown-axis,indivisible,moved-axis", "P('tp', 'fsdp')", "P(None, 'tp')", 4),
    ("indivisible", "P('dp',)", "P(None, None)", 1),
]
# Under Explicit axes every spec is repaired while tracing (PartitionSpec notation), once per call (per layer).
EXPLICIT = [
    ("parameters", "unknown-axis,indivisible", "P('fsdp', 'tp', None)", "P(None, None, None)", 1),
    ("parameters", "unknown-axis,indivisible", "P('tp', None, 'fsdp')", "P(None, None, None)", 1),
    ("parameters", "unknown-axis", "P('fsdp', 'tp')", "P(None, 'tp')", 1),
    ("parameters", "unknown-axis", "P('tp', 'fsdp')", "P('tp', None)", 1),
    ("parameters", "rank-mismatch", "P(None, 'tp')", "P(None,)", 1),
    ("parameters", "unknown-axis,indivisible", "P('tp', 'fsdp')", "P(None, None)", 1),
    ("batch", "indivisible", "P('dp', None)", "P(None, None)", 1),
    ("heads (explicit)", "indivisible", "P('dp', None, 'tp', None)", "P(None, None, None, None)", 2),
    ("too long", "rank-mismatch,indivisible", "P('dp', 'tp', None, None, None)", "P(None, None, None, None)", 2),
    ("flax constraint", "indivisible", "P('dp', None, 'tp')", "P(None, None, 'tp')", 2),
    ("contraction", "unknown-axis,indivisible", "P('dp', None, 'fsdp')", "P(None, None, None)", 2),
    ("logits (explicit)", "indivisible", "P('dp', None, 'tp')", "P(None, None, None)", 1),
]
# Under Auto axes JAX rejects only unknown axes and over-long specs while tracing; the indivisible constraints reach
# the module, forward and backward, where the default policy (auto) keeps JAX's padded split wherever it leaves each
# device less work than an even one: the parameters' 6 columns over tp=4 (2 a device, against 3 over "tp":(1)2) stay
# as they are, and so does "tp" in constraints that also name the batch's "dp" (1 row, dropped). What the user wrote
# as PartitionSpecs is said as PartitionSpecs; the over-long spec, repaired while tracing (its extra entry) and in the
# module (its batch dim), is one fix.
AUTO = [
    ("parameters", "unknown-axis", "P('fsdp', 'tp', None)", "P(None, 'tp', None)", 1),
    ("parameters", "unknown-axis", "P('tp', None, 'fsdp')", "P('tp', None, None)", 1),
    ("parameters", "unknown-axis", "P('fsdp', 'tp')", "P(None, 'tp')", 1),
    ("parameters", "unknown-axis", "P('tp', 'fsdp')", "P('tp', None)", 1),  # w2
    ("parameters", "unknown-axis", "P('tp', 'fsdp')", "P('tp', None)", 1),  # the embedding (another shape)
    ("parameters", "rank-mismatch", "P(None, 'tp')", "P(None,)", 1),
    ("batch", "indivisible", "P('dp', None)", "P(None, None)", 1),
    ("heads (auto)", "indivisible,kept-padding", "P('dp', None, 'tp', None)", "P(None, None, 'tp', None)", 4),
    ("too long", "rank-mismatch,indivisible,kept-padding", "P('dp', 'tp', None, None, None)",
     "P(None, 'tp', None, None)", 4),
    ("flax constraint", "indivisible", "P('dp', None, 'tp')", "P(None, None, 'tp')", 4),
    ("logits (auto)", "indivisible,kept-padding", "P('dp', None, 'tp')", "P(None, None, 'tp')", 2),
]


def test_report(run):
    explicit, lowered, _, _ = run
    assert report_rows(lowered.fixes) == expected_report(__file__, BOUNDARY if explicit else BOUNDARY_AUTO,
                                                         EXPLICIT if explicit else AUTO)


@pytest.mark.parametrize("explicit", [True, False], ids=["explicit", "auto"])
def test_plain_jit_rejects_the_same_program(state, explicit):
    boxed, params, opt_state, tokens = state
    param_specs, opt_specs = specs(boxed, opt_state)
    step = make_step(LM(explicit=explicit), param_specs)
    unknown = re.escape("Resource axis: fsdp of P('fsdp', 'tp', None) is not found in mesh: ('dp', 'tp').")
    with jax.set_mesh(mesh_of(explicit)), nn.logical_axis_rules(RULES):
        with pytest.raises(ValueError, match=unknown):  # the boundary
            jax.jit(step, in_shardings=(param_specs, opt_specs, P("dp")),
                    out_shardings=(param_specs, opt_specs, P())).trace(params, opt_state, tokens)
        with pytest.raises(ValueError, match=unknown):  # the parameters' placement inside
            jax.jit(step).trace(params, opt_state, tokens)
