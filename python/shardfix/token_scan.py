"""Reading MLIR's token stream a statement at a time: bracket groups, an op's result names and first operand, and
the types written in a signature or after a region. The stand-in scanner (shardfix.standins) is built on it.
Pure: imports neither MLIR nor JAX."""

from __future__ import annotations

from . import mlir_text as mt
from .mlir_text import Token
from .sdy_syntax import Cursor
from .sharding import Mesh


class TokenScan:
    """A module's tokens with their spellings and matching brackets, and the reads a scan of them needs."""

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

    def track(self, index: int, stack: list[int]) -> None:
        """Keep `stack` holding the indices of the open brackets around the token at `index`."""
        partner = self.partner[index]
        if partner > index:
            stack.append(index)
        elif 0 <= partner < index and stack and partner == stack[-1]:
            stack.pop()

    def result_list(self, index: int, stack: list[int]) -> tuple[tuple[str, ...], int] | None:
        """`%a, %b:2 =` starting at `index` (an op's results): the names and the index of `=`."""
        if stack and self.words[stack[-1]] != "{":
            return None
        if index and self.tokens[index - 1].kind == mt.PUNCT and self.words[index - 1] in (",", "("):
            return None
        names, i, n = [], index, len(self.tokens)
        while i < n and self.tokens[i].kind == mt.VALUE:
            names.append(self.words[i])
            i += 1
            if self.is_punct(i, ":") and i + 1 < n and self.tokens[i + 1].kind == mt.INTEGER:
                i += 2
            if self.is_punct(i, ","):
                i += 1
                continue
            break
        return (tuple(names), i) if names and self.is_punct(i, "=") else None

    def first_operand(self, op: int) -> int | None:
        """The index of the first operand of the op named at `op`: inside `(...)` for the generic form, else after
        the op's bracketed parameters and keywords."""
        i = op + 1
        if self.tokens[op].kind == mt.STRING:
            close = self.group_end(i) if self.is_punct(i, "(") else i
            return i + 1 if i + 1 < close and self.tokens[i + 1].kind == mt.VALUE else None
        while i < len(self.tokens):
            token = self.tokens[i]
            if token.kind == mt.VALUE:
                return i
            if token.kind == mt.PUNCT and self.words[i] in ("[", "{", "<") and self.group_end(i) > i:
                i = self.group_end(i) + 1
            elif token.kind in (mt.IDENT, mt.STRING):
                i += 1
            else:
                return None
        return None

    def names_in(self, open_index: int, close_index: int) -> tuple[str, ...]:
        """The SSA names between two tokens (a block's arguments, say)."""
        return tuple(self.words[i] for i in range(open_index + 1, close_index) if self.tokens[i].kind == mt.VALUE)

    # -- types ---------------------------------------------------------------------------------------------------

    def type_end(self, index: int) -> int:
        """Index of the last token of the type starting at `index`: a name and the bracket group after it."""
        if self.is_punct(index, "("):  # a function type
            close = self.group_end(index)
            return self.type_end(close + 2) if self.is_punct(close + 1, "->") else close
        if self.is_punct(index + 1, "<") and self.tokens[index + 1].start == self.tokens[index].end:
            return self.group_end(index + 1)
        return index

    def _span(self, first: int, last: int) -> str:
        return self.text[self.tokens[first].start:self.tokens[last].end]

    def typed_list(self, first: int, close: int) -> list[str] | None:
        """Types of `%name: type (loc(...))?, ...` between `first` and `close`."""
        types, i = [], first
        while i < close:
            if self.tokens[i].kind != mt.VALUE or not self.is_punct(i + 1, ":"):
                return None
            last = self.type_end(i + 2)
            types.append(self._span(i + 2, last))
            i = last + 1
            if i < close and self.words[i] == "loc" and self.is_punct(i + 1, "("):
                i = self.group_end(i + 1) + 1
            if i < close and self.is_punct(i, ","):
                i += 1
        return types

    def types(self, i: int, close: int) -> list[str]:
        """Comma-separated types from `i`, up to `close` or whatever follows the last of them (a location)."""
        types = []
        while i < close:
            last = self.type_end(i)
            types.append(self._span(i, last))
            i = last + 1
            if not (i < close and self.is_punct(i, ",")):
                break
            i += 1
        return types

    def function_type(self, c: Cursor) -> tuple[list[str] | None, list[str] | None]:
        """`(inputs) -> results` (results parenthesized or one type) at the cursor."""
        if not c.at("("):
            return None, None
        close = self.group_end(c.pos)
        inputs = self.types(c.pos + 1, close)
        if not self.is_punct(close + 1, "->"):
            return inputs, None
        first = close + 2
        if self.is_punct(first, "("):
            return inputs, self.types(first + 1, self.group_end(first))
        return inputs, [self._span(first, self.type_end(first))]

    def return_types(self, region_open: int, region_close: int) -> list[str] | None:
        """Types the region's last `sdy.return` returns (custom or generic form)."""
        i, last = region_open + 1, None
        while i < region_close:
            if self.words[i] in ("sdy.return", '"sdy.return"'):
                last = i
            i = self.group_end(i) + 1 if self.is_punct(i, "{") else i + 1
        if last is None:
            return None
        i = last + 1
        if self.words[last] == '"sdy.return"':
            i = self.group_end(i) + 1 if self.is_punct(i, "(") else i
            if not self.is_punct(i, ":") or not self.is_punct(i + 1, "("):
                return None
            return self.types(i + 2, self.group_end(i + 1))
        while i < region_close and (self.tokens[i].kind == mt.VALUE or self.is_punct(i, ",")):
            i += 1
        if not self.is_punct(i, ":"):
            return []
        return self.types(i + 1, region_close)
