"""Sharding changes collected during a pass and written at the end, once per attribute: a function's argument
attributes are rebuilt once however many of its arguments change, an op's per-value list once however many of
its values do. That keeps a pass linear in the module's size."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from ..sharding import TensorSharding
from .attrs import sharding_to_attr

if TYPE_CHECKING:
    from .walker import ShardingSite

_FUNCTION_KEYS = ("arg_attrs", "res_attrs")


class Edits:
    def __init__(self):
        self.per_value: dict[tuple[ir.Operation, str], dict[int, TensorSharding]] = {}
        self.attributes: dict[tuple[ir.Operation, str], ir.Attribute | TensorSharding | None] = {}
        self.entries: dict[tuple[ir.Operation, str], dict[int, dict[str, ir.Attribute | None]]] = {}
        self.changed = 0

    def set_site(self, site: "ShardingSite", new: TensorSharding) -> None:
        """Give the site a new sharding."""
        self.changed += 1
        if site.attr_name in _FUNCTION_KEYS:
            self.entries.setdefault((site.op, site.attr_name), {}).setdefault(site.index, {})["sdy.sharding"] = new
        elif site.kind in ("op-result", "manual-in", "manual-out", "named-in", "named-out"):
            self.per_value.setdefault((site.op, site.attr_name), {})[site.index] = new
        else:
            self.attributes[(site.op, site.attr_name)] = new

    def set_attribute(self, op: ir.Operation, name: str, value: ir.Attribute | TensorSharding | None) -> None:
        """Set (None: remove) an attribute of an op as a whole."""
        self.changed += 1
        self.attributes[(op, name)] = value

    def set_entry(self, fn: ir.Operation, key: str, index: int, name: str, value) -> None:
        """Set (None: remove) one entry of a function argument's (key="arg_attrs") or result's attributes."""
        self.changed += 1
        self.entries.setdefault((fn, key), {}).setdefault(index, {})[name] = value

    def apply(self) -> None:
        for (op, name), value in self.attributes.items():
            with op.context:
                if value is None:
                    if name in op.attributes:
                        del op.attributes[name]
                else:
                    op.attributes[name] = _attribute(value)
        for (op, name), changes in self.per_value.items():
            with op.context:
                values = list(sdy.TensorShardingPerValueAttr(op.attributes[name]).shardings)
                for index, new in changes.items():
                    values[index] = sharding_to_attr(new)
                op.attributes[name] = sdy.TensorShardingPerValueAttr.get(values)
        for (fn, key), changes in self.entries.items():
            with fn.context:
                dicts = list(ir.ArrayAttr(fn.attributes[key]))
                for index, entries in changes.items():
                    current = ir.DictAttr(dicts[index])
                    values = {current[i].name: current[i].attr for i in range(len(current))}
                    for name, value in entries.items():
                        if value is None:
                            values.pop(name, None)
                        else:
                            values[name] = _attribute(value)
                    dicts[index] = ir.DictAttr.get(values)
                fn.attributes[key] = ir.ArrayAttr.get(dicts)
        self.attributes.clear()
        self.per_value.clear()
        self.entries.clear()


def _attribute(value) -> ir.Attribute:
    return sharding_to_attr(value) if isinstance(value, TensorSharding) else value
