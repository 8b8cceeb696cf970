"""The package as users get it: the pure core imports neither JAX nor MLIR, top-level names load lazily, and the
wheel carries every subpackage, the typing marker, the license and metadata that admit the installed JAX.
The sdist builds, installs and carries the test suites whole. (`make test-install` installs the sdist and the wheel
each into a fresh environment that has the newest JAX.)"""

import os
import re
import subprocess
import sys
import tarfile
import zipfile

import jax
import jaxlib
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PURE = ["shardfix", "shardfix.sharding", "shardfix.sdy_syntax", "shardfix.correct", "shardfix.report",
        "shardfix.locations", "shardfix.passes"]


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "SHARDFIX"}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environment)


def test_pure_modules_import_neither_jax_nor_mlir():
    code = (f"import sys\nfor name in {PURE!r}: __import__(name)\n"
            "import shardfix\nshardfix.__version__, dir(shardfix)\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'mlir'))\n"
            "print(loaded)\n"
            "shardfix.enable\n"
            "print('jax' in sys.modules)\n")
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "True"]  # nothing before the first public JAX-facing name


def test_lazy_exports():
    import shardfix
    for name in shardfix.__all__:
        assert name in dir(shardfix) and getattr(shardfix, name) is not None
    for name in ("autofix_shardings", "enable", "disable", "enabled", "is_enabled", "ShardingFixWarning"):
        assert name in shardfix.__all__
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        shardfix.nothing_here  # noqa: B018


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def _admits(requirement: str, version: str) -> bool:
    """Whether a requirement made of `>=` and `<` bounds (the only kinds shardfix uses) admits `version`."""
    low, high = re.search(r">=([\d.]+)", requirement)[1], re.search(r"<([\d.]+)", requirement)[1]
    return _version(low) <= _version(version) < _version(high)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """`python -m build`: the sdist, then the wheel built from the unpacked sdist, as pip builds it when it installs
    the sdist (the wheel's shardfix.pth and stub come from the sdist's files)."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), ROOT], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [wheel] = [out / n for n in os.listdir(out) if n.endswith(".whl")]
    [sdist] = [out / n for n in os.listdir(out) if n.endswith(".tar.gz")]
    return wheel, sdist


@pytest.fixture(scope="module")
def wheel(dist):
    return zipfile.ZipFile(dist[0])


def test_the_sdist_holds_the_build_inputs_and_the_test_suites_whole(dist):
    with tarfile.open(dist[1]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"pyproject.toml", "setup.py", "MANIFEST.in", "LICENSE", "README.md", "python/shardfix.pth",
            "python/shardfix/__init__.pyi", "python/shardfix/py.typed", "passes/__init__.py", "Makefile",
            "requirements.txt", "requirements-oldest.txt", "tools/opt", "test/lit/lit.cfg.py"} <= names
    tracked = subprocess.run(["git", "ls-files", "tests", "test/lit", "examples"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    if tracked:  # in a git checkout: every tracked test file, support module and data file ships
        assert set(tracked) <= names, sorted(set(tracked) - names)[:10]
    assert {"tests/conftest.py", "tests/support/__init__.py"} <= names
    assert not any("__pycache__" in n or "/Output/" in n or ".hypothesis" in n for n in names)


def test_wheel_contents_and_metadata(wheel):
    files = set(wheel.namelist())
    packages = {os.path.relpath(d, os.path.join(ROOT, "python")).replace(os.sep, "/")
                for d, _, names in os.walk(os.path.join(ROOT, "python", "shardfix")) if "__init__.py" in names}
    packages.add("shardfix/passes")
    for package in packages:
        assert f"{package}/__init__.py" in files, f"{package} is not in the wheel"
    assert {"shardfix/py.typed", "shardfix/__init__.pyi", "shardfix/run.py", "shardfix.pth"} <= files
    assert not any(f.startswith(("tests/", "support/")) for f in files)
    [metadata] = [n for n in files if n.endswith(".dist-info/METADATA")]
    meta = wheel.read(metadata).decode()
    headers = [line.split(": ", 1) for line in meta.splitlines() if ": " in line]
    requires = {re.match(r"[\w.-]+", value)[0]: value for key, value in headers
                if key == "Requires-Dist" and "extra ==" not in value}
    assert _admits(requires["jax"], jax.__version__) and _admits(requires["jaxlib"], jaxlib.__version__)
    assert _admits(requires["jax"], "0.10.2") and _admits(requires["jax"], "0.12.0.1")
    assert ("Requires-Python", ">=3.11") in [tuple(h) for h in headers]
    assert ("License-Expression", "Apache-2.0") in [tuple(h) for h in headers]
    classifiers = {value for key, value in headers if key == "Classifier"}
    assert {f"Programming Language :: Python :: 3.{minor}" for minor in (11, 12, 13)} <= classifiers
    assert any(n.endswith("licenses/LICENSE") for n in files)
    entry_points = wheel.read(metadata.replace("METADATA", "entry_points.txt")).decode()
    assert "shardfix-opt = shardfix.opt:main" in entry_points
