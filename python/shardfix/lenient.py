"""What a lenient load changes in a module's text so that MLIR's verifier accepts it whatever its shardings say, and
what it puts back once the module is parsed (shardfix.ir.loader).

Read as MLIR tokens, in sdy's custom syntax and in MLIR's generic form alike:
  - a sharding in an attribute dictionary (`sdy.sharding = ...`, and sdy's propagation edges) keeps its place: only
    its key is renamed, to one of the same length that no dialect verifies, and renamed back after the parse;
  - the shardings that are sdy ops' own are verified with the op, so each gets a placeholder the verifier takes (a
    single-device sharding for a sharding constraint or a reshard; none for a data-flow edge or a named
    computation, where they are optional; for a manual computation, shardings with just the manual axes its body's
    local shapes need), and the original is written beside it as a discardable attribute (MLIR parses it, aliases
    and all, without verifying it) that is moved into place after the parse;
  - what an sdy collective checks stays as written: its own sharding, and the shardings of the values it reads and
    defines (found by SSA name), which it reads from their ops.
Every change keeps the lines of the text after it, and its columns where the change is no longer than the text it
replaces, so the module's locations are the original's. Pure: imports neither MLIR nor JAX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import mlir_text as mt
from .manual import placeholder_parts
from .sdy_syntax import Cursor, read_manual_axes, read_mesh, read_symbol, read_tensor_sharding_body
from .sharding import COLLECTIVES, DimSharding, Mesh, ShardingPerValue, ShardingSyntaxError, TensorSharding

KEYS = frozenset({"sdy.sharding", "sdy.propagation_edges", "sdy.block_arg_propagation_edges",
                  "sdy.result_propagation_edges"})
SINGLE_DEVICE = "<mesh<[], device_ids=[0]>, []>"  # a sharding the verifier takes on any value
REPAIRED = "repaired"  # plan(freeze=REPAIRED): see plan()
INHERENT = "inherent."  # after the prefix: the name of a held original (`<prefix>.inherent.sharding = ...`)
_OPS = ("sdy.sharding_constraint", "sdy.reshard", "sdy.data_flow_edge", "sdy.named_computation",
        "sdy.manual_computation")
# Each inherent sharding attribute, as the text around its value in sdy's syntax makes the attribute.
WRAP = {"sharding": ("#sdy.sharding", ""), "in_shardings": ("#sdy.sharding_per_value<", ">"),
        "out_shardings": ("#sdy.sharding_per_value<", ">"), "manual_axes": ("#sdy<manual_axes", ">")}


def wrap(key: str, value: str) -> str:
    return WRAP[key][0] + value + WRAP[key][1]


@dataclass
class Plan:
    text: str  # the text to parse
    prefix: str  # `sdy` renamed: `<prefix>.sharding`; held originals: `<prefix>.inherent.<name>`
    changes: int = 0  # renamed keys and held originals: what the parsed module must give back
    frozen_lines: set[int] = field(default_factory=set)  # lines of shardings kept as written for a collective


_MESH = re.compile(r'mesh(?: @([\w$.-]+) = <\[([^\]]*)\]|(<))')  # `sdy.mesh @m = <[...]`, or an inline `mesh<`
_SHARDING = re.compile(r'<@([\w$.-]+), \[([^\]]*)\]([^>]*)>')
_NAME = re.compile(r'"([^"]*)"')


def looks_valid(text: str) -> bool:
    """A quick look (regular expressions over the text) at what the sdy verifier most often rejects: every sharding
    written as MLIR prints it, on a mesh the text defines, naming only that mesh's axes, each once, no sub-axes.
    It only orders the attempts to load (a module whose strict parse fails is loaded leniently all the same)."""
    meshes = {}
    for name, axes, inline in _MESH.findall(text):  # one scan for both (a scan of 10 MiB costs milliseconds)
        if inline:  # an inline mesh: not looked at here
            return False
        if name:
            meshes[name] = set(_NAME.findall(axes))
    for mesh, dims, rest in set(_SHARDING.findall(text)):
        names = _NAME.findall(dims + rest)
        if mesh not in meshes or not meshes[mesh].issuperset(names) or len(set(names)) != len(names) or \
                ":(" in dims + rest:
            return False
    return True


def quick_plan(text: str) -> Plan | None:
    """The keys renamed where they are written as MLIR prints them (`{sdy.sharding = ` or `, sdy.sharding = `), at
    the speed of str.replace: the plan for a module whose sdy ops verify as they are (the parse says whether they
    do, and the module gives back as many keys as were renamed only if each was one). None where an sdy collective
    may read a renamed sharding."""
    if any(name in text for name in COLLECTIVES):
        return None
    found = Plan(text, _prefix(text))
    for key in KEYS if "propagation_edges" in text else ("sdy.sharding",):
        for before in ("{", ", "):
            written = f"{before}{key} = "
            found.changes += found.text.count(written)
            found.text = found.text.replace(written, f"{before}{found.prefix}{key[3:]} = ")
    return found


def plan(text: str, freeze: bool | str = True) -> Plan | None:
    """The text to parse instead of `text`, or None when it doesn't lex as MLIR. `freeze`: what an sdy collective
    checks stays as written; False: it is held aside like the rest (the collective then verifies against no
    sharding on its operand, and after a repair against the repaired one); REPAIRED: a sharding in an attribute
    dictionary that a collective reads is held aside, the collective verifying meanwhile against it without the
    axes its mesh lacks (an all_gather of "y" from {"y", "zz"})."""
    tokens = mt.tokenize(text)
    if any(t.kind == mt.ERROR for t in tokens):
        return None
    prefix = _prefix(text)
    scan = _Scan(text, tokens, prefix, freeze)
    scan.run()
    edits = sorted(scan.edits, key=lambda e: (e[0], e[1]))
    pieces, pos = [], 0
    for start, end, replacement in edits:
        original = text[start:end]
        lines = original.count("\n")
        pieces += [text[pos:start], replacement + (" " * (len(original) - len(replacement)) if not lines else
                                                   "\n" * lines + " " * (len(original) - original.rfind("\n") - 1))]
        pos = end
    return Plan("".join(pieces) + text[pos:], prefix, scan.changes, scan.frozen_lines)


def _prefix(text: str) -> str:
    """What `sdy` becomes in a renamed key: three letters that the text doesn't hold before a dot."""
    return next(p for p in (f"sd{c}" for c in "_0123456789abcdefgh") if p + "." not in text)


class _Scan:
    """One walk over the tokens, collecting the edits."""

    def __init__(self, text: str, tokens: list[mt.Token], prefix: str, freeze: bool | str = True):
        self.text, self.tokens, self.prefix = text, tokens, prefix
        self.words = [text[t.start:t.end] for t in tokens]
        self.partner = mt.match_brackets(text, tokens)
        self.edits: list[tuple[int, int, str]] = []
        self.changes = 0
        self.frozen_lines: set[int] = set()
        self.meshes: dict[str, Mesh] = {}
        self.aliases: dict[str, int] = {}  # `#name` -> the token its value starts at
        self.manual: list[tuple[int, frozenset[str]]] = []  # (body's last token, manual axes) around the scan
        self.function, self.function_token, self.results = 0, -1, ()
        self.freeze = freeze
        self.frozen = self._collective_names() if freeze else set()

    # -- tokens ----------------------------------------------------------------------------------------------------

    def end(self, i: int) -> int:
        """The token closing the bracket at `i` (`i` itself for one that opens nothing)."""
        return self.partner[i] if i < len(self.tokens) and self.partner[i] > i else i

    def at(self, i: int, word: str) -> bool:
        return i < len(self.words) and self.words[i] == word and self.tokens[i].kind != mt.STRING

    def span(self, first: int, last: int) -> str:
        """Tokens first..last on one line: a gap holding a line break or a comment becomes one space."""
        out = [self.words[first]]
        for k in range(first + 1, last + 1):
            gap = self.text[self.tokens[k - 1].end:self.tokens[k].start]
            out += [" " if "\n" in gap or "/" in gap else gap, self.words[k]]
        return "".join(out)

    def walk(self):
        """Each token's index, with the bracket stack around it (the tokens of the open brackets)."""
        stack: list[int] = []
        for i, token in enumerate(self.tokens):
            if token.kind == mt.PUNCT and self.partner[i] >= 0:
                if self.partner[i] > i:
                    stack.append(i)
                elif stack and stack[-1] == self.partner[i]:
                    stack.pop()
                continue
            if self.words[i] in ("func.func", '"func.func"'):
                self.function, self.function_token = self.function + 1, i
            yield i, stack

    def result_list(self, i: int, stack: list[int]) -> tuple[tuple[str, ...], int] | None:
        """`%a, %b:2 =` from token `i` (an op's results): their names and the token of `=`."""
        if (stack and self.words[stack[-1]] != "{") or (i and self.words[i - 1] in (",", "(")):
            return None
        names, n = [], len(self.tokens)
        while i < n and self.tokens[i].kind == mt.VALUE:
            names.append(self.words[i])
            i += 3 if self.at(i + 1, ":") and i + 2 < n and self.tokens[i + 2].kind == mt.INTEGER else 1
            if not self.at(i, ","):
                break
            i += 1
        return (tuple(names), i) if names and self.at(i, "=") else None

    def _collective_names(self) -> set[tuple[int, str]]:
        """(function, SSA name) of every value an sdy collective reads or defines."""
        names = set()
        for i, stack in self.walk():
            found = self.tokens[i].kind == mt.VALUE and self.result_list(i, stack)
            op = found[1] + 1 if found else -1
            if not found or op >= len(self.words) or self.words[op].strip('"') not in COLLECTIVES:
                continue
            names.update((self.function, r) for r in found[0])
            j = op + 1 + (self.words[op][0] == '"')  # the generic form's operands are in brackets
            while j < len(self.words) and self.tokens[j].kind != mt.VALUE and self.words[j] not in (":", ")"):
                j = self.end(j) + 1
            if j < len(self.words) and self.tokens[j].kind == mt.VALUE:
                names.add((self.function, self.words[j].split("#")[0]))
        self.function = 0
        return names

    def frozen_by_collective(self, names, i: int) -> bool:
        if not any((self.function, n) in self.frozen for n in names):
            return False
        self.frozen_lines.update(mt.line_col(self.text, self.tokens[k].start)[0] for k in (i, self.function_token)
                                 if k >= 0)
        return True

    # -- the walk ----------------------------------------------------------------------------------------------------

    def run(self) -> None:
        for i, stack in self.walk():
            while self.manual and i > self.manual[-1][0]:
                self.manual.pop()
            kind, word = self.tokens[i].kind, self.words[i]
            if kind == mt.HASH and not stack and self.at(i + 1, "="):
                self.aliases[word] = i + 2
            elif kind == mt.VALUE and (found := self.result_list(i, stack)):
                self.results = found[0]
                if found[1] + 1 < len(self.words) and self.words[found[1] + 1].strip('"') in _OPS:
                    try:
                        self.op(found[1] + 1, self.words[found[1] + 1])
                    except (ShardingSyntaxError, IndexError, KeyError):
                        pass  # not in the syntax expected: left as written, for MLIR's own error
            elif word in ("sdy.mesh", '"sdy.mesh"'):
                self.mesh(i)
            elif word.strip('"') in KEYS and kind in (mt.IDENT, mt.STRING) and self.at(i + 1, "=") and stack and \
                    self.words[stack[-1]] == "{" and not self.at(stack[-1] - 1, "="):  # not a dictionary in a value
                renamed = word.replace("sdy", self.prefix, 1)
                if not self.frozen_by_collective(self.owner(stack), i):
                    self.edits.append((self.tokens[i].start, self.tokens[i].end, renamed))
                    self.changes += 1
                elif self.freeze == REPAIRED and word.strip('"') == "sdy.sharding" and \
                        (known := self.known_axes_only(i + 2)) is not None:
                    # the collective verifies against the sharding without the axes its mesh lacks while the
                    # original is held aside under the renamed key, which takes its place again after the parse
                    self.edits.append((self.tokens[i].start, self.tokens[i].end, f"{word} = {known}, {renamed}"))
                    self.changes += 1

    def known_axes_only(self, i: int, bare: bool = False) -> str | None:
        """The sharding attribute at token `i` with every axis its mesh lacks left out, or None where it names none
        (or isn't one this reads); `bare`: an sdy op's `<@mesh, [...]>`, given back in that form (as is a
        `#sdy.sharding`'s when the attribute is written whole: what a placeholder of an sdy op's takes)."""
        try:
            c = self.cursor(i)
            per_value = not bare and c.accept("#sdy.sharding_per_value")
            if per_value:
                c.expect("<")
                c.expect("[")
            elif not bare:
                c.expect("#sdy.sharding")
            shardings = tuple(c.separated("]", lambda: read_tensor_sharding_body(c))) if per_value else \
                (read_tensor_sharding_body(c),)
        except (ShardingSyntaxError, IndexError):
            return None
        if any(not isinstance(t.mesh, str) or t.mesh not in self.meshes for t in shardings):
            return None
        names = lambda t: set(self.meshes[t.mesh].axis_names)  # noqa: E731
        known = lambda refs, t: tuple(a for a in refs if a.name in names(t))  # noqa: E731
        kept = tuple(TensorSharding(t.mesh, tuple(DimSharding(known(d.axes, t), d.is_closed, d.priority)
                                                  for d in t.dims), known(t.replicated, t), known(t.unreduced, t))
                     for t in shardings)
        if kept == shardings:
            return None
        return str(ShardingPerValue(kept)) if per_value else kept[0].body() if bare else str(kept[0])

    def owner(self, stack: list[int]) -> tuple[str, ...]:
        """The SSA names a dictionary's entries describe: the argument before it in a signature, else the results
        of the op being read."""
        if len(stack) < 2 or self.words[stack[-2]] != "(":
            return self.results
        i = stack[-1] - 1
        while i > stack[-2] and self.tokens[i].kind != mt.VALUE and self.words[i] != ",":
            i = self.partner[i] - 1 if 0 <= self.partner[i] < i else i - 1
        return (self.words[i],) if i > stack[-2] and self.tokens[i].kind == mt.VALUE else ()

    def mesh(self, i: int) -> None:
        """`sdy.mesh @name = <...>`, or `"sdy.mesh"() <{mesh = ..., sym_name = "name"}>` (the mesh maybe an alias)."""
        try:
            if self.words[i][0] != '"':
                c = Cursor(self.text, self.tokens, i + 1)
                name = read_symbol(c)
                c.expect("=")
                self.meshes[name] = read_mesh(c)
                return
            entries = self.entries(self.end(i + 1) + 2) if self.at(self.end(i + 1) + 1, "<") else {}
            if "mesh" in entries and "sym_name" in entries:
                c = self.cursor(entries["mesh"][1])
                c.accept("#sdy.mesh")
                self.meshes[mt.unquote(self.words[entries["sym_name"][1]])] = read_mesh(c)
        except (ShardingSyntaxError, IndexError):
            pass

    def cursor(self, i: int) -> Cursor:
        """A cursor at the attribute value starting at token `i`, through an alias to what it stands for."""
        return Cursor(self.text, self.tokens, self.aliases.get(self.words[i], i))

    def entries(self, open_: int) -> dict[str, tuple[int, int, int]]:
        """A dictionary's entries: name -> (its token, its value's first and last token)."""
        found, i, close = {}, open_ + 1, self.end(open_)
        while i < close and self.at(i + 1, "="):
            last = self.end(i + 2)
            while last + 1 < close and not self.at(last + 1, ","):
                last = self.end(last + 1)
            found[self.words[i].strip('"')] = (i, i + 2, last)
            i = last + 2
        return found

    # -- sdy's own ops -------------------------------------------------------------------------------------------------

    def op(self, i: int, name: str) -> None:
        """Placeholders for the shardings of the op named at token `i`, the originals held beside them."""
        generic, name = name[0] == '"', name.strip('"')
        held: dict[str, tuple] = {}  # name -> tokens of its key, its value's first and last, its dictionary
        block = body = attrs = None  # tokens: `(` of the block's arguments, `{` of the body, `{` of the attributes
        if generic:  # "name"(operands) <{properties}> ({regions}) {attributes} : type
            after, dictionaries = self.end(i + 1), []
            if self.at(after + 1, "<"):
                dictionaries.append(after + 2)
                after = self.end(after + 1)
            if self.at(after + 1, "("):
                body, after = after + 2, self.end(after + 1)
                block = body + 2 if self.words[body + 1].startswith("^") else None
            if self.at(after + 1, "{"):
                attrs = after + 1
                dictionaries.append(attrs)
            for d in dictionaries:
                held.update({k: v + (d,) for k, v in self.entries(d).items() if k in WRAP})
        else:  # sdy's syntax: the sharding or keywords, then a body's block arguments and the body
            j = i + 2 if name in ("sdy.sharding_constraint", "sdy.reshard", "sdy.data_flow_edge") else \
                self.end(self.end(i + 1) + 1) + 1 if name == "sdy.named_computation" else self.end(i + 1) + 1
            if name != "sdy.data_flow_edge" and self.at(j, "<"):
                held["sharding"] = (j, j, self.end(j), None)
            while self.words[j] in WRAP and self.at(j + 1, "="):
                held[self.words[j]] = (j, j + 2, self.end(j + 2), None)
                j = self.end(j + 2) + 1
            if name in ("sdy.named_computation", "sdy.manual_computation") and self.at(j, "("):
                block, body = j, self.end(j) + 1
            after = self.end(body) if body is not None else max((v[2] for v in held.values()), default=j)
        if not held:
            return
        block_names = tuple(self.words[k] for k in range(block + 1, self.end(block))
                            if self.tokens[k].kind == mt.VALUE) if block is not None else ()
        new: dict[str, str | None] = {k: SINGLE_DEVICE if k == "sharding" and name != "sdy.data_flow_edge" else None
                                      for k in held}  # None: left out while the module is parsed
        if name == "sdy.manual_computation":
            places = self.manual_placeholders(held, generic, block, body, after)
            if places is not None:
                new = dict(zip(("in_shardings", "out_shardings", "manual_axes"), places))
            axes = places[3] if places is not None else \
                read_manual_axes(self.cursor(held["manual_axes"][1])) if "manual_axes" in held else ()
            self.manual.append((self.end(body) if body is not None else i, frozenset(axes)))
            if places is None:
                return
        if self.frozen_by_collective(self.results + block_names, i):
            # (a sharding_constraint's or reshard's sharding: in the last plan, what the collective verifies against
            # while the original is held aside is that sharding without the axes its mesh lacks)
            known = self.known_axes_only(held["sharding"][1], bare=not generic) \
                if self.freeze == REPAIRED and set(held) == {"sharding"} else None
            if known is None:
                return
            new = {"sharding": known.removeprefix(WRAP["sharding"][0])}  # the placeholder's text wraps a body
        if generic and any(not self.cursor(first).at(WRAP[k][0].split("<")[0]) for k, (_, first, _, _) in
                           held.items()):
            return  # not the attribute the op takes there: MLIR's own error says so
        originals = [f"{self.prefix}.{INHERENT}{k} = " + (self.span(first, last) if generic else
                                                          wrap(k, self.span(first, last)))
                     for k, (_, first, last, _) in held.items()]
        self.changes += len(originals)
        for key, (k, first, last, _) in held.items() if not generic else ():
            self.edits.append((self.tokens[k if new[key] is None else first].start, self.tokens[last].end,
                               new[key] or ""))
        for dictionary in {h[3] for h in held.values()} if generic else ():  # each written again as a whole
            parts = [self.span(k, last) if key not in held else f"{self.words[k]} = {wrap(key, new[key])}"
                     for key, (k, _, last) in self.entries(dictionary).items() if key not in held or new[key]]
            if dictionary == attrs:
                parts, originals = originals + parts, []
            self.edits.append((self.tokens[dictionary].end, self.tokens[self.end(dictionary)].start,
                               ", ".join(parts)))
        if originals and attrs is None and self.at(after + 1, "{"):
            attrs = after + 1
        if originals and attrs is not None:
            at = self.tokens[attrs].end
            self.edits.append((at, at, ", ".join(originals) + ("" if self.at(attrs + 1, "}") else ", ")))
        elif originals:
            at = self.tokens[after].end
            self.edits.append((at, at, " {" + ", ".join(originals) + "}"))

    def manual_placeholders(self, held, generic: bool, block, body, after: int):
        """A manual computation's placeholders (manual.placeholder_parts), or None when none fits its body."""
        if body is None or any(k not in held for k in ("in_shardings", "out_shardings", "manual_axes")):
            return None
        lists = {}
        for key in ("in_shardings", "out_shardings"):
            c = self.cursor(held[key][1])
            if generic:
                c.expect("#sdy.sharding_per_value")
                c.expect("<")
            c.expect("[")
            lists[key] = c.separated("]", lambda: read_tensor_sharding_body(c))
        axes = read_manual_axes(self.cursor(held["manual_axes"][1]))
        local_in = self.types(block + 1, self.end(block)) if block is not None else []
        j = after + 1
        if self.at(j, "{"):
            j = self.end(j) + 1
        if not self.at(j, ":") or not self.at(j + 1, "("):
            return None
        global_in = self.types(j + 2, self.end(j + 1))
        k = self.end(j + 1) + 1
        global_out = [] if not self.at(k, "->") else \
            self.types(k + 2, self.end(k + 1)) if self.at(k + 1, "(") else self.types(k + 1, k + 2)
        types = {"in_shardings": (global_in, local_in), "out_shardings": (global_out, self.returned(body))}
        bound = frozenset().union(*(axes for _, axes in self.manual))  # by the manual computations around it
        return placeholder_parts(lists, axes, bound, types, self.meshes)

    # -- types ---------------------------------------------------------------------------------------------------------

    def types(self, i: int, close: int) -> list[str]:
        """The types of a list from `i` up to `close`, each written `type` or `%name: type loc(...)`: a name and the
        bracket group right after it."""
        found = []
        while i < close:
            i += 2 if self.tokens[i].kind == mt.VALUE and self.at(i + 1, ":") else 0
            last = self.end(i + 1) if self.at(i + 1, "<") and self.tokens[i + 1].start == self.tokens[i].end else i
            found.append(self.text[self.tokens[i].start:self.tokens[last].end])
            i = self.end(last + 2) + 1 if self.at(last + 1, "loc") else last + 1
            if not self.at(i, ","):
                break
            i += 1
        return found

    def returned(self, body: int) -> list[str] | None:
        """The types the last `sdy.return` of a body returns."""
        i, last = body + 1, None
        while i < self.end(body):
            if self.words[i] in ("sdy.return", '"sdy.return"'):
                last = i
            i = self.end(i) + 1 if self.at(i, "{") else i + 1
        if last is None:
            return None
        i = last + 1
        if self.words[last][0] == '"':
            i = self.end(i) + 1 if self.at(i, "(") else i
            return self.types(i + 2, self.end(i + 1)) if self.at(i, ":") and self.at(i + 1, "(") else None
        while self.tokens[i].kind == mt.VALUE or self.at(i, ","):
            i += 1
        return self.types(i + 1, self.end(body)) if self.at(i, ":") else []
