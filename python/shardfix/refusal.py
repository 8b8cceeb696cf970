"""Why a module can't be repaired, in shardfix's words: what is wrong and what a repair would need, at the place
MLIR's parser or verifier pointed to (its own message follows as a note). Pure: imports neither MLIR nor JAX."""

from __future__ import annotations

from .report import Diagnostic
from .sharding import COLLECTIVES

# (fragments of MLIR's message, any of which selects the entry; what is wrong; what a repair would need)
_CAUSES: list[tuple[tuple[str, ...], str, str]] = [
    (("is not divisible by the manual axes size",),
     "a manual axis doesn't divide a dimension of this manual computation",
     "a dimension its manual axes divide: another sharding would change the local shapes the body is written for"),
    (("corresponding sharding, and region",),
     "the manual axes of this manual computation don't split its values into the body's local shapes",
     "in/out shardings whose manual axes give exactly the body's shapes, or a body for these ones"),
    (("must have all manual axes come before free axes",),
     "a manual axis follows a free axis within one dimension",
     "the manual axes first: reordering them changes which device holds which block, so it is left to you"),
    (("all in and out shardings must be bound to the same mesh",),
     "this manual computation's shardings use different meshes",
     "one mesh for all its in and out shardings"),
    (("number of op operands and region", "number of op results and region", "defined outside the region",
      "block argument", "failed to infer returned types", "are incompatible with return type"),
     "the op's regions don't match its operands or results",
     "a body with one argument per operand and one result per result: a structural change, not a sharding"),
    (tuple(f"'{name}' op" for name in sorted(COLLECTIVES)) + ("collective on operand",),
     "an sdy collective doesn't agree with the shardings around it",
     "the collective's axes and out_sharding consistent with its operand's sharding: fix-shardings never changes "
     "a collective, and repairs a sharding one reads only where the repair is what the collective expects"),
    (("axis size must be at least 1", "duplicate axis name", "device id", "total product of axis sizes",
      "sorted device ids", "Mesh not in symbol table"),
     "a mesh definition is invalid",
     "a valid `sdy.mesh`: fix-shardings changes shardings, never the meshes they refer to"),
    (("sharding rule", "factor", "mapping rank", "number of operands and mappings", "number of results and mappings"),
     "an op's sharding rule (sdy.sharding_rule) is invalid",
     "a rule that matches the op: it describes the computation, not a layout"),
    (("propagation edges", "value ref"),
     "propagation-edge debug information (sdy.propagation_edges) is malformed",
     "well-formed edges, or none"),
    (("unreduced", "reduction"),
     "unreduced axes are used in a way the verifier rejects",
     "unreduced axes consistent with the computation: they carry partial sums, not a layout"),
    (("data_flow_edge",),
     "a data-flow edge op is misplaced",
     "a data-flow edge on a value it may describe"),
]


_BYTECODE = ("the module is MLIR bytecode that doesn't verify, and bytecode is only read by verifying it",
             "the module as text (JAX: lowered.as_text()), where shardings the verifier rejects are held aside for "
             "repair")
_COLLECTIVE = ("a sharding that an sdy collective reads (or the collective's own) is wrong, and no repair of the "
               "sharding alone makes the collective agree with it",
               "the sharding and the collective corrected together, by hand")


def explain(diagnostics: list[Diagnostic], collective_lines: frozenset[int] = frozenset(),
            bytecode: bool = False) -> list[Diagnostic]:
    """shardfix's error for a module that fails to load even with its shardings held aside (`collective_lines`:
    where shardings were kept as written because collectives read them), or for MLIR bytecode that doesn't verify
    (the bytecode reader verifies what it reads, so nothing can be held aside), then MLIR's."""
    first = next((d for d in diagnostics if d.severity == "error"), None)
    if first is None:
        return diagnostics
    what, need = _BYTECODE if bytecode else _COLLECTIVE if first.loc.line in collective_lines else \
        _cause(first.message)
    ours = Diagnostic("error", f"fix-shardings can't repair this: {what}; it would need {need}", first.loc)
    return [ours] + [Diagnostic("note" if d is first else d.severity,
                                ("MLIR: " if d is first else "") + d.message, d.loc) for d in diagnostics]


def _cause(message: str) -> tuple[str, str]:
    verifier = "' op " in message or message.startswith("'")
    if not verifier:
        return (f"the text doesn't parse as MLIR here ({message})",
                "valid MLIR syntax first: shardings are repaired once the module parses")
    for fragments, what, need in _CAUSES:
        if any(f in message for f in fragments):
            return what, need
    return ("this op doesn't verify for a reason no change of sharding repairs",
            "the op itself to change")
