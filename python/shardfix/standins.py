"""Stand-ins: module text that MLIR's verifier accepts whatever its shardings say, and the original attributes to
put back once it is parsed.

MLIR's Python bindings verify every module they parse, so a module whose shardings the verifier rejects can't be
loaded as it is. Reading the text as MLIR tokens, this module finds each place a sharding lives and replaces it
by a stand-in that verifies on any value:
  - a `sdy.sharding` (or propagation-edge) entry of an attribute dictionary becomes `<prefix>.<name> = N`, a
    discardable integer naming the original;
  - the sharding of `sdy.sharding_constraint` / `sdy.reshard` becomes a single-device sharding, a data-flow
    edge's and a named computation's shardings are left out, and the op is tagged `{<prefix> = N}`;
  - a manual computation gets in/out shardings holding only the manual axes its body's local shapes need (and
    valid manual axes), and the same tag.
sdy's ops in MLIR's generic form, shardings as properties, get the same (shardfix.standins_generic).
Shardings that sdy collectives check against (a collective's own, and those of the values it reads, found by
SSA name) stay as they are: the collective must go on verifying with them.
Every replacement keeps the lines and, where it can, the columns of the text around it, so the parsed module's
locations are the original's. Pure: imports neither MLIR nor JAX.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import mlir_text as mt
from .correct import rejected_anywhere
from .manual import stand_in_parts
from .sdy_syntax import Cursor, read_manual_axes, read_mesh, read_symbol, read_tensor_sharding_body
from .sharding import Mesh, ShardingSyntaxError, TensorSharding
from .standins_generic import SINGLE_DEVICE, GenericForms
from .token_scan import TokenScan

HELD_KEYS = frozenset({"sdy.sharding", "sdy.propagation_edges", "sdy.block_arg_propagation_edges",
                       "sdy.result_propagation_edges"})
COLLECTIVES = frozenset({"sdy.all_gather", "sdy.all_slice", "sdy.all_to_all", "sdy.collective_permute",
                         "sdy.all_reduce", "sdy.reduce_scatter", "sdy.sharded_to_unreduced",
                         "sdy.replicated_to_unreduced"})


@dataclass
class StandIns:
    text: str  # the module text with stand-ins
    prefix: str  # name of the tag attribute; held dictionary entries are `<prefix>.<original name>`
    held: list[str] = field(default_factory=list)  # original attribute texts, by number
    tagged_ops: dict[int, dict[str, str]] = field(default_factory=dict)  # tag -> {attribute name: held number}
    collective_lines: set[int] = field(default_factory=set)  # lines of shardings kept as written for a collective

    def __bool__(self) -> bool:
        return bool(self.held)


@dataclass
class _Statement:
    results: tuple[str, ...] = ()


def stand_in(text: str) -> StandIns | None:
    """The text with stand-ins (false when nothing in it could be held aside), or None when it doesn't lex as
    MLIR."""
    tokens = mt.tokenize(text)
    if any(t.kind == mt.ERROR for t in tokens):
        return None
    scanner = TokenScan(text, tokens)
    frozen = _collective_names(scanner)
    prefix = "shardfix.held"
    while prefix in text:
        prefix += "_"
    out = StandIns("", prefix)
    edits: list[tuple[int, int, str]] = []
    _Rewriter(scanner, frozen, out, edits).run()
    if not out.held:
        return out  # nothing to hold aside (false, but it knows which shardings collectives read)
    pieces, pos = [], 0
    for start, end, replacement in sorted(edits, key=lambda e: (e[0], e[1])):
        pieces.append(text[pos:start])
        pieces.append(_fit(text[start:end], replacement))
        pos = end
    pieces.append(text[pos:])
    out.text = "".join(pieces)
    return out


def quickly_rejected(text: str) -> bool:
    """Whether a sharding in the text is one the verifier rejects whatever it is on, judged from the lines that
    mention sdy alone (MLIR's tokens never span lines, so each line lexes on its own): a quick look that lets a
    large module skip a strict parse bound to fail (MLIR's error for it prints the whole failing function). A
    sharding written over several lines is not seen; then the strict parse decides, as for a small module."""
    meshes: dict[str, Mesh] = {}
    shardings: list[TensorSharding] = []
    pos = text.find("sdy")
    while pos >= 0:
        start, end = text.rfind("\n", 0, pos) + 1, text.find("\n", pos)
        end = len(text) if end < 0 else end
        _read_line(text[start:end], meshes, shardings)
        pos = text.find("sdy", end)
    return any(rejected_anywhere(s, meshes) for s in set(shardings))  # a module repeats a few shardings


def _read_line(line: str, meshes: dict[str, Mesh], shardings: list[TensorSharding]) -> None:
    tokens = mt.tokenize(line)
    words = [line[t.start:t.end] for t in tokens]
    for i, word in enumerate(words):
        try:
            if word == "sdy.mesh" and i + 2 < len(words) and words[i + 2] == "=":
                c = Cursor(line, tokens, i + 1)
                name = read_symbol(c)
                c.expect("=")
                meshes[name] = read_mesh(c)
            elif word == '"sdy.mesh"':  # the generic form: `<{mesh = #sdy.mesh<[...]>, sym_name = "name"}>`
                at = {w: k for k, w in enumerate(words) if k > i}
                if "mesh" in at and "sym_name" in at and words[at["sym_name"] + 1:at["sym_name"] + 2] == ["="]:
                    c = Cursor(line, tokens, at["mesh"] + 1)
                    c.expect("=")
                    c.accept("#sdy.mesh")
                    mesh = read_mesh(c)
                    k = at["sym_name"] + 2
                    if k < len(words) and tokens[k].kind == mt.STRING:
                        meshes[mt.unquote(words[k])] = mesh
            elif word == "<" and i + 2 < len(words) and (tokens[i + 1].kind == mt.SYMBOL or words[i + 1] == "mesh"):
                shardings.append(read_tensor_sharding_body(Cursor(line, tokens, i)))
        except ShardingSyntaxError:
            continue


def _fit(original: str, replacement: str) -> str:
    """The replacement laid out so the text after it keeps its line, and its column where the replacement is no
    longer than the original."""
    lines = original.count("\n")
    if not lines:
        return replacement + " " * (len(original) - len(replacement))
    tail = len(original) - original.rfind("\n") - 1
    return replacement + "\n" * lines + " " * tail


def _collective_names(s: TokenScan) -> set[tuple[int, str]]:
    """(function, SSA name) of every value an sdy collective reads or defines."""
    names: set[tuple[int, str]] = set()
    stack: list[int] = []
    function = 0
    words = s.words
    for i, token in enumerate(s.tokens):
        kind = token.kind
        if kind == mt.PUNCT:
            s.track(i, stack)
            continue
        if kind != mt.VALUE:
            if words[i] in ("func.func", '"func.func"'):
                function += 1
            continue
        found = s.result_list(i, stack)
        if found is None:
            continue
        results, equals = found
        op = equals + 1
        if op >= len(s.tokens) or s.spelling(op).strip('"') not in COLLECTIVES:
            continue
        names.update((function, r) for r in results)
        operand = s.first_operand(op)
        if operand is not None:
            names.add((function, s.spelling(operand).split("#")[0]))
    return names


class _Rewriter(GenericForms):
    """One pass over the tokens, collecting the edits that put stand-ins in place."""

    def __init__(self, s: TokenScan, frozen: set[tuple[int, str]], out: StandIns, edits: list):
        self.s, self.frozen, self.out, self.edits = s, frozen, out, edits
        self.statement = _Statement()
        self.manual_stack: list[tuple[int, frozenset[str]]] = []  # (region end index, manual axes) around
        self.function_token = -1  # the last func.func seen (errors about its arguments point there)

    def hold(self, attribute_text: str) -> int:
        self.out.held.append(attribute_text)
        return len(self.out.held) - 1

    def is_frozen(self, names, index: int) -> bool:
        """Whether a collective reads one of `names`; if so the sharding at token `index` stays as written."""
        if not any((self.s.function, n) in self.frozen for n in names):
            return False
        for token in (index, self.function_token):
            if token >= 0:
                self.out.collective_lines.add(mt.line_col(self.s.text, self.s.tokens[token].start)[0])
        return True

    def run(self) -> None:
        s, stack, words = self.s, [], self.s.words
        for i, token in enumerate(s.tokens):
            while self.manual_stack and i > self.manual_stack[-1][0]:
                self.manual_stack.pop()
            if token.kind == mt.PUNCT:
                s.track(i, stack)
                continue
            spelling = words[i]
            if spelling in ("func.func", '"func.func"'):
                s.function += 1
                self.function_token = i
                self.statement = _Statement()
            elif token.kind == mt.HASH and not stack and s.is_punct(i + 1, "="):
                s.aliases[spelling] = self._value_extent(i + 2)
            elif token.kind == mt.IDENT and spelling == "sdy.mesh":
                self._mesh(i)
            elif token.kind == mt.STRING and spelling == '"sdy.mesh"':  # generic form: no results to lead to it
                self._op(i)
            elif token.kind == mt.VALUE:
                found = s.result_list(i, stack)
                if found is not None:
                    self.statement = _Statement(found[0])
                    self._op(found[1] + 1)
            elif token.kind in (mt.IDENT, mt.STRING) and spelling.strip('"') in HELD_KEYS and \
                    s.is_punct(i + 1, "=") and stack and s.spelling(stack[-1]) == "{" and \
                    not (stack[-1] and s.is_punct(stack[-1] - 1, "=")):  # not a dictionary nested in a value
                self._dict_entry(i, stack)

    # -- definitions -------------------------------------------------------------------------------------------

    def _mesh(self, index: int) -> None:
        c = Cursor(self.s.text, self.s.tokens, index + 1)
        try:
            name = read_symbol(c)
            c.expect("=")
            self.s.meshes[name] = read_mesh(c)
        except ShardingSyntaxError:
            pass

    def _value_extent(self, index: int) -> tuple[int, int]:
        """Offsets of one attribute value starting at token `index`: a token and the bracket group after it."""
        s = self.s
        if index >= len(s.tokens):
            return (len(s.text), len(s.text))
        last = index
        if s.is_punct(index + 1, "<") and s.tokens[index + 1].start == s.tokens[index].end:
            last = s.group_end(index + 1)
        elif s.spelling(index) in mt.OPEN_TO_CLOSE:
            last = s.group_end(index)
        return s.tokens[index].start, s.tokens[last].end

    def _attribute_text(self, start: int, end: int) -> str:
        """The text of an attribute value, with an alias (`#name`) replaced by what it stands for."""
        text = self.s.text[start:end].strip()
        seen = set()
        while text in self.s.aliases and text not in seen:
            seen.add(text)
            a, b = self.s.aliases[text]
            text = self.s.text[a:b].strip()
        return text

    # -- attribute dictionaries --------------------------------------------------------------------------------

    def _dict_entry(self, index: int, stack: list[int]) -> None:
        s = self.s
        end = index + 2
        while end < len(s.tokens) and not (s.tokens[end].kind == mt.PUNCT and s.spelling(end) in (",", "}")):
            end = s.group_end(end) + 1
        if end >= len(s.tokens) or end == index + 2:
            return
        if self.is_frozen(self._dict_owner(stack), index):
            return
        key = mt.unquote(s.spelling(index)) if s.tokens[index].kind == mt.STRING else s.spelling(index)
        value = self._attribute_text(s.tokens[index + 2].start, s.tokens[end - 1].end)
        number = self.hold(value)
        self.edits.append((s.tokens[index].start, s.tokens[end - 1].end, f"{self.out.prefix}.{key} = {number}"))

    def _dict_owner(self, stack: list[int]) -> tuple[str, ...]:
        """The SSA names an attribute dictionary belongs to: the argument before it in a signature, else the
        results of the op being read."""
        s = self.s
        if len(stack) >= 2 and s.spelling(stack[-2]) == "(":
            i = stack[-1] - 1  # back to the value this entry's list item starts with, if any
            while i > stack[-2] and s.tokens[i].kind != mt.VALUE and s.words[i] != ",":
                i = s.partner[i] - 1 if 0 <= s.partner[i] < i else i - 1
            return (s.spelling(i),) if i > stack[-2] and s.tokens[i].kind == mt.VALUE else ()
        return self.statement.results

    # -- ops in sdy's custom syntax ----------------------------------------------------------------------------

    def _op(self, index: int) -> None:
        s = self.s
        if index >= len(s.tokens) or s.tokens[index].kind not in (mt.IDENT, mt.STRING):
            return
        if s.tokens[index].kind == mt.STRING:
            try:
                self._generic(index, mt.unquote(s.spelling(index)))
            except (ShardingSyntaxError, IndexError):
                pass  # not the form expected: leave the op as written
            return
        name = s.spelling(index)
        try:
            if name in ("sdy.sharding_constraint", "sdy.reshard", "sdy.data_flow_edge"):
                self._single(index, name)
            elif name == "sdy.named_computation":
                self._named(index)
            elif name == "sdy.manual_computation":
                self._manual(index)
        except (ShardingSyntaxError, IndexError):
            return  # not the syntax expected: leave the op as written

    def _tag(self, after: int, held: dict[str, int]) -> None:
        """Tag the op whose attr-dict may follow token `after` with the numbers of its held attributes."""
        s = self.s
        tag = len(self.out.tagged_ops)
        self.out.tagged_ops[tag] = held
        entry = f"{self.out.prefix} = {tag}"
        if s.is_punct(after + 1, "{"):
            at = s.tokens[after + 1].end
            empty = s.is_punct(after + 2, "}")
            self.edits.append((at, at, entry if empty else entry + ", "))
        else:
            at = s.tokens[after].end
            self.edits.append((at, at, " {" + entry + "}"))

    def _single(self, index: int, name: str) -> None:
        s = self.s
        if self.is_frozen(self.statement.results, index):
            return
        i = index + 1
        if s.tokens[i].kind != mt.VALUE:
            return
        i += 1
        optional = name == "sdy.data_flow_edge"
        if optional:
            if not (s.spelling(i) == "sharding" and s.is_punct(i + 1, "=")):
                return
            start = s.tokens[i].start
            i += 2
        else:
            start = s.tokens[i].start
        if not s.is_punct(i, "<"):
            return
        close = s.group_end(i)
        number = self.hold("#sdy.sharding" + s.text[s.tokens[i].start:s.tokens[close].end])
        self.edits.append((start, s.tokens[close].end, "" if optional else SINGLE_DEVICE))
        attribute = "sharding"
        self._tag(close, {attribute: number})

    def _named(self, index: int) -> None:
        s = self.s
        c = Cursor(s.text, s.tokens, index + 1)
        c.expect("<")
        c.pos = s.group_end(c.pos - 1) + 1
        if not c.at("("):
            return
        c.pos = s.group_end(c.pos) + 1
        spans: dict[str, tuple[int, int]] = {}  # attribute -> (its keyword, its closing bracket)
        for attribute in ("in_shardings", "out_shardings"):
            if c.at(attribute) and c.at("=", 1) and c.at("[", 2):
                spans[attribute] = (c.pos, s.group_end(c.pos + 2))
                c.pos = spans[attribute][1] + 1
        if not spans or not c.at("("):
            return
        block_args = s.names_in(c.pos, s.group_end(c.pos))
        c.pos = s.group_end(c.pos) + 1
        if not c.at("{") or self.is_frozen(self.statement.results + block_args, index):
            return
        held = {}
        for attribute, (keyword, close) in spans.items():
            body = s.text[s.tokens[keyword + 2].start:s.tokens[close].end]
            held[attribute] = self.hold("#sdy.sharding_per_value<" + body + ">")
            self.edits.append((s.tokens[keyword].start, s.tokens[close].end, ""))
        self._tag(s.group_end(c.pos), held)

    def _manual_parts(self, index: int, lists: dict, axes, block_args: tuple[int, int], local_in,
                      region: tuple[int, int], after: int):
        """A manual computation's stand-in pieces (manual.stand_in_parts), or None where it stays as written (a
        collective reads one of its values, or no stand-in fits its body); the axes it binds for the ops inside it
        are noted either way. `region`: the `{` and `}` of its body; `after`: the token its attribute dictionary
        (if any) and type follow."""
        s = self.s
        local_out = s.return_types(*region)
        c = Cursor(s.text, s.tokens, after + 1)
        if c.at("{"):
            c.pos = s.group_end(c.pos) + 1
        c.expect(":")
        global_in, global_out = s.function_type(c)
        types = {"in_shardings": (global_in, local_in), "out_shardings": (global_out, local_out)}
        bound = frozenset().union(*(a for _, a in self.manual_stack))
        parts = None
        if not self.is_frozen(self.statement.results + s.names_in(*block_args), index):
            parts = stand_in_parts(lists, axes, bound, types, s.meshes)
        self.manual_stack.append((region[1], frozenset(parts[3] if parts is not None else axes)))
        return parts

    def _manual(self, index: int) -> None:
        s = self.s
        c = Cursor(s.text, s.tokens, index + 1)
        if not c.at("("):
            return
        c.pos = s.group_end(c.pos) + 1
        start = c.pos
        lists: dict[str, list[TensorSharding]] = {}
        for attribute in ("in_shardings", "out_shardings"):
            c.expect(attribute)
            c.expect("=")
            c.expect("[")
            lists[attribute] = c.separated("]", lambda: read_tensor_sharding_body(c))
        axes_start = c.pos
        c.expect("manual_axes")
        c.expect("=")
        axes = read_manual_axes(c)
        end = c.pos - 1
        originals = {
            "in_shardings": "#sdy.sharding_per_value<" + s.text[s.tokens[start + 2].start:
                                                                 s.tokens[s.group_end(start + 2)].end] + ">",
            "out_shardings": "#sdy.sharding_per_value<" + s.text[s.tokens[s.group_end(start + 2) + 3].start:
                                                                  s.tokens[axes_start - 1].end] + ">",
            "manual_axes": "#sdy<manual_axes" + s.text[s.tokens[axes_start + 2].start:s.tokens[end].end] + ">",
        }
        if not c.at("("):
            return
        block_open, block_close = c.pos, s.group_end(c.pos)
        local_in = s.typed_list(block_open + 1, block_close)
        c.pos = block_close + 1
        if not c.at("{"):
            return
        region = (c.pos, s.group_end(c.pos))
        parts = self._manual_parts(index, lists, axes, (block_open, block_close), local_in, region, region[1])
        if parts is None:
            return
        ins, outs, manual, _ = parts
        text = f"in_shardings={ins} out_shardings={outs} manual_axes={manual}"
        held = {name: self.hold(value) for name, value in originals.items()}
        self.edits.append((s.tokens[start].start, s.tokens[end].end, text))
        self._tag(region[1], held)
