"""The README's Python examples run, so what they show (results, comments) can't drift from what shardfix does:
every ```python block is a doctest, run in order in one namespace, except the two below."""

import doctest
import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
# Sections whose Python blocks are not doctests: the quick start runs as a script (tests/test_tracetime_readme.py
# checks the warning it prints), and the decorator's block is a sketch over the user's own `params` and `batch`.
NOT_DOCTESTS = ("## Quick start", "## `@autofix_shardings`")


def python_blocks() -> list[tuple[str, int, str]]:
    """(section heading, line number, code) of each ```python block."""
    text = open(README).read()
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        before = text[:match.start()]
        heading = re.findall(r"^## .*$", before, re.M)[-1]
        blocks.append((heading, before.count("\n") + 2, match.group(1)))
    return blocks


def test_every_python_block_is_a_doctest_or_run_elsewhere():
    for heading, line, code in python_blocks():
        assert code.startswith(">>> ") or heading.startswith(NOT_DOCTESTS), f"README.md:{line} ({heading})"


def test_the_readme_doctests(monkeypatch):
    monkeypatch.chdir(os.path.dirname(README))
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(verbose=False)
    globs: dict = {}
    ran = 0
    for heading, line, code in python_blocks():
        if not code.startswith(">>> "):
            continue
        test = parser.get_doctest(code, globs, f"README.md:{line}", README, line - 1)
        ran += len(test.examples)
        runner.run(test, out=lambda text: pytest.fail(text, pytrace=False), clear_globs=False)
        globs = test.globs  # a DocTest runs in a copy: the next block starts from what this one left
    assert ran >= 20 and runner.summarize(verbose=False).failed == 0
