"""tools/opt's output and its limits, as mlir-opt behaves: files written through symlinks with their mode kept,
FIFOs and devices written directly, a closed or full standard output and a run past its time limit are clean
errors (exit 1, one located line, nothing written), numbers out of range are usage errors."""

import io
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading

import pytest

from shardfix.opt import OptMain
from shardfix.output import OutputError, write_output
from shardfix.watchdog import run_guarded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPT = os.path.join(ROOT, "tools", "opt")
MODULE = b"func.func @id(%arg0: tensor<2xf32>) -> tensor<2xf32> {\n  return %arg0 : tensor<2xf32>\n}\n"


def run(argv, stdin=MODULE):
    out, err = io.StringIO(), io.StringIO()
    code = OptMain(stdout=out, stderr=err, stdin=io.BytesIO(stdin)).run(argv)
    return code, out.getvalue(), err.getvalue()


def test_output_through_a_symlink_keeps_the_link_and_the_mode(tmp_path):
    target = tmp_path / "real.mlir"
    target.write_text("old\n")
    target.chmod(0o640)
    link = tmp_path / "link.mlir"
    link.symlink_to(target)
    assert run(["-", "-o", str(link)])[0] == 0
    assert link.is_symlink() and "func.func @id" in target.read_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.mlir", "real.mlir"]


def test_a_new_file_gets_the_umask_mode(tmp_path):
    mask = os.umask(0o022)
    try:
        write_output(str(tmp_path / "new.mlir"), b"x\n")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "new.mlir").stat().st_mode) == 0o644


def test_a_file_the_user_may_not_write_is_refused_and_kept():
    """As mlir-opt: a read-only file is not replaced behind its owner's back (checked as an unprivileged user: root
    may write anything)."""
    directory = tempfile.mkdtemp(prefix="shardfix-ro-")
    try:
        os.chmod(directory, 0o777)
        target = os.path.join(directory, "out.mlir")
        with open(target, "w") as f:
            f.write("keep\n")
        os.chmod(target, 0o444)
        script = ("import os, sys\n"
                  f"sys.path.insert(0, {os.path.join(ROOT, 'python')!r})\n"
                  "from shardfix.output import OutputError, write_output\n"
                  "if os.geteuid() == 0:\n    os.setgid(65534)\n    os.setuid(65534)\n"
                  "try:\n    write_output(sys.argv[1], b'new')\n    print('written')\n"
                  "except OutputError as e:\n    print(e)\n")
        proc = subprocess.run([sys.executable, "-c", script, target], capture_output=True, text=True)
        assert proc.stdout == f"cannot write output file '{target}': permission denied\n", proc.stderr
        with open(target) as f:
            assert f.read() == "keep\n"
    finally:
        shutil.rmtree(directory)


def test_a_file_with_other_hard_links_is_written_in_place(tmp_path):
    target, other = tmp_path / "out.mlir", tmp_path / "other-name.mlir"
    target.write_text("old\n")
    os.link(target, other)
    assert run(["-", "-o", str(target)])[0] == 0
    assert other.read_text() == target.read_text() and "func.func @id" in other.read_text()
    assert target.stat().st_ino == other.stat().st_ino


def test_an_empty_output_name_or_a_directory_is_a_clean_error(tmp_path):
    assert run(["-", "-o", ""])[2] == "shardfix-opt: error: no output file name given\n"
    assert run(["-", "-o", str(tmp_path)])[2] == f"shardfix-opt: error: cannot write output file '{tmp_path}': it is a directory\n"


def test_fifo_is_written_directly(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(open(fifo, "rb").read()))
    reader.start()
    assert run(["-", "-o", str(fifo)])[0] == 0
    reader.join(timeout=30)
    assert b"func.func @id" in received[0] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_devices_are_written_directly():
    write_output("/dev/null", b"anything\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    with pytest.raises(OutputError, match="cannot write output file '/dev/full': no space left on the device"):
        write_output("/dev/full", b"x" * 100000)


def test_full_standard_output_is_one_line_and_exit_1():
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([sys.executable, OPT, "-"], input=MODULE, stdout=full, stderr=subprocess.PIPE)
    assert proc.returncode == 1
    assert proc.stderr.decode() == "shardfix-opt: error: cannot write to standard output: no space left on the device\n"


def with_closed(fd: int, argv: list[str]) -> list[str]:
    """`argv` run with file descriptor `fd` closed: a small Python closes it and execs the command (no preexec_fn,
    which would fork this multithreaded process)."""
    return [sys.executable, "-c", f"import os, sys; os.close({fd}); os.execv(sys.argv[1], sys.argv[1:])", *argv]


def test_closed_standard_output_is_one_line_and_exit_1():
    proc = subprocess.run(with_closed(1, [sys.executable, OPT, "-"]), input=MODULE, stderr=subprocess.PIPE)
    assert proc.returncode == 1
    assert proc.stderr.decode() == "shardfix-opt: error: cannot write to standard output: it is closed\n"


def test_closed_standard_input_is_one_line_and_exit_1():
    proc = subprocess.run(with_closed(0, [sys.executable, OPT, "-", "-p", "fix-shardings"]), capture_output=True)
    assert proc.returncode == 1 and proc.stdout == b""
    assert proc.stderr.decode() == "shardfix-opt: error: cannot read standard input: standard input is closed\n"


def test_a_run_past_its_time_limit_is_a_located_error_and_writes_nothing(tmp_path):
    source, target = tmp_path / "in.mlir", tmp_path / "out.mlir"
    source.write_bytes(b"\n" + MODULE)
    target.write_text("keep\n")
    # The worker imports JAX before it can do anything: it can't finish in 10 ms.
    proc = subprocess.run([sys.executable, OPT, str(source), "-o", str(target), "--timeout", "0.01"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith(f"{source}:1:1: error: no result after 0.01 s")
    assert "nothing was written" in proc.stderr and "Traceback" not in proc.stderr
    assert target.read_text() == "keep\n"


CHILDREN = """
import os, signal

def crash(argv, channel):
    channel.progress(int(argv[0]))
    os.kill(os.getpid(), signal.SIGKILL)

def fail(argv, channel):
    raise RuntimeError("broken: " + " ".join(argv))

def answer(argv, channel):
    channel.output("-", "out " + " ".join(argv) + "\\n")
    return 0
"""


@pytest.fixture
def children(tmp_path, monkeypatch):
    """A module of child functions the watchdog's fresh interpreter can import (through PYTHONPATH)."""
    (tmp_path / "watchdog_children.py").write_text(CHILDREN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "watchdog_children"


def test_a_crashed_run_is_a_located_error(capfd, children):
    code = run_guarded(f"{children}:crash", ["7"], 30, "m.mlir", "shardfix-opt")
    assert code == 1
    assert capfd.readouterr().err == ("m.mlir:7:1: error: internal error: the run died of SIGKILL while working "
                                      "here; nothing was written\n")


def test_the_child_is_a_fresh_interpreter_not_a_fork(capfd, children):
    """No fork of this (multithreaded, JAX-importing) process: no DeprecationWarning, whatever the filters say."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run_guarded(f"{children}:answer", ["a", "b"], 30, "m.mlir", "shardfix-opt") == 0
        assert run_guarded(f"{children}:fail", ["x"], 30, "m.mlir", "shardfix-opt") == 1
    out, err = capfd.readouterr()
    assert out == "out a b\n"
    assert err == "shardfix-opt: internal error: RuntimeError: broken: x\n"


@pytest.mark.parametrize("argv, message", [
    (["--target-mesh", "dp=99999999999999999999", "-p", "fix-shardings"],
     "shardfix-opt: error: --target-mesh: axis 'dp' size 99999999999999999999 is out of range (at most 2147483647)"),
    (["--target-mesh", "a=65536,b=65536", "-p", "fix-shardings"],
     "shardfix-opt: error: --target-mesh: a mesh of 4294967296 devices is out of range (at most 2147483647)"),
    (["-p", "ring-reorder{stripe=99999999999999999999}"],
     "<pass-pipeline>:1:1: error: option 'stripe' of 'ring-reorder' is out of range: 99999999999999999999 (at most "
     "2147483647)"),
    (["--timeout", "1e99"], "shardfix-opt: error: argument --timeout: expected 0 to 10000000 seconds, got '1e99'"),
])
def test_numbers_out_of_range_are_usage_errors(argv, message):
    code, out, err = run(["-", *argv])
    assert (code, out, err) == (1, "", message + "\n")


SPLIT = (b'sdy.mesh @mesh = <["a"=2]>\nfunc.func @first(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n'
         b'  return %arg0 : tensor<4xf32>\n}\n// -----\nfunc.func @broken() {\n  %0 = stablehlo.bogus\n}\n'
         b'// -----\nfunc.func @third() {\n  return\n}\n')


def test_split_input_file_prints_every_chunk_that_succeeded(tmp_path):
    code, out, err = run(["-", "--split-input-file"], SPLIT)
    assert code == 1 and err.startswith("<stdin>:7:")
    assert out.count("// -----") == 1 and "@first" in out and "@third" in out and "@broken" not in out
    target = tmp_path / "out.mlir"
    assert run(["-", "--split-input-file", "-o", str(target)], SPLIT)[0] == 1 and not target.exists()


def test_mlir_opt_spellings():
    for argv in (["-split-input-file", "-pass-pipeline=fix-shardings"], ["--split-input-file", "-fix-shardings"],
                 ["-split-input-file", "--pass-pipeline", "fix-shardings", "-o=-"]):
        code, out, err = run(["-", *argv], SPLIT.replace(b"  %0 = stablehlo.bogus\n", b"  return\n"))
        assert (code, err) == (0, ""), argv
        assert out.count("// -----") == 2 and "@third" in out
    assert run(["-", "-no-such-pass"])[2] == "shardfix-opt: error: unrecognized arguments: -no-such-pass\n"
