"""The command-line driver behind tools/opt and `shardfix-opt`, following mlir-opt's conventions.

Exit status 0 on success, 1 on any user error (located `FILE:LINE:COL: error: ...` on stderr, no traceback, and no
output file written or changed). `main` runs the work in a child process with a time limit (shardfix.watchdog);
`OptMain` is the work itself, which tests drive in-process.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import sys
from dataclasses import dataclass, field

from . import __version__
from .expectations import check, expectations
from .locations import SourceLoc
from .output import OutputError, write_output
from .report import Diagnostic, Report

PROG = "shardfix-opt"
SPLIT_MARKER = "// -----"
DEFAULT_TIMEOUT_S = 600.0
_BYTECODE_MAGIC = b"ML\xefR"


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter,
                usage=f"{PROG} [options] [-NAME[='OPTIONS'] ...] [input]",
                description="Run shardfix and MLIR passes on .mlir files (mlir-opt's conventions; single-dash long "
                            "options such as -split-input-file work too). A pass is added to the pipeline with "
                            "-NAME or --NAME='OPTIONS' (ours below, or any pass MLIR registers, e.g. -canonicalize), "
                            "or the whole pipeline is given with -p.")
    p.add_argument("input", nargs="?", default="-", help="input file, or - for standard input (default)")
    p.add_argument("-h", "--help", action="store_true", help="show this help, with the passes, and exit")
    p.add_argument("-o", dest="output", default="-", help="output file (default: standard output)")
    p.add_argument("-p", "--pass-pipeline", dest="pipeline", default=None,
                   help="comma-separated passes, e.g. 'fix-shardings{policy=drop},sdy-propagation-pipeline'")
    p.add_argument("--split-input-file", nargs="?", const=SPLIT_MARKER, default=None, metavar="MARKER",
                   help=f"process each chunk between MARKER lines on its own (default marker '{SPLIT_MARKER}')")
    p.add_argument("--output-split-marker", default=SPLIT_MARKER, metavar="MARKER",
                   help=f"the line between the chunks' outputs (default '{SPLIT_MARKER}')")
    p.add_argument("--emit-bytecode", action="store_true", help="write MLIR bytecode instead of text")
    p.add_argument("--no-implicit-module", action="store_true",
                   help="the input must be one top-level operation (no module is put around it)")
    p.add_argument("--mlir-disable-threading", action="store_true",
                   help="run MLIR single-threaded (shardfix's context always is: accepted for mlir-opt's sake)")
    p.add_argument("--verify-diagnostics", action="store_true",
                   help="check diagnostics and pass remarks against expected-* comments in the input")
    p.add_argument("--report", nargs="?", const="text", choices=("text", "json"),
                   help="print every recorded change and remark to stderr (as JSON lines with =json)")
    p.add_argument("--target-mesh", default=None, help="retarget to this mesh, e.g. 'dp=4,tp=2' (fix-shardings)")
    p.add_argument("--allow-unregistered-dialect", action="store_true", help="accept ops of unknown dialects")
    p.add_argument("--print-op-generic", "--mlir-print-op-generic", dest="print_op_generic", action="store_true",
                   help="print ops in generic form")
    p.add_argument("--mlir-print-debuginfo", action="store_true", help="print locations")
    p.add_argument("--mlir-print-ir-before-all", action="store_true",
                   help="print the module to stderr before every pass")
    p.add_argument("--mlir-print-ir-after-all", action="store_true",
                   help="print the module to stderr after every pass")
    p.add_argument("--mlir-timing", action="store_true", help="print the time each pass took to stderr")
    p.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"give up after this long with an error, writing nothing (0: no limit; default "
                        f"{DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--list-passes", action="store_true", help="list shardfix's passes and their options")
    p.add_argument("--version", action="store_true", help="print versions and exit")
    return p


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got '{text}'") from None
    if not 0 <= value <= 10**7:
        raise argparse.ArgumentTypeError(f"expected 0 to 10000000 seconds, got '{text}'")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse mlir-opt style arguments: `-split-input-file` means `--split-input-file`, `-o=FILE` means `-o FILE`,
    and `-name` / `--name[=options]` for a pass (ours or MLIR's) appends it to the pipeline."""
    parser = make_parser()
    long_options = {s for action in parser._actions for s in action.option_strings if s.startswith("--")}
    normalized = []
    for arg in argv:
        if arg.startswith("-o="):
            normalized += ["-o", arg[3:]]
        elif arg.startswith("-") and not arg.startswith("--") and len(arg) > 2 and \
                "--" + arg[1:].split("=", 1)[0] in long_options:
            normalized.append("-" + arg)
        else:
            normalized.append(arg)
    args, rest = parser.parse_known_args(normalized)
    flags = [a for a in rest if a.startswith("-") and len(a) > 1]
    if len(flags) != len(rest):
        raise UsageError(f"unrecognized arguments: {' '.join(a for a in rest if a not in flags)}")
    args.pass_flags = [(a, _pass_flag(a)) for a in flags]
    if args.pass_flags and args.pipeline is not None:
        raise UsageError(f"passes given both as flags ({' '.join(flags)}) and with --pass-pipeline")
    if args.emit_bytecode and args.split_input_file is not None:
        raise UsageError("--emit-bytecode with --split-input-file is not supported (bytecode holds one module; "
                         "split the file first)")
    return args


def _pass_flag(arg: str) -> str:
    """`--sdy-foo='a=1 b=2'` -> `sdy-foo{a=1 b=2}`."""
    name, eq, options = arg.lstrip("-").partition("=")
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise UsageError(f"unrecognized arguments: {arg}")
    return f"{name}{{{options}}}" if eq else name


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
            self.stdout.write(_list_passes())
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
            run_pipeline(module, pipeline, ctx, pass_ctx, explain_failures=held,
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


def _list_passes(flags: bool = False) -> str:
    """Our passes, a line each, and a line for each of their options (`flags`: spelled as the -NAME flags)."""
    from shardfix import passes
    lines = ["shardfix passes (registered MLIR passes such as canonicalize or sdy-propagation-pipeline mix freely):"]
    for name in passes.pass_names():
        cls = passes.lookup(name)
        lines.append(f"  {'-' if flags else ''}{name}: {cls.description}")
        for option, (_, kind, default) in cls.options().items():
            lines.append(f"    {option}={_kind_text(kind)} (default: {default!r})")
    return "\n".join(lines) + "\n"


def help_text() -> str:
    """--help: the options, then our passes and their options; `-NAME` adds a pass, `--NAME='a=1 b=2'` with
    options (the same as `-p 'NAME{a=1 b=2}'`)."""
    return (make_parser().format_help() + "\npasses: -NAME adds the pass NAME to the pipeline, --NAME='OPT=VALUE "
            "...' with options (as -p 'NAME{OPT=VALUE ...}').\n" + _list_passes(flags=True))


def _kind_text(kind) -> str:
    import typing
    if typing.get_origin(kind) is typing.Literal:
        return "|".join(typing.get_args(kind))
    return kind.__name__


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
