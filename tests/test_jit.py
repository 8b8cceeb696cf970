"""@autofix_shardings on 8 CPU devices: fixes, caching, options, composability; results equal references."""

import logging
import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardfix
from shardfix import ShardingFixError, ShardingFixWarning, autofix_shardings

MESH = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
X = (np.arange(48, dtype=np.float32).reshape(6, 8) / 10.0)
W = (np.arange(64, dtype=np.float32).reshape(8, 8) / 100.0)


def model(x, w):
    y = jax.lax.with_sharding_constraint(jnp.tanh(x @ w), NamedSharding(MESH, P("tp", None)))  # constrained
    return y * 2.0


def reference(x, w):
    return np.tanh(np.asarray(x) @ np.asarray(w)) * 2.0


CALL_LINE = next(i for i, line in enumerate(open(__file__), 1) if line.rstrip().endswith("# the call"))
CONSTRAINED_LINE = next(i for i, line in enumerate(open(__file__), 1) if line.rstrip().endswith("# constrained"))


def caught(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)  # the call
    return out, [r for r in record if issubclass(r.category, ShardingFixWarning)]


def test_bare_decorator_fixes_inner_constraint_and_warns_once():
    # 2 rows over tp=4: the default policy (auto) splits them evenly over "tp":(1)2, one row a device as padding
    # would give (on 6 rows it keeps JAX's padded split, 2 rows a device against 3).
    x = X[:2]
    f = autofix_shardings(model)
    out, told = caught(f, x, W)
    np.testing.assert_allclose(np.asarray(out), reference(x, W), rtol=1e-6)
    assert len(told) == 1
    message = str(told[0].message)
    assert f"{__file__}:{CONSTRAINED_LINE}: 'sdy.sharding_constraint' sharding: P('tp', None) -> " \
           f"<@mesh, [{{\"tp\":(1)2}}, {{}}]> [indivisible]" in message
    assert (told[0].filename, told[0].lineno) == (__file__, CALL_LINE)  # the warning points at the caller
    out, told = caught(f, x, W)
    assert told == [] and f.cache_misses == 1  # cached: neither lowered nor compiled again


def test_cache_is_per_signature():
    f = autofix_shardings(model, on_fix="ignore")
    f(X, W), f(X + 1, W)
    assert f.cache_misses == 1
    f(np.ones((12, 8), np.float32), W)
    assert f.cache_misses == 2
    f(jax.device_put(X, NamedSharding(MESH, P("dp"))), W)  # another input sharding is another signature
    assert f.cache_misses == 3


def test_boundary_shardings_corrected_and_reported():
    f = autofix_shardings(model, mesh=MESH, in_shardings=(P("dp", "sp"), P(None, "tp")), out_shardings=P("tp"),
                          policy="subaxis")
    with pytest.warns(ShardingFixWarning, match="changed 3 sharding"):
        lowered = f.lower(X, W)
    assert [(fx.site, fx.before, fx.after, fx.reason) for fx in lowered.fixes] == [
        ("in_shardings[0] (shape (6, 8))", "P('dp', 'sp')", "P('dp', None)", "unknown-axis"),
        ("out_shardings (shape (6, 8))", "P('tp',)", "P(None, None)", "indivisible"),
        ("'sdy.sharding_constraint' sharding", "P('tp', None)", '<@mesh, [{"tp":(1)2}, {}]>', "indivisible"),
    ]
    assert 'sdy.sharding_constraint %' in lowered.as_text() and '{"tp":(1)2}' in lowered.as_text()
    compiled = lowered.compile()
    assert " pad(" not in compiled.as_text()
    np.testing.assert_allclose(np.asarray(compiled(X, W)), reference(X, W), rtol=1e-6)
    # An argument already placed with another sharding is moved to the one the executable wants.
    placed = jax.device_put(X, NamedSharding(MESH, P(None, "tp")))
    out = compiled(placed, W)
    np.testing.assert_allclose(np.asarray(out), reference(X, W), rtol=1e-6)
    assert out.sharding.spec == P(None, None)


def test_nothing_said_when_nothing_changed():
    f = autofix_shardings(lambda x: x * 2)
    out, told = caught(f, X)
    assert told == [] and f.lower(X).fixes == []


def test_on_fix_modes(caplog):
    with pytest.raises(ShardingFixError, match=r"\[indivisible\]"):
        autofix_shardings(model, policy="subaxis", on_fix="error")(X, W)
    out, told = caught(autofix_shardings(model, policy="subaxis", on_fix="ignore"), X, W)
    assert told == []
    with caplog.at_level(logging.WARNING, logger="shardfix"):
        out, told = caught(autofix_shardings(model, policy="subaxis", on_fix="log"), X, W)
    assert told == [] and "indivisible" in caplog.text
    with pytest.raises(ValueError, match="on_fix must be one of"):
        autofix_shardings(model, on_fix="shout")


def test_wrapping_a_jitted_function_takes_its_options():
    jitted = jax.jit(model, in_shardings=(NamedSharding(MESH, P("tp")), None))
    f = autofix_shardings(jitted, on_fix="ignore")
    lowered = f.lower(X, W)
    # MESH's axes are Auto: the auto policy moves tp to the dim it divides
    assert ("in_shardings[0] (shape (6, 8))", "P('tp',)", "P(None, 'tp')") in [(x.site, x.before, x.after) for x in lowered.fixes]
    np.testing.assert_allclose(np.asarray(f(X, W)), reference(X, W), rtol=1e-6)


def test_pytrees_kwargs_and_static_arguments():
    @autofix_shardings(static_argnums=(1,), static_argnames=("scale",), on_fix="ignore")
    def g(params, n, *, scale, bias):
        y = jax.lax.with_sharding_constraint(params["x"] @ params["w"], NamedSharding(MESH, P("tp")))
        return {"out": y * scale * n + bias}

    params = {"x": X, "w": W}
    out = g(params, 3, scale=0.5, bias=np.float32(1.0))["out"]
    np.testing.assert_allclose(np.asarray(out), X @ W * 1.5 + 1.0, rtol=1e-5)
    g(params, 3, scale=0.5, bias=np.float32(2.0))
    assert g.cache_misses == 1
    g(params, 4, scale=0.5, bias=np.float32(2.0))
    g(params, 4, scale=2.0, bias=np.float32(2.0))
    assert g.cache_misses == 3


def test_donation_is_passed_through():
    f = autofix_shardings(model, donate_argnums=(0,), on_fix="ignore")
    x, w = jnp.asarray(X), jnp.asarray(W)
    np.testing.assert_allclose(np.asarray(f(x, w)), reference(X, W), rtol=1e-6)
    assert x.is_deleted() and not w.is_deleted()  # the donated input's buffer went to the output, as jax.jit does


def test_mesh_from_context_and_from_arguments():
    f = autofix_shardings(lambda x: x + 1, in_shardings=P("tp"), on_fix="ignore")
    with jax.set_mesh(MESH):
        lowered = f.lower(X)
    assert [(x.before, x.after) for x in lowered.fixes] == [("P('tp',)", "P(None, 'tp')")]
    g = autofix_shardings(lambda x: x + 1, in_shardings=P(("dp", "tp")), on_fix="ignore")
    lowered = g.lower(jax.device_put(np.ones((12, 8), np.float32), NamedSharding(MESH, P("dp"))))
    # tp, which 12 rows over dp=2 can't hold too, moves to the 8 columns; the argument, committed to P('dp'), moves
    assert [(x.before, x.after) for x in lowered.fixes] == [("P(('dp', 'tp'),)", "P('dp', 'tp')"),
                                                            ("P('dp',)", "P('dp', 'tp')")]
    with pytest.raises(ValueError, match="no mesh to apply it to"):
        autofix_shardings(lambda x: x, in_shardings=P("tp")).lower(X)


def test_under_outer_jit_grad_and_vmap():
    f = autofix_shardings(model, in_shardings=(P("tp"), None), mesh=MESH, on_fix="ignore")
    outer = jax.jit(lambda x, w: f(x, w).sum())
    np.testing.assert_allclose(float(outer(X, W)), reference(X, W).sum(), rtol=1e-5)
    grad = jax.grad(lambda x: f(x, W).sum())(X)
    expected = jax.grad(lambda x: (jnp.tanh(x @ W) * 2.0).sum())(X)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(expected), rtol=1e-5, atol=1e-6)
    batched = jax.vmap(lambda x: autofix_shardings(lambda v: jnp.tanh(v) * 2, on_fix="ignore")(x))(X)
    np.testing.assert_allclose(np.asarray(batched), np.tanh(X) * 2, rtol=1e-6)


def test_value_and_grad_gets_everything():
    def loss(w, x):
        y = jax.lax.with_sharding_constraint(jnp.tanh(x @ w), NamedSharding(MESH, P("tp", None)))
        return jnp.mean(y ** 2)

    f = autofix_shardings(jax.value_and_grad(loss), policy="subaxis", on_fix="ignore")
    lowered = f.lower(W, X)
    assert any(fx.reason == "indivisible" for fx in lowered.fixes)
    value, grad = f(W, X)
    ref_value, ref_grad = jax.value_and_grad(lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2))(W, X)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(ref_grad), rtol=1e-5, atol=1e-7)
    assert " pad(" not in lowered.compile().as_text()


def test_cached_calls_take_the_compiled_fast_path():
    """After the first call, calls with the same signature never come back to Python (JAX's C++ dispatch)."""
    f = autofix_shardings(model, on_fix="ignore")
    for _ in range(5):
        out = f(jnp.asarray(X), jnp.asarray(W))
    np.testing.assert_allclose(np.asarray(out), reference(X, W), rtol=1e-6)
    assert f.cache_misses == 1


class _Scaled:
    def __init__(self, scale):
        self.scale = scale

    def __hash__(self):
        return hash(self.scale)

    def __eq__(self, other):
        return isinstance(other, _Scaled) and other.scale == self.scale

    @autofix_shardings(static_argnums=0, on_fix="ignore")
    def apply(self, x):
        return x * self.scale


def test_cached_calls_never_reenter_python():
    """Donated and keyword arguments, 1000-leaf pytrees and methods: one Python-level miss, then C++ only."""
    donated = autofix_shardings(lambda x: x * 2.0, donate_argnums=0, on_fix="ignore")
    x = jnp.ones((8, 8))
    for _ in range(3):
        x = donated(x)
    keywords = autofix_shardings(lambda x, *, scale: x * scale, on_fix="ignore")
    leaves = autofix_shardings(lambda tree: jax.tree.map(lambda v: v + 1.0, tree), on_fix="ignore")
    tree = {f"w{i}": jnp.full((2,), float(i)) for i in range(1000)}
    obj = _Scaled(3.0)
    for _ in range(3):
        keywords(x, scale=jnp.float32(2.0))
        out = leaves(tree)
        obj.apply(x)
    np.testing.assert_array_equal(np.asarray(x), np.full((8, 8), 8.0))
    assert float(out["w999"][0]) == 1000.0
    assert (donated.cache_misses, keywords.cache_misses, leaves.cache_misses, _Scaled.apply.cache_misses) == \
        (1, 1, 1, 1)
    # ... and not a single Python frame of shardfix's runs on a cached call
    package = os.path.dirname(shardfix.__file__)
    entered = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            entered.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        x = donated(x)
        keywords(x, scale=jnp.float32(2.0))
        leaves(tree)
        obj.apply(x)
        cached = list(entered)
        donated(jnp.ones((4, 4)))  # a new signature: a miss, which does run shardfix (the probe sees it)
    finally:
        sys.setprofile(None)
    assert cached == [] and entered != []


def test_aot_compiled_takes_jax_call_and_moves_only_what_jax_refuses():
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    spec = NamedSharding(mesh, P("dp"))
    f = autofix_shardings(lambda x: x * 2.0, in_shardings=spec, on_fix="ignore")
    compiled = f.lower(jax.ShapeDtypeStruct((8, 4), jnp.float32)).compile()
    fitting = jax.device_put(jnp.ones((8, 4)), spec)
    elsewhere = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("tp")))
    np.testing.assert_array_equal(np.asarray(compiled(fitting)), np.full((8, 4), 2.0))
    out = compiled(elsewhere)  # JAX's Compiled refuses this one; shardfix's moves it
    np.testing.assert_array_equal(np.asarray(out), np.full((8, 4), 2.0))
    with pytest.raises(ValueError, match="disagree"):
        jax.jit(lambda x: x * 2.0, in_shardings=spec).lower(jax.ShapeDtypeStruct((8, 4), jnp.float32)).compile()(
            elsewhere)
    with pytest.raises(TypeError):  # JAX's own errors pass through unchanged
        compiled(jnp.ones((8, 4), jnp.int32))


def test_traced_with_consts_as_arg_lowers_through_the_pipeline():
    """JAX 0.11 and later: the Traced it returns lowers through shardfix too (before, neither Traced has it)."""
    table = jnp.arange(8.0).reshape(4, 2)
    f = autofix_shardings(lambda x: jax.lax.with_sharding_constraint(x * table, NamedSharding(MESH, P(None, "tp"))),
                          policy="subaxis", on_fix="ignore")
    traced = f.trace(jnp.ones((4, 2)))
    if not hasattr(jax.stages.Traced, "with_consts_as_arg"):
        assert not hasattr(traced, "with_consts_as_arg")
        return
    consts, with_arg = traced.with_consts_as_arg()
    assert len(consts) == 1 and isinstance(with_arg, jax.stages.Traced)
    lowered = with_arg.lower()
    # the constraint keeps a sub-axis inside; the result it sets gets a sharding JAX can read back
    assert '"tp":(1)2' in lowered.as_text() and [fix.reason for fix in lowered.fixes] == ["indivisible"] * 2
    np.testing.assert_array_equal(np.asarray(lowered.compile()(consts, jnp.ones((4, 2)))), np.asarray(table))
