"""Dependencies point one way: pure core <- MLIR glue (ir/) <- ring analysis (ring/) <- passes <- pipeline <- {JAX
integration (jit/), command line}. Read from every module's source (its imports at any depth, those only for type
checkers aside), and checked on a fresh interpreter."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"shardfix": ROOT / "python" / "shardfix", "shardfix.passes": ROOT / "passes"}
TOP = {"shardfix", "shardfix.opt", "shardfix.opt_args", "shardfix.run", "shardfix._startup", "shardfix.watchdog", "shardfix.output",
       "shardfix.expectations"}  # the package's entry and the command line's own modules


def layer(module: str) -> int:
    for prefix, rank in (("shardfix.jit", 5), ("shardfix.pipeline", 4), ("shardfix.passes", 3),
                         ("shardfix.ring", 2), ("shardfix.ir", 1)):
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return 5 if module in TOP else 0


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if package == "shardfix" and parts[0] == "passes":
                continue
            name = ".".join((package,) + parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The shardfix modules `name` imports, wherever in its source (a lazy import is a dependency too)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(node) for stmt in ast.walk(tree) if isinstance(stmt, ast.If) and
                   "TYPE_CHECKING" in ast.unparse(stmt.test) for body in stmt.body for node in ast.walk(body)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycle_in(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state and (found := visit(module)) is not None:
            return found
    return None


def test_the_walk_sees_the_package():
    edges = graph()
    assert {"shardfix.sharding", "shardfix.ir.loader", "shardfix.ring.detect", "shardfix.passes.fix_shardings",
            "shardfix.pipeline", "shardfix.jit._jax", "shardfix.opt"} <= set(edges)
    assert "shardfix.sharding" in edges["shardfix.ir.attrs"]  # `from ..sharding import ...`
    assert "shardfix.ir.context" in edges["shardfix.ir"]  # `from .context import ...` in a package's __init__
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    assert cycle_in(graph()) is None


def test_imports_follow_the_layers():
    against = [f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
               for module, targets in graph().items() for target in targets if layer(target) > layer(module)]
    assert against == []


def test_ir_passes_and_pipeline_load_nothing_of_the_jax_layer():
    code = ("import sys\nimport shardfix.ir, shardfix.ir.loader, shardfix.passes, shardfix.pipeline\n"
            "from shardfix import passes\n[passes.lookup(name) for name in passes.pass_names()]\n"
            "shardfix.ir.make_context()\n"
            "print(sorted(m for m in sys.modules if m.startswith('shardfix.jit')))\n")
    environment = {k: v for k, v in os.environ.items() if k != "SHARDFIX"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environment)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_the_readme_layout_names_what_the_tree_holds():
    # one line per module group: each path it names exists, and every top-level module of python/shardfix/ is named
    # on a line of its own or listed as the pure core
    layout = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    block = layout.split("```\n", 2)[1]
    named = set()
    for line in block.splitlines():
        head, _, rest = line.split()[0].partition("{")
        inner, _, tail = rest.partition("}")
        for path in [head + part + ("" if part.endswith((".py", ".pyi")) else tail) for part in inner.split(",")] \
                if rest else [head]:
            if "*" not in path:
                assert (ROOT / path).exists(), line
                named.add(Path(path).name)
    core = re.search(r"not\s+named on a later line \(([^)]*)\)", layout)[1]
    core = {name.strip() + ".py" for name in core.split(",")}
    assert all((ROOT / "python" / "shardfix" / name).exists() for name in core)
    assert {m.name for m in (ROOT / "python" / "shardfix").glob("*.py*")} <= named | core
