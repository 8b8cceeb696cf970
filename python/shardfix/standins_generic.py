"""Stand-ins for sdy ops written in MLIR's generic form, `"name"(operands) <{properties}> ({regions}) {attributes}
: type`, where shardings are properties: the part of the stand-in scanner (shardfix.standins) that reads them.

A sharding_constraint's or reshard's sharding is held behind one the verifier takes on anything; a data_flow_edge's
and a named computation's (optional) are left out; a manual computation's in/out shardings and manual axes are
replaced by ones that fit its body; an `sdy.mesh` definition is read for the shardings that name it. A property
holding another kind of attribute than the op takes is left as written, for MLIR's own error. Pure: imports neither
MLIR nor JAX.
"""

from __future__ import annotations

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
        if name not in ("sdy.sharding_constraint", "sdy.reshard", "sdy.data_flow_edge", "sdy.named_computation",
                        "sdy.manual_computation", "sdy.mesh"):
            return
        s = self.s
        i = index + 1
        if not s.is_punct(i, "("):
            return
        operands = (i, s.group_end(i))
        i = operands[1] + 1
        if not (s.is_punct(i, "<") and s.is_punct(i + 1, "{")):
            return  # no properties: nothing held there
        props_close = s.group_end(i + 1)
        entries = self._entries(i + 1, props_close)
        after = s.group_end(i)
        regions = None
        if s.is_punct(after + 1, "("):
            regions = (after + 1, s.group_end(after + 1))
        tag_after = regions[1] if regions else after
        if name == "sdy.mesh":
            self._generic_mesh(entries)
            return
        if name == "sdy.manual_computation":
            self._generic_manual(index, entries, operands, regions, tag_after)
            return
        keys = ("sharding",) if name != "sdy.named_computation" else ("in_shardings", "out_shardings")
        present = [k for k in keys if k in entries]
        if not present:
            return
        block_args = s.names_in(*self._block_args(regions)) if regions else ()
        if self.is_frozen(self.statement.results + block_args, index):
            return
        texts = {key: self._attribute_text(s.tokens[entries[key][1]].start, s.tokens[entries[key][2]].end)
                 for key in present}
        kind = "#sdy.sharding<" if name != "sdy.named_computation" else "#sdy.sharding_per_value<"
        if any(not _is_a(text, kind) for text in texts.values()):
            return  # not the attribute the op takes there: MLIR's own error says so
        held = {}
        for key in present:
            key_index, first, last = entries[key]
            held[key] = self.hold(texts[key])
            if name in ("sdy.sharding_constraint", "sdy.reshard"):  # required: one the verifier takes on anything
                self.edits.append((s.tokens[first].start, s.tokens[last].end, "#sdy.sharding" + SINGLE_DEVICE))
            else:  # optional: left out
                self._drop_entry(key_index, last, props_close)
        self._tag(tag_after, held)

    def _generic_mesh(self, entries: dict) -> None:
        """`"sdy.mesh"() <{mesh = #sdy.mesh<[...]>, sym_name = "name"}>`: the mesh, for the shardings naming it."""
        if "mesh" not in entries or "sym_name" not in entries:
            return
        s = self.s
        name_token = entries["sym_name"][1]
        if s.tokens[name_token].kind != mt.STRING:
            return
        c = Cursor(s.text, s.tokens, entries["mesh"][1])
        c.accept("#sdy.mesh")
        self.s.meshes[mt.unquote(s.spelling(name_token))] = read_mesh(c)

    def _entries(self, open_index: int, close_index: int) -> dict[str, tuple[int, int, int]]:
        """The entries of an attribute dictionary: name -> (its token, its value's first and last token)."""
        s = self.s
        entries, i = {}, open_index + 1
        while i < close_index:
            if s.tokens[i].kind not in (mt.IDENT, mt.STRING) or not s.is_punct(i + 1, "="):
                return entries
            key = mt.unquote(s.spelling(i)) if s.tokens[i].kind == mt.STRING else s.spelling(i)
            first = i + 2
            last = s.group_end(first)
            while last + 1 < close_index and not s.is_punct(last + 1, ","):
                last = s.group_end(last + 1)
            entries[key] = (i, first, last)
            i = last + 2
        return entries

    def _drop_entry(self, key_index: int, last: int, close_index: int) -> None:
        """Leave a dictionary entry out, with the comma that separates it from the next (or the previous)."""
        s = self.s
        start, end = s.tokens[key_index].start, s.tokens[last].end
        if s.is_punct(last + 1, ","):
            end = s.tokens[last + 2].start if last + 2 < close_index else s.tokens[last + 1].end
        elif s.is_punct(key_index - 1, ","):
            start = s.tokens[key_index - 1].start
        self.edits.append((start, end, ""))

    def _block_args(self, regions: tuple[int, int]) -> tuple[int, int]:
        """The bracket group of the first block's arguments in `({ ^bb0(...): ... })`, or an empty span."""
        s = self.s
        i = regions[0] + 1
        if s.is_punct(i, "{") and s.spelling(i + 1).startswith("^") and s.is_punct(i + 2, "("):
            return i + 2, s.group_end(i + 2)
        return i, i

    def _generic_manual(self, index: int, entries: dict, operands: tuple[int, int], regions, tag_after: int) -> None:
        s = self.s
        if regions is None or any(k not in entries for k in ("in_shardings", "out_shardings", "manual_axes")):
            return
        texts = {k: self._attribute_text(s.tokens[entries[k][1]].start, s.tokens[entries[k][2]].end)
                 for k in ("in_shardings", "out_shardings", "manual_axes")}
        if not (_is_a(texts["in_shardings"], "#sdy.sharding_per_value<") and
                _is_a(texts["out_shardings"], "#sdy.sharding_per_value<") and
                _is_a(texts["manual_axes"], "#sdy<manual_axes")):
            return  # not the attributes the op takes there: MLIR's own error says so
        lists = {k: list(parse_sharding_per_value(texts[k]).shardings) for k in ("in_shardings", "out_shardings")}
        axes = parse_manual_axes(texts["manual_axes"])
        block_open, block_close = self._block_args(regions)
        local_in = s.typed_list(block_open + 1, block_close) if block_close > block_open else []
        region_open, region_close = regions[0] + 1, s.group_end(regions[0] + 1)
        local_out = s.return_types(region_open, region_close)
        c = Cursor(s.text, s.tokens, tag_after + 1)
        if c.at("{"):
            c.pos = s.group_end(c.pos) + 1
        c.expect(":")
        global_in, global_out = s.function_type(c)
        parts = self._manual_parts(index, lists, axes, (block_open, block_close), region_close,
                                   {"in_shardings": (global_in, local_in), "out_shardings": (global_out, local_out)})
        if parts is None:
            return
        ins, outs, manual, _ = parts
        held = {name: self.hold(value) for name, value in texts.items()}
        for key, text in (("in_shardings", f"#sdy.sharding_per_value<{ins}>"),
                          ("out_shardings", f"#sdy.sharding_per_value<{outs}>"),
                          ("manual_axes", f"#sdy<manual_axes{manual}>")):
            _, first, last = entries[key]
            self.edits.append((s.tokens[first].start, s.tokens[last].end, text))
        self._tag(tag_after, held)
