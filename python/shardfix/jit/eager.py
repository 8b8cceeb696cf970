"""Repairs outside any trace while the plugin is on: JAX checks specs in eager code too (`jax.device_put`,
`jax.make_array_from_callback`, an eager `reshard` or `with_sharding_constraint`, a NamedSharding made for them, a
`jax.jit`'s in/out shardings as it is made), as Flax's eager variable sharding and Linen's `nn.logical_to_mesh_sharding`
+ `jax.device_put` do. The plugin's eager session repairs each with the trace-time rules and tells each fix at once,
at the user's line, while the call is on the stack (on_fix="error" raises there)."""

from __future__ import annotations

from ..report import Fix
from .tracing import Repairs

EAGER_NAME = "eager code (outside jit)"


class EagerRepairs(Repairs):
    """A repair session for what the plugin's session sees outside traces: fixes are told, not kept."""

    def __init__(self, session):
        super().__init__(session.settings.policy)
        self.session = session

    def repair(self, sharding, shape, api, divisibility=True, accepted=False, itemsize=None):
        fixed = super().repair(sharding, shape, api, divisibility, accepted, itemsize)
        if self._awaiting_shape:  # no value will be typed with it here: the names-only fix, now
            self.close()
        return fixed

    def _record(self, fix: Fix, call) -> None:
        self.add([fix])

    def add(self, fixes: list[Fix]) -> None:
        self.session.tell(fixes, EAGER_NAME)
