"""Running tools/opt's driver over a corpus of .mlir test cases, each in a forked child with a time limit, and
judging the outcome (used by tests/test_mutants.py and bench/shardy_corpus.py).

A case is one `// -----` chunk of a file whose RUN lines split it (`-split-input-file`), else the whole file (of a
split-file test, `//--- part1.mlir ...`, its first part: the module
the sharding tools see; the other parts are the interpreter harness around it).
It is INVALID when it carries an `expected-error`, VALID otherwise. For each case:
  plain   the driver with no pipeline (parse, verify, print)
  fix     `-p fix-shardings --report=json`
  reparse the fix output, parsed and verified again
The children import nothing: the parent imported shardfix and JAX once, so a case costs a fork, not a start.
A process that has run JAX computations holds JAX's threads, and forking it can deadlock (Python warns about
every such fork): `judge_file` runs the whole judgement in a fresh interpreter, which forks before any thread
starts.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
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


def split_cases(name: str, text: str, split: bool | None = None) -> list[Case]:
    """The cases of one file; `split`: whether `// -----` separates cases (default: when its RUN lines say
    `-split-input-file`)."""
    lines = text.split("\n")
    unregistered = "allow-unregistered-dialect" in text
    if any(line.startswith(PARTS_MARKER) for line in lines):
        # A split-file test: its first part is the module the sharding tools see; the later parts are the harness
        # that runs it in the interpreter (functions the harness script writes, ops of its `check` dialect).
        starts = [i for i, line in enumerate(lines) if line.startswith(PARTS_MARKER)] + [len(lines)]
        body = "\n" * (starts[0] + 1) + "\n".join(lines[starts[0] + 1:starts[1]]) + "\n"
        return [Case(f"{name}#0", body, "expected-error" in body, unregistered)]
    if not (split if split is not None else "split-input-file" in text):  # taken whole, `// -----` or not
        return [Case(f"{name}#0", text, "expected-error" in text, unregistered)]
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
    again: "Run | None" = None  # the output run again (re-verified), when asked for

    @property
    def outcome(self) -> str:
        if self.timed_out:
            return "hang"
        if self.signal:
            return f"crash:{self.signal}"
        if self.traceback:
            return "traceback"
        return {0: "ok", 1: "error"}.get(self.code, f"exit:{self.code}")


def _child(argv: list[str], data: bytes, out_path: str, err_path: str, reverify: list[str] | None) -> None:
    """In the forked child: run the driver with its streams on files (and, when it succeeds and `reverify` gives
    the arguments, run the driver again on its output, its streams on files beside); never returns."""
    code = 70
    try:
        err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(err_fd, 2)  # native crashes write here too
        code = _drive(argv, data, out_path, err_path)
        if code == 0 and reverify is not None:
            with open(out_path, "rb") as f:
                code = 100 + _drive(reverify, f.read(), out_path + ".again", err_path + ".again")
    finally:
        os._exit(code)


def _drive(argv: list[str], data: bytes, out_path: str, err_path: str) -> int:
    from shardfix.opt import OptMain
    with open(out_path, "w") as out, open(err_path, "a") as err:
        try:
            return OptMain(stdout=out, stderr=err, stdin=io.BytesIO(data)).run(argv)
        except BaseException:  # noqa: BLE001  (an escaped exception is the finding)
            err.write("\nTRACEBACK\n" + traceback.format_exc())
            return 70


class Pool:
    """Runs the driver in forked children, `jobs` at a time, each with a time limit."""

    def __init__(self, workdir: Path, jobs: int = 2, timeout: float = 60.0):
        import jax  # noqa: F401  (import once, before forking)
        import shardfix.opt  # noqa: F401
        import shardfix.passes.fix_shardings  # noqa: F401
        from shardfix.ir import make_context
        make_context(False), make_context(True)  # single-threaded: the children share them safely
        self.workdir, self.jobs, self.timeout = workdir, jobs, timeout
        workdir.mkdir(parents=True, exist_ok=True)

    def run_all(self, jobs: list[tuple[list[str], bytes]], reverify: list[list[str]] | None = None) -> list[Run]:
        """Each job's run; with `reverify` (arguments per job), a successful run's output is run again in the
        same child and that second run is the result's `again`."""
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
                    _child(argv, data, out, err, reverify[index] if reverify is not None else None)
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
            run = results[index] = _result(status, out, err, time.monotonic() - start)
            if run.code is not None and run.code >= 100:  # the run succeeded; this is the second run's status
                run.again = _result(0, out + ".again", err + ".again", 0.0)
                run.again.code, run.code = run.code - 100, 0
                if "\nTRACEBACK\n" in run.again.stderr:
                    run.again.stderr, run.again.traceback = run.again.stderr.split("\nTRACEBACK\n", 1)
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


def judge(cases: list[Case], pool: Pool, pipeline: str = "fix-shardings", plain_always: bool = True) -> list[Verdict]:
    """Run every case through `pipeline` and re-verify each output; run it plain too (always, or only where the
    pipeline failed: a module that loads as it is must never be refused)."""
    flags = lambda c: ["--allow-unregistered-dialect"] if c.unregistered else []  # noqa: E731
    fix = lambda some: pool.run_all([(["-", "-p", pipeline, "--report=json", *flags(c)], c.text.encode())  # noqa: E731
                                     for c in some], reverify=[["-", *flags(c)] for c in some])
    fixes = fix(cases)
    # Like mlir-opt's tests, a case with ops of dialects nobody registered runs with them allowed.
    retry = [i for i, run in enumerate(fixes) if not cases[i].unregistered and "unregistered dialect" in run.stderr]
    for i in retry:
        cases[i].unregistered = True
    for i, run in zip(retry, fix([cases[i] for i in retry])):
        fixes[i] = run
    need_plain = [i for i, run in enumerate(fixes) if plain_always or run.outcome != "ok"]
    plains = dict(zip(need_plain, pool.run_all([(["-", *flags(cases[i])], cases[i].text.encode())
                                                for i in need_plain])))
    verdicts = [Verdict(case, plains.get(i, Run(0)), fixes[i], fixes[i].again) for i, case in enumerate(cases)]
    for verdict in verdicts:
        verdict.fixes = sum(1 for ln in verdict.fix.stderr.splitlines() if ln.startswith('{"') and '"fix"' in ln)
    return verdicts


def judge_file(path: Path, workdir: Path, *, expects_error: bool, jobs: int, timeout: float,
               plain_always: bool = True, every: int = 1) -> list[tuple[str, str, str]]:
    """(case name, result, first line of the fix's stderr) for every case of `path` (split at `// -----`), or
    every `every`-th from the first, judged in a fresh interpreter (see the module's docstring)."""
    request = {"path": str(path), "workdir": str(workdir), "expects_error": expects_error, "jobs": jobs,
               "timeout": timeout, "plain_always": plain_always, "every": every}
    tests = str(Path(__file__).resolve().parent.parent)
    code = f"import sys; sys.path.insert(0, {tests!r}); from support.corpus import _judge_file_main; _judge_file_main()"
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(request), capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"judging {path} failed:\n{done.stderr[-4000:]}")
    return [tuple(row) for row in json.loads(done.stdout)]


def _judge_file_main() -> None:
    request = json.loads(sys.stdin.read())
    path = Path(request["path"])
    cases = split_cases(path.name, path.read_text(), split=True)[::request["every"]]
    for case in cases:
        case.expects_error = case.expects_error or request["expects_error"]
    pool = Pool(Path(request["workdir"]), jobs=request["jobs"], timeout=request["timeout"])
    verdicts = judge(cases, pool, plain_always=request["plain_always"])
    json.dump([(v.case.name, v.result, (v.fix.stderr.strip().splitlines() or [""])[0]) for v in verdicts],
              sys.stdout)
