"""shardfix relies on private JAX internals (all in shardfix/jit/_jax.py). If these move, fail here, loudly."""

import jax
import jaxlib

TESTED = ("0.10.2", "0.12.0.1")  # the oldest and the newest JAX the suite runs on (make test-oldest, make test)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def test_versions_in_tested_range():
    for name, version in (("jax", jax.__version__), ("jaxlib", jaxlib.__version__)):
        assert _version(TESTED[0]) <= _version(version) <= _version(TESTED[1]), \
            f"shardfix is tested with {name} {TESTED[0]} to {TESTED[1]}, found {version}"


def test_private_names_used():
    from jaxlib.mlir import ir, passmanager
    from jaxlib.mlir.dialects import sdy, stablehlo
    from shardfix.jit import _jax
    ctx = _jax.new_ir_context()
    for op in ("func.func", "stablehlo.add", "sdy.manual_computation", "chlo.erf", "mhlo.add"):
        assert ctx.is_registered_operation(op), op
    assert hasattr(stablehlo, "register_stablehlo_passes")
    for name in ("TensorShardingAttr", "TensorShardingPerValueAttr", "DimensionShardingAttr", "AxisRefAttr",
                 "SubAxisInfoAttr", "MeshAttr", "MeshAxisAttr"):
        assert hasattr(sdy, name), name
    assert hasattr(passmanager.PassManager, "add") and hasattr(ir.Operation, "parse")


def test_lowered_private_fields():
    """lowering.patch_lowered rebuilds a Lowered from these fields."""
    import jax.numpy as jnp
    lowered = jax.jit(lambda x: x + 1).lower(jnp.ones(4))
    for field in ("_lowering", "_no_kwargs", "_in_types", "_out_types", "args_info", "out_tree"):
        assert hasattr(lowered, field), field
    inner = lowered._lowering
    assert hasattr(inner, "_hlo") and hasattr(inner, "_executable")
    assert {"in_shardings", "out_shardings"} <= set(inner.compile_args)


def test_cpp_dispatch_internals():
    """autofix_shardings serves cached calls through JAX's C++ dispatcher with these private pieces."""
    from jax._src import sharding_impls, stages, tree_util
    from jax._src.interpreters import pxla
    from jax._src.lib import _jax
    for owner, name in ((_jax, "pjit"), (pxla, "JitGlobalCppCacheKeys"), (pxla, "MeshExecutableFastpathData"),
                        (pxla, "reflatten_outputs_for_dispatch"), (pxla, "cc_shard_arg"), (pxla, "ExecuteReplicated"),
                        (tree_util, "dispatch_registry"), (stages.Compiled, "call"),
                        (sharding_impls, "physical_sharding")):
        assert hasattr(owner, name), f"{owner.__name__}.{name} moved"
    import jax.numpy as jnp
    from shardfix import autofix_shardings
    f = autofix_shardings(lambda x: x + 1)
    assert f._dispatch is not None, "the C++ dispatcher could not be built"
    assert float(f(jnp.ones(()))) == 2.0
    executable = jax.jit(lambda x: x + 1).lower(jnp.ones(4)).compile()._executable
    for name in ("unsafe_call", "xla_executable", "_in_shardings", "_out_shardings", "in_avals", "_kept_var_idx",
                 "_dispatch_in_layouts", "shard_const_args"):
        assert hasattr(executable, name), f"MeshExecutable.{name} moved"
