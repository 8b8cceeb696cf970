"""The command-line driver behind tools/opt and `shardfix-opt`, following mlir-opt's conventions.

Exit status 0 on success, 1 on any user error (located `FILE:LINE:COL: error: ...` on stderr, no traceback, and no
output file written or changed). `main` runs the work in a child process with a time limit (shardfix.watchdog);
`OptMain` is the work itself, which tests drive in-process.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
from dataclasses import dataclass, field

from . import __version__
from .expectations import check, expectations
from .locations import SourceLoc
from .opt_args import PROG, UsageError, help_text, list_passes, parse_args
from .output import OutputError, write_output
from .report import Diagnostic, Report

_BYTECODE_MAGIC = b"ML\xefR"


@dataclass
class _Chunk:
    text: str | bytes
    first_line: int  # 1-based line of the chunk in the whole input
    output: str | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)


class _Failure(Exception):
    """Already reported to stderr."""


class OptMain:
    """One invocation; tests drive `run(argv)` directly with their own streams. With a `channel` (the watchdog's
    child), progress and output go to it rather than to the streams."""

    def __init__(self, stdout=None, stderr=None, stdin=None, channel=None):
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.stdin = stdin if stdin is not None else sys.stdin.buffer if sys.stdin is not None else None
        self.channel = channel

    def run(self, argv: list[str]) -> int:
        from .pipeline import PipelineError
        try:
            return self._run(parse_args(argv))
        except UsageError as e:
            self._error(f"{PROG}: error: {e}")
        except PipelineError as e:
            self._error(f"<pass-pipeline>:1:{e.col}: error: {e}")
        except _Failure:
            pass
        return 1

    def _error(self, line: str) -> None:
        print(line, file=self.stderr)

    def _run(self, args) -> int:
        if args.help:
            self.stdout.write(help_text())
            return 0
        if args.version:
            import jax
            import jaxlib
            print(f"{PROG} {__version__} (jax {jax.__version__}, jaxlib {jaxlib.__version__})", file=self.stdout)
            return 0
        if args.list_passes:
            self.stdout.write(list_passes())
            return 0
        from .ir import make_context
        from .pipeline import PassContext, Pipeline, PipelineError, build_pass_manager, parse_pipeline
        from .sharding import parse_mesh_spec
        pass_ctx = PassContext(Report())
        if args.target_mesh is not None:
            try:
                pass_ctx.target_mesh = parse_mesh_spec(args.target_mesh)
            except ValueError as e:
                raise UsageError(f"--target-mesh: {e}") from None
        ctx = make_context(args.allow_unregistered_dialect)
        for flag, element in args.pass_flags:  # a flag that names no pass is an unknown option, as in mlir-opt
            try:
                build_pass_manager(parse_pipeline(element), ctx, pass_ctx)
            except PipelineError:
                raise UsageError(f"unrecognized arguments: {flag}") from None
        text = args.pipeline if args.pipeline is not None else ",".join(e for _, e in args.pass_flags)
        pipeline = parse_pipeline(text) if text else Pipeline(())
        if args.target_mesh is not None and not any(e.ours is not None and e.ours.name == "fix-shardings"
                                                    for e in pipeline.elements):
            raise UsageError("--target-mesh is applied by fix-shardings; add it to the pipeline (-p fix-shardings)")
        name, source = self._read(args.input)
        build_pass_manager(pipeline, ctx, pass_ctx)  # reject unknown MLIR passes before reading any module

        chunks = _split(source, args.split_input_file)
        ok = True
        for chunk in chunks:
            if self.channel is not None:
                self.channel.progress(chunk.first_line)
            ok &= self._process(chunk, name, pipeline, ctx, pass_ctx, args)
        if args.verify_diagnostics:
            ok = all([self._verify(chunk, name) for chunk in chunks])
        if args.report and pass_ctx.report:
            self.stderr.write(pass_ctx.report.render_json() if args.report == "json"
                              else pass_ctx.report.render_text())
        written = [c.output for c in chunks if c.output is not None]
        if ok or (args.output == "-" and written and not args.verify_diagnostics):
            # Like mlir-opt, standard output gets every chunk that succeeded even when another failed; a file
            # is written only when all did.
            if args.emit_bytecode:
                self._emit(args.output, written[0] if written else b"")
            else:
                self._emit(args.output, (args.output_split_marker + "\n").join(written))
        return 0 if ok else 1

    def _emit(self, path: str, data: str | bytes) -> None:
        if self.channel is not None:
            self.channel.output(path, data)
            return
        try:
            if path == "-":
                if isinstance(data, bytes):
                    self.stdout.flush()
                    self.stdout.buffer.write(data)
                    self.stdout.buffer.flush()
                else:
                    self.stdout.write(data)
                    self.stdout.flush()
            else:
                write_output(path, data if isinstance(data, bytes) else data.encode())
        except (OutputError, OSError, ValueError, AttributeError) as e:
            reason = e if isinstance(e, OutputError) else f"cannot write to standard output: {e}"
            self._error(f"{PROG}: error: {reason}")
            raise _Failure() from None

    def _read(self, path: str) -> tuple[str, str | bytes]:
        if path == "-":
            try:
                if self.stdin is None:
                    raise OSError("standard input is closed")
                name, data = "<stdin>", self.stdin.read()
            except (OSError, ValueError) as e:
                self._error(f"{PROG}: error: cannot read standard input: {e}")
                raise _Failure() from None
        else:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                self._error(f"{PROG}: error: cannot open input file '{path}': {e.strerror}")
                raise _Failure() from None
            name = path
        if data.startswith(_BYTECODE_MAGIC):
            return name, data
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data[:e.start].count(b"\n") + 1
            col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
            self._error(f"{name}:{line}:{col}: error: input is not UTF-8 text nor MLIR bytecode "
                        f"(byte 0x{data[e.start]:02x})")
            raise _Failure() from None
        if "\0" in text:
            line = text[:text.index("\0")].count("\n") + 1
            self._error(f"{name}:{line}:1: error: input contains NUL bytes (binary data?)")
            raise _Failure()
        return name, text

    def _process(self, chunk: _Chunk, name: str, pipeline, ctx, pass_ctx, args) -> bool:
        from .ir import LoadError
        from .ir.loader import load_module
        from .pipeline import run_pipeline
        before = len(pass_ctx.report.fixes), len(pass_ctx.report.remarks), len(pass_ctx.report.rings)
        try:
            root = _explicit_root(chunk.text, ctx, name, pipeline) if args.no_implicit_module else None
            module, held = load_module(chunk.text, ctx, name, lenient=pipeline.loads_leniently)
            self.stderr.flush()
            run_pipeline(module, pipeline, ctx, pass_ctx, explain_failures=held, verified=not held,
                         print_ir_before_all=args.mlir_print_ir_before_all,
                         print_ir_after_all=args.mlir_print_ir_after_all, timing=args.mlir_timing)
        except LoadError as e:
            chunk.diagnostics = e.diagnostics
            if not args.verify_diagnostics:
                for d in e.diagnostics:
                    self._error(d.render(fallback=name))
            return False
        finally:
            if args.verify_diagnostics:
                fresh = Report(pass_ctx.report.fixes[before[0]:], pass_ctx.report.remarks[before[1]:],
                               pass_ctx.report.rings[before[2]:])
                chunk.diagnostics = chunk.diagnostics + fresh.diagnostics()
        if root is not None:  # --no-implicit-module and a single op that is not a module: printed as it is
            module = root
        with ctx:
            if args.emit_bytecode:
                buffer = io.BytesIO()
                module.write_bytecode(buffer)
                chunk.output = buffer.getvalue()
                return True
            chunk.output = module.get_asm(print_generic_op_form=args.print_op_generic,
                                          enable_debug_info=args.mlir_print_debuginfo, assume_verified=True)
        if not chunk.output.endswith("\n"):
            chunk.output += "\n"
        return True

    def _verify(self, chunk: _Chunk, name: str) -> bool:
        text = chunk.text if isinstance(chunk.text, str) else ""
        errors = check(expectations(text), chunk.diagnostics, name)
        for line in errors:
            self._error(line)
        return not errors


def _explicit_root(text: str | bytes, ctx, name: str, pipeline):
    """--no-implicit-module: the input's one top-level operation, parsed as it is (mlir-opt's error when there
    are more or none); None when it is a module (the pipeline runs on it as usual)."""
    from jaxlib.mlir import ir

    from .ir import LoadError, diagnostics_of
    if isinstance(text, bytes):
        return None  # bytecode always holds one top-level operation
    with ctx:
        try:
            op = ir.Operation.parse(text, source_name=name).operation
        except ir.MLIRError as e:  # MLIR puts "found: N top-level operations" at line 0: the file's start
            raise LoadError([d if d.loc.line else dataclasses.replace(d, loc=SourceLoc(name, 1, 1))
                             for d in diagnostics_of(e)]) from None
    if op.name == "builtin.module":
        return None
    if pipeline.elements:
        from .report import Diagnostic
        raise LoadError([Diagnostic("error", f"--no-implicit-module: the top-level operation is '{op.name}', and "
                                             f"the pipeline runs on 'builtin.module'", _op_loc(op, name))])
    return op


def _op_loc(op, name: str) -> SourceLoc:
    from .ir.locations import source_loc
    loc = source_loc(op.location)
    return loc if loc.file and loc.line else SourceLoc(name, 1, 1)


def _split(source: str | bytes, marker: str | None) -> list[_Chunk]:
    """The input's chunks between `marker` lines, each padded with blank lines so its diagnostics keep the file's
    lines."""
    if isinstance(source, bytes) or marker is None:
        return [_Chunk(source, 1)]
    lines = source.split("\n")
    chunks, start = [], 0
    for i, line in enumerate(lines):
        if line.strip() == marker.strip():
            chunks.append(_Chunk("\n" * start + "\n".join(lines[start:i]), start + 1))
            start = i + 1
    chunks.append(_Chunk("\n" * start + "\n".join(lines[start:]), start + 1))
    return chunks


def main(argv: list[str] | None = None) -> int:
    """tools/opt: the run in a child process with a time limit; a crash or a bug is one line, never a traceback."""
    from .watchdog import run_guarded
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    if args.timeout == 0 or args.version or args.list_passes or args.help:
        return _unguarded(argv)
    input_name = "<stdin>" if args.input == "-" else args.input
    return run_guarded("shardfix.opt:_work", argv, args.timeout, input_name, PROG)


def _work(argv: list[str], channel) -> int:
    try:
        return OptMain(channel=channel).run(argv)
    except Exception as e:  # a bug in shardfix: one line, the traceback only on request
        if os.environ.get("SHARDFIX_TRACEBACK"):
            raise
        print(f"{PROG}: internal error: {type(e).__name__}: {e} (set SHARDFIX_TRACEBACK=1 for details)",
              file=sys.stderr)
        return 1


def _unguarded(argv: list[str]) -> int:
    try:
        return _work(argv, None)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
