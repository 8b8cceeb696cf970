"""Run a Python program with shardfix enabled for every jax.jit in it, without editing it:

    python -m shardfix.run [--policy P] [--ring-reorder R] [--on-fix O] script.py [args...]
    python -m shardfix.run [options] -m module [args...]

Options not given come from the SHARDFIX environment variable (e.g. SHARDFIX="policy=drop,on_fix=log"), else the
defaults. The program sees the `sys.argv` it would see when run directly.
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = "usage: python -m shardfix.run [--policy P] [--ring-reorder R] [--on-fix O] (script.py | -m module) [args...]"
_OPTIONS = {"--policy": "policy", "--ring-reorder": "ring_reorder", "--on-fix": "on_fix"}


def parse(argv: list[str]) -> tuple[dict, str | None, str | None, list[str]]:
    """(settings given, module, script, the program's arguments); ValueError on a bad command line."""
    chosen: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in _OPTIONS:
            if not eq:
                if i + 1 == len(argv):
                    raise ValueError(f"{name} needs a value")
                i, value = i + 1, argv[i + 1]
            chosen[_OPTIONS[name]] = value
        elif arg == "-m":
            if i + 1 == len(argv):
                raise ValueError("-m needs a module name")
            return chosen, argv[i + 1], None, argv[i + 2:]
        elif arg.startswith("-"):
            raise ValueError(f"unknown option {arg}")
        else:
            return chosen, None, arg, argv[i + 1:]
        i += 1
    raise ValueError("give a script, or -m and a module")


def main(argv: list[str] | None = None) -> None:
    try:
        chosen, module, script, args = parse(sys.argv[1:] if argv is None else argv)
        from shardfix.jit.plugin import ENV_VAR, enable, settings_from_text
        base = settings_from_text(os.environ.get(ENV_VAR) or "1")
        settings = {} if base is None else {"policy": base.policy, "ring_reorder": base.ring_reorder,
                                            "on_fix": base.on_fix}
        enable(**{**settings, **chosen})
    except ValueError as e:
        sys.exit(f"{USAGE}\nerror: {e}")
    if module is not None:
        sys.argv = [module] + args
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [script] + args
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
