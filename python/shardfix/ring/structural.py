"""Structural keys: equal for ops that are the same program up to the names of the functions they call (the layers
of a model, each its own shard_map with its own copies of the kernel's helpers).

A key is the op's text as printed without locations, every callee's name replaced by the callee's own key (a
digest of it): linear in the module, each op and function keyed once. Printing is most of what keys cost (a model
whose every layer has its own copies is printed whole), so a function is printed only when no function with the
same bytecode signature was printed before. Its signature is its bytecode without locations (a copy of it with
every location made unknown: bytecode.py; writing it costs about a fifth of printing), each string of its string
table that names a function replaced by that function's key digest, its own name by a marker. Two functions with
the same signature are the same program up to the strings that differ, each of which names functions with equal
keys; where such a string differs, the key is taken over only if the printed function's text shows it nowhere but
as a symbol reference (`@name`, which the key replaces by the callee's key digest, and the header, which the key
leaves out): then the other function, printed, would differ only in references to functions with equal keys, and
has the same key. Anything else (a name also used as a string, a recursive function, bytecode this reader does
not follow) is printed. The text is kept as the printer's bytes (decoding it would cost a sixth of the printing).

A ring region (a manual computation: isolated from above, so its body reads nothing but its arguments) is keyed the
same way: its signature is the bytecode of a copy of it without locations, its operands made the arguments of a
scratch function (printed alone, the op shows its operands as unknown values, so which values they are is no part
of the key either; the group's key says where they come from), and it is printed only when no region with the same
signature was printed before (a model whose every layer is its own shard_map repeats a few regions)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from jaxlib.mlir import ir, passmanager

from . import bytecode

if TYPE_CHECKING:
    from .detect import RingRegion

# a symbol reference, as the printer writes it; not a custom call's target, which it writes the same way
# (`stablehlo.custom_call @Sharding(...)`) though it names no function: a function of that name is another thing.
# The `@` comes first and the look-behind after it (the same matches as `(?<!custom_call )@...`): a pattern that
# starts with a literal is searched for that byte, one that starts with a look-behind is tried at every position
# (ten times slower over a region's text)
_TARGET = b"custom_call @"
# a quoted string (left as written: "@f1" is text, not a reference, whatever f1's key) or a symbol reference
_SYMBOL = re.compile(rb'"(?:[^"\\]|\\.)*"|@(?<!custom_call @)([A-Za-z0-9_$.\-]+)')
_BARE = re.compile(rb"[A-Za-z_][A-Za-z0-9_$.]*\Z")  # a name the printer writes unquoted, as `@name`
_WORD = re.compile(rb"[A-Za-z0-9_$]")
_SELF = b"\0self"  # the function's own name in a string table (strings hold no NUL: this is none of them)
_NO_NAME = b"\0op"  # what a region printed for others to take its key over is named: no string of its text
_ISOLATED = "sdy.manual_computation"  # the ops keyed by their signature: isolated from above (the others printed)


@dataclass
class _Printed:
    """A function keyed by its text, for those with the same bytecode signature to take its key over."""

    name: bytes
    strings: list[bytes]  # its bytecode string table, each function's name replaced as in the signature
    raw: list[bytes]  # the same, as written
    text: bytes  # as printed
    key: bytes | str  # a function's key (its normalised text), or a region's (the digest `of` gives)
    _only_referenced: dict[bytes, bool] = field(default_factory=dict)

    def only_referenced(self, name: bytes) -> bool:
        """Whether the text shows `name` only as whole symbol references (`@name`, then no `.` or `-` that would
        make the reference a longer one), and its own name only in the header. An occurrence inside a longer word
        (`closed_call_4` in `closed_call_41`) is no printing of the string: the printer glues no string to a
        letter, digit, `_` or `$`."""
        found = self._only_referenced.get(name)
        if found is None:
            text, shown = self.text, 0
            found = True
            for match in re.finditer(re.escape(name), text):
                before, after = text[match.start() - 1:match.start()], text[match.end():match.end() + 1]
                if _WORD.match(before) or _WORD.match(after):
                    continue
                shown += 1
                if before != b"@" or after in (b".", b"-") or text[match.start() - 2:match.start() - 1] == b'"' or \
                        text[match.start() - len(_TARGET):match.start()] == _TARGET:
                    found = False
                    break
            self._only_referenced[name] = found = found and (name != self.name or shown == 1)
        return found


class StructuralKeys:
    """Keys equal for ops that are the same program up to the names of the functions they call (module docstring)."""

    def __init__(self, funcs: dict[str, ir.Operation]):
        self.funcs = funcs
        self._names = {name.encode(): name for name in funcs}
        self._keys: dict[str, bytes] = {}
        self._digests: dict[str, bytes] = {}  # function name -> digest of its key
        # a symbol reference as written -> what the key writes for it (`_normalised`): every match of the same
        # name gets the same replacement once its function's digest is final
        self._replaced: dict[bytes, bytes] = {}
        self._printed: dict[bytes, _Printed] = {}  # bytecode signature -> the first function printed with it
        self._printed_ops: dict[bytes, _Printed] = {}  # the same for regions
        self.printed: list[str] = []  # the functions keyed by their text, in order (the others took a key over)
        self.printed_ops = 0  # how many regions were keyed by their text (the others took a key over)
        self._stripping: tuple[ir.Module, passmanager.PassManager] | None = None  # where `_split` strips copies
        self._holders: dict[tuple[ir.Type, ...], tuple] = {}  # see `_split_op`

    def of_ring(self, ring: RingRegion) -> str:
        """The key of a ring region's op, kept on the region (the proof's memo and the layout's both ask)."""
        found = ring._read.get("structure")
        if found is None:
            found = ring._read["structure"] = self.of(ring.region)
        return found

    def of(self, op: ir.Operation) -> str:
        signed = None
        if op.name == _ISOLATED:
            try:
                signed = self._signed(*self._split_op(op), None, set())
            except bytecode.Unreadable:
                pass
        if signed is not None:
            found = self._same_as_printed(self._printed_ops, *signed)
            if found is not None:
                return cast(str, found)
        text = cast(bytes, op.get_asm(binary=True, use_local_scope=True, assume_verified=True))
        self.printed_ops += 1
        key = hashlib.blake2b(self._normalised(text, set()), digest_size=16).hexdigest()
        if signed is not None:
            signature, strings, raw = signed
            self._printed_ops.setdefault(signature, _Printed(_NO_NAME, strings, raw, text, key))
        return key

    def _function(self, name: str, calling: set) -> bytes:
        found = self._keys.get(name)
        if found is None:
            if name in calling:
                return b"@" + name.encode()  # recursion: the name stands for itself
            inner = calling | {name}
            signed = self._signature(name, inner)
            if signed is not None:
                found = cast("bytes | None", self._same_as_printed(self._printed, *signed))
            if found is None:
                text = cast(bytes, self.funcs[name].get_asm(binary=True, use_local_scope=True,
                                                            assume_verified=True))
                self.printed.append(name)
                found = self._normalised(text[text.index(b"(", text.index(b"@")):], inner)  # own name left out
                if signed is not None:
                    signature, strings, raw = signed
                    self._printed.setdefault(signature, _Printed(name.encode(), strings, raw, text, found))
            self._keys[name] = found
        return found

    def _signature(self, name: str, calling: set) -> tuple[bytes, list[bytes], list[bytes]] | None:
        """(digest of the function's bytecode with each string naming a function replaced by that function's key
        digest and its own name by _SELF, those strings, the strings as written); None where the bytecode can't be
        read or names a function being keyed (recursion: printed)."""
        try:
            raw, sections = self._split(name)
        except bytecode.Unreadable:
            return None
        return self._signed(raw, sections, name.encode(), calling)

    def _signed(self, raw: list[bytes], sections: list[tuple[int, bytes]], own: bytes | None,
                calling: set) -> tuple[bytes, list[bytes], list[bytes]] | None:
        """`_signature` of split bytecode; `own`: the function's name (None for a region: it has none)."""
        names = self._names
        strings = list(raw)
        # most strings name no function (types, attributes, dialects): only those that do are looked at
        for i in [i for i, s in enumerate(raw) if s in names]:
            s = raw[i]
            callee = names[s]
            if s == own:
                strings[i] = _SELF
            elif callee in calling:
                return None
            else:
                strings[i] = b"\0" + self._digest(callee, calling)
        hashed = hashlib.blake2b(b"".join(b"%d:%d:" % (ident, len(body)) + body for ident, body in sections),
                                 digest_size=16)
        # one for each list of strings: no string holds a NUL but a marker, as its first byte, so each run of NULs
        # reads back as separators, empty strings between them and whether a marker follows
        hashed.update(b"%d:" % len(strings) + b"\0\0".join(strings))
        return hashed.digest(), strings, raw

    def _split(self, name: str) -> tuple[list[bytes], list[tuple[int, bytes]]]:
        """bytecode.split of the function without its locations: a copy of it, alone in a scratch module, with
        every location made unknown (the text a key is made of has no locations, and bytecode has them all: a
        layer's source lines, the text position a parsed module gives each value written without one; locations
        inside attributes stay, as in the text). Only the functions keyed are copied (a model whose layers share
        their kernel keys a few)."""
        original = self.funcs[name]
        scratch, strip = self._scratch(original.context)
        copy = original.clone(ir.InsertionPoint(scratch.body))
        try:
            strip.run(scratch.operation)
            return bytecode.split(copy)
        finally:
            copy.erase()

    def _split_op(self, op: ir.Operation) -> tuple[list[bytes], list[tuple[int, bytes]]]:
        """bytecode.split of a region without its locations: a copy of it in a scratch function whose arguments
        are its operands, stripped as `_split` strips a function; the function's bytecode is split (an op's own
        would name values it doesn't hold). The copy reads the region's operands when made and is handed the
        arguments before anything else is done; its body reads nothing else (the op is isolated from above)."""
        context = op.context
        scratch, strip = self._scratch(context)
        types = [value.type for value in op.operands]
        # the holder's attributes and its arguments' locations, made once per list of operand types (a model's
        # layers repeat a few)
        made = self._holders.get(tuple(types))
        if made is None:
            unknown = ir.Location.unknown(context)
            made = self._holders[tuple(types)] = (
                {"sym_name": ir.StringAttr.get("region", context),
                 "function_type": ir.TypeAttr.get(ir.FunctionType.get(types, [], context), context)},
                unknown, [unknown] * len(types))
        attributes, unknown, locations = made
        holder = ir.Operation.create("func.func", regions=1, loc=unknown, ip=ir.InsertionPoint(scratch.body),
                                     attributes=attributes)
        try:
            block = ir.Block.create_at_start(holder.regions[0], types, locations)
            operands = op.clone(ir.InsertionPoint(block)).operands
            for i, argument in enumerate(block.arguments):
                operands[i] = argument
            del operands  # (no handle into the holder outlives it)
            strip.run(scratch.operation)
            return bytecode.split(holder)
        finally:
            holder.erase()

    def _scratch(self, context: ir.Context) -> tuple[ir.Module, passmanager.PassManager]:
        """The module copies are stripped in, and the pass manager that strips them (made once)."""
        if self._stripping is None:
            strip = passmanager.PassManager.parse("builtin.module(strip-debuginfo)", context)
            strip.enable_verifier(False)  # a copy read as it is: nothing to verify
            self._stripping = ir.Module.create(ir.Location.unknown(context)), strip
        return self._stripping

    @staticmethod
    def _same_as_printed(printed_by: dict[bytes, _Printed], signature: bytes, strings: list[bytes],
                         raw: list[bytes]) -> bytes | str | None:
        """The key of the function (or region) printed with this signature, where it is this one's key too
        (module docstring), else None."""
        printed = printed_by.get(signature)
        if printed is None or printed.strings != strings:
            return None
        for theirs, ours in zip(printed.raw, raw):
            if theirs != ours and not (_BARE.match(theirs) and _BARE.match(ours)
                                       and printed.only_referenced(theirs)):
                return None
        return printed.key

    def _digest(self, name: str, calling: set) -> bytes:
        digest = self._digests.get(name)
        if digest is None:
            digest = hashlib.blake2b(self._function(name, calling), digest_size=16).hexdigest().encode()
            if name not in calling:
                self._digests[name] = digest
        return digest

    def _normalised(self, text: bytes, calling: set) -> bytes:
        names, replaced = self._names, self._replaced

        def replace(match: re.Match) -> bytes:
            raw = match.group(1)
            if raw is None:
                return match.group(0)  # a string
            found = replaced.get(raw)
            if found is not None:
                return found
            name = names.get(raw)
            if name is None:  # no function's name (a mesh's, most often): as written, whoever asks
                found = replaced[raw] = match.group(0)
                return found
            found = b"@{" + self._digest(name, calling) + b"}"
            if name in self._digests:  # final (a name being keyed stands for itself only while it is)
                replaced[raw] = found
            return found

        return _SYMBOL.sub(replace, text)


__all__ = ["StructuralKeys"]
