"""The parts of an op's MLIR bytecode (`Operation.write_bytecode`) that structural keys compare: the string table,
and everything else. Writing bytecode costs about a fifth of printing the same op as text, and the bytecode holds
the op exactly (locations included), with every string (symbol names among them) once, in the string section, and
referenced from everywhere else by its index.

The format (mlir/docs/BytecodeFormat.md, stable across the MLIR versions JAX 0.10.2 to 0.12 ship): a header (the
magic "ML\\xefR", a varint version, a NUL-terminated producer), then sections, each an id byte (bit 7: aligned), a
varint length, for aligned sections a varint alignment and padding, then its data. The string section (id 0) is a
varint count, the strings' lengths plus one (for the NUL) in reverse order, then the NUL-terminated strings."""

from __future__ import annotations

import io

from jaxlib.mlir import ir

_MAGIC = b"ML\xefR"
_STRINGS = 0


class Unreadable(ValueError):
    """Bytecode this reader does not follow (the caller falls back to the op's text)."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """MLIR's prefix varint at `at`: (value, offset after it). The trailing zeros of the first byte say how many
    bytes follow it."""
    first = data[at]
    if first & 1:
        return first >> 1, at + 1
    if first == 0:
        return int.from_bytes(data[at + 1:at + 9], "little"), at + 9
    size = (first & -first).bit_length()
    return int.from_bytes(data[at:at + size], "little") >> size, at + size


def split(op: ir.Operation) -> tuple[list[bytes], list[tuple[int, bytes]]]:
    """(the op's bytecode string table in index order, every other section as (id, data) in order, the header as
    section -1). Raises Unreadable where the bytecode is not as described above."""
    stream = io.BytesIO()
    op.write_bytecode(stream)
    data = stream.getvalue()
    try:
        if not data.startswith(_MAGIC):
            raise Unreadable("no bytecode magic")
        _, at = _varint(data, len(_MAGIC))
        at = data.index(b"\0", at) + 1
        sections: list[tuple[int, bytes]] = [(-1, data[:at])]
        strings: list[bytes] | None = None
        while at < len(data):
            ident = data[at]
            size, at = _varint(data, at + 1)
            if ident & 0x80:
                alignment, at = _varint(data, at)
                at += -at % alignment
            body, at = data[at:at + size], at + size
            if len(body) != size:
                raise Unreadable("a section runs past the end")
            if ident & 0x7F == _STRINGS:
                strings = _strings(body)
            else:
                sections.append((ident & 0x7F, body))
    except IndexError:
        raise Unreadable("truncated") from None
    if strings is None:
        raise Unreadable("no string section")
    return strings, sections


_EVEN = bytes(range(0, 256, 2))


def _strings(body: bytes) -> list[bytes]:
    count, at = _varint(body, 0)
    lengths = body[at:at + count]
    if lengths.translate(None, _EVEN) == lengths:  # all odd: each a one-byte varint (every string under 127 bytes)
        at += count
    else:
        for _ in range(count):
            _, at = _varint(body, at)
    # the NUL-terminated strings, in index order (the lengths only delimit them: NUL ends each, and is in none)
    out = body[at:].split(b"\0")
    if len(out) != count + 1 or out.pop():
        raise Unreadable("the strings are not as many NUL-terminated strings as counted")
    return out


__all__ = ["Unreadable", "split"]
