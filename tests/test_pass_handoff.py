"""What a pass hands on to the pass right after it (PassContext.handoff): ring-reorder's walk of the module finds the
function bodies that hold a manual computation, so hoist-permutations, run right after it, needn't walk every
function again. Handed on only to the next pass of the same pipeline, and the module hoisted the same either way."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardfix.ir import make_context, parse_module
from shardfix.pipeline import PassContext, parse_pipeline, run_pipeline
from shardfix.ring import hoist
from support import ring_kernels

MESH = jax.make_mesh((2, 4), ("dp", "cp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
B, S, D = 2, 64, 16


def _program(layers: int):
    """`layers` residual ring-attention layers in main, and one more in a function of its own (a nested jit)."""
    attention = ring_kernels.sharded(ring_kernels.scan_ring_attention("cp", 4, 8), MESH)

    @jax.jit
    def last_layer(x):
        return x + attention(x, x * 0.5, x)

    def program(x):
        for _ in range(layers):
            x = x + attention(x, x, x * 2.0)
        return last_layer(jnp.tanh(x))

    return program


def _lowered_text(layers: int = 2) -> str:
    x = jax.ShapeDtypeStruct((B, S, D), jnp.float32,
                             sharding=jax.sharding.NamedSharding(MESH, jax.sharding.PartitionSpec("dp", "cp")))
    return jax.jit(_program(layers)).lower(x).as_text(debug_info=True)


def _run(text: str, *pipelines: str) -> tuple[str, list]:
    """The module after each pipeline in turn (each its own pass manager), printed with locations; and the
    `holders` each hoist-permutations run was given."""
    given = []
    original = hoist.Mover.__init__

    def spy(self, module, holders=None):
        given.append(holders)
        original(self, module, holders)

    ctx = make_context()
    module = parse_module(text, ctx, "<lowered>")
    hoist.Mover.__init__ = spy
    try:
        for pipeline in pipelines:
            run_pipeline(module.operation, parse_pipeline(pipeline), ctx, PassContext())
    finally:
        hoist.Mover.__init__ = original
    with ctx:
        return module.operation.get_asm(enable_debug_info=True), given


@pytest.fixture(scope="module")
def text():
    return _lowered_text()


def test_hoist_right_after_ring_reorder_is_handed_the_bodies_that_hold_manual_computations(text):
    together, given = _run(text, "ring-reorder{strategy=zigzag},hoist-permutations")
    (holders,) = given
    assert holders is not None
    # main (its layers' regions and permutations) and the nested jit's function (its own layer's): the bodies
    # the walk of hoist-permutations would find
    assert "main" in holders and any(name.startswith("last_layer") for name in holders)
    assert together.count("shardfix.sequence_permutation") < text.count("sdy.manual_computation") * 2
    apart, given = _run(text, "ring-reorder{strategy=zigzag}", "hoist-permutations")
    assert given == [None]
    assert together == apart


@pytest.mark.parametrize("pipeline", ["hoist-permutations",
                                      "ring-reorder{strategy=zigzag},canonicalize,hoist-permutations",
                                      "ring-reorder{mode=off},hoist-permutations"])
def test_hoist_walks_for_itself_unless_ring_reorder_ran_right_before(text, pipeline):
    _, given = _run(text, pipeline)
    assert given == [None]


def test_the_handed_on_module_computes_what_jit_computes():
    from shardfix.jit.lowering import patch_lowered
    program = _program(2)
    x = np.random.default_rng(0).standard_normal((B, S, D)).astype(np.float32)
    x = jax.device_put(x, jax.sharding.NamedSharding(MESH, jax.sharding.PartitionSpec("dp", "cp")))
    lowered = jax.jit(program).lower(x)
    moved, report = patch_lowered(lowered, "ring-reorder{strategy=zigzag},hoist-permutations")
    assert [r.applied for r in report.rings] == [True] * 3
    np.testing.assert_allclose(np.asarray(moved.compile()(x)), np.asarray(lowered.compile()(x)), rtol=1e-5,
                               atol=1e-5)
