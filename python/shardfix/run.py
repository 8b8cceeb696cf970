"""Run a Python program with shardfix enabled for every jax.jit in it, without editing it:

    python -m shardfix.run [--policy P] [--ring-reorder R] [--on-fix O] script.py [args...]
    python -m shardfix.run [options] -m module [args...]

Options not given come from the SHARDFIX environment variable (e.g. SHARDFIX="policy=drop,on_fix=log"), else the
defaults. The program sees the `sys.argv` it would see when run directly.
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys

PROG = "python -m shardfix.run"
_SETTINGS = ("policy", "ring_reorder", "on_fix")  # validated by the plugin's Settings, which know the choices


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Run a script or module with the shardfix plugin enabled for "
                                "every jax.jit in it. Options not given come from the SHARDFIX environment "
                                "variable (e.g. SHARDFIX=\"policy=drop,on_fix=log\"), else the defaults.")
    p.add_argument("--policy", help="how an indivisible dimension is corrected: auto, subaxis, prefix or drop")
    p.add_argument("--ring-reorder", help="ring attention load balancing: auto, zigzag, striped or off")
    p.add_argument("--on-fix", help="how a change is told: warn (a ShardingFixWarning), log (a record of the "
                                    "`shardfix` logger, on stderr unless logging is configured), error "
                                    "(ShardingFixError) or ignore")
    p.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE [ARGS]",
                   help="run a library module as a script, as `python -m` does")
    p.add_argument("script", nargs="?", help="the script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the program's arguments")
    return p


def parse(argv: list[str]) -> tuple[dict, str | None, str | None, list[str]]:
    """(settings given, module, script, the program's arguments); a bad command line exits with status 2 and
    argparse's message, `--help` with status 0."""
    parser = make_parser()
    ns = parser.parse_args(argv)
    chosen = {key: getattr(ns, key) for key in _SETTINGS if getattr(ns, key) is not None}
    if ns.module is not None:
        if not ns.module:
            parser.error("-m needs a module name")
        return chosen, ns.module[0], None, ns.module[1:]
    if ns.script is None:
        parser.error("give a script, or -m and a module")
    return chosen, None, ns.script, ns.args


def main(argv: list[str] | None = None) -> None:
    chosen, module, script, args = parse(sys.argv[1:] if argv is None else argv)
    try:
        from shardfix.jit.plugin import ENV_VAR, enable, settings_from_text
        base = settings_from_text(os.environ.get(ENV_VAR) or "1")
        settings = {} if base is None else {"policy": base.policy, "ring_reorder": base.ring_reorder,
                                            "on_fix": base.on_fix}
        settings.update(chosen)
        enable(**settings)
    except ValueError as e:
        make_parser().error(str(e))
    if settings.get("on_fix") == "log" and not logging.getLogger().handlers:
        # The program configured no logging (yet): as the application here, show shardfix's records on stderr.
        logging.basicConfig(format="%(name)s: %(levelname)s: %(message)s")
    if module is not None:
        sys.argv = [module] + args
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [script] + args
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
