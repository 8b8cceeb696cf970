"""Stand-ins for sdy ops written in MLIR's generic form, `"name"(operands) <{properties}> ({regions}) {attributes}
: type`, where shardings are inherent attributes (properties, or entries of the attribute dictionary): the part of
the stand-in scanner (shardfix.standins) that reads them.

A sharding_constraint's or reshard's sharding is held behind one the verifier takes on anything; a data_flow_edge's
and a named computation's (optional) are left out; a manual computation's in/out shardings and manual axes are
replaced by ones that fit its body; an `sdy.mesh` definition (inline or through an alias) is read for the shardings
that name it. The dictionary holding them is written again as a whole. A property holding another kind of attribute
than the op takes is left as written, for MLIR's own error. Pure: imports neither MLIR nor JAX.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import mlir_text as mt
from .sdy_syntax import Cursor, parse_manual_axes, parse_sharding_per_value, read_mesh

SINGLE_DEVICE = "<mesh<[], device_ids=[0]>, []>"  # a sharding the verifier takes on any value


def _is_a(attribute_text: str, start: str) -> bool:
    """Whether an attribute's text starts with `start` (`#sdy<manual_axes`, say), whitespace between its tokens
    aside."""
    return "".join(attribute_text[:len(start) + 64].split()).startswith(start)


class GenericForms:
    """The generic-form readers of the stand-in scanner (a mixin of standins._Rewriter, whose state they use: the
    token scan `s`, `hold`, `edits`, `_tag`, `_attribute_text`, `is_frozen`, `statement` and `_manual_parts`)."""

    def _generic(self, index: int, name: str) -> None:
        if name not in _OPS:
            return
        s = self.s
        if not s.is_punct(index + 1, "("):
            return
        operands_close = s.group_end(index + 1)
        i = operands_close + 1
        in_properties = s.is_punct(i, "<") and s.is_punct(i + 1, "{")
        after = s.group_end(i) if in_properties else operands_close
        regions = (after + 1, s.group_end(after + 1)) if s.is_punct(after + 1, "(") else None
        tag_after = regions[1] if regions else after
        # the inherent attributes: properties, or (MLIR takes that too) the attribute dictionary after the regions
        holder = i + 1 if in_properties else tag_after + 1
        if not s.is_punct(holder, "{"):
            return
        found = self._entries(holder, s.group_end(holder))
        if found is None:
            return
        target = _Dictionary(holder, s.group_end(holder), found, in_properties, tag_after)
        if name == "sdy.mesh":
            self._generic_mesh(found)
        elif name == "sdy.manual_computation":
            self._generic_manual(index, target, regions)
        else:
            self._generic_sharded(index, name, target, regions)

    def _generic_sharded(self, index: int, name: str, target: "_Dictionary", regions) -> None:
        """A sharding_constraint's or reshard's sharding, a data_flow_edge's, a named computation's lists."""
        s = self.s
        keys = ("sharding",) if name != "sdy.named_computation" else ("in_shardings", "out_shardings")
        present = [k for k in keys if k in target.entries]
        if not present:
            return
        block_args = s.names_in(*self._block_args(regions)) if regions else ()
        if self.is_frozen(self.statement.results + block_args, index):
            return
        texts = {key: self._entry_text(target, key) for key in present}
        kind = "#sdy.sharding<" if name != "sdy.named_computation" else "#sdy.sharding_per_value<"
        if any(not _is_a(text, kind) for text in texts.values()):
            return  # not the attribute the op takes there: MLIR's own error says so
        held = {key: self.hold(texts[key]) for key in present}
        if name in ("sdy.sharding_constraint", "sdy.reshard"):  # required: one the verifier takes on anything
            self._rewrite(target, held, {"sharding": "#sdy.sharding" + SINGLE_DEVICE})
        else:  # optional: left out
            self._rewrite(target, held, {key: None for key in present})

    def _generic_mesh(self, entries: dict) -> None:
        """`"sdy.mesh"() <{mesh = #sdy.mesh<[...]>, sym_name = "name"}>`: the mesh, for the shardings naming it."""
        if "mesh" not in entries or "sym_name" not in entries:
            return
        s = self.s
        name_token = entries["sym_name"][1]
        if s.tokens[name_token].kind != mt.STRING:
            return
        _, first, last = entries["mesh"]
        text = self._attribute_text(s.tokens[first].start, s.tokens[last].end)  # an alias stands for its value
        c = Cursor(text)
        c.accept("#sdy.mesh")
        mesh = read_mesh(c)
        if c.token() is None:
            self.s.meshes[mt.unquote(s.spelling(name_token))] = mesh

    def _entries(self, open_index: int, close_index: int) -> dict[str, tuple[int, int, int]] | None:
        """The entries of an attribute dictionary: name -> (its token, its value's first and last token); None
        when it holds something else (an entry without a value, say)."""
        s = self.s
        entries, i = {}, open_index + 1
        while i < close_index:
            if s.tokens[i].kind not in (mt.IDENT, mt.STRING) or not s.is_punct(i + 1, "=") or i + 2 >= close_index:
                return None
            key = mt.unquote(s.spelling(i)) if s.tokens[i].kind == mt.STRING else s.spelling(i)
            first = i + 2
            last = s.group_end(first)
            while last + 1 < close_index and not s.is_punct(last + 1, ","):
                last = s.group_end(last + 1)
            entries[key] = (i, first, last)
            i = last + 2
        return entries

    def _entry_text(self, target: "_Dictionary", key: str) -> str:
        _, first, last = target.entries[key]
        return self._attribute_text(self.s.tokens[first].start, self.s.tokens[last].end)

    def _rewrite(self, target: "_Dictionary", held: dict[str, int], values: dict[str, str | None]) -> None:
        """Write the dictionary again: entries in `values` get that value (None: left out), the others stay as
        written (on one line, comments dropped); the op is tagged with the numbers of its held attributes, in this
        dictionary when it is the attribute dictionary, else in one after the regions."""
        s = self.s
        parts = []
        for key, (key_index, first, last) in target.entries.items():
            if key in values:
                if values[key] is not None:
                    parts.append(f"{s.spelling(key_index)} = {values[key]}")
            else:
                parts.append(self._one_line(key_index, last))
        if target.in_properties:
            self._tag(target.tag_after, held)
        else:
            tag = len(self.out.tagged_ops)
            self.out.tagged_ops[tag] = held
            parts.insert(0, f"{self.out.prefix} = {tag}")
        self.edits.append((s.tokens[target.open].end, s.tokens[target.close].start, ", ".join(parts)))

    def _one_line(self, first: int, last: int) -> str:
        """The text of tokens first..last, the space between two of them a single space where it holds a line
        break or a comment (else as written: `4x8xf32` stays whole)."""
        s = self.s
        pieces = [s.spelling(first)]
        for k in range(first + 1, last + 1):
            gap = s.text[s.tokens[k - 1].end:s.tokens[k].start]
            pieces.append(" " if "\n" in gap or "/" in gap else gap)
            pieces.append(s.spelling(k))
        return "".join(pieces)

    def _block_args(self, regions: tuple[int, int]) -> tuple[int, int]:
        """The bracket group of the first block's arguments in `({ ^bb0(...): ... })`, or an empty span."""
        s = self.s
        i = regions[0] + 1
        if s.is_punct(i, "{") and s.spelling(i + 1).startswith("^") and s.is_punct(i + 2, "("):
            return i + 2, s.group_end(i + 2)
        return i, i

    def _generic_manual(self, index: int, target: "_Dictionary", regions) -> None:
        s = self.s
        keys = ("in_shardings", "out_shardings", "manual_axes")
        if regions is None or any(k not in target.entries for k in keys):
            return
        texts = {k: self._entry_text(target, k) for k in keys}
        if not (_is_a(texts["in_shardings"], "#sdy.sharding_per_value<") and
                _is_a(texts["out_shardings"], "#sdy.sharding_per_value<") and
                _is_a(texts["manual_axes"], "#sdy<manual_axes")):
            return  # not the attributes the op takes there: MLIR's own error says so
        lists = {k: list(parse_sharding_per_value(texts[k]).shardings) for k in ("in_shardings", "out_shardings")}
        axes = parse_manual_axes(texts["manual_axes"])
        block_open, block_close = self._block_args(regions)
        local_in = s.typed_list(block_open + 1, block_close) if block_close > block_open else []
        region = (regions[0] + 1, s.group_end(regions[0] + 1))
        parts = self._manual_parts(index, lists, axes, (block_open, block_close), local_in, region, target.tag_after)
        if parts is None:
            return
        ins, outs, manual, _ = parts
        held = {name: self.hold(value) for name, value in texts.items()}
        self._rewrite(target, held, {"in_shardings": f"#sdy.sharding_per_value<{ins}>",
                                     "out_shardings": f"#sdy.sharding_per_value<{outs}>",
                                     "manual_axes": f"#sdy<manual_axes{manual}>"})


@dataclass
class _Dictionary:
    """Where an op in the generic form holds its inherent attributes."""

    open: int  # its `{` and `}` tokens
    close: int
    entries: dict[str, tuple[int, int, int]]
    in_properties: bool  # `<{...}>`; else the attribute dictionary
    tag_after: int  # the token the op's attribute dictionary (if any) follows


_OPS = frozenset({"sdy.sharding_constraint", "sdy.reshard", "sdy.data_flow_edge", "sdy.named_computation",
                  "sdy.manual_computation", "sdy.mesh"})
