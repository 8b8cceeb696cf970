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
    fix_lines = lambda lines: [line for line in lines if re.match(r"(model\.py:\d+: |  model\.py:\d+: )", line)]  # noqa
    assert len(fix_lines(shown.splitlines())) == 4  # the header and three fixes
    assert fix_lines(told) == fix_lines(shown.splitlines())
