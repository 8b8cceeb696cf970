"""The process-wide plugin: every jax.jit compile goes through shardfix while it is enabled, reported at the user's
line; disabled, jax.jit behaves exactly as before; the environment variable and `python -m shardfix.run`."""

import logging
import os
import re
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardfix
from shardfix import ShardingFixError, ShardingFixWarning, autofix_shardings

MESH = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
X = np.arange(16, dtype=np.float32).reshape(8, 2) / 10.0
W = np.arange(4, dtype=np.float32).reshape(2, 2) / 10.0


@jax.jit
def layer(x, w):
    return jax.lax.with_sharding_constraint(jnp.tanh(x @ w), NamedSharding(MESH, P(None, "tp")))  # 2 columns


@jax.jit
def step(x, w):
    return jnp.sum(layer(layer(x, w), w) ** 2)


def reference(x, w):
    h = np.tanh(np.tanh(x @ w) @ w)
    return float(np.sum(h ** 2))


LINE = {tag: i for i, line in enumerate(open(__file__), 1) for tag in ("# 2 columns", "# the call", "# the inner call")
        if line.rstrip().endswith(tag)}


def call(fn, *args):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = fn(*args)  # the call
    return out, [w for w in record if issubclass(w.category, ShardingFixWarning)]


def test_every_jit_goes_through_shardfix_while_enabled_and_jax_is_unchanged_after():
    plain_text = step.lower(X, W).compile().as_text()
    assert " pad(" in plain_text  # what JAX does with 2 columns over tp=4
    plain_out, told = call(step, X, W)
    plain_grads = jax.grad(step)(X, W)
    size = step._cache_size()
    assert told == []
    with shardfix.enabled():
        assert shardfix.is_enabled()
        out, told = call(step, X, W)
        np.testing.assert_allclose(float(out), reference(X, W), rtol=1e-6)
        assert len(told) == 1 and (told[0].filename, told[0].lineno) == (__file__, LINE["# the call"])
        text = str(told[0].message)
        assert text.startswith("shardfix changed 2 sharding(s) of step:")  # the constraint in each nested call,
        assert text.count(f"{__file__}:{LINE['# 2 columns']}: 'sdy.sharding_constraint' sharding: "  # one entry
                          "P(None, 'tp') -> <@mesh, [{}, {\"tp\":(1)2}]> [indivisible] (x2)\n") == 1
        compiled, told = call(lambda: step.lower(X, W).compile())  # JAX's executable for the call: told then
        assert " pad(" not in compiled.as_text() and told == []
        grads, told = call(jax.jit(jax.grad(step)), X, W)
        assert told == []  # the same fixes again (in the backward pass too): told once, above
        np.testing.assert_allclose(np.asarray(grads), np.asarray(plain_grads), rtol=1e-5, atol=1e-7)
        assert step._cache_size() == size + 1  # the plugin's executable is kept apart from JAX's
    assert not shardfix.is_enabled()
    out, told = call(step, X, W)
    assert told == [] and float(out) == float(plain_out)
    assert step._cache_size() == size + 1  # JAX's own executable served again: nothing compiled
    assert step.lower(X, W).compile().as_text() == plain_text


def test_settings_and_on_fix_modes(caplog):
    with shardfix.enabled(policy="drop", on_fix="error"):
        with pytest.raises(ShardingFixError, match=re.escape("sharding: P(None, 'tp') -> P(None, None) [indivisible]")):
            jax.jit(lambda x: layer(x, W) * 3.0)(X)
    with shardfix.enabled(on_fix="log"), caplog.at_level(logging.WARNING, logger="shardfix"):
        out, told = call(jax.jit(lambda x: layer(x, W) * 4.0), X)
    assert told == [] and "indivisible" in caplog.text
    with shardfix.enabled(on_fix="ignore"):
        out, told = call(jax.jit(lambda x: layer(x, W) * 5.0), X)
    assert told == []
    with pytest.raises(ValueError, match="policy must be one of"):
        shardfix.enable(policy="sometimes")
    assert not shardfix.is_enabled()


def test_enable_disable_and_nested_contexts():
    shardfix.enable(policy="drop")
    try:
        with shardfix.enabled(policy="prefix"):
            _, told = call(jax.jit(lambda x: layer(x, W) * 6.0), X)
            assert "-> P(None, None)" in str(told[0].message)  # prefix keeps no axis of 4 on 2 columns
        _, told = call(jax.jit(lambda x: layer(x, W) * 7.0), X)
        assert shardfix.is_enabled() and "-> P(None, None)" in str(told[0].message)
    finally:
        shardfix.disable()
    _, told = call(jax.jit(lambda x: layer(x, W) * 8.0), X)
    assert told == [] and not shardfix.is_enabled()


def test_a_gspmd_module_gets_one_clear_warning():
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        with shardfix.enabled():
            outs = [call(jax.jit(lambda x, k=k: layer(x, W) * k), X) for k in (9.0, 10.0)]
        decorated = autofix_shardings(lambda x: layer(x, W) * 11.0)
        said = call(decorated, X)[1] + call(decorated.lower, X)[1]
    finally:
        jax.config.update("jax_use_shardy_partitioner", True)
    assert [str(w.message) for w in said] == [str(w.message) for w in outs[0][1]]  # once for the function too
    told = outs[0][1] + outs[1][1]
    assert [str(w.message) for w in told] == [
        "shardfix repairs only Shardy modules; this program is lowered for GSPMD (jax_use_shardy_partitioner=False), "
        "so its shardings are compiled as they are"]
    np.testing.assert_allclose(np.asarray(outs[1][0]), np.tanh(X @ W) * 10.0, rtol=1e-6)


def test_decorated_function_under_an_outer_transformation_says_so_once():
    inner = autofix_shardings(lambda x: layer(x, W) * 2.0)
    outer = jax.jit(lambda x: inner(x) + 1.0)  # the inner call
    _, told = call(outer, X)
    _, again = call(jax.jit(lambda x: inner(x) - 1.0), X)
    assert len(told) == 1 and again == []
    assert "runs inside another transformation" in str(told[0].message)
    assert (told[0].filename, told[0].lineno) == (__file__, LINE["# the inner call"])
    with shardfix.enabled():  # the plugin repairs the outer module: nothing to say
        fresh = autofix_shardings(lambda x: layer(x, W) * 2.0)
        _, told = call(jax.jit(lambda x: fresh(x) + 1.0), X)
    assert [w for w in told if "inside another transformation" in str(w.message)] == []


SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)

    @jax.jit
    def f(x):
        return jax.lax.with_sharding_constraint(x * 2.0, NamedSharding(mesh, P(None, "tp")))

    x = np.ones((4, 2), np.float32)
    out = f(x)
    print("args", sys.argv[1:], "pad" if " pad(" in f.lower(x).compile().as_text() else "no pad", float(out.sum()))
""")


def run_python(args, tmp_path, **env):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    environment = {k: v for k, v in os.environ.items() if k != "SHARDFIX"}
    environment.update(env, PYTHONWARNINGS="default")
    return subprocess.run([sys.executable, *[str(script) if a == "SCRIPT" else a for a in args]], env=environment,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_run_a_script_that_never_imports_shardfix(tmp_path):
    done = run_python(["-m", "shardfix.run", "--policy", "drop", "SCRIPT", "--steps", "3"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "args ['--steps', '3'] no pad 16.0" in done.stdout
    assert f"{tmp_path / 'train.py'}:12: ShardingFixWarning: shardfix changed 1 sharding(s) of f:" in done.stderr
    assert f"{tmp_path / 'train.py'}:9: 'sdy.sharding_constraint' sharding: P(None, 'tp') -> P(None, None)" in done.stderr
    plain = run_python(["SCRIPT"], tmp_path)
    assert "args [] pad 16.0" in plain.stdout and "ShardingFixWarning" not in plain.stderr


def test_environment_variable(tmp_path):
    done = run_python(["-m", "shardfix.run", "-m", "train", "--flag"], tmp_path, SHARDFIX="on_fix=log")
    assert done.returncode == 0 and "args ['--flag'] no pad" in done.stdout  # a module, run as with python -m
    # the constraint (a sub-axis inside) and the result it sets, which JAX reads back as a NamedSharding
    assert "ShardingFixWarning" not in done.stderr and "shardfix changed 2 sharding(s) of f:" in done.stderr
    imported = run_python(["-c", "import shardfix, runpy; runpy.run_path('train.py')"], tmp_path, SHARDFIX="1")
    assert "no pad" in imported.stdout and "ShardingFixWarning" in imported.stderr
    ignored = run_python(["-c", "import shardfix, runpy; runpy.run_path('train.py')"], tmp_path, SHARDFIX="bogus")
    assert ignored.returncode == 0 and " pad " in ignored.stdout and "Traceback" not in ignored.stderr
    assert "RuntimeWarning: SHARDFIX='bogus': expected 1, 0, or comma-separated" in ignored.stderr
    bad = run_python(["-m", "shardfix.run", "SCRIPT"], tmp_path, SHARDFIX="policy=sometimes")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "error: SHARDFIX='policy=sometimes': policy must be one of" in bad.stderr
    usage = run_python(["-m", "shardfix.run", "--colour", "SCRIPT"], tmp_path)
    assert usage.returncode != 0 and "error: unrecognized arguments: --colour" in usage.stderr


PTH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python", "shardfix.pth")


@pytest.mark.parametrize("setting, expected", [("policy=drop", "no pad"), ("0", "pad"), (None, "pad")])
def test_shardfix_pth_enables_the_plugin_for_a_script_that_never_imports_shardfix(tmp_path, setting, expected):
    """shardfix.pth (installed beside the package by `pip install .`; .ci/install-check runs it so) reads SHARDFIX
    as the interpreter starts. Here its directory is added as a site directory, which runs it the same way."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "shardfix.pth").write_text(open(PTH).read())
    start = f"import site; site.addsitedir({str(site_dir)!r}); import runpy; runpy.run_path('train.py', run_name='__main__')"
    env = {} if setting is None else {"SHARDFIX": setting}
    done = run_python(["-c", start], tmp_path, **env)
    assert done.returncode == 0, done.stderr
    assert f"args [] {expected} 16.0" in done.stdout
    assert ("ShardingFixWarning: shardfix changed 1 sharding(s) of f:" in done.stderr) == (expected == "no pad")


def test_a_failure_at_start_up_never_stops_the_interpreter(tmp_path):
    (tmp_path / "user.py").write_text("import shardfix._startup\nimport jax\nprint('running')\n")
    done = subprocess.run([sys.executable, "user.py"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SHARDFIX": "policy=sometimes"}, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "running\n"
    # said once, as a warning at the user's line that imported JAX, and the plugin stays off
    assert done.stderr.count("policy must be one of") == 1, done.stderr
    assert done.stderr.startswith(f"{tmp_path / 'user.py'}:2: RuntimeWarning: SHARDFIX='policy=sometimes': ")
