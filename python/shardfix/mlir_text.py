"""MLIR's textual syntax as tokens: a lexer following MLIR's own token rules, and bracket matching over them.

Readers of sdy syntax (shardfix.sdy_syntax) and the lenient loader's plan (shardfix.lenient) work on these
tokens, never on raw characters: a string literal or a comment that happens to look like a sharding stays a string
or a comment. Also the input convention tools/opt shares with mlir-opt: text that isn't one `builtin.module` is
wrapped in one (wrap_in_module). Pure: imports neither MLIR nor JAX.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

# Token kinds.
IDENT = "ident"  # bare identifier or keyword: func.func, tensor, in_shardings, x8xf32
STRING = "string"  # "..." (escapes kept as written)
INTEGER = "integer"
FLOAT = "float"
VALUE = "value"  # %name
SYMBOL = "symbol"  # @name or @"name"
BLOCK = "block"  # ^name
HASH = "hash"  # #name: an attribute alias or a dialect attribute (#sdy.sharding)
BANG = "bang"  # !name: a type alias or a dialect type (!stablehlo.token)
PUNCT = "punct"  # ( ) [ ] { } < > , : = ? * + | - -> ... {-# #-}
ERROR = "error"  # a character MLIR doesn't accept, or an unterminated string

OPEN_TO_CLOSE = {"(": ")", "[": "]", "{": "}", "<": ">"}
CLOSE_TO_OPEN = {v: k for k, v in OPEN_TO_CLOSE.items()}

_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_BARE_START = _LETTERS | {"_"}
_BARE_CHARS = _LETTERS | _DIGITS | frozenset("_$.")
_SUFFIX_START = _LETTERS | frozenset("_$.-")  # after % # ! ^ when the name is not all digits
_SUFFIX_CHARS = _LETTERS | _DIGITS | frozenset("_$.-")
_SPACE = frozenset(" \t\r\n\f\v")
_SINGLE_PUNCT = frozenset("()[]{}<>,:=?*+|")


class Token(NamedTuple):  # a tuple: modules have hundreds of thousands of tokens
    kind: str
    start: int  # offset of the first character in the text
    end: int  # offset just past the last character


def tokenize(text: str) -> list[Token]:
    """The tokens of `text`, comments and whitespace left out. Characters MLIR rejects become ERROR tokens, so a
    caller decides how strict to be."""
    tokens: list[Token] = []
    append = tokens.append
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _SPACE:
            i += 1
            if i < n and text[i] in _SPACE:
                i = _scan(text, i, _SPACE)
            continue
        start = i
        if c == "/" and text.startswith("//", i):
            newline = text.find("\n", i)
            i = n if newline < 0 else newline
            continue
        if c == '"':
            i = _string_end(text, i)
            append(Token(STRING if text[i - 1] == '"' and i - start >= 2 else ERROR, start, i))
            continue
        if c in _BARE_START:
            i = _scan(text, i + 1, _BARE_CHARS)
            append(Token(IDENT, start, i))
            continue
        if c in _DIGITS:
            i, kind = _number_end(text, i)
            append(Token(kind, start, i))
            continue
        if c in "%^#!":
            if c == "#" and text.startswith("#-}", i):
                append(Token(PUNCT, start, i + 3))
                i += 3
                continue
            j = _suffix_id_end(text, i + 1)
            if j == i + 1:
                append(Token(ERROR, start, i + 1))
                i += 1
                continue
            append(Token({"%": VALUE, "^": BLOCK, "#": HASH, "!": BANG}[c], start, j))
            i = j
            continue
        if c == "@":
            if i + 1 < n and text[i + 1] == '"':
                i = _string_end(text, i + 1)
                append(Token(SYMBOL if text[i - 1] == '"' else ERROR, start, i))
            elif i + 1 < n and text[i + 1] in _BARE_START:
                i = _scan(text, i + 2, _BARE_CHARS)
                append(Token(SYMBOL, start, i))
            else:
                i += 1
                append(Token(ERROR, start, i))
            continue
        if c == "-":
            width = 2 if text.startswith("->", i) else 1
            append(Token(PUNCT, start, i + width))
            i += width
            continue
        if c == "{" and text.startswith("{-#", i):
            append(Token(PUNCT, start, i + 3))
            i += 3
            continue
        if c == "." and text.startswith("...", i):
            append(Token(PUNCT, start, i + 3))
            i += 3
            continue
        i += 1
        append(Token(PUNCT if c in _SINGLE_PUNCT else ERROR, start, i))
    return tokens


_CHARS = {}  # frozenset -> the same characters as a string, for str.lstrip


def _scan(text: str, i: int, allowed: frozenset) -> int:
    """End of the run of `allowed` characters from `i` (str.lstrip scans in C, a window at a time)."""
    chars = _CHARS.get(allowed)
    if chars is None:
        chars = _CHARS[allowed] = "".join(sorted(allowed))
    n = len(text)
    while i < n:
        window = text[i:i + 64]
        rest = len(window.lstrip(chars))
        i += len(window) - rest
        if rest:
            return i
    return n


def _suffix_id_end(text: str, i: int) -> int:
    """End of the name after a sigil: all digits, or a letter or one of `_$.-` followed by those and digits."""
    if i < len(text) and text[i] in _DIGITS:
        return _scan(text, i, _DIGITS)
    if i < len(text) and text[i] in _SUFFIX_START:
        return _scan(text, i + 1, _SUFFIX_CHARS)
    return i


def _string_end(text: str, i: int) -> int:
    """Offset past the string literal starting at `i` (a quote); at a newline or the end when unterminated."""
    j, n = i + 1, len(text)
    newline = text.find("\n", j)
    limit = n if newline < 0 else newline
    while j < limit:
        quote, escape = text.find('"', j, limit), text.find("\\", j, limit)
        if quote < 0:
            return limit
        if 0 <= escape < quote:
            j = escape + 2
            continue
        return quote + 1
    return limit


def _number_end(text: str, i: int) -> tuple[int, str]:
    n = len(text)
    if text.startswith("0x", i) and i + 2 < n and text[i + 2] in _HEX:
        return _scan(text, i + 2, _HEX), INTEGER
    j = _scan(text, i, _DIGITS)
    if j < n and text[j] == "." and (j + 1 >= n or text[j + 1] != "."):
        j = _scan(text, j + 1, _DIGITS)
        if j < n and text[j] in "eE":
            k = j + 1
            if k < n and text[k] in "+-":
                k += 1
            if k < n and text[k] in _DIGITS:
                j = _scan(text, k, _DIGITS)
        return j, FLOAT
    return j, INTEGER


def match_brackets(text: str, tokens: Sequence[Token]) -> list[int]:
    """For each token, the index of its matching bracket (both ways), or -1. `<`/`>` count as brackets (MLIR uses
    them only so); a bracket whose partner is missing or of another kind stays -1, as do the ones it encloses."""
    partner = [-1] * len(tokens)
    stack: list[int] = []
    for index, token in enumerate(tokens):
        if token.kind != PUNCT:
            continue
        c = text[token.start:token.end]
        if c in OPEN_TO_CLOSE:
            stack.append(index)
        elif c in CLOSE_TO_OPEN:
            # An unmatched closer pops nothing; a mismatched one ends the openers it skips.
            for depth in range(len(stack) - 1, -1, -1):
                if text[tokens[stack[depth]].start] == CLOSE_TO_OPEN[c]:
                    opener = stack[depth]
                    del stack[depth:]
                    partner[opener], partner[index] = index, opener
                    break
    return partner


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of an offset."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def unquote(literal: str) -> str:
    """The value of an MLIR string literal (quotes included in `literal`): `\\"`, `\\\\`, `\\n`, `\\t` and
    two-hex-digit escapes of UTF-8 bytes."""
    body, out, i = literal[1:-1], bytearray(), 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "\"\\nt":
                out += {"n": b"\n", "t": b"\t"}.get(nxt, nxt.encode())
                i += 2
                continue
            pair = body[i + 1:i + 3]
            if len(pair) == 2 and pair[0] in _HEX and pair[1] in _HEX:
                out.append(int(pair, 16))
                i += 3
                continue
        out += c.encode("utf-8", "surrogatepass")
        i += 1
    return out.decode("utf-8", "replace")


def quote(value: str) -> str:
    """An MLIR string literal for `value`, escaped as MLIR prints it (bytes outside printable ASCII as two hex
    digits)."""
    out = []
    for byte in value.encode("utf-8", "surrogatepass"):
        if byte in (0x22, 0x5C):
            out.append("\\" + chr(byte))
        elif byte < 0x20 or byte >= 0x7F:
            out.append(f"\\{byte:02X}")
        else:
            out.append(chr(byte))
    return '"' + "".join(out) + '"'


def tensor_shape(type_text: str) -> tuple | str | None:
    """The shape of a `tensor<...>` type's text: a tuple of dims (None for `?`), "unranked" for `tensor<*x...>`,
    None for any other type."""
    text = type_text.strip()
    if not (text.startswith("tensor<") and text.endswith(">")):
        return None
    body = text[len("tensor<"):-1].strip()
    if body.startswith("*"):
        return "unranked"
    dims = []
    for part in body.split("x"):
        part = part.strip()
        if part == "?":
            dims.append(None)
        elif part.isdigit() and part.isascii():
            dims.append(int(part))
        else:
            return tuple(dims)  # the element type (and any encoding) follows the last dim
    return tuple(dims)


def wrap_in_module(text: str) -> str:
    """`module {` ... `}` around the text's ops (mlir-opt's implicit module, for text that isn't a single
    `builtin.module`), put on a blank line before the first op so no position moves.
    Attribute and type alias definitions (`#map = ...`, `!t = ...`) stay outside, where MLIR wants them."""
    lines = text.split("\n")
    aliases = _alias_ends(text)
    after = aliases[-1][1] + 1 if aliases else 0
    first = next((i for i in range(after, len(lines)) if lines[i].strip() and not lines[i].lstrip().startswith("//")),
                 len(lines))
    blank = next((i for i in range(first - 1, after - 1, -1) if not lines[i].strip()), None)
    if blank is not None:
        lines[blank] = "module {"
    elif first < len(lines):
        lines[first] = "module { " + lines[first]
    else:
        lines.append("module {")
    return "\n".join(lines) + "\n}"


def _alias_ends(text: str) -> list[tuple[int, int]]:
    """(first line, last line) of each top-level alias definition, 0-based, in order; the scan stops at the first
    top-level token that starts something else."""
    tokens = tokenize(text)
    partner = match_brackets(text, tokens)
    found, i = [], 0
    while i + 1 < len(tokens) and tokens[i].kind in (HASH, BANG) and \
            text[tokens[i + 1].start:tokens[i + 1].end] == "=":
        start_line = text.count("\n", 0, tokens[i].start)
        j = i + 2
        line = text.count("\n", 0, tokens[j].start) if j < len(tokens) else start_line
        # the value runs to the end of the line its brackets close on
        while j < len(tokens) and text.count("\n", 0, tokens[j].start) == line:
            if partner[j] > j:
                j = partner[j]
                line = text.count("\n", 0, tokens[j].start)
            j += 1
        found.append((start_line, line))
        i = j
    return found
