"""Running tools/opt's driver over a corpus of .mlir test cases, each in a forked child with a time limit, and
judging the outcome (used by tests/test_mutants.py and bench/shardy_corpus.py).

A case is one `// -----` chunk of a file (an `//--- name` split-file is one case: its parts form one program).
It is INVALID when it carries an `expected-error`, VALID otherwise. For each case:
  plain   the driver with no pipeline (parse, verify, print)
  fix     `-p fix-shardings --report=json`
  reparse the fix output, parsed and verified again
The children import nothing: the parent imported shardfix and JAX once, so a case costs a fork, not a start.
"""

from __future__ import annotations

import io
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

SPLIT_MARKER = "// -----"
PARTS_MARKER = "//--- "
REFUSAL = "fix-shardings can't repair this"


@dataclass
class Case:
    name: str  # file#chunk
    text: str  # padded with blank lines so its diagnostics carry the file's line numbers
    expects_error: bool
    unregistered: bool  # the file's RUN lines allow unregistered dialects

    @property
    def kind(self) -> str:
        return "INVALID" if self.expects_error else "VALID"


def split_cases(name: str, text: str) -> list[Case]:
    lines = text.split("\n")
    unregistered = "allow-unregistered-dialect" in text
    if any(line.startswith(PARTS_MARKER) for line in lines):
        body = "\n".join("" if line.startswith(PARTS_MARKER) else line for line in lines)
        return [Case(f"{name}#0", body, "expected-error" in body, unregistered)]
    cases, start = [], 0
    for i, line in enumerate(lines + [SPLIT_MARKER]):
        if line.strip() != SPLIT_MARKER:
            continue
        chunk = lines[start:i]
        if any(ln.strip() and not ln.lstrip().startswith("//") for ln in chunk):
            padded = "\n" * start + "\n".join(chunk) + "\n"
            cases.append(Case(f"{name}#{len(cases)}", padded, "expected-error" in padded, unregistered))
        start = i + 1
    return cases


def load_cases(root: Path) -> list[Case]:
    cases = []
    for path in sorted(root.rglob("*.mlir")):
        cases.extend(split_cases(path.relative_to(root).as_posix(), path.read_text()))
    return cases


@dataclass
class Run:
    code: int | None  # exit status; None when killed
    signal: str = ""  # the signal that ended it
    timed_out: bool = False
    traceback: str = ""  # a Python exception that escaped the driver
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    @property
    def outcome(self) -> str:
        if self.timed_out:
            return "hang"
        if self.signal:
            return f"crash:{self.signal}"
        if self.traceback:
            return "traceback"
        return {0: "ok", 1: "error"}.get(self.code, f"exit:{self.code}")


def _child(argv: list[str], data: bytes, out_path: str, err_path: str) -> None:
    """In the forked child: run the driver with its streams on files; never returns."""
    code = 70
    try:
        err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(err_fd, 2)  # native crashes write here too
        from shardfix.opt import OptMain
        with open(out_path, "w") as out, open(err_path, "a") as err:
            try:
                code = OptMain(stdout=out, stderr=err, stdin=io.BytesIO(data)).run(argv)
            except BaseException:  # noqa: BLE001  (an escaped exception is the finding)
                err.write("\nTRACEBACK\n" + traceback.format_exc())
                code = 70
    finally:
        os._exit(code)


class Pool:
    """Runs the driver in forked children, `jobs` at a time, each with a time limit."""

    def __init__(self, workdir: Path, jobs: int = 2, timeout: float = 60.0):
        import jax  # noqa: F401  (import once, before forking)
        import shardfix.jit._jax  # noqa: F401
        import shardfix.opt  # noqa: F401
        import shardfix.passes.fix_shardings  # noqa: F401
        self.workdir, self.jobs, self.timeout = workdir, jobs, timeout
        workdir.mkdir(parents=True, exist_ok=True)

    def run_all(self, jobs: list[tuple[list[str], bytes]]) -> list[Run]:
        results: list[Run | None] = [None] * len(jobs)
        running: dict[int, tuple[int, float, str, str]] = {}  # pid -> (job index, start, out, err)
        todo = list(range(len(jobs)))[::-1]
        while todo or running:
            while todo and len(running) < self.jobs:
                index = todo.pop()
                out, err = str(self.workdir / f"{index}.out"), str(self.workdir / f"{index}.err")
                argv, data = jobs[index]
                pid = os.fork()
                if pid == 0:
                    _child(argv, data, out, err)
                running[pid] = (index, time.monotonic(), out, err)
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                now = time.monotonic()
                for child, (index, start, out, err) in list(running.items()):
                    if now - start > self.timeout:
                        os.kill(child, signal.SIGKILL)
                        os.waitpid(child, 0)
                        del running[child]
                        results[index] = Run(None, timed_out=True, seconds=now - start,
                                             stderr=_read(err))
                time.sleep(0.002)
                continue
            if pid not in running:
                continue
            index, start, out, err = running.pop(pid)
            results[index] = _result(status, out, err, time.monotonic() - start)
        return results  # type: ignore[return-value]


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
        os.unlink(path)
        return text
    except OSError:
        return ""


def _result(status: int, out: str, err: str, seconds: float) -> Run:
    stdout, stderr = _read(out), _read(err)
    tb = ""
    if "\nTRACEBACK\n" in stderr:
        stderr, tb = stderr.split("\nTRACEBACK\n", 1)
    if os.WIFSIGNALED(status):
        return Run(None, signal.Signals(os.WTERMSIG(status)).name, stdout=stdout, stderr=stderr, seconds=seconds)
    return Run(os.WEXITSTATUS(status), traceback=tb, stdout=stdout, stderr=stderr, seconds=seconds)


@dataclass
class Verdict:
    case: Case
    plain: Run
    fix: Run
    reparse: Run | None = None
    fixes: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def loads(self) -> bool:
        return self.plain.outcome == "ok"

    @property
    def result(self) -> str:
        """repaired | unchanged | refused | unsupported | BAD:<why>: a module that loads must come out verifying;
        an invalid one repaired, or refused in shardfix's words at a file:line:col."""
        for run in (self.plain, self.fix, self.reparse):
            if run is not None and run.outcome not in ("ok", "error"):
                return f"BAD:{run.outcome}"
        if self.fix.outcome == "ok":
            if self.reparse is None or self.reparse.outcome != "ok":
                return "BAD:unverifiable-output"
            return "repaired" if self.fixes else "unchanged"
        first = next((ln for ln in self.fix.stderr.splitlines() if ": error: " in ln), "")
        if self.loads:
            return "BAD:loadable-module-refused"
        if not self.case.expects_error:
            return "unsupported"  # a valid case the installed jaxlib can't read (newer syntax or ops)
        if REFUSAL in first and _located(first):
            return "refused"
        return "BAD:unexplained-error"


def _located(line: str) -> bool:
    head = line.split(": error: ", 1)[0]
    parts = head.rsplit(":", 2)
    return len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit()


def judge(cases: list[Case], pool: Pool, pipeline: str = "fix-shardings") -> list[Verdict]:
    """Run every case plain and through `pipeline`, then re-verify each output."""
    flags = lambda c: ["--allow-unregistered-dialect"] if c.unregistered else []  # noqa: E731
    jobs = []
    for case in cases:
        data = case.text.encode()
        jobs.append((["-", *flags(case)], data))
        jobs.append((["-", "-p", pipeline, "--report=json", *flags(case)], data))
    runs = pool.run_all(jobs)
    verdicts = [Verdict(case, runs[2 * i], runs[2 * i + 1]) for i, case in enumerate(cases)]
    again = [v for v in verdicts if v.fix.outcome == "ok"]
    reparses = pool.run_all([(["-", *flags(v.case)], v.fix.stdout.encode()) for v in again])
    for verdict, reparse in zip(again, reparses):
        verdict.reparse = reparse
        verdict.fixes = sum(1 for ln in verdict.fix.stderr.splitlines() if ln.startswith('{"') and '"fix"' in ln)
    return verdicts
