"""What `lower` and `compile` of an autofix_shardings function return."""

from __future__ import annotations

import jax

from ..report import Fix, RingDecision


class AutofixLowered:
    """What `f.lower(...)` returns: the patched module, the fixes, the ring decisions."""

    def __init__(self, lowered: jax.stages.Lowered, fixes: list[Fix], rings: list[RingDecision]):
        self._lowered, self.fixes, self.rings = lowered, fixes, rings

    def as_text(self, *args, **kwargs) -> str:
        return self._lowered.as_text(*args, **kwargs)

    def compile(self) -> "AutofixCompiled":
        return AutofixCompiled(self._lowered.compile())


class AutofixCompiled:
    """A compiled executable that moves arguments placed with another sharding to the shardings it expects."""

    def __init__(self, compiled: jax.stages.Compiled):
        self._compiled = compiled
        self._expected = jax.tree.leaves(compiled.input_shardings)

    def as_text(self) -> str:
        return self._compiled.as_text()

    def __getattr__(self, name):
        return getattr(self._compiled, name)

    def moves(self, leaves) -> dict:
        """leaf index -> sharding, for the argument leaves committed to a sharding the executable doesn't take."""
        if len(leaves) != len(self._expected):
            return {}
        return {i: s for i, (x, s) in enumerate(zip(leaves, self._expected))
                if isinstance(x, jax.Array) and x.committed and x.sharding != s}

    def __call__(self, *args, **kwargs):
        leaves, tree = jax.tree.flatten((args, kwargs))
        moves = self.moves(leaves)
        if moves:
            leaves = [jax.device_put(x, moves[i]) if i in moves else x for i, x in enumerate(leaves)]
            args, kwargs = jax.tree.unflatten(tree, leaves)
        return self._compiled(*args, **kwargs)
