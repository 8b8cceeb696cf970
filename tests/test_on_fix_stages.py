"""on_fix is honoured wherever a trace repairs something, not only at calls: `.trace()`, `.eval_shape()`,
`jax.eval_shape(decorated)` and `.lower()` of a decorated function, and, under the plugin, `jax.eval_shape` (Flax's
`jax.eval_shape(init)` idiom), `jax.jit(f).trace()` and `.lower()`. "error" raises from the user's call; "warn"
warns once, at the user's line, while the call is on the stack (never at exit, never from inside shardfix)."""

import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardfix
from shardfix import ShardingFixError, ShardingFixWarning, autofix_shardings

MESH = jax.make_mesh((2, 4), ("dp", "tp"))
X = jnp.ones((6, 8))


def step(x):
    return jax.sharding.reshard(x * 2, P("tp", "zz"))


DECORATED = {
    ".trace": lambda f: f.trace(X),
    ".eval_shape": lambda f: f.eval_shape(X),
    "jax.eval_shape": lambda f: jax.eval_shape(f, X),
    ".lower": lambda f: f.lower(X),
}
PLUGIN = {
    "jax.eval_shape": lambda: jax.eval_shape(step, X),
    "jit.trace": lambda: jax.jit(step).trace(X),
    "jit.lower": lambda: jax.jit(step).lower(X),
}


def told(run):
    """The ShardingFixWarnings `run` raises: (file, line) of each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [(w.filename, w.lineno) for w in caught if issubclass(w.category, ShardingFixWarning)]


@pytest.mark.parametrize("stage", list(DECORATED))
def test_decorator_stage_raises_and_warns(stage):
    with jax.set_mesh(MESH):
        with pytest.raises(ShardingFixError, match=r"P\('tp', 'zz'\) -> P\(None, None\)"):
            DECORATED[stage](autofix_shardings(step, on_fix="error"))
        line = DECORATED[stage].__code__.co_firstlineno  # the user's call: the innermost frame outside libraries
        assert told(lambda: DECORATED[stage](autofix_shardings(step))) == [(__file__, line)]


@pytest.mark.parametrize("stage", list(PLUGIN))
def test_plugin_stage_raises_and_warns(stage):
    with jax.set_mesh(MESH):
        with shardfix.enabled(on_fix="error"), pytest.raises(ShardingFixError, match=r"P\('tp', 'zz'\)"):
            PLUGIN[stage]()
        with shardfix.enabled():
            assert told(PLUGIN[stage]) == [(__file__, PLUGIN[stage].__code__.co_firstlineno)]


SCRIPT = """
import jax, jax.numpy as jnp
from jax.sharding import PartitionSpec as P
with jax.set_mesh(jax.make_mesh((2, 4), ("dp", "tp"))):
    jax.eval_shape(lambda x: jax.sharding.reshard(x, P("tp", "zz")), jnp.ones((6, 8)))
print("done")
"""


@pytest.mark.parametrize("on_fix", ["error", "warn"])
def test_plugin_eval_shape_in_a_script_tells_at_the_call(tmp_path, on_fix):
    script = tmp_path / "init.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "shardfix.run", "--on-fix", on_fix, str(script)],
                          capture_output=True, text=True, timeout=120)
    assert "atexit" not in done.stderr and "notify.py" not in done.stderr, done.stderr
    if on_fix == "error":
        assert done.returncode != 0 and "ShardingFixError" in done.stderr and "done" not in done.stdout
    else:
        assert done.returncode == 0 and f"{script}:5: ShardingFixWarning" in done.stderr, done.stderr
