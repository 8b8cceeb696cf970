"""What type checkers see: mypy and pyright read shardfix's real signatures (python/shardfix/__init__.pyi) in the
installed package, reject a wrong policy / on_fix / ring_reorder, and type a decorated function as jax.jit types
its functions; the stub says what the run-time functions take; `inspect.signature` shows readable defaults."""

import ast
import inspect
import os
import subprocess
import sys

import shardfix

STUB = os.path.join(os.path.dirname(shardfix.__file__), "__init__.pyi")

USER = '''\
import jax
import jax.numpy as jnp
from typing import reveal_type

import shardfix
from shardfix import autofix_shardings


@autofix_shardings
def bare(x: jax.Array) -> jax.Array:
    return x * 2


@autofix_shardings(policy="drop", on_fix="log", ring_reorder="off", static_argnums=(1,))
def configured(x: jax.Array, n: int) -> jax.Array:
    return x + n


same_as_jit: jax.stages.Wrapped = bare
reveal_type(bare)
reveal_type(configured)
lowered = bare.lower(jnp.ones(2))
with shardfix.enabled(policy="subaxis"):
    pass
version: str = shardfix.__version__


@autofix_shardings(policy="bogus")  # wrong
def wrong_policy(x: jax.Array) -> jax.Array: return x


@autofix_shardings(on_fix="warning")  # wrong
def wrong_on_fix(x: jax.Array) -> jax.Array: return x


@autofix_shardings(ring_reorder=3)  # wrong
def wrong_ring(x: jax.Array) -> jax.Array: return x


shardfix.enable(policy="sometimes")  # wrong
'''
WRONG_LINES = [n for n, line in enumerate(USER.splitlines(), 1) if line.endswith("# wrong")]


def test_mypy_and_pyright_check_a_users_script(tmp_path):
    (tmp_path / "user.py").write_text(USER)
    # Both at once (each takes a while to read JAX), from a directory without configuration of its own.
    mypy = subprocess.Popen([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull,
                             "--no-error-summary", "--hide-error-context", "--python-executable", sys.executable,
                             "user.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pyright = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "pyright"), "--pythonpath",
                                sys.executable, "user.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    mypy_out, pyright_out = mypy.communicate(timeout=300)[0], pyright.communicate(timeout=300)[0]

    errors = [line for line in mypy_out.splitlines() if ": error: " in line]
    assert [int(line.split(":")[1]) for line in errors] == WRONG_LINES, mypy_out
    assert 'user.py:20: note: Revealed type is "jax._src.stages.Wrapped"' in mypy_out
    assert 'user.py:21: note: Revealed type is "jax._src.stages.Wrapped"' in mypy_out
    assert errors[-1].endswith('error: Argument "policy" to "enable" has incompatible type "Literal[\'sometimes\']"; '
                               'expected "Literal[\'auto\', \'subaxis\', \'prefix\', \'drop\']"  [arg-type]')

    errors = [line.strip() for line in pyright_out.splitlines() if " - error: " in line]
    assert [int(line.split(":")[1]) for line in errors] == WRONG_LINES, pyright_out
    assert 'Literal[\'bogus\']" cannot be assigned to parameter "policy"' in errors[0]
    assert 'Literal[\'warning\']" cannot be assigned to parameter "on_fix"' in errors[1]
    assert '"Literal[3]" cannot be assigned to parameter "ring_reorder"' in errors[2]
    assert 'user.py:20:13 - information: Type of "bare" is "Wrapped"' in pyright_out
    assert 'user.py:21:13 - information: Type of "configured" is "Wrapped"' in pyright_out


def _stub_functions() -> dict[str, ast.FunctionDef]:
    """The stub's functions; of an overloaded one, the first overload (the one with a function)."""
    tree = ast.parse(open(STUB).read())
    functions: dict[str, ast.FunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions.setdefault(node.name, node)
    return functions


def test_the_stub_declares_every_public_name_as_the_run_time_takes_it():
    functions = _stub_functions()
    tree = ast.parse(open(STUB).read())
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    assert set(shardfix.__all__) - {"__version__"} == set(functions) | classes
    for name in classes:
        assert issubclass(getattr(shardfix, name), Warning if name.endswith("Warning") else Exception)
    for name, node in functions.items():
        runtime = inspect.signature(getattr(shardfix, name))
        args = node.args
        stub_params = [(a.arg, "POSITIONAL_OR_KEYWORD") for a in args.args]
        stub_params += [(a.arg, "KEYWORD_ONLY") for a in args.kwonlyargs]
        assert stub_params == [(p.name, p.kind.name) for p in runtime.parameters.values()], name
        defaults = dict(zip([a.arg for a in args.args][len(args.args) - len(args.defaults):], args.defaults))
        defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
        for param, default in defaults.items():
            if not (isinstance(default, ast.Constant) and default.value is Ellipsis):
                assert ast.literal_eval(default) == runtime.parameters[param].default, (name, param)


def test_signatures_show_readable_defaults():
    text = str(inspect.signature(shardfix.autofix_shardings))
    assert "object at" not in text
    assert text.startswith("(fun: 'Callable | None' = None, *, in_shardings=UNSPECIFIED, out_shardings=UNSPECIFIED, "
                           "static_argnums=NOT_GIVEN, ")
    assert text.endswith("policy: 'str' = 'auto', ring_reorder: 'str' = 'auto', on_fix: 'str' = 'warn')")
