"""tools/opt's command line: mlir-opt's spellings parsed into options and a pipeline, and the help text with our
passes. Pure: imports neither MLIR nor JAX (the pass list imports the pass classes)."""

from __future__ import annotations

import argparse

PROG = "shardfix-opt"
SPLIT_MARKER = "// -----"
DEFAULT_TIMEOUT_S = 600.0


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


def list_passes(flags: bool = False) -> str:
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
            "...' with options (as -p 'NAME{OPT=VALUE ...}').\n" + list_passes(flags=True))


def _kind_text(kind) -> str:
    import typing
    if typing.get_origin(kind) is typing.Literal:
        return "|".join(typing.get_args(kind))
    return kind.__name__
