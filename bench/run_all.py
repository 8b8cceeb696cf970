"""`make bench`: run every bench/bench_*.py and write their tables to bench/RESULTS.md (`run_all.py NAME ...` runs
some of them; the sections of the others stay as they were)."""

from __future__ import annotations

import datetime
import importlib
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402,F401  (sets XLA_FLAGS before JAX is imported)


def main() -> None:
    import jax
    names = sys.argv[1:] or sorted(f[:-3] for f in os.listdir(HERE) if f.startswith("bench_") and f.endswith(".py"))
    sections = []
    for name in names:
        print(f"running {name} ...", flush=True)
        section = importlib.import_module(name).main()
        print(section, flush=True)
        sections.append(section)
    device = jax.devices()[0]
    command = " ".join(["python bench/run_all.py"] + sys.argv[1:])
    header = (f"# Benchmark results\n\nCommand: `{command}` (`make bench` runs every benchmark)"
              f"\nDate: {datetime.date.today()}; machine: {platform.machine()}, {os.cpu_count()} cores, "
              f"{device.platform.upper()} ({jax.device_count()} simulated devices); jax {jax.__version__}.\n"
              "Ratios are measured side by side in one run (interleaved, median of several rounds).\n\n")
    # Each benchmark's sections replace their earlier versions; sections of benchmarks not run stay.
    from results import write_sections
    write_sections({section.split("\n", 1)[0]: section for text in sections for section in _split(text)},
                   None if sys.argv[1:] else header)  # a partial run keeps the header of the full one


def _split(text: str) -> list[str]:
    """A benchmark's output, one string per `## ` section."""
    parts = ("\n" + text).split("\n## ")
    return ["## " + part.strip("\n") for part in parts[1:]]


if __name__ == "__main__":
    main()
