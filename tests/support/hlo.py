"""Reading compiled HLO text: the collectives an executable runs and the bytes they move."""

from __future__ import annotations

import math
import re

_COLLECTIVE = re.compile(r"= (\(.*?\)|\w+\[[\d,]*\](?:\{[^}]*\})?) (collective-permute|all-to-all|all-gather|"
                         r"all-reduce|reduce-scatter)(?:-start)?\(")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")
_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
          "s8": 1, "u8": 1, "pred": 1}


def collective_bytes(hlo: str) -> dict[str, list[int]]:
    """kind ('collective-permute', 'all-to-all', ...) -> bytes of each such op's result, per device. An
    all-to-all that XLA splits into a tuple of pieces counts all of them (one piece stays on its device)."""
    out: dict[str, list[int]] = {}
    for shape, kind in _COLLECTIVE.findall(hlo):
        total = sum(_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
                    for dtype, dims in _ARRAY.findall(shape))
        out.setdefault(kind, []).append(total)
    return out


def pad_count(hlo: str) -> int:
    """How many pad instructions the compiled HLO has."""
    return len(re.findall(r"= \S+ pad\(", hlo))
