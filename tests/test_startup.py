"""What shardfix costs and does in a process that doesn't ask for it: SHARDFIX switches the plugin on when JAX is
first imported (never at start-up), -W / PYTHONWARNINGS filters name shardfix's warning, the `shardfix` logger
says what each pass did, and the version is the package's."""

import importlib.metadata
import io
import logging
import os
import subprocess
import sys
import sysconfig
import tomllib

import pytest

import shardfix
from shardfix.opt import OptMain

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTH = os.path.join(ROOT, "python", "shardfix.pth")


@pytest.fixture
def site_dir(tmp_path):
    """A site directory holding shardfix.pth, as pip installs it beside the package."""
    directory = tmp_path / "site"
    directory.mkdir()
    (directory / "shardfix.pth").write_text(open(PTH).read())
    return directory


def python(code: str, site_dir, *options: str, **env) -> subprocess.CompletedProcess:
    """`python OPTIONS -c CODE` with shardfix.pth processed at start-up, as an installed one is."""
    environment = {k: v for k, v in os.environ.items() if k not in ("SHARDFIX", "PYTHONWARNINGS")}
    environment.update(env)
    start = f"import site; site.addsitedir({str(site_dir)!r})\n"
    return subprocess.run([sys.executable, *options, "-c", start + code], capture_output=True, text=True,
                          timeout=120, env=environment, cwd=site_dir)


LOADED = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'shardfix')))"


def test_shardfix_set_costs_a_process_without_jax_no_import(site_dir):
    for value in ("1", "policy=drop", "bogus"):  # a bad value is said only once JAX is imported
        done = python(LOADED, site_dir, SHARDFIX=value)
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout == "['shardfix', 'shardfix._startup']\n"
    assert python(LOADED, site_dir).stdout == "[]\n"  # unset: not even shardfix


def test_the_plugin_is_on_once_jax_is_imported(site_dir):
    code = "import sys\nprint('shardfix.jit.plugin' in sys.modules)\nimport jax.numpy\nimport shardfix\n" \
           "print(shardfix.is_enabled())\n"
    assert python(code, site_dir, SHARDFIX="1").stdout == "False\nTrue\n"
    assert python(code, site_dir, SHARDFIX="0").stdout == "False\nFalse\n"
    # JAX imported before shardfix is: `import shardfix` switches it on at once
    late = "import jax, shardfix\nprint(shardfix.is_enabled())\n"
    assert subprocess.run([sys.executable, "-c", late], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SHARDFIX": "1"}).stdout == "True\n"


def test_this_environment_has_shardfix_pth_as_a_regular_install_has():
    """`make test`'s editable install puts shardfix.pth beside the package as `pip install .` does, and a path entry
    for python/ that type checkers follow: SHARDFIX works there as in a regular install."""
    purelib = sysconfig.get_path("purelib")
    with open(os.path.join(purelib, "shardfix.pth")) as installed, open(PTH) as source:
        assert installed.read() == source.read()
    done = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SHARDFIX": "1"})
    assert (done.stdout, done.stderr) == ("['shardfix', 'shardfix._startup']\n", "")
    paths = subprocess.run([sys.executable, "-c", "import sys; print(sys.path)"], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout
    assert repr(os.path.join(ROOT, "python")) in paths


WARN = "import warnings, shardfix\nwarnings.warn('changed', shardfix.ShardingFixWarning)\nprint('done')\n"
# Python reads -W and PYTHONWARNINGS before site-packages is on sys.path, so it can't import shardfix then (nor
# any installed package) and says so; shardfix.pth applies the options again once it can.
NOT_YET = "Invalid -W option ignored: invalid module name: 'shardfix'\n"


def test_warning_filters_on_the_command_line_and_in_the_environment(site_dir):
    plain = python(WARN, site_dir)
    assert plain.stdout == "done\n" and "ShardingFixWarning: changed" in plain.stderr
    for options, env in ((["-W", "ignore::shardfix.ShardingFixWarning"], {}),
                         ([], {"PYTHONWARNINGS": "ignore::shardfix.ShardingFixWarning"})):
        done = python(WARN, site_dir, *options, **env)
        assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", NOT_YET)
    error = python(WARN, site_dir, "-W", "error::shardfix.ShardingFixWarning")
    assert error.returncode == 1 and error.stdout == ""
    assert error.stderr.endswith("shardfix.report.ShardingFixWarning: changed\n")
    # the later option wins, as Python orders them
    later = python(WARN, site_dir, "-W", "ignore::shardfix.ShardingFixWarning", "-W", "error")
    assert later.returncode == 1 and later.stderr.endswith("ShardingFixWarning: changed\n")


LOCATED = """\
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from shardfix import autofix_shardings
mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
def g(x):
    return jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, P(None, "tp")))
f = autofix_shardings(g, in_shardings=P("tp"), mesh=mesh, policy="drop")
print(float(f(np.ones((6, 2), np.float32)).sum()))
"""


def test_every_location_of_a_warning_is_written_one_way(tmp_path):
    """Run by a relative path, the header and every entry name the file as Python does (relative); run by an
    absolute one, all are absolute."""
    (tmp_path / "model.py").write_text(LOCATED)
    for path in ("model.py", str(tmp_path / "model.py")):
        done = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({path!r})"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        header, *entries = [line for line in done.stderr.splitlines() if "model.py:" in line]
        assert header.startswith(f"{path}:8: ShardingFixWarning: shardfix changed 2 sharding(s) of g:")
        assert [e.split(": ", 1)[0].strip() for e in entries] == [f"{path}:5", f"{path}:6"], done.stderr


def test_the_shardfix_logger_says_each_pass_and_why_a_ring_was_left_alone(caplog):
    source = open(os.path.join(ROOT, "test", "lit", "ring-reorder", "modes-and-idempotence.mlir"), "rb").read()
    with caplog.at_level(logging.DEBUG, logger="shardfix"):
        code = OptMain(stdout=io.StringIO(), stderr=io.StringIO(), stdin=io.BytesIO(source)).run(
            ["-", "-p", "fix-shardings,ring-reorder{strategy=zigzag}"])
    assert code == 0
    assert [type(h) for h in logging.getLogger("shardfix").handlers] == [logging.NullHandler]
    records = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "shardfix"]
    info = [m for level, m in records if level == "INFO"]
    assert info[0].startswith("fix-shardings: ") and info[0].endswith(
        " ms, 0 sharding(s) changed, 0 of 0 ring(s) reordered, 0 remark(s)")
    assert info[1].startswith("ring-reorder: ") and info[1].endswith(
        " ms, 0 sharding(s) changed, 1 of 2 ring(s) reordered, 0 remark(s)")
    [debug] = [m for level, m in records if level == "DEBUG"]
    assert debug.startswith("ring-reorder: <stdin>:") and "ring on axis 'cp' (zigzag) left alone: not provably " \
        "safe: 'stablehlo.convert'" in debug


def test_the_version_is_the_package_metadata():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["version"]
    assert shardfix.__version__ == importlib.metadata.version("shardfix") == declared
    out = io.StringIO()
    assert OptMain(stdout=out).run(["--version"]) == 0 and out.getvalue().startswith(f"shardfix-opt {declared} (")
