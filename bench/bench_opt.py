"""`tools/opt -p fix-shardings` against `tools/opt` alone (parse, verify, print) on a Llama-style training step
(tests/support/llama.py, dp=2 x tp=4, lowered with debug info) at 64 and 256 layers: the valid module as JAX lowers
it, and a copy with one argument's sharding naming an axis the mesh lacks, which loads only leniently. Goal: the
valid module through fix-shardings at most 1.15x of tools/opt alone. Each command runs as a user runs it (a fresh
process: JAX's import included), the commands alternating, the median of `--rounds` wall times.

    python bench/bench_opt.py [--layers 64 256] [--rounds 3] [--baseline DIR] [--results]

`--baseline DIR` times the invalid module's repair with the shardfix package found in DIR too (a checkout's
`python` folder), in the same run: the lenient load against an earlier version of it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import common  # noqa: F401  (sets XLA_FLAGS first, puts tests/ on the path)

TITLE = ("## tools/opt -p fix-shardings vs tools/opt alone on a Llama-style step "
         "(goal: at most 1.15x on the valid module)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _invalid_copy(text: str) -> str:
    marker = 'sdy.sharding = #sdy.sharding<@mesh, [{'
    at = text.index(marker) + len(marker)
    return text[:at] + '"no_such_axis"' + ("" if text[at] == "}" else ", ") + text[at:]


def _wall(path: str, pipeline: bool, python_path: str) -> tuple[float, float]:
    """Wall seconds of the command, and the CPU seconds (user + system) of its processes: on a machine others load
    too, the second moves less with what else runs."""
    env = {**os.environ, "PYTHONPATH": python_path}
    args = [sys.executable, os.path.join(ROOT, "tools", "opt"), path, "-o", os.devnull]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args + (["-p", "fix-shardings"] if pipeline else []), env=env, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr[-2000:]}")
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def measure(layers_list: list[int], rounds: int, baseline: str | None) -> list[dict]:
    import jax
    from support.llama import lowered_step

    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    ours = os.path.join(ROOT, "python")
    rows = []
    with tempfile.TemporaryDirectory(prefix="shardfix-bench-opt-") as work:
        for layers in layers_list:
            text = lowered_step(mesh, layers).as_text(debug_info=True)
            valid, invalid = os.path.join(work, f"valid{layers}.mlir"), os.path.join(work, f"invalid{layers}.mlir")
            with open(valid, "w") as f:
                f.write(text)
            with open(invalid, "w") as f:
                f.write(_invalid_copy(text))
            runs = {"plain": (valid, False, ours), "fix": (valid, True, ours), "invalid": (invalid, True, ours)}
            if baseline:
                runs["invalid_baseline"] = (invalid, True, baseline)
            times: dict[str, list[float]] = {name: [] for name in runs}
            cpu: dict[str, list[float]] = {name: [] for name in runs}
            for i in range(rounds):
                for name in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
                    wall, used = _wall(*runs[name])
                    times[name].append(wall)
                    cpu[name].append(used)
            row = {"layers": layers, "kib": len(text) // 1024, **{k: statistics.median(v) for k, v in times.items()},
                   **{f"{k}_cpu": statistics.median(v) for k, v in cpu.items()}}
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    return rows


def render(rows: list[dict], rounds: int, baseline: str | None) -> str:
    head = ("| layers | module (KiB) | tools/opt (s) | -p fix-shardings (s) | ratio | CPU s: tools/opt, -p fix-shardings "
            "| CPU ratio | invalid copy, -p fix-shardings (s) |")
    if baseline:
        head += " invalid copy, earlier loader (s) |"
    table = [head, "|" + "---:|" * (head.count("|") - 1)]
    for r in rows:
        line = (f"| {r['layers']} | {r['kib']} | {r['plain']:.2f} | {r['fix']:.2f} | {r['fix'] / r['plain']:.2f}x "
                f"| {r['plain_cpu']:.2f}, {r['fix_cpu']:.2f} | {r['fix_cpu'] / r['plain_cpu']:.2f}x | {r['invalid']:.2f} |")
        if baseline:
            line += f" {r['invalid_baseline']:.2f} |"
        table.append(line)
    return (f"{TITLE}\n\n"
            f"Command: `python bench/bench_opt.py{' --baseline DIR' if baseline else ''}` (wall seconds of "
            f"`tools/opt FILE -o /dev/null [-p fix-shardings]`, each a fresh process as users run it, JAX's import "
            f"included; median of {rounds} runs, the commands alternating; *CPU s*: the median user + system seconds "
            f"of the same runs, which move less than wall time when others load the machine). The model: tests/support/llama.py, "
            "dp=2 x tp=4, lowered with debug info. A valid module is parsed and verified once, as it is (above 4 MiB "
            "after a quick look at its shardings finds nothing wrong: shardfix.lenient.looks_valid), and not verified "
            "again after fix-shardings when the pass changed nothing; the *invalid copy* (one argument's sharding "
            "names an axis the mesh lacks) is parsed as it is, refused by the verifier, then parsed again with its "
            "keys renamed and put back (above 4 MiB, where the quick look sees the unknown axis, the renamed keys come "
            "first), and verified after the pass"
            + (", against the same run with the loader of an earlier checkout (*earlier loader*)" if baseline else "")
            + ".\n\n" + "\n".join(table) + "\n")


def main(argv=None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", help="a checkout's python folder: its loader times the invalid copy too")
    ap.add_argument("--results", action="store_true", help="put the table into bench/RESULTS.md")
    args = ap.parse_args([] if argv is None and __name__ != "__main__" else argv)
    section = render(measure(args.layers, args.rounds, args.baseline), args.rounds, args.baseline)
    if args.results:
        from results import replace_section
        replace_section(TITLE, section)
    return section


if __name__ == "__main__":
    print(main())
