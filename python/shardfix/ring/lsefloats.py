"""What a log-sum-exp merge computes in float32, beside what it computes exactly (lseforms.py), in the cases
where the two part: sample numbers for the blocks' lses, run through the merge's ops in numpy float32, against
the exact value at the same numbers (float64).

The cases (scenarios), each keyed by a string:

- "start<s>": the state is still at its start (an unknown coverage, the state's, holds no keys yet; its start
  pseudo-token is its lse), with four draws s of the blocks' numbers, so that a rounding at the first merge (a
  -1e4 start: ulp(1e4) = 1e-3) is not hidden by one lucky draw;
- "state@<M>": the state holds only masked keys, lse = M (a step-0 reset or an isneginf guard that took a block
  whose row is all masked as the state);
- "cell@<M>:<block>": that one block's row is all masked, lse = M, the state and the other blocks are not;
- "pre@<M>:<block>": the state still at its start (its unknown coverage holds nothing) and that block, one the
  state started from (computed before the loop: with k, v sent ahead, not the own causal block), all masked: the
  state holds masked keys alone at the loop's first merge; a value without that block is its "start0" value there;
- "normal": nothing masked, the state holds keys (the value of any case a number does not depend on).

Each scenario is drawn DRAWS times, with other numbers (the start's draws are its four keys; every other key's
draw d > 0 is the key prefixed "#d "). One draw can hide a rounding: a sample that happens to sit within a few
ulps of a multiple of ulp(1e4) = 2^-10 passes through -1e4 + x unchanged (the samples are multiples of 1/500 in
[-1, 1): 8 of their 1000 values sit on that grid); a merge is taken as exact in a scenario only where every draw
says so. The numbers depend only on the draw and on the names of the blocks,
which the analysis makes from the module alone (coverage.naming), never from what the process ran before.

The masked ones only where the scores may hold a mask value (logsum.may_mask): unmasked scores are bounded by
the data, and a merge's rounding then stays that of its operands.

A merge is order-free in floats only where its float value is its exact value in each: which rows are at their
start, or meet an all-masked block, at which merge, is what the layout changes.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from .values import CoverageVar

MASKS = (-1e30, -1e4)  # an all-masked row's lse: the usual mask value, and a small one whose merges round
DRAWS = 4
START_KEYS = tuple(f"start{s}" for s in range(DRAWS))
NORMAL = "normal"
_PRE = "pre@"
MASK_LIKE = 1e3  # a score constant this large is a mask value (-1e4, -1e9, -1e30, finfo.min), not a scale
_ULPS = 16  # a merge's few float32 roundings, each of half an ulp, and no more (a -100 start rounds by ~32)

Samples = tuple  # ((key, float), ...): a number per scenario


def _drawn(key: str, draw: int) -> str:
    return key if draw == 0 else f"#{draw} {key}"


def _split(key: str) -> tuple[int, str]:
    """(the draw, the scenario) of a key."""
    if key.startswith("#"):
        draw, base = key[1:].split(" ", 1)
        return int(draw), base
    return 0, key


def _every_draw(*keys: str) -> tuple[str, ...]:
    return tuple(_drawn(k, d) for d in range(DRAWS) for k in keys)


NORMALS = _every_draw(NORMAL)
PLAIN = START_KEYS + NORMALS
STATE_KEYS = _every_draw(*(f"state@{m:g}" for m in MASKS))


def cell_keys(part) -> tuple[str, ...]:
    return _every_draw(*(f"cell@{m:g}:{part}" for m in MASKS))


def pre_keys(part) -> tuple[str, ...]:
    return _every_draw(*(f"{_PRE}{m:g}:{part}" for m in MASKS))


def is_normal(key: str) -> bool:
    """Whether scenario `key` is one where nothing is masked and the state holds keys (any draw)."""
    return _split(key)[1] == NORMAL


def at_start(key: str) -> bool:
    """Whether the state is still at its start in scenario `key`."""
    return key in START_KEYS or _split(key)[1].startswith(_PRE)


def _scenario(key: str) -> tuple[int, float | None, float | None, str | None]:
    """(salt, the state's masked lse or None, a block's masked lse or None, that block's name or None); a state
    at its start has salt >= 0 and holds nothing: returned as salt, None, None, None with key in START_KEYS."""
    draw, key = _split(key)
    if key.startswith("start"):
        return int(key[5:]), None, None, None
    if key.startswith("state@"):
        return draw, float(key[6:]), None, None
    if key.startswith(("cell@", _PRE)):
        mask, name = key[key.index("@") + 1:].split(":", 1)
        return draw, None, float(mask), name
    return draw, None, None, None


def _sample(salt: int, *key) -> float:
    return (zlib.crc32(repr((salt,) + key if salt else key).encode()) % 1000) / 500.0 - 1.0


def part_sample(kind: str, part, key: str) -> float | None:
    """A block's (or the state's) lse or max in scenario `key`; None where it holds no keys (the state at its
    start)."""
    salt, state, cell_mask, cell = _scenario(key)
    if isinstance(part, CoverageVar):
        if at_start(key):
            return None
        if state is not None:
            return state
    elif cell == str(part):
        return cell_mask
    return _sample(salt, kind, _name(part))


def _name(part) -> str:
    """A block's name; the state's is its loop's: the running lse and output are carried in two slots, whose
    unknowns are found to be one only where they meet (logsum._alias_states), and must be one number before."""
    return part.family() if isinstance(part, CoverageVar) else str(part)


def term_sample(key: str, part) -> float:
    """A block's (or the state's) summed term: one number per block whatever fn spells it (two spellings of one
    output, broadcast or not, are one number; sums of different terms never merge in the algebra anyway)."""
    return _sample(_scenario(key)[0], "term", _name(part))


def same_number(a: float, b: float) -> bool:
    """Whether float value a is exact value b, up to a few float32 roundings."""
    if math.isnan(a) or math.isnan(b):
        return False
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= _ULPS * float(np.finfo(np.float32).eps) * max(1.0, abs(b))


def keys_of(*samples: Samples) -> list[str]:
    seen: dict = {}
    for s in samples:
        for k, _ in s:
            seen.setdefault(k, None)
    return list(seen)


def at(samples: Samples, key: str) -> float:
    """The number in scenario `key`; one a value has no case for does not depend on that block: its number
    where nothing is masked, or at the state's start for a "pre@" key (the state there holds nothing)."""
    for k, x in samples:
        if k == key:
            return x
    draw, base = _split(key)
    return at(samples, START_KEYS[draw]) if base.startswith(_PRE) else dict(samples)[_drawn(NORMAL, draw)]


def f32_all(fn, *samples: Samples) -> Samples:
    """fn applied in float32, scenario by scenario."""
    with np.errstate(all="ignore"):
        return tuple((k, float(fn(*(np.float32(at(s, k)) for s in samples)))) for k in keys_of(*samples))


def constant(x: float, keys=PLAIN) -> Samples:
    return tuple((k, float(x)) for k in keys)
