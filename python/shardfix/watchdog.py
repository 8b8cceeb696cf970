"""A time limit for a driver run. MLIR's parser, verifier and passes can't be interrupted from Python, so the run
happens in a child process that sends its output back over a pipe; the parent (which never imports MLIR or JAX)
writes it only once the child has finished well. A child past the limit is killed, a crashed one reported, and in
both cases nothing is written. Pure: imports neither MLIR nor JAX.

The child is a fresh interpreter (`sys.executable`), never a fork: a fork of a process that runs threads (any
process that has imported JAX, a test runner's) can deadlock, and Python warns about it. The child finds the same
shardfix package as the parent, and runs `module:function(argv, channel)`."""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

from .output import OutputError, write_output

_HEADER = struct.Struct("<cQ")  # message kind, payload length


class Channel:
    """The child's end: progress (which input line it is working on) and the output to write."""

    def __init__(self, fd: int):
        self.fd = fd

    def _send(self, kind: bytes, payload: bytes) -> None:
        data = _HEADER.pack(kind, len(payload)) + payload
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def progress(self, line: int) -> None:
        self._send(b"P", str(line).encode())

    def output(self, path: str, data: str | bytes) -> None:
        """What to write to `path` ("-": standard output): text, or bytes (MLIR bytecode) as they are."""
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        self._send(b"O", path.encode("utf-8", "surrogateescape") + b"\0" + data)


@dataclass
class _Received:
    line: int = 1
    outputs: list[tuple[str, bytes]] = field(default_factory=list)
    buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= _HEADER.size:
            kind, length = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + length:
                return
            payload = bytes(self.buffer[_HEADER.size:_HEADER.size + length])
            del self.buffer[:_HEADER.size + length]
            if kind == b"P":
                self.line = int(payload)
            else:
                path, _, text = payload.partition(b"\0")
                self.outputs.append((path.decode("utf-8", "surrogateescape"), text))


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):  # None where the stream was closed when Python started
        if stream is not None:
            stream.flush()


_INTERNAL_ERROR = 70  # the child's exit status when `work` raised: it has said so on stderr

# The child: `-P` keeps the current directory (a user's own `jax.py`, say) off its path; the directory holding the
# parent's shardfix goes first, so that the child runs the same code whether shardfix is installed, editable or
# only on PYTHONPATH.
_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); "
          "from shardfix.watchdog import _child_main; sys.exit(_child_main(sys.argv[2:]))")
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_guarded(target: str, argv: list[str], timeout: float, input_name: str, prog: str) -> int:
    """Run `target` ("module:function", called as function(argv, channel) and returning an exit status) in a child
    process with a time limit; write what it sends as output; return the exit status."""
    stdout_open = _fd_open(1)
    for fd in (0, 1, 2):  # a closed standard stream must not be taken by the pipe below
        if not _fd_open(fd):
            os.dup2(os.open(os.devnull, os.O_RDWR), fd)
    read_end, write_end = os.pipe()
    _flush()
    try:
        child = subprocess.Popen([sys.executable, "-P", "-c", _CHILD, _PACKAGE_ROOT, prog, target, str(write_end),
                                  json.dumps(argv)], pass_fds=(write_end,))
    finally:
        os.close(write_end)
    received, deadline = _Received(), time.monotonic() + timeout if timeout > 0 else None
    try:
        status = _collect(child, read_end, received, deadline)
    except KeyboardInterrupt:
        child.kill()
        child.wait()
        return 130
    finally:
        os.close(read_end)
    where = f"{input_name}:{received.line}:1"
    if status is None:
        print(f"{where}: error: no result after {timeout:g} s (MLIR's parser, verifier or a pass did not finish); "
              f"nothing was written; --timeout sets the limit", file=sys.stderr)
        return 1
    if status < 0:
        name = signal.Signals(-status).name
        print(f"{where}: error: internal error: the run died of {name} while working here; nothing was written",
              file=sys.stderr)
        return 1
    code = status
    if code == _INTERNAL_ERROR:
        return 1
    for path, data in received.outputs:
        try:
            if path == "-" and not stdout_open:
                raise OutputError("cannot write to standard output: it is closed")
            write_output(path, data)
        except OutputError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 1
    return code


def _collect(child: subprocess.Popen, fd: int, received: _Received, deadline: float | None) -> int | None:
    """Read the child's messages until it exits; its exit status (-N: killed by signal N), or None when it ran past
    the deadline."""
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], wait)
        if ready:
            data = os.read(fd, 1 << 20)
            if data:
                received.feed(data)
                continue
            return child.wait()  # the pipe closed: the child is done
        if deadline is not None and time.monotonic() >= deadline:
            child.kill()
            child.wait()
            return None


def _child_main(args: list[str]) -> int:
    """The child: `prog target fd argv-as-JSON`. Whatever `target` raises is one line on stderr, never a traceback."""
    prog, target, fd, argv = args[0], args[1], int(args[2]), json.loads(args[3])
    try:
        module, _, function = target.partition(":")
        code = getattr(importlib.import_module(module), function)(argv, Channel(fd))
    except BaseException as e:  # noqa: BLE001  (reported by the parent as an internal error)
        if sys.stderr is not None:
            print(f"{prog}: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        code = _INTERNAL_ERROR
    _flush()
    return code
