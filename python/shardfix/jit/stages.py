"""What `trace`, `lower` and `compile` of an autofix_shardings function return: JAX's own stage objects (instances
of jax.stages.Traced / Lowered / Compiled subclasses, so everything JAX's have works, `jax.export` included), with
shardfix's pipeline behind `Traced.lower` and the report on them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax

from ..report import Fix, Report, RingDecision, merge_fixes
from . import _jax
from .specs import in_user_terms

if TYPE_CHECKING:
    from .decorator import AutofixFunction


class AutofixTraced(jax.stages.Traced):
    """A traced autofix_shardings function: JAX's Traced; `.lower()` runs shardfix's pipeline on the module.
    `.fixes`: the repairs made while tracing."""

    _owner: "AutofixFunction"
    report: Report

    @property
    def fixes(self) -> list[Fix]:
        return merge_fixes(in_user_terms(self.report.fixes))

    def lower(self, *, lowering_platforms: tuple[str, ...] | None = None, _private_parameters: Any = None
              ) -> "AutofixLowered":
        return self._owner._lower_traced(self, lowering_platforms=lowering_platforms,
                                         _private_parameters=_private_parameters)

    def _jax_lower(self, **kwargs) -> jax.stages.Lowered:
        return jax.stages.Traced.lower(self, **kwargs)

    # What JAX versions with these methods return is a Traced again: one whose `lower()` is shardfix's too.
    if hasattr(jax.stages.Traced, "with_consts_as_arg"):
        def with_consts_as_arg(self) -> tuple[list[Any], "AutofixTraced"]:
            consts, new = super().with_consts_as_arg()
            return consts, traced(new, self._owner, self.report)

    if hasattr(jax.stages.Traced, "physicalize"):
        def physicalize(self, ctx) -> "AutofixTraced":
            return traced(super().physicalize(ctx), self._owner, self.report)


class AutofixLowered(jax.stages.Lowered):
    """The patched module of an autofix_shardings function: JAX's Lowered (`as_text()` shows the patched module),
    with `.fixes` (every sharding changed) and `.rings` (the ring decisions)."""

    report: Report

    @property
    def fixes(self) -> list[Fix]:
        return merge_fixes(in_user_terms(self.report.fixes))

    @property
    def rings(self) -> list[RingDecision]:
        return list(self.report.rings)

    def compile(self, compiler_options: dict[str, Any] | None = None, *,
                device_assignment: tuple | None = None) -> "AutofixCompiled":
        compiled = super().compile(compiler_options, device_assignment=device_assignment)
        return _compiled(compiled)


class AutofixCompiled(jax.stages.Compiled):
    """A compiled autofix_shardings function: JAX's Compiled, which moves arguments committed to another sharding
    to the sharding the executable takes (shardfix may have changed it) instead of refusing them. A call whose
    arguments fit goes straight to JAX's own call; only one JAX refuses comes back for the move."""

    _expected: list

    def moves(self, leaves: list) -> dict:
        """leaf index -> sharding, for the argument leaves committed to a sharding the executable doesn't take."""
        if len(leaves) != len(self._expected):
            return {}
        return {i: s for i, (x, s) in enumerate(zip(leaves, self._expected))
                if s is not None and isinstance(x, jax.Array) and x.committed and x.sharding != s}

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except ValueError as e:
            if not _jax.is_input_sharding_mismatch(e):
                raise
            leaves, tree = jax.tree.flatten((args, kwargs))
            moves = self.moves(leaves)
            if not moves:
                raise
        leaves = [jax.device_put(x, moves[i]) if i in moves else x for i, x in enumerate(leaves)]
        args, kwargs = jax.tree.unflatten(tree, leaves)
        return super().__call__(*args, **kwargs)


def traced(jax_traced: jax.stages.Traced, owner: "AutofixFunction", report: Report) -> AutofixTraced:
    new = _jax.as_subclass(jax_traced, AutofixTraced)
    new._owner, new.report = owner, report
    return new


def lowered(jax_lowered: jax.stages.Lowered, report: Report) -> AutofixLowered:
    new = jax_lowered if isinstance(jax_lowered, AutofixLowered) else _jax.as_subclass(jax_lowered, AutofixLowered)
    new.report = report
    return new


def _compiled(jax_compiled: jax.stages.Compiled) -> AutofixCompiled:
    new = _jax.as_subclass(jax_compiled, AutofixCompiled)
    new._expected = _jax.compiled_input_shardings(jax_compiled)
    return new
