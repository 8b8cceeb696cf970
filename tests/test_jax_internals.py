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
