"""Pipeline strings -> an MLIR PassManager running shardfix's Python passes beside registered MLIR passes.

MLIR's textual pipeline parser can't see Python passes, so the string is split here: each top-level element is
either one of ours (`fix-shardings{policy=drop}`) or handed to MLIR as text (`canonicalize`,
`sdy-propagation-pipeline`, `func.func(cse)`). The verifier runs after every pass.
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from dataclasses import dataclass

from jaxlib.mlir import ir, passmanager

from shardfix import passes as registry
from shardfix.passes import OptionError, Pass, PassContext, PassError

from ._log import logger
from .ir import LoadError, diagnostics_of
from .ir.context import register_jax_passes
from .locations import SourceLoc
from .refusal import explain
from .report import Diagnostic


class PipelineError(ValueError):
    """A pipeline string that doesn't parse; `col` is 1-based within the string."""

    def __init__(self, message: str, col: int = 1):
        super().__init__(message)
        self.col = col


@dataclass(frozen=True)
class Element:
    text: str
    col: int  # 1-based column of the element in the pipeline string
    ours: Pass | None = None


@dataclass(frozen=True)
class Pipeline:
    elements: tuple[Element, ...]

    @property
    def loads_leniently(self) -> bool:
        """A pipeline whose first pass repairs invalid shardings takes modules the sdy verifier rejects."""
        return bool(self.elements) and self.elements[0].ours is not None and \
            self.elements[0].ours.accepts_invalid_shardings

    def __str__(self) -> str:
        return ",".join(e.text for e in self.elements)


@functools.lru_cache(maxsize=256)
def parse_pipeline(text: str) -> Pipeline:
    """Split a comma-separated pipeline; `builtin.module(...)` around it is accepted and removed."""
    body, offset = text.strip(), len(text) - len(text.lstrip())
    if body.startswith("builtin.module(") and body.endswith(")"):
        offset += len("builtin.module(")
        body = body[len("builtin.module("):-1]
    elements = []
    for piece, col in _split_top_level(body, ",", offset):
        stripped = piece.strip()
        col += len(piece) - len(piece.lstrip())
        if not stripped:
            raise PipelineError("empty pass name in the pipeline", col)
        elements.append(_element(stripped, col))
    return Pipeline(tuple(elements))


def _element(text: str, col: int) -> Element:
    name, _, rest = text.partition("{")
    name = name.strip()
    cls = registry.lookup(name)
    if cls is None:
        return Element(text, col)
    if rest and not rest.rstrip().endswith("}"):
        raise PipelineError(f"options of '{name}' are not closed with '}}'", col)
    try:
        return Element(text, col, cls.from_options(_parse_options(rest.rstrip()[:-1] if rest else "", col)))
    except OptionError as e:
        raise PipelineError(str(e), col) from None


def _parse_options(text: str, col: int) -> dict[str, str]:
    options = {}
    for item, _ in _split_top_level(text, " ", 0):
        if not item.strip():
            continue
        key, eq, value = item.strip().partition("=")
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if key in options:
            raise PipelineError(f"option '{key}' given twice", col)
        options[key] = value if eq else "true"
    return options


def _split_top_level(text: str, sep: str, offset: int):
    """Pieces of `text` between `sep`s that are outside brackets and quotes, with their 1-based columns."""
    depth, quoted, start = 0, False, 0
    for i, c in enumerate(text):
        if c == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
            if depth < 0:
                raise PipelineError(f"unbalanced '{c}' in the pipeline", offset + i + 1)
        elif c == sep and depth == 0:
            yield text[start:i], offset + start + 1
            start = i + 1
    if depth or quoted:
        raise PipelineError("unbalanced brackets or quotes in the pipeline", offset + len(text) + 1)
    yield text[start:], offset + start + 1


def build_pass_manager(pipeline: Pipeline, ctx: ir.Context, pass_ctx: PassContext, verify_each: bool = True,
                       print_ir_after_all: bool = False, timing: bool = False,
                       print_ir_before_all: bool = False, verified: bool = False) -> passmanager.PassManager:
    """A PassManager for the pipeline; MLIR prints the module before (`print_ir_before_all`) and after every pass
    (`print_ir_after_all`) and the time of each pass (`timing`, when the manager is deleted) to stderr.
    `verified`: the module verified as it is now; where every pass is one of ours, each is then followed by the
    verifier only if it changed the module (MLIR's verifier would run after each, and costs about as much as
    fix-shardings on a module it leaves alone)."""
    only_ours = verify_each and verified and all(e.ours is not None for e in pipeline.elements)
    with ctx:
        pm = passmanager.PassManager("builtin.module")
        elements = pipeline.elements
        for i, element in enumerate(elements):
            if element.ours is not None:
                # the elements around it, where they are ours
                follows = elements[i - 1].ours if i > 0 else None
                precedes = elements[i + 1].ours if i + 1 < len(elements) else None
                pm.add(_runner(element.ours, pass_ctx, verify=only_ours, follows=follows, precedes=precedes),
                       **_pass_names(element.ours))
                continue
            register_jax_passes()
            try:
                pm.add(element.text)
            except ValueError as e:
                raise PipelineError(_mlir_pipeline_message(str(e), element.text), element.col) from None
        pm.enable_verifier(verify_each and not only_ours)
        if print_ir_after_all or print_ir_before_all:
            pm.enable_ir_printing(print_before_all=print_ir_before_all, print_after_all=print_ir_after_all,
                                  print_module_scope=True)
        if timing:
            pm.enable_timing()
    return pm


def _pass_names(pass_: Pass) -> dict[str, str]:
    """How MLIR names a Python pass in its IR dumps, timing and crash reports, as it names its own
    (`CanonicalizerPass: canonicalize`): the class, and the pipeline name as the argument (without one MLIR says
    `unknown<NAME>`)."""
    return {"name": type(pass_).__name__, "argument": pass_.name, "description": pass_.description}


def _runner(pass_: Pass, pass_ctx: PassContext, verify: bool = False, follows: Pass | None = None,
            precedes: Pass | None = None):
    """The pass as MLIR calls it; `verify`: then the verifier, unless the pass says it changed nothing. `follows`,
    `precedes`: the passes of ours that run right before and right after it in the pipeline, if any (what the one
    before hands on is handed to this one; the one after is PassContext.next_pass)."""
    def run(op, _external_pass) -> None:
        handoff, pass_ctx.handoff = pass_ctx.handoff, None
        pass_ctx.handed = handoff[1] if handoff is not None and follows is not None and handoff[0] is follows else {}
        pass_ctx.next_pass = precedes
        report = pass_ctx.report
        before = len(report.fixes), len(report.remarks), len(report.rings)
        start = time.perf_counter()
        # A pass makes many small short-lived objects and no garbage cycles to speak of; with the cyclic
        # collector on, each collection also scans the caller's whole heap (a JAX process holds millions of
        # objects), which would make a pass's time follow the size of the process rather than of the module.
        collecting = gc.isenabled()
        gc.disable()
        try:
            changes = pass_.apply(op, pass_ctx)
        finally:
            pass_ctx.handed, pass_ctx.next_pass = {}, None
            if collecting:
                gc.enable()
        if verify and changes != 0:
            op.verify()
        if logger.isEnabledFor(logging.INFO):
            _log_pass(pass_.name, time.perf_counter() - start, report, before)
    return run


def _log_pass(name: str, seconds: float, report, before: tuple[int, int, int]) -> None:
    """INFO: the pass's time and what it changed; DEBUG: each ring it left alone, and why."""
    fixes, remarks, rings = report.fixes[before[0]:], report.remarks[before[1]:], report.rings[before[2]:]
    applied = sum(r.applied for r in rings)
    logger.info("%s: %.1f ms, %d sharding(s) changed, %d of %d ring(s) reordered, %d remark(s)", name,
                seconds * 1e3, sum(f.count for f in fixes), applied, len(rings), len(remarks))
    for fix in fixes:
        logger.info("%s: %s: %s", name, fix.location or "?", fix.message())
    for ring in rings:
        if not ring.applied:
            logger.debug("%s: %s: ring on axis %r (%s) left alone: %s", name, ring.location or "?", ring.axis,
                         ring.strategy, ring.why or "no reason recorded")


def _mlir_pipeline_message(message: str, element: str) -> str:
    for line in message.splitlines():
        if "error:" in line:
            return line.split("error:", 1)[1].strip()
    first = next((line for line in message.splitlines() if line.strip()), message)
    if "no such option" in message:
        return f"{first.split(':', 1)[-1].strip()} in '{element}'"
    return first


def run_pipeline(module: ir.Operation, pipeline: Pipeline, ctx: ir.Context, pass_ctx: PassContext,
                 verify_each: bool = True, explain_failures: bool = False, print_ir_after_all: bool = False,
                 timing: bool = False, print_ir_before_all: bool = False, verified: bool = False) -> None:
    """Run the pipeline on the module in place; failures raise LoadError with located diagnostics. The result
    is verified after every pass (`verified`: the module verified as it is, so after those that changed it), or
    (verify_each=False, cheaper for long pipelines) once at the end.
    `explain_failures` (for a module loaded leniently, which held shardings the verifier rejects): a
    verifier error is said in shardfix's words, as what the repair couldn't do."""
    if not pipeline.elements:
        return
    pm = build_pass_manager(pipeline, ctx, pass_ctx, verify_each, print_ir_after_all, timing, print_ir_before_all,
                            verified)
    try:
        with ctx:
            pm.run(module)
            if not verify_each:
                module.verify()
    except ir.MLIRError as e:
        diagnostics = diagnostics_of(e)
        raise LoadError(explain(diagnostics) if explain_failures else diagnostics) from None
    except PassError as e:
        raise LoadError([Diagnostic("error", str(e), e.loc)]) from None
    finally:
        del pm  # MLIR prints the timing report now


__all__ = ["Pipeline", "PipelineError", "parse_pipeline", "build_pass_manager", "run_pipeline", "PassContext",
           "SourceLoc"]
