"""Source locations: MLIR location syntax read into call-site frames, and the user's frame picked out of them.

JAX records each op's Python traceback as a chain of MLIR call-site locations (innermost frame first), wrapped
in name locations that carry the op's name scope:
    loc("jit(f)/dot_general"(callsite("inner"("model.py":7:11 to :78) at "f"("model.py":9:4))))
A report should point at the user's own line, which is the first frame outside JAX, the installed libraries
(site-packages: Flax, optax, ...) and shardfix itself.
Pure: imports neither MLIR nor JAX.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    """A source position; line and col are 0 when unknown."""

    file: str = ""
    line: int = 0
    col: int = 0
    name: str = ""  # a name location's name when there is no file position (JAX names arguments so)

    def __str__(self) -> str:
        if not self.file:
            return self.name
        if self.file.endswith(".py"):
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.line}:{self.col}"

    def __bool__(self) -> bool:
        return bool(self.file or self.name)


@dataclass(frozen=True)
class Frame:
    """One file position of a location, with the function name JAX gives it (empty when none)."""

    file: str
    line: int
    col: int
    function: str = ""
    end_line: int = 0  # where the expression ends (` to [line]:col`), 0 when the location doesn't say
    end_col: int = 0


@dataclass(frozen=True)
class ParsedLocation:
    frames: tuple[Frame, ...]  # innermost first
    names: tuple[str, ...]  # name locations without a file position under them (JAX's argument names, say)


class LocationSyntaxError(ValueError):
    pass


class _Reader:
    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def peek(self, token: str) -> bool:
        self.skip()
        return self.text.startswith(token, self.pos)

    def accept(self, token: str) -> bool:
        if self.peek(token):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str) -> None:
        if not self.accept(token):
            raise LocationSyntaxError(f"expected '{token}' at offset {self.pos} of {self.text!r}")

    def string(self) -> str:
        self.expect('"')
        out = []
        while self.pos < len(self.text) and self.text[self.pos] != '"':
            c = self.text[self.pos]
            if c == "\\" and self.pos + 1 < len(self.text):
                self.pos += 1
                c = self.text[self.pos]
                hexa = self.text[self.pos:self.pos + 2]
                if c not in '"\\' and len(hexa) == 2 and all(h in "0123456789abcdefABCDEF" for h in hexa):
                    c = chr(int(hexa, 16))  # MLIR escapes other bytes as two hex digits
                    self.pos += 1
            out.append(c)
            self.pos += 1
        self.expect('"')
        return "".join(out)

    def integer(self) -> int:
        self.skip()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isdigit():
            self.pos += 1
        if start == self.pos:
            raise LocationSyntaxError(f"expected a number at offset {start} of {self.text!r}")
        return int(self.text[start:self.pos])

    def skip_balanced(self, open_: str, close: str) -> None:
        """Skip a bracketed group (strings inside it included) starting at the current position."""
        self.expect(open_)
        depth = 1
        while self.pos < len(self.text) and depth:
            c = self.text[self.pos]
            if c == '"':
                self.string()
                continue
            depth += (c == open_) - (c == close)
            self.pos += 1


def parse_location(text: str) -> ParsedLocation:
    """Read the printed form of an MLIR location (`loc(...)`); unknown forms give no frames."""
    frames: list[Frame] = []
    names: list[str] = []
    reader = _Reader(text)
    try:
        reader.expect("loc(")
        _read(reader, frames, names, "")
        reader.expect(")")
    except LocationSyntaxError:
        return ParsedLocation(tuple(frames), tuple(names))
    return ParsedLocation(tuple(frames), tuple(names))


def _read(r: _Reader, frames: list[Frame], names: list[str], function: str) -> None:
    if r.accept("unknown"):
        return
    if r.accept("callsite("):
        _read(r, frames, names, function)
        r.expect("at")
        _read(r, frames, names, "")
        r.expect(")")
        return
    if r.accept("fused"):
        if r.peek("<"):
            r.skip_balanced("<", ">")
        r.expect("[")
        while not r.accept("]"):
            _read(r, frames, names, function)
            r.accept(",")
        return
    if r.peek('"'):
        text = r.string()
        if r.accept(":"):  # "file":line:col, optionally ` to [line]:col`
            line = r.integer()
            r.expect(":")
            col = r.integer()
            end_line = end_col = 0
            if r.accept("to"):
                end_line = line if r.peek(":") else r.integer()
                r.expect(":")
                end_col = r.integer()
            frames.append(Frame(text, line, col, function, end_line, end_col))
            return
        if r.accept("("):  # a name location around a child
            before = len(frames)
            _read(r, frames, names, text)
            r.expect(")")
            if len(frames) == before:
                names.append(text)
            return
        names.append(text)
        return
    raise LocationSyntaxError(f"unexpected location syntax at offset {r.pos} of {r.text!r}")


def location_name(text: str) -> str:
    """The name of the outermost name location of a printed MLIR location (JAX's name stack and primitive, as
    "jit(f)/while/body/closed_call"), "" when it has none."""
    reader = _Reader(text)
    try:
        reader.expect("loc(")
        if reader.peek('"'):
            name = reader.string()
            return name if reader.peek("(") else ""
    except LocationSyntaxError:
        pass
    return ""


# ---------------------------------------------------------------------------------------------------------------
# The user's frame.

_OWN_DIR = os.path.dirname(os.path.abspath(__file__))
_LIBRARY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_STDLIB_DIRS = tuple(sorted({os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib")}))


@functools.lru_cache(maxsize=4096)
def is_library_file(path: str) -> bool:
    """Installed libraries (JAX, Flax, ...), Python's standard library and shardfix: never the line a user wrote."""
    if not path or path.startswith("<frozen"):
        return True
    absolute = os.path.abspath(path)
    if absolute.startswith((_OWN_DIR + os.sep,) + _STDLIB_DIRS):
        return True
    return any(marker in absolute for marker in _LIBRARY_MARKERS)


def user_frame(frames) -> Frame | None:
    """The first frame (innermost first) in the user's own code; else the first frame at all."""
    frames = list(frames)
    for frame in frames:
        if not is_library_file(frame.file):
            return frame
    return frames[0] if frames else None


def source_loc_of(text: str) -> SourceLoc:
    """The user's position in a printed MLIR location, else its first name."""
    parsed = parse_location(text)
    frame = user_frame(parsed.frames)
    if frame is not None:
        return SourceLoc(frame.file, frame.line, frame.col)
    return SourceLoc(name=parsed.names[0]) if parsed.names else SourceLoc()


def caller_frame(skip: int = 1):
    """The innermost frame of the running Python stack in the user's own code (`skip` frames above this one's
    caller); None when there is none."""
    frame = sys._getframe(skip + 1)
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def caller_loc(skip: int = 1) -> SourceLoc:
    """The file and line of `caller_frame(skip)`."""
    frame = caller_frame(skip + 1)
    return SourceLoc() if frame is None else SourceLoc(frame.f_code.co_filename, frame.f_lineno)


def user_stacklevel() -> int:
    """The `stacklevel` that makes `warnings.warn`, called in a function that this function's caller calls, point
    at the user's own frame."""
    frame, level = sys._getframe(1), 2
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1
