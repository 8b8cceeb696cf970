"""Run a pipeline on a copy of a module JAX lowered, and give JAX back what it needs to compile the result.

JAX's own module is never edited: the pipeline runs on a bytecode copy in shardfix's MLIR context. Results are
memoized per JAX module object and pipeline, so every path to one module (a call, `.lower()`, an AOT compile with
other compiler options) gets the same patched module object, which keeps JAX's compilation cache (keyed on the
module object) hitting.
"""

from __future__ import annotations

import dataclasses
import io
import threading
import weakref

import jax
from jax.sharding import NamedSharding
from jaxlib.mlir import ir

from ..ir import make_context, module_meshes, parse_module, sharding_from_attr
from ..pipeline import PassContext, parse_pipeline, run_pipeline
from ..report import Report
from ..ring import ties
from . import _jax
from .results import repair_returned_constraints
from .specs import to_named_sharding


@dataclasses.dataclass(frozen=True)
class Patch:
    """A pipeline's outcome on one module: the module to compile (JAX's own when nothing changed), the entry
    shardings JAX should expect for it, and the report."""

    module: ir.Module
    in_shardings: tuple
    out_shardings: tuple
    report: Report
    changed: bool


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """What the memo keeps of a run: the patched module (None: unchanged; the memo must not hold JAX's module, its
    weak key), the entry shardings it changed, and the report. JAX may compile one module object with other entry
    shardings (another device, say), so these are applied to the shardings of each compile."""

    module: ir.Module | None
    entry_changes: dict
    report: Report
    meshes: dict = dataclasses.field(default_factory=dict)  # the module's meshes by name (the model's)


_lock = threading.Lock()  # one MLIR context, used by one thread at a time
_memo: "weakref.WeakKeyDictionary[ir.Module, dict]" = weakref.WeakKeyDictionary()
_outputs: "weakref.WeakSet[ir.Module]" = weakref.WeakSet()


class _Memo:
    """The memo's handle in JAX's cache registry: `jax.clear_caches()` empties it."""

    @staticmethod
    def cache_clear() -> None:
        with _lock:
            _memo.clear()

    @staticmethod
    def cache_info() -> str:
        return f"{len(_memo)} modules"


_MEMO_HANDLE = _Memo()
_jax.register_cache(_MEMO_HANDLE, "shardfix patched modules")


def is_patched(module: ir.Module) -> bool:
    """Whether `module` came out of `patch_module` with changes (it is never patched twice)."""
    return module in _outputs


def patch_module(module: ir.Module, in_shardings: tuple, out_shardings: tuple, pipeline: str,
                 ring_passes: str = "", target_mesh=None, devices=None) -> Patch:
    """Run `pipeline` on a copy of JAX's `module`, whose entry computation JAX compiles with these shardings, then
    `ring_passes` where the module has collective permutes (without them there is no ring to reorder)."""
    key = (pipeline, ring_passes, target_mesh)
    with _lock:
        per_module = _memo.get(module)
        if per_module is None:
            per_module = _memo[module] = {}
        outcome = per_module.get(key)
        if outcome is None:
            outcome = per_module[key] = _run(module, pipeline, ring_passes, target_mesh)
            if outcome.module is not None:
                _outputs.add(outcome.module)
    if outcome.module is None:
        return Patch(module, in_shardings, out_shardings, outcome.report, False)
    new_in, new_out = _updated_shardings(in_shardings, out_shardings, outcome, devices)
    return Patch(outcome.module, new_in, new_out, outcome.report, True)


def _run(original: ir.Module, pipeline: str, ring_passes: str, target_mesh) -> _Outcome:
    pass_ctx = PassContext(target_mesh=target_mesh)
    if not _has_mesh(original) and target_mesh is None:  # no sdy sharding anywhere: nothing to do
        return _Outcome(None, {}, pass_ctx.report)
    ctx = make_context()
    data = _bytecode(original)
    # An op's name is in the bytecode's string table once for all its uses: finding it there costs no walk.
    if ring_passes and b"collective_permute" in data:
        pipeline = f"{pipeline},{ring_passes}"
    with ctx:
        try:  # a bytecode copy of JAX's module (five times cheaper than text), locations included
            patched = ir.Module.parse(data)
            module = patched.operation
        except ir.MLIRError:  # only a module the verifier rejects, which JAX does not produce; load it leniently
            patched = None
            module = parse_module(original.operation.get_asm(enable_debug_info=True), ctx, "<lowered>",
                                  lenient=True)
    before = _entry_sharding_attrs(_main_function(module))
    parsed = parse_pipeline(pipeline)
    run_pipeline(module, parsed, ctx, pass_ctx, verify_each=False)
    report = pass_ctx.report
    policy = next((e.ours.policy for e in parsed.elements if e.ours is not None and e.ours.name == "fix-shardings"),
                  None)
    main = _main_function(module)
    if policy is not None and main is not None:  # the results JAX reads back: see results.py
        with ctx:
            report.fixes.extend(repair_returned_constraints(main, module, policy))
    # the scopes that tie autodiff's regions to their ring (ring/ties.py) are read now: the module compiled, and
    # shown, carries the names JAX would have given
    tied = ties.PREFIX.encode() in data
    if not report.fixes and not any(r.applied for r in report.rings) and not tied:
        return _Outcome(None, {}, report)
    if patched is None or tied:
        text = module.get_asm(enable_debug_info=True, assume_verified=True)
        with ctx:
            patched = ir.Module.parse(ties.strip(text) if tied else text)
    after = _entry_sharding_attrs(_main_function(patched.operation))
    changes = {place: sharding_from_attr(attr) for place, attr in after.items() if place not in before or before[place] != attr}
    return _Outcome(patched, changes, report, module_meshes(module))


def _bytecode(module: ir.Module) -> bytes:
    buffer = io.BytesIO()
    module.operation.write_bytecode(buffer)  # reads JAX's module, never changes it
    return buffer.getvalue()


def _has_mesh(module: ir.Module) -> bool:
    """Whether the module declares an sdy mesh (Shardy modules with shardings do; eager ops don't)."""
    return any(op.operation.name == "sdy.mesh" for op in module.body.operations)


def _main_function(module: ir.Operation) -> ir.Operation | None:
    for op in module.regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            return op
    return None


def _entry_sharding_attrs(main: ir.Operation | None) -> dict:
    """("arg" | "result", index) -> the sdy.sharding attribute on @main's arguments and results: read from the
    function's attributes alone (no walk of its body)."""
    out: dict = {}
    if main is None:
        return out
    for key, kind in (("arg_attrs", "arg"), ("res_attrs", "result")):
        if key not in main.attributes:
            continue
        for i, entry in enumerate(ir.ArrayAttr(main.attributes[key])):
            entry = ir.DictAttr(entry)
            if "sdy.sharding" in entry:
                out[(kind, i)] = entry["sdy.sharding"]
    return out


def _updated_shardings(in_shardings: tuple, out_shardings: tuple, outcome: _Outcome, devices
                       ) -> tuple[tuple, tuple]:
    """JAX's entry shardings with each one the pipeline changed replaced (JAX checks them against the module). The
    mesh is the one JAX gave, else that of another entry sharding, else the module's on the compile's devices (a
    function whose entry shardings are all unspecified)."""
    shardings = {"arg": list(in_shardings), "result": list(out_shardings)}
    mesh = _any_mesh(in_shardings + out_shardings)
    for (kind, index), sharding in outcome.entry_changes.items():
        current = shardings[kind]
        if index < len(current):
            on = getattr(current[index], "mesh", None) or mesh
            if on is None and devices is not None and sharding.mesh in outcome.meshes:
                model = outcome.meshes[sharding.mesh]
                on = mesh = _jax.mesh_on(devices, model.axes, model.device_ids)
            current[index] = to_named_sharding(sharding, on)
    return tuple(shardings["arg"]), tuple(shardings["result"])


def _any_mesh(shardings: tuple):
    for s in shardings:
        if isinstance(s, NamedSharding):
            return s.mesh
    return None


def patch_lowered(lowered: jax.stages.Lowered, pipeline: str = "fix-shardings",
                  pass_ctx: PassContext | None = None, *, ring_passes: str = "", cls: type = jax.stages.Lowered
                  ) -> tuple[jax.stages.Lowered, Report]:
    """Run `pipeline` (then `ring_passes`, where the module has collective permutes) on a copy of the lowered
    module; return a Lowered (a `cls`) for the patched module, and the report (also added to `pass_ctx.report` when
    given). When nothing changed, the original Lowered is returned."""
    in_shardings, out_shardings = _jax.compile_shardings(lowered)
    patch = patch_module(_jax.lowered_module(lowered), in_shardings, out_shardings, pipeline, ring_passes,
                         target_mesh=pass_ctx.target_mesh if pass_ctx is not None else None,
                         devices=_jax.lowering_devices(lowered))
    if pass_ctx is not None:
        pass_ctx.report.extend(patch.report)
    if not patch.changed:
        return lowered, patch.report
    return _jax.relowered(lowered, patch.module, patch.in_shardings, patch.out_shardings, cls), patch.report
