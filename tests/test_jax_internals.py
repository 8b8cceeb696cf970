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


# -- trace-time spec checks (shardfix/jit/_jax.py, section "trace-time spec checks") ------------------------------
# One test per function the hooks wrap: it exists under that name, takes the parameters the wrapper relies on, and
# every module that binds it by name now holds the wrapper (shardfix.jit.tracing.install rebinds them).

import inspect  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402


def _parameters(function) -> list[str]:
    return list(inspect.signature(getattr(function, "__wrapped__", function)).parameters)


def _hooked(module, name: str, first_parameters: list[str]):
    from shardfix.jit import tracing
    tracing.install()
    wrapper = getattr(module, name, None)
    assert wrapper is not None, f"{module.__name__}.{name} moved"
    original = getattr(wrapper, "__wrapped__", None)
    assert original is not None, f"{module.__name__}.{name} is not the shardfix wrapper"
    assert _parameters(original)[:len(first_parameters)] == first_parameters, f"{module.__name__}.{name} changed"
    stale = [m.__name__ for m in list(sys.modules.values())
             if isinstance(getattr(m, "__dict__", None), dict) and any(v is original for v in vars(m).values())]
    assert not stale, f"{name} is still bound unwrapped in {stale}"
    return original


@pytest.mark.parametrize("module, name, parameters", [
    ("named_sharding", "_check_unique_resources", ["pspec", "arg_name"]),
    ("named_sharding", "_check_mesh_resource_axis", ["mesh", "pspec"]),
    ("sharding_impls", "canonicalize_sharding", ["sharding", "api_name"]),
    ("core", "get_sharding", ["sharding", "shape"]),
    ("pjit", "with_sharding_constraint", ["x", "shardings"]),
    ("pjit", "reshard", ["xs", "out_shardings"]),
    ("api", "device_put", ["x", "device"]),
    ("pjit", "pjit_check_aval_sharding", ["shardings", "flat_avals", "names", "what_aval", "allow_uneven_sharding"]),
])
def test_spec_check_hooked(module, name, parameters):
    import importlib
    _hooked(importlib.import_module(f"jax._src.{module}"), name, parameters)


@pytest.mark.parametrize("name, avals, index", [("_process_in_axis_resources", "in_avals", 4),
                                                ("_check_and_canonicalize_out_shardings", "out_avals", 5)])
def test_jit_boundary_canonicalization_hooked(name, avals, index):
    """The wrapper calls JAX's uncached function (`__wrapped__` of util.cache) and finds the avals by position."""
    from jax._src import pjit
    original = _hooked(pjit, name, [])
    uncached = getattr(original, "__wrapped__", None)
    assert uncached is not None, f"pjit.{name} is no longer a util.cache"
    assert _parameters(uncached).index(avals) == index


def test_spec_check_cache_and_contexts():
    from jax._src import config, mesh as mesh_lib, named_sharding, source_info_util, traceback_util
    assert callable(named_sharding.check_pspec.cache_clear)  # cleared after lenient construction
    assert "include_in_jit_key" in inspect.signature(config.int_state).parameters
    assert "include_in_trace_context" in inspect.signature(config.int_state).parameters
    assert hasattr(mesh_lib.thread_resources.env, "physical_mesh") and callable(mesh_lib.get_abstract_mesh)
    assert hasattr(jax.make_mesh((2, 4), ("a", "b")).abstract_mesh, "are_all_axes_explicit")
    assert callable(traceback_util.register_exclusion) and callable(source_info_util.register_exclusion)
    frames = list(source_info_util.user_frames(source_info_util.current().traceback))
    assert frames and frames[0].file_name == __file__ and frames[0].start_line > 0


def test_spec_check_session_key_separates_caches():
    """The session's config state is part of JAX's trace context: the same jax.jit object traces again inside."""
    from jax._src import config
    from shardfix.jit import _jax, tracing
    tracing.install()
    outside = config.trace_context()
    with _jax.repair_key(12345):
        assert config.trace_context() != outside
    assert config.trace_context() == outside
