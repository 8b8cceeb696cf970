"""The command-line driver behind tools/opt and `shardfix-opt`, following mlir-opt's conventions.

Exit status 0 on success, 1 on any user error (located `FILE:LINE:COL: error: ...` on stderr, no traceback, and no
output file written or changed).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field

from . import __version__
from .ir import LoadError, make_context, parse_module
from .pipeline import PassContext, Pipeline, PipelineError, build_pass_manager, parse_pipeline, run_pipeline
from .report import Diagnostic, Report
from .sharding import parse_mesh_spec

PROG = "shardfix-opt"
_SPLIT_MARKER = re.compile(r"^[ \t]*// -----[ \t]*$", re.MULTILINE)
_EXPECTED = re.compile(r"//\s*expected-(error|warning|remark|note)\s*(@(?:above|below|[+-]\d+))?\s*\{\{(.*?)\}\}")
_BYTECODE_MAGIC = b"ML\xefR"


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Run shardfix and MLIR passes on .mlir files.")
    p.add_argument("input", nargs="?", default="-", help="input file, or - for standard input (default)")
    p.add_argument("-o", dest="output", default="-", help="output file (default: standard output)")
    p.add_argument("-p", "--pass-pipeline", dest="pipeline", default=None,
                   help="comma-separated passes, e.g. 'fix-shardings{policy=drop},sdy-propagation-pipeline'")
    p.add_argument("--split-input-file", action="store_true", help="process each '// -----' chunk on its own")
    p.add_argument("--verify-diagnostics", action="store_true",
                   help="check diagnostics and pass remarks against expected-* comments in the input")
    p.add_argument("--report", nargs="?", const="text", choices=("text", "json"),
                   help="print every recorded change and remark to stderr (as JSON lines with =json)")
    p.add_argument("--target-mesh", default=None, help="retarget to this mesh, e.g. 'dp=4,tp=2' (fix-shardings)")
    p.add_argument("--allow-unregistered-dialect", action="store_true", help="accept ops of unknown dialects")
    p.add_argument("--print-op-generic", action="store_true", help="print ops in generic form")
    p.add_argument("--mlir-print-debuginfo", action="store_true", help="print locations")
    p.add_argument("--list-passes", action="store_true", help="list shardfix's passes and their options")
    p.add_argument("--version", action="store_true", help="print versions and exit")
    return p


@dataclass
class _Chunk:
    text: str
    first_line: int  # 0-based line of the chunk in the whole input
    output: str | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)


class OptMain:
    """One invocation; tests drive `run(argv)` directly with their own streams."""

    def __init__(self, stdout=None, stderr=None, stdin=None):
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.stdin = stdin or sys.stdin.buffer

    def run(self, argv: list[str]) -> int:
        try:
            return self._run(make_parser().parse_args(argv))
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
        if args.version:
            import jax, jaxlib
            print(f"{PROG} {__version__} (jax {jax.__version__}, jaxlib {jaxlib.__version__})", file=self.stdout)
            return 0
        if args.list_passes:
            self.stdout.write(_list_passes())
            return 0
        pass_ctx = PassContext(Report())
        if args.target_mesh is not None:
            try:
                pass_ctx.target_mesh = parse_mesh_spec(args.target_mesh)
            except ValueError as e:
                raise UsageError(f"--target-mesh: {e}") from None
        pipeline = parse_pipeline(args.pipeline) if args.pipeline else Pipeline(())
        if args.target_mesh is not None and not any(e.ours is not None and e.ours.name == "fix-shardings"
                                                    for e in pipeline.elements):
            raise UsageError("--target-mesh is applied by fix-shardings; add it to the pipeline (-p fix-shardings)")
        name, source = self._read(args.input)
        ctx = make_context(args.allow_unregistered_dialect)
        build_pass_manager(pipeline, ctx, pass_ctx)  # reject unknown MLIR passes before reading any module

        chunks = _split(source, args.split_input_file)
        ok = True
        for chunk in chunks:
            ok &= self._process(chunk, name, pipeline, ctx, pass_ctx, args)
        if args.verify_diagnostics:
            ok = all([self._verify(chunk, name) for chunk in chunks])
        if args.report and pass_ctx.report:
            self.stderr.write(pass_ctx.report.render_json() if args.report == "json"
                              else pass_ctx.report.render_text())
        if not ok:
            return 1
        self._write(args.output, "// -----\n".join(c.output or "" for c in chunks))
        return 0

    def _read(self, path: str) -> tuple[str, str | bytes]:
        if path == "-":
            name, data = "<stdin>", self.stdin.read()
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
        if not text.strip():
            self._error(f"{name}:1:1: error: input is empty")
            raise _Failure()
        return name, text

    def _process(self, chunk: _Chunk, name: str, pipeline: Pipeline, ctx, pass_ctx: PassContext, args) -> bool:
        before = len(pass_ctx.report.fixes), len(pass_ctx.report.remarks), len(pass_ctx.report.rings)
        try:
            module = parse_module(chunk.text, ctx, name, lenient=pipeline.loads_leniently)
            run_pipeline(module, pipeline, ctx, pass_ctx)
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
        with ctx:
            chunk.output = module.get_asm(print_generic_op_form=args.print_op_generic,
                                          enable_debug_info=args.mlir_print_debuginfo, assume_verified=True)
        if not chunk.output.endswith("\n"):
            chunk.output += "\n"
        return True

    def _verify(self, chunk: _Chunk, name: str) -> bool:
        expected = []
        lines = chunk.text.split("\n")
        for i, line in enumerate(lines):
            for m in _EXPECTED.finditer(line):
                target = i + 1
                if m.group(2):
                    at = m.group(2)[1:]
                    target += {"above": -1, "below": 1}.get(at, None) or int(at)
                expected.append([m.group(1), target, m.group(3), i + 1, m.start() + 1, False])
        ok = True
        for d in chunk.diagnostics:
            if d.severity == "note" and not any(e[0] == "note" for e in expected):
                continue
            match = next((e for e in expected if not e[5] and e[0] == d.severity and e[1] == d.loc.line
                          and e[2] in d.message), None)
            if match is None:
                self._error(f"{d.loc if d.loc.file else name}: error: unexpected {d.severity}: {d.message}")
                ok = False
            else:
                match[5] = True
        for severity, _, text, line, col, seen in expected:
            if not seen:
                self._error(f"{name}:{line}:{col}: error: expected {severity} \"{text}\" was not produced")
                ok = False
        return ok

    def _write(self, path: str, text: str) -> None:
        if path == "-":
            self.stdout.write(text)
            return
        directory = os.path.dirname(os.path.abspath(path))
        try:
            fd, tmp = tempfile.mkstemp(prefix=".shardfix-", dir=directory)
        except OSError as e:
            self._error(f"{PROG}: error: cannot write output file '{path}': {e.strerror}")
            raise _Failure() from None
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError as e:
            os.unlink(tmp)
            self._error(f"{PROG}: error: cannot write output file '{path}': {e.strerror}")
            raise _Failure() from None


class _Failure(Exception):
    """Already reported to stderr."""


def _split(source: str | bytes, split: bool) -> list[_Chunk]:
    if isinstance(source, bytes) or not split:
        return [_Chunk(source, 0)]
    chunks, start, line = [], 0, 0
    for m in _SPLIT_MARKER.finditer(source):
        chunks.append(_Chunk("\n" * line + source[start:m.start()], line))
        line += source[start:m.end()].count("\n")
        start = m.end()
    chunks.append(_Chunk("\n" * line + source[start:], line))
    return chunks


def _list_passes() -> str:
    from shardfix import passes
    lines = ["shardfix passes (registered MLIR passes such as canonicalize or sdy-propagation-pipeline mix freely):"]
    for name in passes.pass_names():
        cls = passes.lookup(name)
        lines.append(f"  {name}: {cls.description}")
        for option, (_, kind, default) in cls.options().items():
            lines.append(f"    {option}={_kind_text(kind)} (default: {default!r})")
    return "\n".join(lines) + "\n"


def _kind_text(kind) -> str:
    import typing
    if typing.get_origin(kind) is typing.Literal:
        return "|".join(typing.get_args(kind))
    return kind.__name__


def main(argv: list[str] | None = None) -> int:
    try:
        return OptMain().run(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug in shardfix: say so in one line, the traceback only on request
        if os.environ.get("SHARDFIX_TRACEBACK"):
            raise
        print(f"{PROG}: internal error: {type(e).__name__}: {e} (set SHARDFIX_TRACEBACK=1 for details)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
