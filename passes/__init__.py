"""shardfix's passes: the base class, option parsing, and the registry (name -> lazily imported class).

A pass is a small frozen dataclass: its fields are its options, spelled in kebab-case in pipelines
(`fix-shardings{policy=drop target-mesh=dp=4,tp=2}`), typed by the field annotation (a Literal of choices, int,
bool or str).
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from shardfix.locations import SourceLoc
from shardfix.report import Report
from shardfix.sharding import Mesh


INT_OPTION_MAX = 2**31 - 1  # integer options end up in MLIR's 32- and 64-bit attributes


class PassError(Exception):
    """A pass met input it must not change; carries the place to report."""

    def __init__(self, message: str, loc: SourceLoc = SourceLoc()):
        super().__init__(message)
        self.loc = loc


class OptionError(ValueError):
    """A pass name or option that doesn't exist or doesn't parse."""


@dataclass
class PassContext:
    """What a pipeline run shares between passes: the report, driver-wide settings, and what a pass leaves for the
    pass that runs right after it."""

    report: Report = field(default_factory=Report)
    target_mesh: Mesh | None = None
    # What a pass found out about the module as it leaves it, for the next pass to use instead of finding it again:
    # (that pass, {name: fact}), set by the pass as it ends. The pipeline gives it (as `handed`) only to a pass that
    # runs right after that one, no other pass (MLIR's included) in between; any other pass is handed nothing.
    handoff: tuple["Pass", dict] | None = None
    handed: dict = field(default_factory=dict)
    # the pass of ours the pipeline runs right after the running one (no other pass in between), if any
    next_pass: "Pass | None" = None


@dataclass(frozen=True)
class Pass:
    name: ClassVar[str]
    description: ClassVar[str]
    # True for passes that repair shardings the sdy verifier rejects: a pipeline starting with one loads leniently.
    accepts_invalid_shardings: ClassVar[bool] = False

    def apply(self, module, ctx: PassContext) -> int | None:
        """Run on the module in place; how many changes it made, where the pass can say (0: the module is exactly
        as it was, so the verifier needn't look at it again), else None."""
        raise NotImplementedError

    @classmethod
    def options(cls) -> dict[str, tuple[str, object, object]]:
        """kebab-case option name -> (field name, type, default)."""
        hints = typing.get_type_hints(cls)
        return {f.name.replace("_", "-"): (f.name, hints[f.name], f.default) for f in dataclasses.fields(cls)}

    @classmethod
    def from_options(cls, options: dict[str, str]) -> "Pass":
        known = cls.options()
        values = {}
        for key, text in options.items():
            if key not in known:
                names = ", ".join(known) or "none"
                raise OptionError(f"unknown option '{key}' for pass '{cls.name}' (options: {names})")
            field_name, kind, default = known[key]
            values[field_name] = _convert(cls.name, key, kind, text, minimum=0 if default == 0 else 1)
        return cls(**values)


def _convert(pass_name: str, key: str, kind, text: str, minimum: int = 1):
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        if text not in choices:
            raise OptionError(f"option '{key}' of '{pass_name}' must be one of {', '.join(choices)}; got '{text}'")
        return text
    if kind is bool:
        if text not in ("true", "false", "1", "0"):
            raise OptionError(f"option '{key}' of '{pass_name}' must be true or false; got '{text}'")
        return text in ("true", "1")
    if kind is int:
        try:
            value = int(text)
        except ValueError:
            raise OptionError(f"option '{key}' of '{pass_name}' must be an integer; got '{text}'") from None
        if value < minimum:
            need = "positive" if minimum == 1 else "0 or more"
            raise OptionError(f"option '{key}' of '{pass_name}' must be {need}; got {value}")
        if value > INT_OPTION_MAX:
            raise OptionError(f"option '{key}' of '{pass_name}' is out of range: {value} (at most {INT_OPTION_MAX})")
        return value
    return text


_REGISTRY = {
    "fix-shardings": "shardfix.passes.fix_shardings:FixShardings",
    "ring-reorder": "shardfix.passes.ring_reorder:RingReorder",
    "hoist-permutations": "shardfix.passes.hoist_permutations:HoistPermutations",
}


def pass_names() -> list[str]:
    return list(_REGISTRY)


def lookup(name: str) -> type[Pass] | None:
    target = _REGISTRY.get(name)
    if target is None:
        return None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)
