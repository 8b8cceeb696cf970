"""`--verify-diagnostics`: the `// expected-error @+1 {{text}}` comments of an input (mlir-opt's syntax: error,
warning, remark or note; @+N, @-N, @above, @below or nothing for the same line) matched against the
diagnostics a run produced. Pure: imports neither MLIR nor JAX."""

from __future__ import annotations

from dataclasses import dataclass

from .report import Diagnostic

SEVERITIES = ("error", "warning", "remark", "note")


@dataclass
class Expectation:
    severity: str
    target_line: int  # the line the diagnostic must point to
    text: str  # a substring of its message
    line: int  # where the comment is
    col: int
    seen: bool = False


def expectations(text: str) -> list[Expectation]:
    out = []
    for number, line in enumerate(text.split("\n"), start=1):
        comment = line.find("//")
        while comment >= 0:
            found = _read(line, comment + 2, number)
            if found is not None:
                out.append(found)
            comment = line.find("//", comment + 2)
    return out


def _read(line: str, start: int, number: int) -> Expectation | None:
    """One `expected-<severity> [@where] {{text}}` right after a `//`."""
    i = start
    while i < len(line) and line[i] in " \t":
        i += 1
    if not line.startswith("expected-", i):
        return None
    col = start - 1  # the comment's column (1-based)
    i += len("expected-")
    severity = next((s for s in SEVERITIES if line.startswith(s, i)), None)
    if severity is None:
        return None
    i += len(severity)
    target = number
    while i < len(line) and line[i] in " \t":
        i += 1
    if line.startswith("@", i):
        j = i + 1
        while j < len(line) and line[j] not in " \t{":
            j += 1
        where = line[i + 1:j]
        if where == "above":
            target -= 1
        elif where == "below":
            target += 1
        elif len(where) > 1 and where[0] in "+-" and where[1:].isdigit():
            target += int(where)
        else:
            return None
        i = j
        while i < len(line) and line[i] in " \t":
            i += 1
    if not line.startswith("{{", i):
        return None
    end = line.find("}}", i + 2)
    if end < 0:
        return None
    return Expectation(severity, target, line[i + 2:end], number, col)


def check(expected: list[Expectation], produced: list[Diagnostic], name: str) -> list[str]:
    """The error lines for diagnostics nobody expected and expectations nothing met (empty when all match)."""
    errors = []
    notes_expected = any(e.severity == "note" for e in expected)
    for d in produced:
        if d.severity == "note" and not notes_expected:
            continue
        match = next((e for e in expected if not e.seen and e.severity == d.severity and e.target_line == d.loc.line
                      and e.text in d.message), None)
        if match is None:
            errors.append(f"{d.loc if d.loc.file else name}: error: unexpected {d.severity}: {d.message}")
        else:
            match.seen = True
    for e in expected:
        if not e.seen:
            errors.append(f"{name}:{e.line}:{e.col}: error: expected {e.severity} \"{e.text}\" was not produced")
    return errors
