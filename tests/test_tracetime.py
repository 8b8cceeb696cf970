"""Trace-time repairs (shardfix.jit.tracing) on every API where JAX checks a spec while tracing, on jax.make_mesh's
default (Explicit) axes and on Auto ones: the repaired program is the program written with the repaired spec (same
values, same `jax.typeof(out).sharding`), the fix names the line of the call, and outside a session JAX raises as
before. Also: backward passes, nesting, JAX's caches, threads, policies and the decorator's report."""

import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from shardfix import ShardingFixError, ShardingFixWarning, autofix_shardings
from shardfix.jit import tracing

EXPLICIT = jax.make_mesh((2, 4), ("dp", "tp"))
AUTO = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
X = np.arange(48, dtype=np.float32).reshape(6, 8) / 10.0
BAD = {"indivisible": P("tp", None), "unknown axis": P("dp", "fsdp"), "too long": P("dp", None, "tp")}
REPAIRED = {"indivisible": P(None, None), "unknown axis": P("dp", None), "too long": P("dp", None)}

# name -> (builder(spec, mesh, expected) -> f(x), the modes where JAX rejects the bad specs while tracing). Each
# builder is one line: the fix must name it.
APIS = {
    "reshard": (lambda s, m, e: lambda x: jax.sharding.reshard(x, s), ("explicit",)),
    "reshard NamedSharding": (lambda s, m, e: lambda x: jax.sharding.reshard(x, NamedSharding(m, s)), ("explicit",)),
    # Under Explicit axes a constraint asserts the value's layout: the value has the repaired one already.
    "with_sharding_constraint": (lambda s, m, e: lambda x: jax.lax.with_sharding_constraint(prepared(x, e), s),
                                 ("explicit", "auto")),
    "with_sharding_constraint NamedSharding": (
        lambda s, m, e: lambda x: jax.lax.with_sharding_constraint(prepared(x, e), NamedSharding(m, s)),
        ("explicit", "auto")),
    "jnp.ones out_sharding": (lambda s, m, e: lambda x: x + jnp.ones((6, 8), out_sharding=s), ("explicit",)),
    "jnp.dot out_sharding": (lambda s, m, e: lambda x: jnp.dot(x, x.T * 2, out_sharding=s), ("explicit",)),
    "jnp.einsum out_sharding": (lambda s, m, e: lambda x: jnp.einsum("ij,kj->ik", x, x, out_sharding=s),
                                ("explicit",)),
    "device_put": (lambda s, m, e: lambda x: jax.device_put(x, NamedSharding(m, s)), ("explicit", "auto")),
    "jit in_shardings": (lambda s, m, e: lambda x: jax.jit(lambda y: y * 2, in_shardings=NamedSharding(m, s))(x),
                         ("explicit", "auto")),
    "jit out_shardings": (lambda s, m, e: lambda x: jax.jit(lambda y: y * 2, out_shardings=NamedSharding(m, s))(x),
                          ("explicit", "auto")),
}
MESHES = {"explicit": EXPLICIT, "auto": AUTO}


def prepared(x, expected):
    return jax.sharding.reshard(x, expected) if jax.sharding.get_abstract_mesh().are_all_axes_explicit else x


def cases():
    for api, (_, modes) in APIS.items():
        for mode in modes:
            for bad in BAD:
                if (mode, bad) == ("auto", "indivisible") and api.startswith("with_sharding_constraint"):
                    continue  # under Auto axes JAX accepts (and pads) it; fix-shardings repairs it in the module
                yield pytest.param(api, mode, bad, id=f"{api}-{mode}-{bad}")


def run(fn, x):
    out = jax.jit(fn)(x)
    return np.asarray(out), jax.typeof(out).sharding.spec


@pytest.mark.parametrize("api, mode, bad", list(cases()))
def test_repaired_like_the_program_written_with_the_repaired_spec(api, mode, bad):
    build, _ = APIS[api]
    mesh, spec, expected = MESHES[mode], BAD[bad], REPAIRED[bad]
    shape = (6, 6) if api in ("jnp.dot out_sharding", "jnp.einsum out_sharding") else (6, 8)
    x = jax.device_put(X, NamedSharding(mesh, P()))
    with jax.set_mesh(mesh):
        with pytest.raises((ValueError, AssertionError)):
            run(build(spec, mesh, expected), x)  # plain JAX rejects it
        with tracing.repairing() as repairs:
            values, out_spec = run(build(spec, mesh, expected), x)
        want_values, want_spec = run(build(expected, mesh, expected), x)
    np.testing.assert_array_equal(values, want_values)
    assert out_spec == want_spec
    if mode == "explicit" and api.startswith(("reshard", "jnp.", "device_put")):
        assert out_spec == expected  # the value's type is the repaired spec (types hold Explicit axes only)
    line = build.__code__.co_firstlineno
    assert [(f.location, f.before, f.after) for f in repairs.fixes] == [(f"{__file__}:{line}", str(spec),
                                                                          str(expected))]
    assert repairs.fixes[0].site.endswith(f"(shape {shape})")


def test_fix_details():
    with jax.set_mesh(EXPLICIT), tracing.repairing() as repairs:
        jax.jit(lambda x: jax.sharding.reshard(x, P(("dp", "tp"), "fsdp")))(np.ones((12, 8), np.float32))
    fix, = repairs.fixes
    assert (fix.pass_name, fix.site, fix.reason, fix.before, fix.after, fix.shards_before, fix.shards_after) == (
        "trace", "reshard (shape (12, 8))", "unknown-axis,indivisible", "P(('dp', 'tp'), 'fsdp')", "P('dp', None)",
        8, 2)
    assert [d for _, d in fix.reasons] == [
        "dim 1: axis 'fsdp' is not in the mesh (dp=2, tp=4); dropped",
        "dim 0 of size 12 is not divisible by ('dp', 'tp') (size 8); now 'dp' (size 2)",
        "dim 0: the subaxis policy would keep the sub-axis {\"dp\", \"tp\":(1)2} (\"tp\":(1)2 is 2 of tp's 4 devices), "
        "which a PartitionSpec can't hold; kept the longest dividing prefix of axes instead (\"dp\")",
    ]


@pytest.mark.parametrize("policy, expected", [("subaxis", P("dp", None)), ("prefix", P("dp", None)),
                                              ("drop", P(None, None))])
def test_policies(policy, expected):
    with jax.set_mesh(EXPLICIT), tracing.repairing(policy) as repairs:
        out = jax.jit(lambda x: jax.sharding.reshard(x, P(("dp", "tp"))))(np.ones((12, 8), np.float32))
    assert jax.typeof(out).sharding.spec == expected and repairs.fixes[0].after == str(expected)


def test_backward_pass_reported_once_at_the_forward_line():
    def loss(x):
        y = jax.sharding.reshard(x * 2.0, P("tp", "fsdp"))  # forward
        return jnp.sum(jnp.dot(y, y.T, out_sharding=P("tp", None)) ** 2)

    with jax.set_mesh(EXPLICIT), tracing.repairing() as repairs:
        grad = jax.jit(jax.grad(loss))(X)
    reference = jax.jit(jax.grad(lambda x: jnp.sum(((x * 2.0) @ (x * 2.0).T) ** 2)))(X)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(reference), rtol=1e-6)
    first = loss.__code__.co_firstlineno
    assert [(f.location, f.before, f.after) for f in repairs.fixes] == [
        (f"{__file__}:{first + 1}", "P('tp', 'fsdp')", "P(None, None)"),
        (f"{__file__}:{first + 2}", "P('tp', None)", "P(None, None)"),
    ]


def test_outside_a_session_jax_raises_as_before_and_caches_stay_apart():
    f = jax.jit(lambda x: jax.sharding.reshard(x * 2, P("tp", None)))
    with jax.set_mesh(EXPLICIT):
        with pytest.raises(ValueError, match="does not evenly divide"):
            f(X)
        for _ in range(2):  # each complete session records the repair, though JAX has traced it before
            with tracing.repairing() as repairs:
                np.testing.assert_array_equal(np.asarray(f(X)), X * 2)
            assert len(repairs.fixes) == 1
        with pytest.raises(ValueError, match="does not evenly divide"):
            f(X)  # the repaired trace and executable are not served outside a session
        with tracing.repairing(complete=False) as first:
            f(X)
        with tracing.repairing(complete=False) as second:
            f(X)  # shares JAX's caches with the first: the repair was recorded there
        assert (len(first.fixes), len(second.fixes)) == (1, 0)


def test_sessions_nest_and_isolated_ones_keep_their_fixes():
    f = jax.jit(lambda x: jax.sharding.reshard(x, P("dp", "fsdp")))
    with jax.set_mesh(EXPLICIT), tracing.repairing() as outer:
        with tracing.repairing() as inner:
            f(X)
        with tracing.repairing(isolated=True) as isolated:
            jax.jit(lambda x: jax.sharding.reshard(x, P("tp", None)))(X)
    assert len(inner.fixes) == 1 and outer.fixes == inner.fixes
    assert len(isolated.fixes) == 1 and tracing.active() is None


def test_named_sharding_with_unknown_axes_is_built_only_inside_a_session():
    spec = P("dp", "fsdp")
    with pytest.raises(ValueError, match="Resource axis: fsdp"):
        NamedSharding(EXPLICIT, spec)
    with tracing.repairing():
        NamedSharding(EXPLICIT, spec)
        with pytest.raises(ValueError, match="UNCONSTRAINED"):  # any other complaint still raises
            NamedSharding(EXPLICIT, P("fsdp", P.UNCONSTRAINED))
    with pytest.raises(ValueError, match="Resource axis: fsdp"):
        NamedSharding(EXPLICIT, spec)


def test_other_threads_see_plain_jax():
    results = {}
    barrier = threading.Barrier(2)

    def plain():
        barrier.wait()
        try:
            with jax.set_mesh(EXPLICIT):
                jax.jit(lambda x: jax.sharding.reshard(x + 1, P("tp", None)))(X)
            results["plain"] = "ran"
        except ValueError:
            results["plain"] = "raised"

    thread = threading.Thread(target=plain)
    thread.start()
    with jax.set_mesh(EXPLICIT), tracing.repairing() as repairs:
        barrier.wait()
        jax.jit(lambda x: jax.sharding.reshard(x + 1, P("tp", None)))(X)
        thread.join()
    assert results == {"plain": "raised"} and len(repairs.fixes) == 1


def test_unknown_policy():
    with pytest.raises(ValueError, match="policy must be one of auto, subaxis, prefix, drop; got 'pad'"):
        with tracing.repairing("pad"):
            pass


# -- through the decorator -----------------------------------------------------------------------------------------


def step(x, w):
    h = jax.sharding.reshard(x @ w, P("dp", "tp"))  # batch 1 over dp, 6 over tp
    return jnp.tanh(h).sum()


def test_decorator_reports_trace_time_fixes():
    x, w = np.ones((1, 8), np.float32), np.ones((8, 6), np.float32) / 8
    f = autofix_shardings(step)
    with jax.set_mesh(EXPLICIT):
        with pytest.warns(ShardingFixWarning) as told:
            value = f(x, w)
        with pytest.warns(ShardingFixWarning):
            lowered = f.lower(x, w)
        with pytest.raises(ShardingFixError, match=r"P\('dp', 'tp'\) -> P\(None, None\) \[indivisible\]"):
            autofix_shardings(step, on_fix="error")(x, w)
        with pytest.raises(ValueError, match="does not evenly divide"):
            jax.jit(step)(x, w)
    np.testing.assert_allclose(float(value), np.tanh(x @ w).sum(), rtol=1e-6)
    line = step.__code__.co_firstlineno + 1
    assert [(f.location, f.site, f.before, f.after) for f in lowered.fixes] == [
        (f"{__file__}:{line}", "reshard (shape (1, 6))", "P('dp', 'tp')", "P(None, None)")]
    message = str(told[0].message)
    assert message.splitlines()[:2] == [
        "shardfix changed 1 sharding(s) of step:",
        f"  {__file__}:{line}: reshard (shape (1, 6)): P('dp', 'tp') -> P(None, None) [indivisible]"]


def test_decorator_under_an_outer_jit_repairs_and_tells():
    f = autofix_shardings(step)
    x, w = np.ones((1, 8), np.float32), np.ones((8, 6), np.float32) / 8
    with jax.set_mesh(EXPLICIT), warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        value = jax.jit(lambda x, w: f(x, w) * 2)(x, w)  # the outer call
    np.testing.assert_allclose(float(value), 2 * np.tanh(x @ w).sum(), rtol=1e-6)
    told = [w for w in told if issubclass(w.category, ShardingFixWarning)]
    call_line = test_decorator_under_an_outer_jit_repairs_and_tells.__code__.co_firstlineno + 5
    assert len(told) == 1 and told[0].lineno == call_line


def test_nested_decorated_function_reports_into_the_outer_one():
    inner = autofix_shardings(lambda x: jnp.tanh(x) * 2, in_shardings=P("tp"), mesh=EXPLICIT)

    def outer(x):
        return jax.sharding.reshard(inner(x), P("dp", "fsdp")).sum()  # the outer fix

    with jax.set_mesh(EXPLICIT), warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        lowered = autofix_shardings(outer).lower(X)
    told = [w for w in told if issubclass(w.category, ShardingFixWarning)]
    assert len(told) == 1  # the outer function's, covering both
    assert sorted((f.site, f.before, f.after) for f in lowered.fixes) == [
        ("in_shardings[0] (shape (6, 8))", "P('tp',)", "P(None, None)"),
        ("reshard (shape (6, 8))", "P('dp', 'fsdp')", "P('dp', None)")]
