"""shardfix relies on private JAX internals, all reached through shardfix/jit/_jax.py. Each is exercised here on the
installed JAX, so that a move fails here, loudly, with the name of what moved."""

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix.jit import _jax

TESTED = ("0.10.2", "0.12.0.1")  # the oldest and the newest JAX the suite runs on (make test-oldest, make test)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def test_versions_in_tested_range():
    for name, version in (("jax", jax.__version__), ("jaxlib", jaxlib.__version__)):
        assert _version(TESTED[0]) <= _version(version) <= _version(TESTED[1]), \
            f"shardfix is tested with {name} {TESTED[0]} to {TESTED[1]}, found {version}"
    assert _jax.JAX_VERSION == _version(jax.__version__)[:3]


def test_mlir_context_and_dialects():
    from jaxlib.mlir import ir, passmanager
    from jaxlib.mlir.dialects import sdy, stablehlo
    from shardfix.ir.context import make_context
    ctx = make_context()
    for op in ("func.func", "stablehlo.add", "sdy.manual_computation", "chlo.erf", "mhlo.add"):
        assert ctx.is_registered_operation(op), op
    assert hasattr(stablehlo, "register_stablehlo_passes")
    for name in ("TensorShardingAttr", "TensorShardingPerValueAttr", "DimensionShardingAttr", "AxisRefAttr",
                 "SubAxisInfoAttr", "MeshAttr", "MeshAxisAttr"):
        assert hasattr(sdy, name), name
    assert hasattr(passmanager.PassManager, "add") and hasattr(ir.Operation, "parse")
    assert _jax.uses_shardy() is True  # JAX's default


def test_stages_relowered_and_subclassed():
    f = jax.jit(lambda x: x + 1)
    lowered = f.lower(jnp.ones(4))
    module = _jax.lowered_module(lowered)
    assert "stablehlo.add" in str(module)
    in_shardings, out_shardings = _jax.compile_shardings(lowered)
    assert len(in_shardings) == len(out_shardings) == 1

    class Sub(jax.stages.Lowered):
        pass

    again = _jax.relowered(lowered, module, in_shardings, out_shardings, Sub)
    assert type(again) is Sub and again.as_text() == lowered.as_text()
    compiled = again.compile()
    np.testing.assert_array_equal(np.asarray(compiled(jnp.ones(4))), np.full(4, 2.0))
    assert len(_jax.compiled_input_shardings(compiled)) == 1

    class SubTraced(jax.stages.Traced):
        pass

    traced = _jax.as_subclass(f.trace(jnp.ones(4)), SubTraced)
    assert isinstance(traced, SubTraced) and "add" in str(traced.jaxpr)


def test_jit_objects():
    def g(a, b, c=1.0):
        return a * c + b

    jitted = jax.jit(g, static_argnums=2, donate_argnums=0, keep_unused=True,
                     in_shardings=(NamedSharding(jax.make_mesh((8,), ("x",)), P()), None),
                     compiler_options={"xla_embed_ir_in_executable": True})
    assert _jax.is_jax_jit(jitted) and not _jax.is_jax_jit(g)
    fun, options = _jax.jit_options_of(jitted)
    assert fun is g
    assert options["static_argnums"] == (2,) and options["static_argnames"] == ("c",)
    assert options["donate_argnums"] == (0,) and options["keep_unused"] is True
    assert options["compiler_options"] == {"xla_embed_ir_in_executable": True}
    assert options["in_shardings"][1] is None and "out_shardings" not in options
    assert _jax.static_arguments(jitted) == ((2,), ("c",))
    assert _jax.jit_info(jitted).keep_unused is True
    assert _jax.jit_shardings_key(jax.jit(g, **options)) == _jax.jit_shardings_key(jitted)
    assert _jax.static_positions((2, -1), 3) == {2} and _jax.static_positions((-1,), 2) == {1}
    assert _jax.static_positions((5,), 2) == set()
    outs, fastpath, _ = _jax.jit_cache_miss(jax.jit(g))(jnp.ones(2), jnp.ones(2))
    np.testing.assert_array_equal(np.asarray(outs), np.full(2, 2.0))
    assert fastpath is not None  # the data JAX's dispatcher runs a cached call from
    try:
        jax.jit(g, in_shardings=P("x", "x"))
    except _jax.DuplicateSpecError:
        pass
    else:
        raise AssertionError("DuplicateSpecError is not what jax.jit raises for a repeated axis")


def test_cpp_dispatcher():
    misses = []

    def g(x):
        return x * 2

    inner = jax.jit(g)

    def cache_miss(*args, **kwargs):
        misses.append(1)
        return _jax.jit_cache_miss(inner)(*args, **kwargs)

    dispatch = _jax.cpp_dispatcher(g, "g", cache_miss, (), ())
    for _ in range(3):
        out = dispatch(jnp.ones(3))
    np.testing.assert_array_equal(np.asarray(out), np.full(3, 2.0))
    assert len(misses) == 1 and dispatch._cache_size() == 1
    assert type(dispatch) is type(inner)
    assert jax.jit(g)(jnp.ones(3)) is not None and len(misses) == 1  # a cache of its own: never JAX's
    jax.clear_caches()
    dispatch(jnp.ones(3))
    assert len(misses) == 2
    _jax.clear_dispatcher(dispatch)
    assert dispatch._cache_size() == 0


def test_call_signature():
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("dp")))
    key = _jax.call_signature((x, 3, {"w": np.ones(2)}), {"scale": 2.0}, (1,), ("scale",))
    y = jax.device_put(np.zeros((8, 4), np.float32), NamedSharding(mesh, P("dp")))  # other values, same signature
    assert key == _jax.call_signature((y, 3, {"w": np.zeros(2)}), {"scale": 2.0}, (1,), ("scale",))
    others = [
        ((jax.device_put(x, NamedSharding(mesh, P("tp"))), 3, {"w": np.ones(2)}), {"scale": 2.0}),  # sharding
        ((x, 4, {"w": np.ones(2)}), {"scale": 2.0}),  # a static value
        ((x, 3, {"w": np.ones(3)}), {"scale": 2.0}),  # a shape
        ((x, 3, {"v": np.ones(2)}), {"scale": 2.0}),  # the tree
        ((x, 3, {"w": np.ones(2)}), {"scale": 3.0}),  # a static keyword value
    ]
    assert all(_jax.call_signature(a, k, (1,), ("scale",)) != key for a, k in others)
    with jax.set_mesh(mesh):  # the context mesh
        assert _jax.call_signature((x, 3, {"w": np.ones(2)}), {"scale": 2.0}, (1,), ("scale",)) != key


def test_caches_and_session_state():
    cleared = []

    class Handle:
        def cache_clear(self):
            cleared.append(1)

        def cache_info(self):
            return ""

    handle = Handle()
    _jax.register_cache(handle, "test handle")
    jax.clear_caches()
    assert cleared == [1]
    assert _jax.global_session_state() == 0
    seen = []
    f = jax.jit(lambda x: seen.append(1) or x + 1)
    f(1.0)
    with _jax.session_state(7):
        f(1.0)  # another trace context: traced again
    f(1.0)
    assert len(seen) == 2
    assert _jax.SESSION_STATE_NAME in jax.config.values


def test_hooks_and_tracebacks():
    from shardfix.jit import session
    session.install()  # shardfix's own hooks (installing is once per process)
    assert _jax.hooks_installed()
    from jax._src import pjit, source_info_util, traceback_util
    from jax._src.interpreters import pxla
    assert pjit._trace_for_jit.__code__.co_filename == _jax.__file__
    assert pxla.UnloadedMeshExecutable.from_hlo.__code__.co_filename == _jax.__file__
    assert _jax.PACKAGE_DIR in traceback_util._exclude_paths
    assert not source_info_util.is_user_filename(_jax.__file__)
    assert _jax.trace_function_name((lambda: None,)) == "<lambda>"
    assert _jax.under_trace() is False
    jax.jit(lambda x: x + float(_jax.under_trace()))(1.0)
    assert float(jax.jit(lambda x: x * 0 + _jax.under_trace())(1.0)) == 1.0

    def named(x):
        """Doc."""

    wrapped = _jax.wraps(named)(type("W", (), {})())
    assert (wrapped.__name__, wrapped.__doc__, wrapped.__wrapped__) == ("named", "Doc.", named)


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
    ("array", "make_array_from_callback", ["shape", "sharding", "data_callback"]),
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


def test_private_reads_for_boundary_and_results():
    """The in/out trees the jit boundary wrapper names sites with, the explicit-constraint check, the devices a
    Lowered compiles for, and a Mesh on a compile's devices."""
    from jax._src import core, pjit
    from shardfix.jit import _jax
    in_parameters = _parameters(getattr(pjit._process_in_axis_resources, "__wrapped__"))
    assert "in_tree" in in_parameters or "in_avals" in in_parameters and "kws" in in_parameters
    assert "out_tree" in _parameters(getattr(pjit._check_and_canonicalize_out_shardings, "__wrapped__"))
    assert _parameters(pjit.assert_shardings_equal)[:2] == ["x_aval", "user_sharding"] and callable(core.typeof)
    lowered = jax.jit(lambda x: x + 1).lower(np.ones(4, np.float32))
    devices = _jax.lowering_devices(lowered)
    assert devices is not None and len(list(devices)) >= 1
    mesh = _jax.mesh_on(jax.devices(), (("a", 2), ("b", 4)), (7, 6, 5, 4, 3, 2, 1, 0))
    assert mesh.shape == {"a": 2, "b": 4} and mesh.devices.flat[0] == jax.devices()[7]
    assert _jax.has_explicit_axes(jax.make_mesh((2, 4), ("a", "b"))) and not _jax.has_explicit_axes(mesh)


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


def test_autodiff_ties_hooked():
    """The shard_map autodiff rules the tie recorder wraps (ring/ties.py): a move of any of them fails here; that
    the record is right is tests/test_autodiff_ties.py's."""
    from jax._src import shard_map as sm
    from jax._src.interpreters import ad, partial_eval as pe
    from shardfix.jit import tracing
    tracing.install()
    transposes = ad.fancy_transposes if _jax.JAX_VERSION >= (0, 12) else ad.primitive_transposes
    for rule in (ad.LinearizeTrace.process_shard_map, pe.DynamicJaxprTrace.process_shard_map,
                 transposes[sm.shard_map_p], pe.dce_rules[sm.shard_map_p], ad.LinearizeTrace.process_primitive,
                 ad.LinearizeTrace.process_custom_jvp_call, ad.LinearizeTrace.process_custom_vjp_call):
        assert getattr(rule, "__wrapped__", None) is not None and "shardfix" in rule.__code__.co_filename, rule
    assert hasattr(ad, "LinearizeTracer") and hasattr(pe.JaxprStackFrame, "__slots__")
    # the derivative rules the module does not show go by these names in a jaxpr (Tie.rules)
    from jax._src import ad_util, custom_derivatives as cd
    names = {ad_util.stop_gradient_p.name, cd.custom_jvp_call_p.name}
    names |= {p.name for p in (getattr(cd, "custom_vjp_call_p", None), getattr(cd, "custom_vjp_call_jaxpr_p", None))
              if p is not None}
    assert names <= set(_jax._RULES) and not issubclass(ad.LinearizeTracer, ad.JVPTracer), names
    # the allow-list of standard derivatives holds none of them, nor a solver or a hijax primitive
    from jax._src.lax.control_flow import solves
    assert not (names | {solves.linear_solve_p.name, "call_hi_primitive"}) & _jax._STANDARD
    assert "tracing_eqns" in pe.JaxprStackFrame.__slots__


def test_jnp_logaddexp_rule_is_known_exact_and_a_users_rule_is_not():
    """jax.numpy.logaddexp differentiates by a custom_jvp rule defined in jax._src.lax.other (shardfix.jit._jax
    `_exact_rule` knows it by where JAX defined it): a jaxpr's custom_jvp_call of it carries that rule, and a
    user's custom_jvp of the same function is another. A move of either fails here."""
    from jax._src import core

    @jax.custom_jvp
    def users(a, b):
        return jnp.logaddexp(a, b)

    users.defjvp(lambda p, t: (users(*p), t[0] * jnp.exp(p[0] - users(*p)) + t[1] * jnp.exp(p[1] - users(*p))))

    def calls(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "custom_jvp_call":
                yield eqn
            for value in eqn.params.values():
                for item in value if isinstance(value, (tuple, list)) else (value,):
                    inner = getattr(item, "jaxpr", item)
                    if isinstance(inner, core.Jaxpr):
                        yield from calls(inner)

    found = list(calls(jax.make_jaxpr(lambda a, b: jnp.logaddexp(a, b) + jax.nn.softplus(a) + users(a, b))(
        1.0, 2.0).jaxpr))
    known = [_jax._exact_rule(eqn.params["jvp_jaxpr_fun"]) for eqn in found]
    # logaddexp, softplus (logaddexp(x, 0)), the user's own rule, and the logaddexp inside the user's primal
    assert sorted(known) == [False, True, True, True], known
    assert _jax._rule(found[0].primitive, found[0].params) is None
    assert _jax._rule(found[0].primitive, {**found[0].params, "jvp_jaxpr_fun": None}) == "custom_jvp"


def test_logsumexps_stop_gradient_and_abs_are_known_and_a_users_are_not():
    """jax.nn.logsumexp (jax._src.ops.special) stops the maximum it shifts by and takes abs of the sum: shardfix.jit._jax
    knows such ops by that function's code object among the frames that bound them; a user's are the user's."""
    from jax._src import core

    def found(fn, name):
        out = []

        def walk(jaxpr):
            for eqn in jaxpr.eqns:
                if eqn.primitive.name == name:
                    out.append(_jax._bound_by_exact_function(eqn.source_info))
                for value in eqn.params.values():
                    for item in value if isinstance(value, (tuple, list)) else (value,):
                        inner = getattr(item, "jaxpr", item)
                        if isinstance(inner, core.Jaxpr):
                            walk(inner)

        walk(jax.make_jaxpr(fn)(jnp.ones((2, 3))).jaxpr)
        return out

    assert found(lambda x: jax.nn.logsumexp(x, axis=-1), "stop_gradient") == [True]
    assert found(lambda x: jax.nn.logsumexp(x, axis=-1), "abs") == [True]
    assert found(lambda x: jnp.abs(jax.lax.stop_gradient(x)), "stop_gradient") == [False]
    assert found(lambda x: jnp.abs(jax.lax.stop_gradient(x)), "abs") == [False]

    class Converted:  # logsumexp converts its arguments: what a user's __jax_array__ binds there is the user's
        def __init__(self, x):
            self.x = x

        def __jax_array__(self):
            return jnp.abs(jax.lax.stop_gradient(self.x))

    assert found(lambda x: jax.nn.logsumexp(x, axis=-1, b=Converted(x)), "stop_gradient") == [False, True]
    assert found(lambda x: jax.nn.logsumexp(x, axis=-1, b=Converted(x)), "abs") == [False, True]
