"""autofix_shardings against jax.jit, side by side: every jax.jit parameter and every stage method and attribute give
the same results, the same errors and the same types (on functions with nothing to repair, where both must agree
exactly)."""

import inspect
import traceback
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import ShardingFixWarning, autofix_shardings

MESH = jax.make_mesh((2, 4), ("dp", "tp"))
X = np.arange(64, dtype=np.float32).reshape(8, 8) / 10.0
Y = np.arange(8, dtype=np.float32) / 10.0


def body(x, y):
    return jnp.tanh(x @ x.T) * 2.0 + y


def with_scale(x, y, scale=1.0):
    return body(x, y) * scale


def take_first(x, y):
    return x * 3.0


def both(fun, **jit_kwargs):
    """(jax.jit(fun, ...), autofix_shardings(fun, ...)), made with the same arguments."""
    return jax.jit(fun, **jit_kwargs), autofix_shardings(fun, **jit_kwargs, on_fix="ignore")


def outcome(call):
    """What a call gives: ("ok", value) or ("error", exception type, message)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ShardingFixWarning)
            return ("ok", call())
    except Exception as e:  # noqa: BLE001 (the point is to compare whatever is raised)
        return ("error", type(e), str(e))


def assert_same_values(a, b):
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b):
        assert type(x) is type(y)
        if isinstance(x, jax.Array):
            assert x.shape == y.shape and x.dtype == y.dtype and x.sharding == y.sharding
            assert x.weak_type == y.weak_type
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def assert_same_outcome(call_jax, call_ours):
    a, b = outcome(call_jax), outcome(call_ours)
    assert a[0] == b[0], (a, b)
    if a[0] == "error":
        assert a[1:] == b[1:]
    else:
        assert_same_values(a[1], b[1])
    return a


# Every jax.jit parameter, with arguments that exercise it. (id, function, jit arguments, call arguments)
CASES = [
    ("plain", body, {}, (X, Y), {}),
    ("keyword-argument", body, {}, (X,), {"y": Y}),
    ("in-shardings", body, dict(in_shardings=(NamedSharding(MESH, P("dp")), NamedSharding(MESH, P()))), (X, Y), {}),
    ("in-shardings-spec", body, dict(in_shardings=P("dp")), (X, Y), {}),  # under jax.set_mesh (see below)
    ("out-shardings", body, dict(out_shardings=NamedSharding(MESH, P(None, "tp"))), (X, Y), {}),
    ("static-argnums", with_scale, dict(static_argnums=2), (X, Y, 3.0), {}),
    ("static-argnums-negative", with_scale, dict(static_argnums=-1), (X, Y, 3.0), {}),
    ("static-argnames", with_scale, dict(static_argnames="scale"), (X, Y), {"scale": 3.0}),
    ("static-argnames-positional", with_scale, dict(static_argnames="scale"), (X, Y, 3.0), {}),
    ("donate-argnums", body, dict(donate_argnums=1), (X, Y), {}),
    ("donate-argnames", body, dict(donate_argnames="y"), (X, Y), {}),
    ("keep-unused", take_first, dict(keep_unused=True), (X, Y), {}),
    ("unused-dropped", take_first, {}, (X, Y), {}),
    ("device", body, dict(device=jax.devices()[3]), (X, Y), {}),
    ("backend", body, dict(backend="cpu"), (X, Y), {}),
    ("inline", body, dict(inline=True), (X, Y), {}),
    ("compiler-options", body, dict(compiler_options={"xla_embed_ir_in_executable": True}), (X, Y), {}),
] + [(f"inline-{member.value}", body, dict(inline=member), (X, Y), {})  # JAX 0.11+: jax.Inline's choices
     for member in getattr(jax, "Inline", ())]
IDS = [case[0] for case in CASES]


def public_names(cls) -> list[str]:
    return [n for n in dir(cls) if not n.startswith("_")]


# How a stage member is probed, where reading it or calling it bare won't do.
PROBES = {
    "lower": None, "compile": None, "call": None, "physicalize": None,  # exercised on their own
    "with_consts_as_arg": lambda traced: repr(traced.with_consts_as_arg()[0]),
    "closure_convert": lambda traced: str(traced.closure_convert()[0]),
    "runtime_executable": lambda compiled: type(compiled.runtime_executable()),
    "lojax": lambda traced: type(traced.lojax),
    "compiler_ir": lambda lowered: str(lowered.compiler_ir("stablehlo")),
    "memory_analysis": lambda compiled: str(compiled.memory_analysis()),
}


def comparable(value):
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, str):  # compiled HLO text ends with the Python frames it came from: the calls' lines
        return value.split("\nFileNames\n")[0]
    return repr(value)


def surface(stage, cls) -> dict:
    """Every public member of a JAX stage class, read from `stage` in a comparable form."""
    values = {}
    for name in public_names(cls):
        probe = PROBES.get(name, "default")
        if probe is None:
            continue
        if probe == "default":
            member = getattr(stage, name)
            values[name] = comparable(member() if inspect.ismethod(member) else member)
        else:
            values[name] = probe(stage)
    return values


@pytest.mark.parametrize("wrapped", [False, True], ids=["options", "wrapped-jit"])
@pytest.mark.parametrize("name,fun,jit_kwargs,args,kwargs", CASES, ids=IDS)
def test_every_jit_parameter_and_stage(name, fun, jit_kwargs, args, kwargs, wrapped):
    """Each option given to autofix_shardings, or taken over from the jax.jit it wraps."""
    if name == "in-shardings-spec":  # PartitionSpecs need a context mesh; arrays made there would be committed
        with jax.set_mesh(MESH):
            compare_everything(fun, jit_kwargs, args, kwargs, lambda v: v, wrapped)
    else:
        compare_everything(fun, jit_kwargs, args, kwargs, jnp.asarray, wrapped)


def compare_everything(fun, jit_kwargs, args, kwargs, to_array, wrapped=False):
    jitted, ours = both(fun, **jit_kwargs)
    if wrapped:
        ours = autofix_shardings(jax.jit(fun, **jit_kwargs), on_fix="ignore")

    def fresh():  # new arrays for each call (donated ones are gone after it); static values as they are
        array = lambda v: to_array(v) if isinstance(v, np.ndarray) else v  # noqa: E731
        return tuple(array(a) for a in args), {k: array(v) for k, v in kwargs.items()}

    # The call, twice (the second is served by the C++ dispatcher), with fresh arrays for donation.
    for _ in range(2):
        a_args, a_kwargs = fresh()
        b_args, b_kwargs = fresh()
        assert assert_same_outcome(lambda: jitted(*a_args, **a_kwargs), lambda: ours(*b_args, **b_kwargs))[0] == "ok"
        deleted = lambda xs: [x.is_deleted() for x in xs if isinstance(x, jax.Array)]  # noqa: E731
        assert deleted(a_args) == deleted(b_args)  # donation honoured alike
    assert ours.cache_misses == 1

    # Traced, Lowered, Compiled: the same classes, and every public member equal.
    a_args, a_kwargs = fresh()
    traced_a, traced_b = jitted.trace(*a_args, **a_kwargs), ours.trace(*a_args, **a_kwargs)
    assert isinstance(traced_b, jax.stages.Traced)
    assert surface(traced_a, jax.stages.Traced) == surface(traced_b, jax.stages.Traced)
    lowered_a, lowered_b = traced_a.lower(), traced_b.lower()
    assert isinstance(lowered_b, jax.stages.Lowered) and lowered_b.fixes == [] and lowered_b.rings == []
    assert surface(lowered_a, jax.stages.Lowered) == surface(lowered_b, jax.stages.Lowered)
    assert lowered_a.as_text("hlo") == lowered_b.as_text("hlo")
    compiled_a, compiled_b = lowered_a.compile(), lowered_b.compile()
    assert isinstance(compiled_b, jax.stages.Compiled)
    assert surface(compiled_a, jax.stages.Compiled) == surface(compiled_b, jax.stages.Compiled)
    assert_same_outcome(lambda: compiled_a(*fresh()[0], **fresh()[1]), lambda: compiled_b(*fresh()[0], **fresh()[1]))
    # .lower() directly, eval_shape, and a compile with options of its own.
    assert ours.lower(*a_args, **a_kwargs).as_text() == jitted.lower(*a_args, **a_kwargs).as_text()
    assert repr(ours.eval_shape(*a_args, **a_kwargs)) == repr(jitted.eval_shape(*a_args, **a_kwargs))
    options = {"xla_embed_ir_in_executable": True}
    assert_same_outcome(lambda: lowered_a.compile(compiler_options=options)(*fresh()[0], **fresh()[1]),
                        lambda: lowered_b.compile(compiler_options=options)(*fresh()[0], **fresh()[1]))


def test_the_function_object():
    jitted, ours = both(body)
    assert isinstance(ours, jax.stages.Wrapped) and isinstance(jitted, jax.stages.Wrapped)
    assert type(ours) is type(jitted)  # JAX's own C++ function object
    assert inspect.signature(ours) == inspect.signature(jitted) == inspect.signature(body)
    for attribute in ("__name__", "__qualname__", "__doc__", "__module__", "__wrapped__"):
        assert getattr(ours, attribute) == getattr(jitted, attribute), attribute
    for method in ("trace", "lower", "eval_shape", "clear_cache"):
        assert callable(getattr(ours, method))
    ours(X, Y)
    ours.clear_cache()
    ours(X, Y)
    assert ours.cache_misses == 2


def test_inline_inside_an_outer_jit():
    for inline in (False, True):
        jitted, ours = both(body, inline=inline)
        jaxpr_a = jax.make_jaxpr(lambda x, y: jitted(x, y) + 1)(X, Y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ShardingFixWarning)
            jaxpr_b = jax.make_jaxpr(lambda x, y: ours(x, y) + 1)(X, Y)
        assert str(jaxpr_a) == str(jaxpr_b)


ERROR_CASES = [
    ("static-argnums-out-of-range", body, dict(static_argnums=2), (X, Y), {}),
    ("static-argnames-unknown", body, dict(static_argnames="nope"), (X, Y), {}),
    ("donate-argnums-out-of-range", body, dict(donate_argnums=5), (X, Y), {}),
    ("donate-and-static", with_scale, dict(static_argnums=2, donate_argnums=2), (X, Y, 1.0), {}),
    ("unhashable-static", with_scale, dict(static_argnums=2), (X, Y, np.ones(3)), {}),
    ("device-and-backend", body, dict(device=jax.devices()[0], backend="cpu"), (X, Y), {}),
    ("device-and-in-shardings", body, dict(device=jax.devices()[0], in_shardings=NamedSharding(MESH, P())),
     (X, Y), {}),
    ("bogus-compiler-option", body, dict(compiler_options={"no_such_option": 1}), (X, Y), {}),
    ("kwargs-with-in-shardings", body, dict(in_shardings=NamedSharding(MESH, P())), (X,), {"y": Y}),
    ("kwargs-with-in-shardings-specs", body, dict(in_shardings=(P(), P("dp"))), (X,), {"y": Y}),
    ("missing-argument", body, {}, (X,), {}),
    ("not-an-array", body, {}, (X, "text"), {}),
    ("shape-error-inside", lambda x, y: x @ y[:3], {}, (X, Y), {}),
]


@pytest.mark.parametrize("name,fun,jit_kwargs,args,kwargs", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_same_errors(name, fun, jit_kwargs, args, kwargs):
    made_a = outcome(lambda: jax.jit(fun, **jit_kwargs))
    made_b = outcome(lambda: autofix_shardings(fun, **jit_kwargs, on_fix="ignore"))
    assert made_a[0] == made_b[0] and made_a[1:] == made_b[1:] if made_a[0] == "error" else made_a[0] == made_b[0]
    if made_a[0] == "error":
        return
    jitted, ours = made_a[1], made_b[1]
    result = assert_same_outcome(lambda: jitted(*args, **kwargs), lambda: ours(*args, **kwargs))
    assert result[0] == "error", f"{name} was expected to fail"
    assert_same_outcome(lambda: jitted.lower(*args, **kwargs).as_text(), lambda: ours.lower(*args, **kwargs).as_text())


def test_jax_warnings_point_at_the_same_line():
    def made(wrapper):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrapper(body, device=jax.devices()[1])  # deprecated in JAX: a DeprecationWarning at this line
        return [(w.category, str(w.message), w.filename, w.lineno) for w in caught]

    made_by_jax, made_by_ours = made(jax.jit), made(autofix_shardings)
    assert made_by_jax and made_by_jax == made_by_ours


def user_frames(call) -> list[tuple[str, str]]:
    try:
        call()
    except Exception as e:  # noqa: BLE001
        return [(frame.filename, frame.name) for frame in traceback.extract_tb(e.__traceback__)]
    raise AssertionError("expected an error")


def test_tracebacks_are_filtered_like_jax():
    def fails(x):
        return x @ jnp.ones((3, 3))  # a shape error raised while tracing

    jitted, ours = both(fails)
    for method in (lambda f: f(X), lambda f: f.lower(X), lambda f: f.trace(X), lambda f: f.eval_shape(X)):
        frames_a, frames_b = user_frames(lambda: method(jitted)), user_frames(lambda: method(ours))
        assert not any("shardfix" in path for path, _ in frames_b), frames_b
        assert frames_a == frames_b


class Scaled:
    def __init__(self, scale):
        self.scale = scale

    def __hash__(self):
        return hash(self.scale)

    def __eq__(self, other):
        return isinstance(other, Scaled) and other.scale == self.scale

    def apply(self, x):
        return x * self.scale

    jitted_apply = jax.jit(apply, static_argnums=0)
    ours_apply = autofix_shardings(apply, static_argnums=0, on_fix="ignore")
    jitted_plain = jax.jit(apply)
    ours_plain = autofix_shardings(apply, on_fix="ignore")


def test_methods_and_static_self():
    obj = Scaled(3.0)
    assert_same_outcome(lambda: obj.jitted_apply(X), lambda: obj.ours_apply(X))
    assert_same_outcome(lambda: Scaled(4.0).jitted_apply(X), lambda: Scaled(4.0).ours_apply(X))
    assert type(obj.ours_apply) is type(obj.jitted_apply)  # a bound method
    assert_same_outcome(lambda: obj.jitted_apply.lower(obj, X).as_text(),
                        lambda: obj.ours_apply.lower(obj, X).as_text())
    assert_same_outcome(lambda: Scaled.jitted_apply(obj, X), lambda: Scaled.ours_apply(obj, X))
    # `self` not static: JAX refuses it as an array argument, and so do we, in the same words.
    assert_same_outcome(lambda: obj.jitted_plain(X), lambda: obj.ours_plain(X))


@pytest.mark.parametrize("static_argnums", [2, -1, (1, 2), -2])
def test_static_arguments_resolve_by_signature(static_argnums):
    """Which arguments are static follows jax.jit in each JAX version (0.12 resolves negative numbers against the
    signature, older versions per call), never the number of arguments of one call."""
    def scaled(x, y, scale=1.0):  # a function of its own: jax.jit's C++ cache is shared per function
        return x * scale + y

    jitted, ours = both(scaled, static_argnums=static_argnums)
    calls = [(X, Y), (X, 2.0), (X, 3.0), (X, Y, 2.0), (X, Y, 3.0), (X, Y, 3.0), (X, 2.0, 4.0)]
    for args in calls:
        sizes = jitted._cache_size(), ours._cache_size()
        assert_same_outcome(lambda: jitted(*args), lambda: ours(*args))
        # The call was told apart from the earlier ones (a new cache entry: other static values) by both, or by none.
        assert jitted._cache_size() - sizes[0] == ours._cache_size() - sizes[1]


def test_jax_clear_caches_clears_ours():
    _, ours = both(body)
    ours(X, Y)
    ours(X, Y)
    assert ours.cache_misses == 1
    jax.clear_caches()
    ours(X, Y)
    assert ours.cache_misses == 2


def test_export_exports_the_patched_module():
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    fun = lambda x: jax.lax.with_sharding_constraint(x * 2.0, NamedSharding(mesh, P("tp", None)))  # noqa: E731
    spec = jax.ShapeDtypeStruct((6, 8), jnp.float32)
    plain = jax.export.export(jax.jit(fun))(spec)
    with pytest.warns(ShardingFixWarning, match="indivisible"):
        exported = jax.export.export(autofix_shardings(fun, policy="subaxis"))(spec)
    assert '{"tp":(1)2}' in exported.mlir_module() and '{"tp":(1)2}' not in plain.mlir_module()
    x = np.arange(48, dtype=np.float32).reshape(6, 8)
    run = jax.jit(exported.call, in_shardings=NamedSharding(mesh, P()))  # it was exported for the 8 devices
    np.testing.assert_array_equal(np.asarray(run(x)), x * 2.0)


def test_aot_lowering_for_an_abstract_mesh_and_other_platforms():
    abstract = jax.sharding.AbstractMesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    fun = lambda x: jax.lax.with_sharding_constraint(x * 2.0, NamedSharding(abstract, P("tp", None)))  # noqa: E731
    spec = jax.ShapeDtypeStruct((6, 8), jnp.float32, sharding=NamedSharding(abstract, P("dp")))
    plain = jax.jit(fun).trace(spec).lower(lowering_platforms=("tpu",))
    ours = autofix_shardings(fun, policy="subaxis", on_fix="ignore").trace(spec).lower(lowering_platforms=("tpu",))
    assert isinstance(ours, jax.stages.Lowered)
    # the constraint keeps a sub-axis inside; the result it sets gets a sharding JAX reads back
    assert [(f.before, f.after) for f in ours.fixes] == [("P('tp', None)", '<@mesh, [{"tp":(1)2}, {}]>'),
                                                         ("P('tp', None)", "P(None, None)")]
    result = '{jax.result_info = "result"}'
    assert ours.as_text() == plain.as_text().replace('[{"tp"}, {}]', '[{"tp":(1)2}, {}]').replace(
        result, result[:-1] + ', sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}')
