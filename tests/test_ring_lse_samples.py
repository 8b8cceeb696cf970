"""The floating-point check of log-sum-exp merges (ring/lsefloats.py) runs each merge on sample numbers in each
scenario and compares it with the exact value. Its decisions must not depend on luck or on the process:

- one draw of a scenario can hide a rounding (a sample within a few ulps of a multiple of ulp(1e4) passes through
  -1e4 + x unchanged), so every scenario is drawn several times and a merge is taken as exact only where every
  draw says so;
- the numbers follow from the names of the blocks and states, and the names from the module alone: not from how
  many unknowns the process made before, nor from where Python put an op object.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from shardfix import autofix_shardings
from shardfix.ring import coverage, lsefloats
from support.ring_user_programs import PROGRAMS, meshes

BY_NAME = {p.name: p for p in PROGRAMS}
# refused: its sigmoid merge, guarded by isneginf from a start of -inf, rounds a masked row's lse away
GUARDED_SIGMOID = "refuse-lse-guarded-sigmoid-inf"


@functools.cache
def _meshes():
    return meshes()


def _decisions(name: str, strategy: str = "zigzag") -> list[tuple[bool, str]]:
    p = BY_NAME[name]
    fn, args = p.build(_meshes()[p.mesh])
    low = autofix_shardings(fn, ring_reorder=strategy, on_fix="ignore").lower(*args)
    return [(r.applied, r.why) for r in low.rings]


def test_a_rounding_one_draw_hides_is_found_by_another():
    """A block whose first draw sits on the grid of float32 numbers near 1e4 (a multiple of 2^-10): -1e4 + x, then
    + 1e4, gives x back exactly in that draw, and a check of that draw alone would take the sum for exact. The
    scenario's other draws give the block other numbers, which the sum rounds."""
    name = next(f"b{i}" for i in range(100_000) if (lsefloats._sample(0, "lse", f"b{i}") * 1024).is_integer())

    class Block:
        def __str__(self) -> str:
            return name

    keys = [k for k in lsefloats.STATE_KEYS if k.endswith("state@-10000")]
    assert len(keys) == lsefloats.DRAWS > 1 and keys[0] == "state@-10000"
    exact = [lsefloats.part_sample("lse", Block(), k) for k in keys]
    assert len(set(exact)) == len(exact)  # each draw a number of its own
    computed = [float((np.float32(-1e4) + np.float32(x)) + np.float32(1e4)) for x in exact]
    found = [lsefloats.same_number(c, x) for c, x in zip(computed, exact)]
    assert found[0] and not all(found), (exact, computed)


def _sampled_names(name: str, monkeypatch) -> tuple[list, set]:
    seen: set = set()
    sample = lsefloats._sample

    def spy(salt: int, *key) -> float:
        seen.add((salt,) + key)
        return sample(salt, *key)

    with monkeypatch.context() as patch:
        patch.setattr(lsefloats, "_sample", spy)
        decisions = _decisions(name)
    return decisions, seen


@pytest.mark.parametrize("name", ["lse-step0-reset-logaddexp", GUARDED_SIGMOID])
def test_the_numbers_depend_on_the_module_alone(name, monkeypatch):
    """The same program lowered twice, the second time after the process has made many unknowns and allocated many
    objects (so op objects sit elsewhere): the same blocks sampled under the same names, the same decisions."""
    first = _sampled_names(name, monkeypatch)
    for _ in range(1000):
        coverage.fresh_var("it")
    ballast = [object() for _ in range(50_000)]
    second = _sampled_names(name, monkeypatch)
    assert ballast and first[1] and second == first
    assert any(key[2].startswith("cv") for key in first[1]), sorted(first[1])  # a loop state's name is sampled
