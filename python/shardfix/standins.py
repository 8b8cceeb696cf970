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
Shardings that sdy collectives check against (a collective's own, and those of the values it reads, found by
SSA name) stay as they are: the collective must go on verifying with them.
Every replacement keeps the lines and, where it can, the columns of the text around it, so the parsed module's
locations are the original's. Pure: imports neither MLIR nor JAX.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import mlir_text as mt
from .correct import rejected_anywhere
from .manual import manual_dims, stand_in_sharding, valid_manual_axes
from .mlir_text import Token
from .sdy_syntax import Cursor, read_manual_axes, read_mesh, read_symbol, read_tensor_sharding_body
from .sharding import Mesh, ShardingSyntaxError, TensorSharding

HELD_KEYS = frozenset({"sdy.sharding", "sdy.propagation_edges", "sdy.block_arg_propagation_edges",
                       "sdy.result_propagation_edges"})
COLLECTIVES = frozenset({"sdy.all_gather", "sdy.all_slice", "sdy.all_to_all", "sdy.collective_permute",
                         "sdy.all_reduce", "sdy.reduce_scatter", "sdy.sharded_to_unreduced",
                         "sdy.replicated_to_unreduced"})
_SINGLE_DEVICE = "<mesh<[], device_ids=[0]>, []>"


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


class _Scanner:
    def __init__(self, text: str, tokens: list[Token]):
        self.text, self.tokens = text, tokens
        self.words = [text[t.start:t.end] for t in tokens]  # each token's spelling, sliced once
        self.partner = mt.match_brackets(text, tokens)
        self.function = 0  # which func.func the scan is in (SSA names are scoped by function)
        self.meshes: dict[str, Mesh] = {}
        self.aliases: dict[str, tuple[int, int]] = {}  # #alias -> (start, end) offsets of its value

    def spelling(self, index: int) -> str:
        return self.words[index]

    def is_punct(self, index: int, spelling: str) -> bool:
        return index < len(self.words) and self.words[index] == spelling and self.tokens[index].kind == mt.PUNCT

    def group_end(self, index: int) -> int:
        """Index of the token closing the bracket at `index` (itself for a token that opens nothing)."""
        return self.partner[index] if self.partner[index] > index else index

    def result_list(self, index: int, stack: list[int]) -> tuple[tuple[str, ...], int] | None:
        """`%a, %b:2 =` starting at `index` (an op's results): the names and the index of `=`."""
        if stack and self.spelling(stack[-1]) != "{":
            return None
        if index and self.tokens[index - 1].kind == mt.PUNCT and self.spelling(index - 1) in (",", "("):
            return None
        names, i, n = [], index, len(self.tokens)
        while i < n and self.tokens[i].kind == mt.VALUE:
            names.append(self.spelling(i))
            i += 1
            if self.is_punct(i, ":") and i + 1 < n and self.tokens[i + 1].kind == mt.INTEGER:
                i += 2
            if self.is_punct(i, ","):
                i += 1
                continue
            break
        return (tuple(names), i) if names and self.is_punct(i, "=") else None


def stand_in(text: str) -> StandIns | None:
    """The text with stand-ins (false when nothing in it could be held aside), or None when it doesn't lex as
    MLIR."""
    tokens = mt.tokenize(text)
    if any(t.kind == mt.ERROR for t in tokens):
        return None
    scanner = _Scanner(text, tokens)
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


def _collective_names(s: _Scanner) -> set[tuple[int, str]]:
    """(function, SSA name) of every value an sdy collective reads or defines."""
    names: set[tuple[int, str]] = set()
    stack: list[int] = []
    function = 0
    words = s.words
    for i, token in enumerate(s.tokens):
        kind = token.kind
        if kind == mt.PUNCT:
            _track(s, i, stack)
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
        operand = _first_operand(s, op)
        if operand is not None:
            names.add((function, s.spelling(operand).split("#")[0]))
    return names


def _first_operand(s: _Scanner, op: int) -> int | None:
    """The index of the first operand of the op named at `op`: inside `(...)` for the generic form, else after
    the op's bracketed parameters and keywords."""
    i = op + 1
    if s.tokens[op].kind == mt.STRING:
        close = s.group_end(i) if s.is_punct(i, "(") else i
        return i + 1 if i + 1 < close and s.tokens[i + 1].kind == mt.VALUE else None
    while i < len(s.tokens):
        token = s.tokens[i]
        if token.kind == mt.VALUE:
            return i
        if token.kind == mt.PUNCT and s.spelling(i) in ("[", "{", "<") and s.group_end(i) > i:
            i = s.group_end(i) + 1
        elif token.kind in (mt.IDENT, mt.STRING):
            i += 1
        else:
            return None
    return None


def _track(s: _Scanner, index: int, stack: list[int]) -> None:
    """Keep `stack` holding the indices of the open brackets around the current token."""
    partner = s.partner[index]
    if partner > index:
        stack.append(index)
    elif 0 <= partner < index and stack and partner == stack[-1]:
        stack.pop()


class _Rewriter:
    """One pass over the tokens, collecting the edits that put stand-ins in place."""

    def __init__(self, s: _Scanner, frozen: set[tuple[int, str]], out: StandIns, edits: list):
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
                _track(s, i, stack)
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
        if index >= len(s.tokens) or s.tokens[index].kind != mt.IDENT:
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
        self.edits.append((start, s.tokens[close].end, "" if optional else _SINGLE_DEVICE))
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
        block_args = self._names_in(c.pos, s.group_end(c.pos))
        c.pos = s.group_end(c.pos) + 1
        if not c.at("{") or self.is_frozen(self.statement.results + block_args, index):
            return
        held = {}
        for attribute, (keyword, close) in spans.items():
            body = s.text[s.tokens[keyword + 2].start:s.tokens[close].end]
            held[attribute] = self.hold("#sdy.sharding_per_value<" + body + ">")
            self.edits.append((s.tokens[keyword].start, s.tokens[close].end, ""))
        self._tag(s.group_end(c.pos), held)

    def _names_in(self, open_index: int, close_index: int) -> tuple[str, ...]:
        s = self.s
        return tuple(s.spelling(i) for i in range(open_index + 1, close_index) if s.tokens[i].kind == mt.VALUE)

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
        local_in = self._typed_list(block_open + 1, block_close)
        c.pos = block_close + 1
        if not c.at("{"):
            return
        region_open, region_close = c.pos, s.group_end(c.pos)
        local_out = self._return_types(region_open, region_close)
        c.pos = region_close + 1
        if c.at("{"):
            c.pos = s.group_end(c.pos) + 1
        c.expect(":")
        global_in, global_out = self._function_type(c)
        bound = frozenset().union(*(a for _, a in self.manual_stack))
        if self.is_frozen(self.statement.results + self._names_in(block_open, block_close), index):
            self.manual_stack.append((region_close, frozenset(a for a in axes)))
            return
        stand_ins = self._manual_stand_ins(lists, axes, bound, (global_in, local_in), (global_out, local_out))
        if stand_ins is None:
            self.manual_stack.append((region_close, frozenset(axes)))
            return
        text, kept_axes = stand_ins
        self.manual_stack.append((region_close, frozenset(kept_axes)))
        held = {name: self.hold(value) for name, value in originals.items()}
        self.edits.append((s.tokens[start].start, s.tokens[end].end, text))
        self._tag(region_close, held)

    def _manual_stand_ins(self, lists, axes, bound, inputs, outputs):
        """`in_shardings=[...] out_shardings=[...] manual_axes={...}` that verify for the body, and the axes."""
        originals = lists["in_shardings"] + lists["out_shardings"]
        mesh_ref, mesh = None, None
        for sharding in originals:
            if isinstance(sharding.mesh, Mesh) or sharding.mesh in self.s.meshes:
                mesh_ref = sharding.mesh
                mesh = sharding.mesh if isinstance(sharding.mesh, Mesh) else self.s.meshes[sharding.mesh]
                break
        if mesh is None:
            if len(self.s.meshes) == 1:
                (mesh_ref, mesh), = self.s.meshes.items()
            else:
                mesh_ref = mesh = Mesh(())
        (global_in, local_in), (global_out, local_out) = inputs, outputs
        if global_in is None or local_in is None or global_out is None or local_out is None or \
                len(global_in) != len(local_in) or len(global_out) != len(local_out):
            return None
        kept = valid_manual_axes(axes, mesh, bound) if global_in or global_out else []
        out = []
        for values, types in ((lists["in_shardings"], zip(global_in, local_in)),
                              (lists["out_shardings"], zip(global_out, local_out))):
            shardings = []
            for k, (g, l) in enumerate(types):
                g_shape, l_shape = mt.tensor_shape(g), mt.tensor_shape(l)
                original = values[k] if k < len(values) else None
                if g_shape is None and l_shape is None:  # a token or another non-tensor value
                    shardings.append(TensorSharding(mesh_ref, ()))
                    continue
                if g_shape is None or l_shape is None or g_shape == "unranked" or l_shape == "unranked":
                    return None
                dims = manual_dims(original, g_shape, l_shape, kept, mesh)
                if dims is None:
                    return None
                shardings.append(stand_in_sharding(mesh_ref, dims))
            out.append("[" + ", ".join(x.body() for x in shardings) + "]")
        manual = "{" + ", ".join(mt.quote(a) for a in kept) + "}"
        return f"in_shardings={out[0]} out_shardings={out[1]} manual_axes={manual}", kept

    # -- types -------------------------------------------------------------------------------------------------

    def _type_end(self, index: int) -> int:
        """Index of the last token of the type starting at `index`: a name and the bracket group after it."""
        s = self.s
        if s.is_punct(index, "("):  # a function type
            close = s.group_end(index)
            if s.is_punct(close + 1, "->"):
                return self._type_end(close + 2)
            return close
        if s.is_punct(index + 1, "<") and s.tokens[index + 1].start == s.tokens[index].end:
            return s.group_end(index + 1)
        return index

    def _typed_list(self, first: int, close: int) -> list[str] | None:
        """Types of `%name: type (loc(...))?, ...` between `first` and `close`."""
        s, types, i = self.s, [], first
        while i < close:
            if s.tokens[i].kind != mt.VALUE or not s.is_punct(i + 1, ":"):
                return None
            last = self._type_end(i + 2)
            types.append(s.text[s.tokens[i + 2].start:s.tokens[last].end])
            i = last + 1
            if i < close and s.spelling(i) == "loc" and s.is_punct(i + 1, "("):
                i = s.group_end(i + 1) + 1
            if i < close and s.is_punct(i, ","):
                i += 1
        return types

    def _types(self, i: int, close: int) -> list[str]:
        """Comma-separated types from `i`, up to `close` or whatever follows the last of them (a location)."""
        s, types = self.s, []
        while i < close:
            last = self._type_end(i)
            types.append(s.text[s.tokens[i].start:s.tokens[last].end])
            i = last + 1
            if not (i < close and s.is_punct(i, ",")):
                break
            i += 1
        return types

    def _function_type(self, c: Cursor) -> tuple[list[str] | None, list[str] | None]:
        s = self.s
        if not c.at("("):
            return None, None
        close = s.group_end(c.pos)
        inputs = self._types(c.pos + 1, close)
        if not s.is_punct(close + 1, "->"):
            return inputs, None
        first = close + 2
        if s.is_punct(first, "("):
            return inputs, self._types(first + 1, s.group_end(first))
        return inputs, [s.text[s.tokens[first].start:s.tokens[self._type_end(first)].end]]

    def _return_types(self, region_open: int, region_close: int) -> list[str] | None:
        """Types the region's last `sdy.return` returns (custom or generic form)."""
        s = self.s
        i, last = region_open + 1, None
        while i < region_close:
            if s.spelling(i) in ("sdy.return", '"sdy.return"'):
                last = i
            i = s.group_end(i) + 1 if s.is_punct(i, "{") else i + 1
        if last is None:
            return None
        i = last + 1
        if s.spelling(last) == '"sdy.return"':
            i = s.group_end(i) + 1 if s.is_punct(i, "(") else i
            if not s.is_punct(i, ":") or not s.is_punct(i + 1, "("):
                return None
            return self._types(i + 2, s.group_end(i + 1))
        while i < region_close and (s.tokens[i].kind == mt.VALUE or s.is_punct(i, ",")):
            i += 1
        if not s.is_punct(i, ":"):
            return []
        return self._types(i + 1, region_close)
