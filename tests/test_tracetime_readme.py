"""The README's quick start runs as shown: on jax.make_mesh's default mesh, the warning it shows is the one a user
gets (its header and one line per fix)."""

import os
import re
import subprocess
import sys

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def quick_start_blocks() -> tuple[str, str]:
    text = open(README).read()
    section = text[text.index("## Quick start"):text.index("## What it does")]
    code, shown = re.findall(r"```(?:python)?\n(.*?)```", section, re.S)
    return code, shown


def test_quick_start_prints_the_warning_shown(tmp_path):
    code, shown = quick_start_blocks()
    (tmp_path / "model.py").write_text(code)
    run = subprocess.run([sys.executable, "model.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONWARNINGS": "default"})
    assert run.returncode == 0, run.stderr
    told = [line.replace(str(tmp_path) + os.sep, "") for line in run.stderr.splitlines()]
    start = next(i for i, line in enumerate(told) if "ShardingFixWarning" in line)
    warning = [told[start]] + [line for line in told[start + 1:] if line.startswith("  ")]
    warning = [line for line in warning if not line.startswith("  step(")]  # Python's echo of the calling line
    assert len([line for line in shown.splitlines() if re.match(r"  model\.py:\d+: ", line)]) == 3  # three fixes
    assert warning == shown.rstrip("\n").splitlines()  # the header, each fix and each of its details
