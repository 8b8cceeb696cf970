"""A seeded mutation fuzzer over Shardy's test corpus, for `tools/opt -p fix-shardings`.

    python bench/shardy_mutants.py generate SHARDY_CHECKOUT -n 1200 --seed 1 -o tests/data/shardy_mutants.mlir
    python bench/shardy_mutants.py run tests/data/shardy_mutants.mlir [more files] [--jobs 2] [--timeout 60] [--results]

`generate` takes the valid cases of the corpus that the installed jaxlib loads and gives each mutant one to three
mutations of its shardings, read and rewritten as MLIR tokens: unknown, duplicate and renamed axes, extra and
missing dims, bad sub-axes ((-1)2, (3)2, (2)1, (1)N, overlapping, mergeable, beside the full axis), unordered
replicated axes, priorities on empty dims, unknown meshes, changed mesh sizes, manual axes unknown, duplicated or
out of order, in/out shardings of manual computations missing or surplus, per-value lists of the wrong length or
kind; about half of the mutants are also laid out over several lines (manual computations' shardings and attribute
dictionaries one entry per line). With `--generic` the cases are mutated as MLIR prints them in the generic form
(`"sdy.sharding_constraint"(%0) <{sharding = #sdy.sharding<...>}>`). The same seed gives the same file: `// -----` chunks, each headed by its source
case and mutations.

`run` judges every mutant as bench/shardy_corpus.py judges a corpus case (tests/test_mutants.py does it in CI):
it must come out verifying, or be refused in shardfix's words at a file:line:col; never a crash, hang, traceback
or unverifiable output.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import common  # noqa: F401  (sets XLA_FLAGS first, puts tests/ on the path)
from shardfix import mlir_text as mt
from shardfix.sdy_syntax import Cursor, read_manual_axes, read_mesh, read_symbol, read_tensor_sharding_body
from shardfix.sharding import AxisRef, DimSharding, Mesh, ShardingSyntaxError, TensorSharding
from support.corpus import Pool, judge, load_cases, split_cases

MAX_CASE_CHARS = 3000  # small cases keep the checked-in file small


@dataclass
class Span:
    start: int
    end: int
    value: object  # TensorSharding | Mesh | tuple of manual axes | list of TensorSharding


@dataclass
class Found:
    shardings: list[Span]
    meshes: list[Span]  # sdy.mesh definitions (value: (name, Mesh))
    manual_axes: list[Span]  # the {...} after manual_axes=
    lists: list[Span]  # the [...] after in_shardings= / out_shardings=
    per_value: list[Span]  # #sdy.sharding_per_value<[...]> and #sdy.sharding<...> attribute values


def scan(text: str) -> Found:
    """Where the shardings of a case are, read from its MLIR tokens."""
    tokens = mt.tokenize(text)
    found = Found([], [], [], [], [])
    spelling = lambda i: text[tokens[i].start:tokens[i].end]  # noqa: E731
    for i, token in enumerate(tokens):
        s = spelling(i)
        try:
            if s == "<" and i + 1 < len(tokens) and (tokens[i + 1].kind == mt.SYMBOL or spelling(i + 1) == "mesh"):
                c = Cursor(text, tokens, i)
                value = read_tensor_sharding_body(c)
                found.shardings.append(Span(token.start, tokens[c.pos - 1].end, value))
            elif s == "sdy.mesh" and token.kind == mt.IDENT:
                c = Cursor(text, tokens, i + 1)
                name = read_symbol(c)
                c.expect("=")
                start = c.offset()
                mesh = read_mesh(c)
                found.meshes.append(Span(start, tokens[c.pos - 1].end, (name, mesh)))
            elif s == "manual_axes" and spelling(i + 1) == "=":
                c = Cursor(text, tokens, i + 2)
                axes = read_manual_axes(c)
                found.manual_axes.append(Span(tokens[i + 2].start, tokens[c.pos - 1].end, axes))
            elif s in ("in_shardings", "out_shardings") and spelling(i + 1) == "=" and spelling(i + 2) == "[":
                c = Cursor(text, tokens, i + 3)
                values = c.separated("]", lambda: read_tensor_sharding_body(c))
                found.lists.append(Span(tokens[i + 2].start, tokens[c.pos - 1].end, values))
            elif s in ("#sdy.sharding_per_value", "#sdy.sharding") and spelling(i - 1) == "=":
                c = Cursor(text, tokens, i + 1)
                if s == "#sdy.sharding":
                    value = read_tensor_sharding_body(c)
                else:
                    c.expect("<")
                    c.expect("[")
                    value = c.separated("]", lambda: read_tensor_sharding_body(c))
                    c.expect(">")
                found.per_value.append(Span(token.start, tokens[c.pos - 1].end, (s, value)))
        except (ShardingSyntaxError, IndexError):
            continue
    return found


class Mutator:
    """The mutation operators; each returns (start, end, replacement) edits, or None when it doesn't apply."""

    def __init__(self, text: str, found: Found, rng: random.Random):
        self.text, self.found, self.rng = text, found, rng
        self.meshes = {name: mesh for _, _, (name, mesh) in ((s.start, s.end, s.value) for s in found.meshes)}

    def mesh_of(self, sharding: TensorSharding) -> Mesh | None:
        return sharding.mesh if isinstance(sharding.mesh, Mesh) else self.meshes.get(sharding.mesh)

    def pick_sharding(self, need_axes: bool = False):
        spans = [s for s in self.found.shardings if (self.mesh_of(s.value) is not None and self.mesh_of(s.value).axes)
                 and (not need_axes or s.value.dims)]
        return self.rng.choice(spans) if spans else None

    def edit_sharding(self, change):
        span = self.pick_sharding(need_axes=True)
        if span is None:
            return None
        new = change(span.value, self.mesh_of(span.value))
        return None if new is None else [(span.start, span.end, new.body())]

    def _dim(self, sharding: TensorSharding) -> int:
        return self.rng.randrange(len(sharding.dims))

    def _with_axis(self, sharding: TensorSharding, ref: AxisRef) -> TensorSharding:
        d = self._dim(sharding)
        dims = list(sharding.dims)
        dims[d] = replace(dims[d], axes=dims[d].axes + (ref,))
        return replace(sharding, dims=tuple(dims))

    def _axis(self, mesh: Mesh, even: bool = False) -> tuple[str, int] | None:
        axes = [(n, s) for n, s in mesh.axes if not even or (s % 2 == 0 and s > 2)]
        return self.rng.choice(axes) if axes else None

    def unknown_axis(self):
        return self.edit_sharding(lambda s, m: self._with_axis(s, AxisRef("zz")))

    def duplicate_axis(self):
        return self.edit_sharding(lambda s, m: self._with_axis(s, AxisRef(self._axis(m)[0])))

    def extra_dim(self):
        return self.edit_sharding(lambda s, m: replace(s, dims=s.dims + (DimSharding((AxisRef(self._axis(m)[0]),)),)))

    def missing_dim(self):
        return self.edit_sharding(lambda s, m: replace(s, dims=s.dims[:-1]))

    def _sub_axis(self, pre: int, size_of) -> list | None:
        def change(s, m):
            axis = self._axis(m, even=True)
            return None if axis is None else self._with_axis(s, AxisRef(axis[0], pre, size_of(axis[1])))
        return self.edit_sharding(change)

    def subaxis_negative(self):
        return self._sub_axis(-1, lambda n: 2)

    def subaxis_bad_pre(self):
        return self._sub_axis(3, lambda n: 2)

    def subaxis_size_one(self):
        return self._sub_axis(2, lambda n: 1)

    def subaxis_full(self):
        return self._sub_axis(1, lambda n: n)

    def subaxis_overlap(self):
        def change(s, m):
            axis = self._axis(m, even=True)
            if axis is None:
                return None
            s = self._with_axis(s, AxisRef(axis[0], 1, axis[1] // 2))
            return self._with_axis(s, AxisRef(axis[0], 1, 2))
        return self.edit_sharding(change)

    def subaxis_mergeable(self):
        def change(s, m):
            axis = self._axis(m, even=True)
            if axis is None:
                return None
            d = self._dim(s)
            dims = list(s.dims)
            dims[d] = replace(dims[d], axes=(AxisRef(axis[0], 1, 2), AxisRef(axis[0], 2, 2)))
            return replace(s, dims=tuple(dims))
        return self.edit_sharding(change)

    def subaxis_and_full(self):
        def change(s, m):
            axis = self._axis(m, even=True)
            return None if axis is None else self._with_axis(self._with_axis(s, AxisRef(axis[0])),
                                                             AxisRef(axis[0], 1, 2))
        return self.edit_sharding(change)

    def unordered_replicated(self):
        def change(s, m):
            if len(m.axes) < 2:
                return None
            names = [AxisRef(n) for n, _ in m.axes][::-1]
            return replace(s, dims=tuple(DimSharding((), d.is_closed) for d in s.dims), replicated=tuple(names))
        return self.edit_sharding(change)

    def priority_on_empty(self):
        return self.edit_sharding(lambda s, m: replace(s, dims=(DimSharding((), True, 1),) + s.dims[1:]))

    def unknown_mesh(self):
        return self.edit_sharding(lambda s, m: replace(s, mesh="no_such_mesh"))

    def mesh_size(self):
        spans = [s for s in self.found.meshes if s.value[1].axes and s.value[1].device_ids is None]
        if not spans:
            return None
        span = self.rng.choice(spans)
        name, mesh = span.value
        k = self.rng.randrange(len(mesh.axes))
        axes = list(mesh.axes)
        axes[k] = (axes[k][0], self.rng.choice([n for n in (1, 2, 3, 5, 6, 8) if n != axes[k][1]]))
        return [(span.start, span.end, str(Mesh(tuple(axes))))]

    def _manual_axes(self, change):
        if not self.found.manual_axes:
            return None
        span = self.rng.choice(self.found.manual_axes)
        axes = change(list(span.value))
        if axes is None:
            return None
        text = "{" + ", ".join(mt.quote(a) for a in axes) + "}"
        wrapped = self.text.startswith("#sdy<manual_axes", span.start)  # the generic form's attribute
        return [(span.start, span.end, f"#sdy<manual_axes{text}>" if wrapped else text)]

    def manual_axes_unknown(self):
        return self._manual_axes(lambda axes: axes + ["zz"])

    def manual_axes_duplicate(self):
        return self._manual_axes(lambda axes: axes + axes[:1] if axes else None)

    def manual_axes_unordered(self):
        return self._manual_axes(lambda axes: axes[::-1] if len(axes) > 1 else None)

    def _list(self, change):
        if not self.found.lists:
            return None
        span = self.rng.choice(self.found.lists)
        values = change(list(span.value))
        return None if values is None else [(span.start, span.end, "[" + ", ".join(v.body() for v in values) + "]")]

    def list_missing(self):
        return self._list(lambda values: values[:-1] if values else None)

    def list_surplus(self):
        return self._list(lambda values: values + values[-1:] if values else None)

    def per_value_count(self):
        spans = [s for s in self.found.per_value if s.value[0] == "#sdy.sharding_per_value" and s.value[1]]
        if not spans:
            return None
        span = self.rng.choice(spans)
        values = span.value[1] + span.value[1][-1:]
        return [(span.start, span.end, "#sdy.sharding_per_value<[" + ", ".join(v.body() for v in values) + "]>")]

    def per_value_kind(self):
        if not self.found.per_value:
            return None
        span = self.rng.choice(self.found.per_value)
        kind, value = span.value
        if kind == "#sdy.sharding":
            return [(span.start, span.end, "#sdy.sharding_per_value<[" + value.body() + "]>")]
        return [(span.start, span.end, "#sdy.sharding" + value[0].body())] if value else None

    OPERATORS = ("unknown_axis", "duplicate_axis", "extra_dim", "missing_dim", "subaxis_negative", "subaxis_bad_pre",
                 "subaxis_size_one", "subaxis_full", "subaxis_overlap", "subaxis_mergeable", "subaxis_and_full",
                 "unordered_replicated", "priority_on_empty", "unknown_mesh", "mesh_size", "manual_axes_unknown",
                 "manual_axes_duplicate", "manual_axes_unordered", "list_missing", "list_surplus", "per_value_count",
                 "per_value_kind")


def apply(text: str, edits) -> str:
    out, pos = [], 0
    for start, end, replacement in sorted(edits):
        if start < pos:
            continue  # overlaps an edit already made
        out += [text[pos:start], replacement]
        pos = end
    return "".join(out) + text[pos:]


def multi_line(text: str) -> str:
    """Manual and named computations' sharding lists and manual axes, and attribute dictionaries holding a
    sharding, one entry per line (as hand-written modules often are)."""
    tokens = mt.tokenize(text)
    spelling = lambda i: text[tokens[i].start:tokens[i].end]  # noqa: E731
    partner = mt.match_brackets(text, tokens)
    edits = []
    for i, token in enumerate(tokens):
        s = spelling(i)
        if s in ("in_shardings", "out_shardings", "manual_axes") and spelling(i - 1) not in ("{", ","):
            edits.append((token.start, token.start, "\n      "))
        elif s in ("sdy.sharding", "sdy.sharding_per_value") and spelling(i - 1) in ("{", ","):
            edits.append((token.start, token.start, "\n        "))
        elif s == "[" and i >= 2 and spelling(i - 2) in ("in_shardings", "out_shardings") and partner[i] > i:
            j = i + 1
            while j < partner[i]:  # after each comma between the list's entries
                if spelling(j) == ",":
                    edits.append((tokens[j].end, tokens[j].end, "\n         "))
                j = partner[j] + 1 if partner[j] > j else j + 1
    return apply(text, edits)


def generate(root: Path, count: int, seed: int, generic: bool = False) -> str:
    from shardfix.ir import LoadError, make_context, parse_module
    ctx = make_context(allow_unregistered=True)
    sources = []
    for case in load_cases(root):
        if case.expects_error or len(case.text.strip()) > MAX_CASE_CHARS:
            continue
        if not scan(case.text).shardings:
            continue
        try:
            module = parse_module(case.text, ctx, case.name)
        except LoadError:
            continue  # the installed jaxlib can't read it: nothing to learn from its mutants
        if generic:  # the case as MLIR prints it in the generic form, shardings as properties
            case = replace(case, text=module.get_asm(print_generic_op_form=True))
        sources.append((case, scan(case.text)))
    rng = random.Random(seed)
    chunks, tally = [], collections.Counter()
    while len(chunks) < count:
        case, found = rng.choice(sources)
        mutator = Mutator(case.text, found, rng)
        names, edits = [], []
        for _ in range(rng.choice((1, 1, 2, 3))):
            name = rng.choice(Mutator.OPERATORS)
            change = getattr(mutator, name)()
            if change:
                names.append(name)
                edits += change
        if not names:
            continue
        text = apply(case.text.strip("\n"), [(a - _leading(case.text), b - _leading(case.text), r)
                                             for a, b, r in edits])
        if rng.random() < 0.5:
            text = multi_line(text)
            names.append("multi_line")
        tally.update(names)
        header = f"// mutant {len(chunks)} of {case.name}: {', '.join(names)}"
        code = [ln for ln in text.split("\n") if ln.strip() and not ln.lstrip().startswith("//")]
        chunks.append(header + "\n" + "\n".join(code) + "\n")
    summary = ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
    form = " --generic" if generic else ""
    head = (f"// {count} mutants of openxla/shardy's valid test cases (Apache License 2.0), generated by\n"
            f"// `python bench/shardy_mutants.py generate SHARDY --seed {seed} -n {count}{form}`. Mutations: "
            f"{summary}.\n")
    return head + "\n// -----\n".join(chunks)


def _leading(text: str) -> int:
    return len(text) - len(text.lstrip("\n"))


SECTION = "## Mutants of Shardy's corpus through fix-shardings"
COLUMNS = ("repaired", "unchanged", "refused", "BAD")


def run(paths: list[Path], jobs: int, timeout: float, results: bool = False) -> int:
    rows, failed = [], False
    for path in paths:
        text = path.read_text()
        cases = split_cases(path.name, text, split=True)
        for case in cases:
            case.expects_error = True  # a mutant may be valid or not: either way, repaired or refused in our words
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="shardfix-mutants-") as work:
            verdicts = judge(cases, Pool(Path(work), jobs, timeout), plain_always=False)
        seconds = time.monotonic() - start
        counts = collections.Counter(v.result.split(":")[0] for v in verdicts)
        print(f"{path}: {len(cases)} mutants in {seconds:.0f} s: "
              + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
        bad = [v for v in verdicts if v.result.startswith("BAD")]
        for v in bad:
            print("BAD", v.case.name, v.result, (v.fix.stderr.strip().splitlines() or [""])[0][:300])
        failed = failed or bool(bad)
        origin = text.splitlines()[1].removeprefix("// ").split("`. Mutations:")[0].lstrip("`") if \
            text.startswith("// ") else path.name
        name = path.name if path.parent.name == "data" else "a fresh set, not checked in"
        rows.append(f"| {name} | `{origin}` | {len(cases)} | "
                    + " | ".join(str(counts[c]) for c in COLUMNS) + f" | {seconds:.0f} |")
    if results:
        from results import replace_section
        table = ["| file | made by | mutants | " + " | ".join(COLUMNS) + " | seconds |",
                 "|---|---|---:|" + "---:|" * (len(COLUMNS) + 1)] + rows
        replace_section(SECTION, f"{SECTION}\n\nCommand: `python bench/shardy_mutants.py run FILE... --results`. "
                                 "Each mutant (one to three mutations of a valid case's shardings, about half laid "
                                 "out over several lines) goes through `-p fix-shardings` in a child with a "
                                 f"{timeout:g} s limit and its output is verified again; *BAD*: a crash, hang, "
                                 "traceback, unverifiable output or a refusal not in shardfix's words. "
                                 "tests/data/shardy_mutants.mlir and tests/data/shardy_mutants_generic.mlir (the "
                                 "cases in MLIR's generic form) run in CI (tests/test_mutants.py).\n\n"
                                 + "\n".join(table) + "\n")
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate")
    g.add_argument("path", type=Path, help="a checkout of openxla/shardy, or a directory of .mlir files")
    g.add_argument("-n", type=int, default=1200)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("-o", type=Path, required=True)
    g.add_argument("--generic", action="store_true", help="mutate the cases as printed in MLIR's generic form")
    r = sub.add_parser("run")
    r.add_argument("files", type=Path, nargs="+")
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--timeout", type=float, default=60.0)
    r.add_argument("--results", action="store_true", help="put the table into bench/RESULTS.md")
    args = ap.parse_args(argv)
    if args.command == "generate":
        from shardy_corpus import corpus_root
        args.o.write_text(generate(corpus_root(args.path), args.n, args.seed, args.generic))
        return 0
    return run(args.files, args.jobs, args.timeout, args.results)


if __name__ == "__main__":
    sys.exit(main())
