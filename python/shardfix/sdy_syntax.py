"""Reading sdy's attribute syntax from MLIR tokens into the sharding model (shardfix.sharding).

    mesh            <["a"=2, "b"=4], device_ids=[...]>
    axis ref        "a"   or   "a":(pre)size
    dim sharding    {"a", "b":(1)2}   {"a", ?}   {?}   {}p1
    tensor sharding <@mesh, [{"a"}, {}], replicated={"b"}, unreduced={"c"}>   (or <mesh<[...]>, [...]>)
    manual axes     {"a", "b"}   or   #sdy<manual_axes{"a", "b"}>

Values the verifier would reject (unknown axes, bad sub-axes, ...) read fine: a repair tool has to hold them. What
MLIR's own parser rejects (a priority with leading zeros or beyond 64 bits, a malformed list) is a syntax error
here too. Pure: imports neither MLIR nor JAX.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from . import mlir_text as mt
from .mlir_text import Token
from .sharding import AxisRef, DimSharding, Mesh, MeshRef, ShardingPerValue, ShardingSyntaxError, TensorSharding

T = TypeVar("T")
INT64_MAX = 2**63 - 1


class Cursor:
    """A position in a token list, with the reads sdy syntax needs."""

    def __init__(self, text: str, tokens: list[Token] | None = None, pos: int = 0, end: int | None = None):
        self.text = text
        self.tokens = mt.tokenize(text) if tokens is None else tokens
        self.pos = pos
        self.end = len(self.tokens) if end is None else end

    def token(self, ahead: int = 0) -> Token | None:
        index = self.pos + ahead
        return self.tokens[index] if index < self.end else None

    def spelling(self, ahead: int = 0) -> str:
        token = self.token(ahead)
        return "" if token is None else self.text[token.start:token.end]

    def at(self, spelling: str, ahead: int = 0) -> bool:
        return self.spelling(ahead) == spelling

    def accept(self, spelling: str) -> bool:
        if self.at(spelling):
            self.pos += 1
            return True
        return False

    def expect(self, spelling: str) -> None:
        if not self.accept(spelling):
            self.fail(f"expected '{spelling}' but found {self.describe()}")

    def take(self, kind: str, what: str) -> str:
        token = self.token()
        if token is None or token.kind != kind:
            self.fail(f"expected {what} but found {self.describe()}")
        self.pos += 1
        return self.text[token.start:token.end]

    def describe(self) -> str:
        token = self.token()
        return "end of input" if token is None else f"'{self.text[token.start:token.end]}'"

    def offset(self) -> int:
        token = self.token()
        return len(self.text) if token is None else token.start

    def fail(self, message: str):
        raise ShardingSyntaxError(message, self.offset())

    def integer(self) -> int:
        negative = self.accept("-")
        digits = self.take(mt.INTEGER, "an integer")
        value = int(digits, 16) if digits.startswith("0x") else int(digits)
        return -value if negative else value

    def separated(self, close: str, item: Callable[[], T]) -> list[T]:
        """Items separated by commas up to `close` (consumed)."""
        items: list[T] = []
        if self.accept(close):
            return items
        while True:
            items.append(item())
            if self.accept(close):
                return items
            self.expect(",")


def read_string(c: Cursor, what: str = "a quoted axis name") -> str:
    return mt.unquote(c.take(mt.STRING, what))


def read_symbol(c: Cursor) -> str:
    name = c.take(mt.SYMBOL, "a symbol (@name)")[1:]
    return mt.unquote(name) if name.startswith('"') else name


def read_axis_ref(c: Cursor) -> AxisRef:
    name = read_string(c)
    if c.accept(":"):
        c.expect("(")
        pre = c.integer()
        c.expect(")")
        return AxisRef(name, pre, c.integer())
    return AxisRef(name)


def read_mesh(c: Cursor) -> Mesh:
    """`<["a"=2, ...], device_ids=[...]>`"""
    c.expect("<")
    c.expect("[")

    def axis() -> tuple[str, int]:
        name = read_string(c)
        c.expect("=")
        return name, c.integer()

    axes = c.separated("]", axis)
    device_ids = None
    if c.accept(","):
        c.expect("device_ids")
        c.expect("=")
        c.expect("[")
        device_ids = tuple(c.separated("]", c.integer))
    c.expect(">")
    return Mesh(tuple(axes), device_ids)


def read_dim(c: Cursor) -> DimSharding:
    c.expect("{")
    axes: list[AxisRef] = []
    closed = True
    if not c.accept("}"):
        while True:
            if c.accept("?"):
                closed = False
                c.expect("}")
                break
            axes.append(read_axis_ref(c))
            if c.accept("}"):
                break
            c.expect(",")
    return DimSharding(tuple(axes), closed, _priority(c))


def _priority(c: Cursor) -> int | None:
    """`p<number>` right after a dim's `}`: MLIR lexes it as one identifier."""
    token = c.token()
    if token is None or token.kind != mt.IDENT or c.text[token.start] != "p" or \
            token.start != c.tokens[c.pos - 1].end:
        return None
    digits = c.text[token.start + 1:token.end]
    if not digits or not digits.isdigit() or not digits.isascii():
        c.fail(f"expected a priority p<number> but found '{c.text[token.start:token.end]}'")
    if len(digits) > 1 and digits[0] == "0":
        c.fail(f"a priority has no leading zeros: '{c.text[token.start:token.end]}'")
    value = int(digits)
    if value > INT64_MAX:
        c.fail(f"priority {value} is beyond 64 bits")
    c.pos += 1
    return value


def read_tensor_sharding_body(c: Cursor) -> TensorSharding:
    """`<@mesh, [...], replicated={...}, unreduced={...}>` or `<mesh<[...]>, [...]>`"""
    c.expect("<")
    mesh: MeshRef
    if c.token() is not None and c.token().kind == mt.SYMBOL:
        mesh = read_symbol(c)
    else:
        c.expect("mesh")
        mesh = read_mesh(c)
    c.expect(",")
    c.expect("[")
    dims = c.separated("]", lambda: read_dim(c))
    extra: dict[str, tuple[AxisRef, ...]] = {"replicated": (), "unreduced": ()}
    while c.accept(","):
        keyword = c.take(mt.IDENT, "'replicated' or 'unreduced'")
        if keyword not in extra:
            c.pos -= 1
            c.fail(f"expected 'replicated' or 'unreduced' but found '{keyword}'")
        c.expect("=")
        c.expect("{")
        extra[keyword] = tuple(c.separated("}", lambda: read_axis_ref(c)))
    c.expect(">")
    return TensorSharding(mesh, tuple(dims), extra["replicated"], extra["unreduced"])


def read_manual_axes(c: Cursor) -> tuple[str, ...]:
    """`{"a", "b"}` (in a manual computation's custom syntax) or `#sdy<manual_axes{"a", "b"}>`"""
    wrapped = c.accept("#sdy")
    if wrapped:
        c.expect("<")
        c.expect("manual_axes")
    c.expect("{")
    axes = tuple(c.separated("}", lambda: read_string(c)))
    if wrapped:
        c.expect(">")
    return axes


def _whole(text: str, read: Callable[[Cursor], T]) -> T:
    c = Cursor(text)
    if any(t.kind == mt.ERROR for t in c.tokens):
        bad = next(t for t in c.tokens if t.kind == mt.ERROR)
        raise ShardingSyntaxError(f"unexpected '{text[bad.start:bad.end]}'", bad.start)
    value = read(c)
    if c.token() is not None:
        c.fail(f"unexpected trailing text {c.describe()}")
    return value


def parse_mesh(text: str) -> Mesh:
    """Read `<["a"=2, ...]>` or `#sdy.mesh<[...]>`."""
    def read(c: Cursor) -> Mesh:
        c.accept("#sdy.mesh")
        return read_mesh(c)
    return _whole(text, read)


def parse_tensor_sharding(text: str) -> TensorSharding:
    """Read `#sdy.sharding<...>` or the bare `<...>` form of op syntax."""
    def read(c: Cursor) -> TensorSharding:
        c.accept("#sdy.sharding")
        return read_tensor_sharding_body(c)
    return _whole(text, read)


def parse_sharding_per_value(text: str) -> ShardingPerValue:
    """Read `#sdy.sharding_per_value<[...]>`."""
    def read(c: Cursor) -> ShardingPerValue:
        c.expect("#sdy.sharding_per_value")
        c.expect("<")
        c.expect("[")
        values = c.separated("]", lambda: read_tensor_sharding_body(c))
        c.expect(">")
        return ShardingPerValue(tuple(values))
    return _whole(text, read)


def parse_manual_axes(text: str) -> tuple[str, ...]:
    """Read `#sdy<manual_axes{"a", "b"}>` or `{"a", "b"}`."""
    return _whole(text, read_manual_axes)


def drop_edges(text: str, keep_axis: Callable[[str], bool]) -> tuple[str, list[str]] | None:
    """`#sdy.propagation_edges<[{step-N = [{"axis" = source -> [targets]}, ...]}, ...]>` (debug information
    about propagation) without the edges whose axis `keep_axis` rejects, and the axes dropped; steps left empty go
    too. None when the text isn't in that syntax."""
    c = Cursor(text)
    span = lambda first, last: text[c.tokens[first].start:c.tokens[last].end]  # noqa: E731
    dropped: list[str] = []
    steps: list[str] = []
    try:
        c.expect("#sdy.propagation_edges")
        c.expect("<")
        c.expect("[")
        while not c.accept("]"):
            header = c.pos
            c.expect("{")
            c.take(mt.IDENT, "'step'")
            c.expect("-")
            c.integer()
            c.expect("=")
            c.expect("[")
            head = span(header, c.pos - 1)
            edges: list[str] = []
            while not c.accept("]"):
                first = c.pos
                c.expect("{")
                axis = read_axis_ref(c)
                while not c.accept("}"):
                    if c.token() is None:
                        c.fail("unterminated edge")
                    c.pos += 1
                if keep_axis(axis.name):
                    edges.append(span(first, c.pos - 1))
                else:
                    dropped.append(axis.name)
                if not c.at("]"):
                    c.expect(",")
            c.expect("}")
            if edges:
                steps.append(head + ", ".join(edges) + "]}")
            if not c.at("]"):
                c.expect(",")
        c.expect(">")
    except ShardingSyntaxError:
        return None
    if not dropped:
        return text, []
    return "#sdy.propagation_edges<[" + ", ".join(steps) + "]>", dropped
