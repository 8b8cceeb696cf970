"""shardfix relies on private JAX internals of exactly jax/jaxlib 0.10.2. If these move, fail here, loudly."""

import jax
import jaxlib


def test_pinned_versions():
    assert jax.__version__ == "0.10.2", f"shardfix is pinned to jax 0.10.2, found {jax.__version__}"
    assert jaxlib.__version__ == "0.10.2", f"shardfix is pinned to jaxlib 0.10.2, found {jaxlib.__version__}"


def test_private_names_used():
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir, passmanager
    from jaxlib.mlir.dialects import sdy, stablehlo
    assert callable(jax_mlir.make_ir_context)
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
