"""`make bench`: run every bench/bench_*.py and write their tables to bench/RESULTS.md.

`python bench/run_all.py bench_jit ...` runs only those benchmarks and replaces only their sections of RESULTS.md
(matched by title), each marked with the command, date and JAX that produced it; the other sections stay."""

from __future__ import annotations

import datetime
import importlib
import os
import platform
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Benchmarks of clients pinned to the oldest supported JAX (ejkernel): `make bench-ring` runs them there.
OLDEST_ONLY = {"bench_ring"}
sys.path.insert(0, HERE)

import common  # noqa: E402,F401  (sets XLA_FLAGS before JAX is imported)
import results  # noqa: E402


def main() -> None:
    import jax
    names = sys.argv[1:] or sorted(f[:-3] for f in os.listdir(HERE)
                                   if f.startswith("bench_") and f.endswith(".py") and f[:-3] not in OLDEST_ONLY)
    sections = []
    for name in names:
        print(f"running {name} ...", flush=True)
        section = importlib.import_module(name).main()
        print(section, flush=True)
        sections.append(section)
    device = jax.devices()[0]
    command = " ".join(["python bench/run_all.py"] + sys.argv[1:])
    machine = (f"{datetime.date.today()}; machine: {platform.machine()}, {os.cpu_count()} cores, "
               f"{device.platform.upper()} ({jax.device_count()} simulated devices); jax {jax.__version__}")
    mark = f"_Measured by `{command}`, {machine}._"
    fresh = {}
    for section in sections:
        for piece in re.split(r"(?m)^(?=## )", section)[1:]:
            fresh[piece.splitlines()[0]] = piece.rstrip("\n") + "\n\n" + mark
    header = None if sys.argv[1:] and os.path.exists(results.PATH) else (
        "# Benchmark results\n\nEach section says the command, date, machine and JAX that produced it; `make bench` "
        "runs every benchmark.\nRatios are measured side by side in one run (interleaved, median of several "
        "rounds).\n\n")
    results.write_sections(fresh, header)


if __name__ == "__main__":
    main()
